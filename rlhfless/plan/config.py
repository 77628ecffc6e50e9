"""`PlanConfig`: every knob of the planner (assignment, cut-and-migrate, actor scaling, cost) in one dataclass.

Purpose: one typed, validated source of truth for the planner's defaults; experiments override it from YAML
(`plan:` section) or `plan.key=value`. Non-goals: no I/O besides loading the optional time-profile JSON.

Deviations from the paper: the defaults for cold start and weight sync are assumptions for the tiny local model
(the paper measures its own on L40S); capacity 256 stands in for a KV budget we do not model in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhfless.core.errors import require
from rlhfless.plan.balancer import POLICIES
from rlhfless.plan.cost import CATALOG, BillingRules
from rlhfless.plan.overlap import LearnerCosts
from rlhfless.plan.timemodel import TimeModel

OBJECTIVES = ("score", "min_cost_under_deadline", "min_time_under_budget", "min_cost_at_deadline")


@dataclass(frozen=True)
class PlanConfig:
    """Planner settings (the `plan:` section of a run config)."""

    policy: str = "contiguous"
    """Assignment policy: round_robin (verl-like), contiguous (paper), lpt, karmarkar_karp."""
    capacity: int = 256
    """Max concurrent sequences per decode actor (its KV budget in sequences); >= the largest group."""
    migrate: bool = True
    """Cut-and-migrate: the chosen plan is also simulated with cuts at tau (an actor whose finished fraction
    reaches tau hands its stragglers to others) and keeps them only where the scaler's rule prefers them
    (balancer/migrate_used); off = plans never cut. Decided and logged; not yet executed (one engine batch)."""
    tau: float = 0.7
    """Finished fraction that triggers a cut, in (0, 1] (paper: about 0.7)."""
    scale: bool = True
    """Cost-aware actor scaling on; off = always max_actors actors."""
    lam: float = 0.5
    """lambda: weight of normalised time in the score lam*T/T_min + (1-lam)*C/C_min, in [0, 1]."""
    min_actors: int = 1
    """Smallest candidate number of decode actors (>= 1)."""
    max_actors: int = 8
    """Largest candidate number of decode actors (>= min_actors)."""
    objective: Literal["score", "min_cost_under_deadline", "min_time_under_budget", "min_cost_at_deadline"] = "score"
    """score: minimise the lambda score; min_cost_under_deadline / min_time_under_budget: constrained choice;
    min_cost_at_deadline: the cheapest N whose step is at most deadline_ratio x the serverful plan's (every
    actor, round robin, all warm, priced by the same model)."""
    deadline_ratio: float = 1.0
    """Step-time ratio to the serverful plan (objective min_cost_at_deadline), > 0."""
    deadline_s: float | None = None
    """Decode-stage deadline in seconds (objective min_cost_under_deadline)."""
    budget_usd: float | None = None
    """Decode-stage budget in dollars per step (objective min_time_under_budget)."""
    simulate_migration: bool = False
    """With migrate: weigh EVERY candidate N with cuts at tau, not only the chosen one (slower: an event
    simulation per candidate)."""
    exact_sweep: bool = False
    """Scaler simulates every candidate exactly (slow: milliseconds per candidate) instead of the fast sweep of
    rlhfless.plan.sweep (exact when no actor queues and lengths are per job; estimated otherwise). The chosen
    plan is simulated exactly either way."""
    gpu_kind: str = "cpu-core"
    """Device kind priced from the catalog (rlhfless.plan.cost.CATALOG): H100, A100-80G, H200, L40S, cpu-core."""
    gpus_per_actor: float = 1.0
    """Devices each decode actor holds (> 0)."""
    cold_start_s: float = 3.0
    """Seconds a decode actor needs when it starts cold (process + model load), >= 0; assumed for the tiny model."""
    weight_sync_s: float = 0.2
    """Seconds to load the step's new weights into a decode actor, >= 0."""
    warm_bill_s: float = 0.0
    """Seconds each warm decode actor is billed before the step (kept alive through the idle gap since its last
    use, or restarted that far ahead), >= 0; 0 = a warm actor costs nothing before the step (the runtime's
    planner without the whole-step scorer)."""
    hybrid_warm: int = 0
    """Of the warm decode actors, how many (the busiest) are hybrid functions kept from the last step's learner
    (decode and learner are handlers of one image, `runtime.hybrid`): they hold the step's new weights, so they
    need hybrid_sync_s instead of weight_sync_s, and they bill from the step's start (before it they were learner
    ranks, billed to the learner); those beyond a candidate's decode need stay learner ranks (warm spare blocks).
    >= 0; 0 = none (the runtime's planner: its weight_sync_s is calibrated on every load, zeros included)."""
    hybrid_sync_s: float = 0.0
    """Seconds a hybrid warm actor needs to put the learner's new weights into its engine's layout (the in-place
    reshard), >= 0."""
    time_profile: str | None = None
    """JSON time profile from the engine benchmark; None = the assumed default for the tiny CPU model."""
    billing: BillingRules = field(default_factory=BillingRules)
    """Serverless billing rules (granularity, minimum, cold start billed, keep-alive). A runtime passes the rules
    its meter bills with (`rlhfless.runtime.meter.billing_rules`), so predicted and billed device-seconds agree."""
    learner: LearnerCosts = field(default_factory=LearnerCosts)
    """Whole-step scoring: with learner.whole_step, T(N) and C(N) include the prefill function, the (overlapped)
    scoring and update and their bills (rlhfless.plan.overlap); off = the decode stage alone."""

    def __post_init__(self) -> None:
        require(self.policy in POLICIES, "plan.policy", f"must be one of {list(POLICIES)} (got {self.policy!r})")
        require(isinstance(self.capacity, int) and self.capacity >= 1, "plan.capacity",
                f"must be an integer >= 1 (got {self.capacity!r})")
        require(0.0 < self.tau <= 1.0, "plan.tau", f"must lie in (0, 1] (got {self.tau})")
        require(0.0 <= self.lam <= 1.0, "plan.lam", f"lambda must lie in [0, 1] (got {self.lam})")
        require(isinstance(self.min_actors, int) and self.min_actors >= 1, "plan.min_actors",
                f"must be an integer >= 1 (got {self.min_actors!r})")
        require(isinstance(self.max_actors, int) and self.max_actors >= self.min_actors, "plan.max_actors",
                f"must be an integer >= min_actors={self.min_actors} (got {self.max_actors!r})")
        require(self.objective in OBJECTIVES, "plan.objective", f"must be one of {list(OBJECTIVES)} "
                f"(got {self.objective!r})")
        require(self.objective != "min_cost_under_deadline" or (self.deadline_s or 0) > 0, "plan.deadline_s",
                f"objective min_cost_under_deadline needs deadline_s > 0 (got {self.deadline_s})")
        require(self.objective != "min_time_under_budget" or (self.budget_usd or 0) > 0, "plan.budget_usd",
                f"objective min_time_under_budget needs budget_usd > 0 (got {self.budget_usd})")
        require(self.deadline_ratio > 0, "plan.deadline_ratio", f"must be > 0 (got {self.deadline_ratio})")
        require(self.gpu_kind in CATALOG, "plan.gpu_kind", f"must be one of {list(CATALOG)} (got {self.gpu_kind!r})")
        require(self.gpus_per_actor > 0, "plan.gpus_per_actor", f"must be > 0 (got {self.gpus_per_actor})")
        require(self.cold_start_s >= 0, "plan.cold_start_s", f"must be >= 0 s (got {self.cold_start_s})")
        require(self.weight_sync_s >= 0, "plan.weight_sync_s", f"must be >= 0 s (got {self.weight_sync_s})")
        require(self.warm_bill_s >= 0, "plan.warm_bill_s", f"must be >= 0 s (got {self.warm_bill_s})")
        require(isinstance(self.hybrid_warm, int) and self.hybrid_warm >= 0, "plan.hybrid_warm",
                f"must be an integer >= 0 (got {self.hybrid_warm!r})")
        require(self.hybrid_sync_s >= 0, "plan.hybrid_sync_s", f"must be >= 0 s (got {self.hybrid_sync_s})")

    def candidates(self) -> range:
        """Candidate numbers of decode actors: min_actors..max_actors (only max_actors when scaling is off)."""
        return range(self.min_actors if self.scale else self.max_actors, self.max_actors + 1)

    def time_model(self) -> TimeModel:
        """The time model: the JSON profile when given, else the assumed default for the tiny CPU model."""
        return TimeModel.from_json(self.time_profile) if self.time_profile else TimeModel.default_tiny_cpu()
