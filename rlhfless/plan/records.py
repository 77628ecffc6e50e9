"""Typed records of the planner: jobs in, plans and decisions out, invocations for the cost meter.

Purpose: the frozen dataclasses that the balancer, migration, scaler and cost model exchange with the training
loop, the runtime and the simulator. `Invocation` is deliberately general (any function kind, any actor id) so the
runtime's billing meter can reuse it.

Non-goals: no logic beyond validation and small derived properties; no I/O.

Deviations from the paper: none (the paper does not publish its data structures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlhfless.core.errors import DataError


@dataclass(frozen=True)
class PlanJob:
    """A unit of assignment: one prompt group whose `n_seqs` samples stay on one actor (shared prefix KV).

    group_id: stable id of the group (a prompt id, or `<prompt>/<sample>` for per-sequence jobs).
    n_seqs: number of sequences decoded for it (G for a GRPO group, 1 for a per-sequence job).
    predicted_len: predicted response length in tokens: one float for every sequence, or a tuple of n_seqs floats.
    prompt_len: prompt tokens, prefilled once per job (the prefix is shared by the job's sequences).
    """

    group_id: str
    n_seqs: int
    predicted_len: float | tuple[float, ...]
    prompt_len: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.n_seqs, bool) or not isinstance(self.n_seqs, int) or self.n_seqs < 1:
            raise DataError(f"PlanJob {self.group_id!r}: n_seqs must be an integer >= 1 (got {self.n_seqs!r})")
        if isinstance(self.prompt_len, bool) or not isinstance(self.prompt_len, int) or self.prompt_len < 0:
            raise DataError(f"PlanJob {self.group_id!r}: prompt_len must be an integer >= 0 (got {self.prompt_len!r})")
        lens = self.predicted_len if isinstance(self.predicted_len, tuple) else (self.predicted_len,)
        if isinstance(self.predicted_len, tuple) and len(lens) != self.n_seqs:
            raise DataError(
                f"PlanJob {self.group_id!r}: predicted_len has {len(lens)} entries but n_seqs is {self.n_seqs}"
            )
        # the usual case in one pass (the planner builds a job per group per drawn outcome): plain floats, finite
        # (NaN fails both comparisons) and >= 0; anything else is checked one by one below for the message
        if all(type(x) is float and 0.0 <= x < math.inf for x in lens):
            return
        for x in lens:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise DataError(
                    f"PlanJob {self.group_id!r}: predicted lengths must be finite numbers >= 0 tokens (got {x!r})"
                )

    @classmethod
    def trusted(cls, group_id: str, n_seqs: int, predicted_len: float | tuple[float, ...],
                prompt_len: int = 0) -> PlanJob:
        """The record `PlanJob(...)` builds, without `__post_init__`'s checks: only for jobs the planner's callers
        build from values already checked (a simulated step's groups, a predictor's means raised to 1 token,
        outcomes drawn and clipped to [1, cap]), tens of thousands per simulated step. Never for user input."""
        job = object.__new__(cls)
        job.__dict__.update(group_id=group_id, n_seqs=n_seqs, predicted_len=predicted_len, prompt_len=prompt_len)
        return job

    @classmethod
    def trusted_many(cls, group_ids: Sequence[str], n_seqs: Sequence[int],
                     predicted_len: Sequence[float | tuple[float, ...]], prompt_len: Sequence[int]) -> list[PlanJob]:
        """`trusted` of each (group_id, n_seqs, predicted_len, prompt_len), in order, without a call per job (the
        simulator builds 200-300k a 100-step run). The same trust: never for user input."""
        new, out = object.__new__, []
        for g, n, x, p in zip(group_ids, n_seqs, predicted_len, prompt_len):
            job = new(cls)
            job.__dict__.update(group_id=g, n_seqs=n, predicted_len=x, prompt_len=p)
            out.append(job)
        return out

    def lengths(self) -> tuple[float, ...]:
        """Per-sequence predicted lengths in tokens, always n_seqs entries."""
        if isinstance(self.predicted_len, tuple):
            return tuple(map(float, self.predicted_len))
        return (float(self.predicted_len),) * self.n_seqs

    @property
    def tokens(self) -> float:
        """Predicted decode work of the job in tokens (sum over its sequences)."""
        if isinstance(self.predicted_len, tuple):
            return float(sum(self.predicted_len))
        return float(self.predicted_len) * self.n_seqs


@dataclass(frozen=True)
class AssignmentPlan:
    """Jobs per decode actor with the time model's predicted busy seconds.

    actor_jobs[a]: the jobs of actor a in admission order (the engine admits them FIFO as slots free).
    busy_s[a]: predicted seconds actor a is busy (fixed overhead + prefill + decode); 0 for an actor with no job.
    makespan_s: max(busy_s): the predicted rollout time of the step (overheads of the scaler excluded).
    idle_device_s: sum over actors of (makespan_s - busy_s[a]): device-seconds a fixed pool of n_actors wastes.
    peak_batch[a]: most sequences actor a runs at once in the simulation (never above capacity).
    """

    policy: str
    n_actors: int
    capacity: int
    actor_jobs: tuple[tuple[PlanJob, ...], ...]
    busy_s: tuple[float, ...]
    makespan_s: float
    idle_device_s: float
    peak_batch: tuple[int, ...] = ()

    @property
    def imbalance(self) -> float:
        """max/mean busy seconds over all n_actors (1.0 is perfect balance; 1.0 as well for an empty plan)."""
        mean = sum(self.busy_s) / len(self.busy_s)
        return self.makespan_s / mean if mean > 0 else 1.0

    @property
    def active_actors(self) -> int:
        """Actors with at least one job (the ones a serverless runtime actually starts)."""
        return sum(1 for jobs in self.actor_jobs if jobs)


@dataclass(frozen=True)
class SeqProgress:
    """Live state of one unfinished sequence on an actor (running or still queued).

    generated: tokens generated so far (0 while queued).
    predicted_remaining: predicted tokens still to generate (>= 0).
    prompt_len: prompt tokens (with `generated`, the KV a migration must move).
    """

    seq_id: str
    generated: int
    predicted_remaining: float
    prompt_len: int = 0


@dataclass(frozen=True)
class ActorProgress:
    """Live per-actor progress, as the runtime (or the simulator) observes it at one instant.

    finished: sequences of this actor that are done.
    unfinished: sequences still running or queued on it.
    free_slots: capacity minus running sequences (slots a migrated sequence could take now).
    """

    actor_id: int
    finished: int
    unfinished: tuple[SeqProgress, ...]
    free_slots: int

    @property
    def finished_fraction(self) -> float:
        total = self.finished + len(self.unfinished)
        return self.finished / total if total else 1.0

    @property
    def n_unfinished(self) -> int:
        return len(self.unfinished)

    @property
    def max_remaining(self) -> float:
        """The longest predicted remaining of its unfinished sequences (when it is free again, as predicted)."""
        return max(s.predicted_remaining for s in self.unfinished)


@dataclass(frozen=True)
class Migration:
    """Move sequence `seq_id` from actor `src` to actor `dst` (its KV goes with it)."""

    seq_id: str
    src: int
    dst: int


@dataclass(frozen=True)
class MigrationPlan:
    """The moves decided at one instant and the source actors that can release themselves afterwards."""

    moves: tuple[Migration, ...]
    released: tuple[int, ...]


@dataclass(frozen=True)
class MigrationResult:
    """Outcome of a plan simulated with cuts at tau.

    busy_s[a]: seconds actor a is busy (until it finished or was cut), fixed overhead and prefill included.
    moves: every migration in time order (a sequence may move more than once); released: actors cut early.
    finished[a]: sequences that completed on actor a (they sum to the plan's sequences).
    """

    busy_s: tuple[float, ...]
    makespan_s: float
    idle_device_s: float
    moves: tuple[Migration, ...]
    released: tuple[int, ...]
    finished: tuple[int, ...] = ()

    @property
    def imbalance(self) -> float:
        """max/mean busy seconds over all actors, as `AssignmentPlan.imbalance`."""
        mean = sum(self.busy_s) / len(self.busy_s) if self.busy_s else 0.0
        return self.makespan_s / mean if mean > 0 else 1.0


@dataclass(frozen=True)
class Invocation:
    """One serverless function invocation (or one held serverful device interval).

    kind: function kind ("decode", "prefill", "reward", "learner", ...).
    actor_id: which instance of that kind.
    start_s, end_s: wall-clock seconds from the start of the step (or run); end_s >= start_s.
    cold: True when the invocation started a fresh container (cold start inside [start_s, end_s]).
    gpus: devices it holds (fractions allowed for shared devices; CPU cores for the cpu-core unit).
    cold_start_s: seconds at the beginning spent on the cold start (0 when warm); billing may exclude them.
    """

    kind: str
    actor_id: int
    start_s: float
    end_s: float
    cold: bool = False
    gpus: float = 1.0
    cold_start_s: float = 0.0

    def __post_init__(self) -> None:
        # the usual case in one chained comparison (the scaler prices 20-odd invocations per candidate, 276k in
        # 100 paper-sim steps): finite start <= end, devices > 0, a cold start within the duration; anything
        # else (NaN fails every comparison) takes the checks below, which decide and name the problem
        start, end, cold = self.start_s, self.end_s, self.cold_start_s
        if -math.inf < start <= end < math.inf and self.gpus > 0 and 0 <= cold <= end - start:
            return
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)) or self.end_s < self.start_s:
            raise DataError(f"Invocation {self.kind}/{self.actor_id}: need start_s <= end_s (got {self.start_s}, "
                            f"{self.end_s})")
        if self.gpus <= 0:
            raise DataError(f"Invocation {self.kind}/{self.actor_id}: gpus must be > 0 (got {self.gpus})")
        if self.cold_start_s < 0 or self.cold_start_s > self.duration_s:
            raise DataError(f"Invocation {self.kind}/{self.actor_id}: cold_start_s must lie in [0, duration] "
                            f"(got {self.cold_start_s})")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class ScalingCandidate:
    """One row of the scaler's table: N actors -> predicted step time and cost.

    step_s: predicted decode-stage seconds (slowest actor incl. cold start, weight sync, prefill).
    gpu_seconds: billed GPU-seconds of the decode invocations; cost_usd: the same in dollars.
    score: lam * step_s / min_step + (1 - lam) * cost_usd / min_cost (lower is better; nan if not scored).
    feasible: True when the candidate meets the objective's constraint (always True for objective "score").
    exact: True when step_s and cost equal the continuous-batching simulation (up to float rounding); False
        when they are the fast sweep's estimate (an actor queues, or per-sample lengths out of order; see
        rlhfless.plan.sweep).
    """

    n_actors: int
    active_actors: int
    step_s: float
    gpu_seconds: float
    cost_usd: float
    score: float
    feasible: bool
    migrations: int = 0
    exact: bool = True


@dataclass(frozen=True)
class ScalingDecision:
    """The scaler's choice with every candidate it weighed, and the chosen plan.

    constraint_met: False when no candidate met the deadline/budget and the closest one was taken.
    plan: the chosen placement (without cuts); migration: the cuts at tau the plan includes (simulated on the
    predictions), None when it has none; cut_option: the chosen N costed with cuts at tau, whether or not they
    were kept (None when plan.migrate is off). `chosen` is the row as decided (with the cuts when kept).
    """

    n_actors: int
    objective: str
    candidates: tuple[ScalingCandidate, ...]
    plan: AssignmentPlan
    constraint_met: bool = True
    migration: MigrationResult | None = None
    cut_option: ScalingCandidate | None = None
    wide_actor: int = -1
    """The actor that runs on the wide engine (`rlhfless.plan.wide`), -1 for none."""
    wide_option: ScalingCandidate | None = None
    """The chosen N costed with its straggler on the wide engine, kept or not (None when none was offered)."""
    cut_reason: str = ""
    """Why the cuts at tau were kept or not (`scaler.cut_reason`), where the scaler decides; "" when plan.migrate
    is off."""

    @property
    def chosen(self) -> ScalingCandidate:
        return next(c for c in self.candidates if c.n_actors == self.n_actors)

    @property
    def predicted_device_s(self) -> float:
        """Billed device-seconds the planner predicts for the chosen plan under its billing rules: the whole step
        with plan.learner.whole_step, else the decode functions alone (logged as plan/predicted_device_s)."""
        return self.chosen.gpu_seconds

    def table_rows(self) -> list[dict[str, float]]:
        """Plain rows (one per candidate) for a W&B table or a JSON report."""
        return [
            {"n_actors": c.n_actors, "active_actors": c.active_actors, "step_s": c.step_s,
             "gpu_seconds": c.gpu_seconds, "cost_usd": c.cost_usd, "score": c.score,
             "feasible": c.feasible, "migrations": c.migrations, "exact": c.exact}
            for c in self.candidates
        ]
