"""Cluster policies: each turns a step's work into a `StepSchedule` through the shared planner (`rlhfless.plan`).

`verl` (serverful, tuned), `verl-paper` (verl 0.3.x as the paper ran it), `rlhfuse` (verl plus straggler migration
and inter-stage fusion), `rlhfless` (serverless functions; switches dedup, assign, migrate, scale, prewarm, overlap,
hybrid) and `oracle` (rlhfless fed the true lengths). `decide` returns (StepSchedule, metrics); `observe` feeds the true
lengths back. The rule it keeps: every policy plans with the same planner and one `PerfModel`, so a difference
between policies is the policy's. Each policy in full: docs/internals.md#simpoliciespy.

Deviations from the paper:
1. `hybrid` runs decode and learner as one function image (as verl's hybrid engine does); its role changes bill
   keep-alive as separate functions would (at most 2 s over-billed per change).
2. The learner keeps its optimizer state between steps (not paged to storage; the same for every policy).
3. The rule-based GSM8K reward runs on CPU and is not billed in device-seconds.
4. RLHFuse is reduced to migration and fusion (its fused pipeline schedule is not modelled).
5. PPO's critic has the policy's size (an assumption).
6. Separate images: a function is held warm into the next step only when its keep-alive covers the gap, the gap
   bills less than its cold start (`plan.lifecycle.hold_pays`) and the device budget has room (the learner works
   on every device, so in practice none is); otherwise it is let go at once, billed no keep-alive. A kept
   function unused next step is billed its whole keep-alive (at most the gap over).
7. Separate images: the learner's ranks (a replica's devices each) but the reducer are let go at their share,
   the end of the learner's work, as the runtime's are (`plan.lifecycle.let_go`, `plan.ranks.reducer`); the
   reducer alone runs the optimizer step (all of verl's mini-batch steps under learner parity: the fluid learner
   puts them after the work). The next step's decode and prefill functions are pre-warmed into the freed
   devices from the share, at the lifecycle's time (`plan.lifecycle.prewarm_start_s`); a cold start longer than
   the optimizer step runs on past the next step's start. The scaler prices the learner on the same release
   (`plan.overlap.learner_billed`, `plan.lifecycle.share_release` on the terms `_share_rule` gives both), and
   plans a pre-warm that cannot hide the whole cold start as a cold actor (conservative).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rlhfless.core import metrics as M
from rlhfless.plan import (
    AssignmentPlan,
    MigrationResult,
    PlanConfig,
    PlanJob,
    ScalingDecision,
    TimeModel,
    assign,
    choose,
    realized_plan,
)
from rlhfless.plan import lifecycle
from rlhfless.plan.balancer import JobArrays, job_finish_s
from rlhfless.plan.cost import BillingRules, price
from rlhfless.plan.migrate import play_with_migration
from rlhfless.plan.overlap import LearnerCosts
from rlhfless.plan.wide import WideActor, on_wide
from rlhfless.predictor import Observation, build_predictor
from rlhfless.predictor.base import Prediction
from rlhfless.predictor.config import PredictorConfig
from rlhfless.predictor.spread import draw_lengths
from rlhfless.sim.perf import PerfModel
from rlhfless.sim.step import ActorRun, FnRun, LearnerPlan, StepSchedule, learner_schedule
from rlhfless.sim.workload import StepWork


@dataclass(frozen=True)
class Cluster:
    """What every policy shares: perf model, device count, replicas' time model and capacity, algorithm."""

    perf: PerfModel
    n_devices: int
    time_model: TimeModel
    capacity: int
    algo: str
    template_tokens: int
    billing: BillingRules
    setting: str = "tuned"
    """tuned, or paper (verl 0.3.x's settings, `rlhfless.sim.overheads`; only the verl-paper policy runs on it)."""
    old_logprob: bool = False
    """The learner recomputes the old log-probs with one more actor forward per token."""
    minibatches: int = 1
    """Optimizer steps per step (mini-batch updates)."""
    kv_rebuild_s: float = 0.0
    """Seconds per step each rollout replica spends rebuilding the KV cache it freed."""
    max_response: float | None = None
    """The engine's response cap in tokens (a setting the planner knows; caps its drawn outcomes); None = none."""
    hybrid_join_s: float = 0.0
    """Seconds a released hybrid decode function needs beyond the in-place reshard before it is a learner block
    (communicator rebuild, optimizer-state share, reference model: `scenario.hybrid_join_s`)."""

    @property
    def replicas(self) -> int:
        return self.n_devices // self.perf.tp


@dataclass(frozen=True)
class Switches:
    """RLHFless optimizations, each on or off (the ablation flips them one at a time)."""

    dedup: bool = True
    assign: bool = True
    migrate: bool = True
    scale: bool = True
    prewarm: bool = True
    oracle: bool = False
    overlap: bool = True
    size_learner: bool = True
    """With overlap: start only the learner blocks the backlog needs (`SIZE_SLACK`), not every free device."""
    wide: bool = True
    """Per-actor TP: the scaler may run the straggler on a wider engine (twice the TP; when a node allows it)."""
    hybrid: bool = True
    """Decode and learner are handlers of one function image (the runtime's `runtime.hybrid`): a released decode
    actor's devices go on as a learner block at once (the in-place reshard, no cold start), and the learner's
    blocks at the step's end are the next step's warm decode actors, holding the new weights (the in-place
    reshard instead of the network weight sync); those beyond the decode need stay learner blocks."""
    draws: bool = True
    """The scaler averages each candidate's T and C over `N_DRAWS` outcomes of the lengths drawn from the
    predictor's distribution (`rlhfless.predictor.spread`), not the predicted means alone (no actor tails)."""


N_DRAWS = 2
"""Length outcomes per step the scaler averages over (each a Latin hypercube over the step's sequences; two keep
the predicted step time within a few percent of the simulated one on paper-sim, `docs/simulator.md`)."""

SIZE_SLACK = 0.01
"""A sized learner may end its work up to 1% later than one on every free device (assumed: the price of not
holding devices that would wait idle for groups until the optimizer step; `rlhfless.plan.overlap.size_blocks`)."""


def _learner(c: Cluster, step: StepWork, actor_jobs, finish: dict[str, float] | None, busy, overlap: bool,
             cold_s: float, prewarm: bool, work_scale: float = 1.0, prewarm_bill_s: float | None = None,
             size_slack: float | None = None, release_cold_s: float | None = None,
             warm_spare: int = 0, share_go: bool = False) -> LearnerPlan:
    """The step's scoring + update (`LearnerPlan`): each group's work (tokens x the perf model's learner
    device-seconds per token) arriving when its last sample finishes on its actor. A group whose finish is past
    its actor's realised busy time was migrated: it arrives at the end of the rollout (its new actor is not
    tracked; conservative). finish None: no overlap, every group's work arrives at the end of the rollout
    (`learner_schedule` reads no finish then, so none is simulated)."""
    pm, tail = c.perf, max(busy, default=0.0)
    actor_of = {j.group_id: a for a, jobs in enumerate(actor_jobs) for j in jobs}
    stream, after = learner_split(c)
    spt = stream * work_scale
    ids = step.prompt_ids
    acts = tuple(map(actor_of.__getitem__, ids))
    if finish is None:  # every group arrives at the rollout's end (`tail`, past no actor's busy time but its own)
        done = (tail,) * len(ids)
    else:
        done = tuple([f if f <= busy[a] + 1e-9 else tail for f, a in zip(map(finish.__getitem__, ids), acts)])
    work = tuple([t * spt for t in step.group_tokens])
    return LearnerPlan(overlap, acts, done, work, float(c.n_devices), float(pm.tp), cold_s,
                       prewarm, pm.update_fixed_s(c.algo, c.minibatches), prewarm_bill_s, size_slack, release_cold_s,
                       warm_spare, step.tokens * after * work_scale, share_go)


def learner_split(c: Cluster) -> tuple[float, float]:
    """(device-seconds per token that stream as groups finish, those that wait for the rollout's end). One
    optimizer step: everything streams (gradients accumulate). verl's mini-batches (learner parity): the
    reference and old-log-prob forwards stream (both use the policy the rollout ran), the training waits: each
    mini-batch trains on the policy the one before left, and verl shuffles the batch into them."""
    total = c.perf.learner_s_per_token(c.algo, c.old_logprob)
    after = c.perf.train_s_per_token(c.algo) if c.minibatches > 1 else 0.0
    return total - after, after


def _jobs(step: StepWork, lengths, prompt_of) -> list[PlanJob]:
    """One job per group; lengths: per group, a float for every sample or a tuple of floats per sample (true,
    predicted >= 1, or drawn in [1, cap]): checked where they were made, so built unchecked (`PlanJob.trusted`)."""
    return PlanJob.trusted_many(step.prompt_ids, step.group_sizes, lengths, list(map(prompt_of, step.groups)))


_TRUE_CACHE: dict[tuple, tuple[StepWork, list[PlanJob]]] = {}
TRUE_CACHE_SIZE = 256
"""Steps x keys `true_jobs` keeps (0.21 MB each at paper-sim's 512 groups of 8, tracemalloc; 54 MB full): every
step of a 100-step case for both keys (the serverful engines' and dedup's), so the policies a process plays one
after another build them once; at 64 a 100-step case cleared the cache before the next policy came back to step
0."""


def true_jobs(step: StepWork, prompt_of, key: str = "") -> list[PlanJob]:
    """The step's jobs with their true per-sequence lengths. With a `key` naming `prompt_of`, built once per step
    and key (every policy replays the same steps; building 100k validated PlanJobs per policy was a third of a
    paper-scale run)."""
    if key:
        hit = _TRUE_CACHE.get((id(step), key))
        if hit is not None and hit[0] is step:
            return hit[1]
    jobs = _jobs(step, [tuple(map(float, g.lengths)) for g in step.groups], prompt_of)
    if key:
        if len(_TRUE_CACHE) >= TRUE_CACHE_SIZE:
            _TRUE_CACHE.clear()
        _TRUE_CACHE[(id(step), key)] = (step, jobs)
    return jobs


_ARRAYS_CACHE: dict[int, tuple[list[PlanJob], JobArrays]] = {}


def true_arrays(jobs: list[PlanJob]) -> JobArrays:
    """`JobArrays.from_jobs(jobs)` of a step's true jobs (`true_jobs`' list), once per list while `true_jobs`
    keeps it: the verl policies of a case (verl, verl-paper and its range, RLHFuse's twin clusters) assign the
    same step's jobs, each on its own cluster. Read only, as `assign` reads it."""
    hit = _ARRAYS_CACHE.get(id(jobs))
    if hit is not None and hit[0] is jobs:
        return hit[1]
    ja = JobArrays.from_jobs(jobs)
    if len(_ARRAYS_CACHE) >= TRUE_CACHE_SIZE:
        _ARRAYS_CACHE.clear()
    _ARRAYS_CACHE[id(jobs)] = (jobs, ja)  # the list itself: its id stays its own while held
    return ja


def prime_true_jobs(pols: list, work: list[StepWork]) -> None:
    """Build the true jobs of every step of `work` for every key the policies read (`true_keys`) into
    `true_jobs`' cache, where it holds them all: before the processes that play the policies fork, so they
    share one copy instead of each building its own (the same records either way)."""
    keys: dict = {}
    for pol in pols:
        keys.update(pol.true_keys())
    if len(work) * len(keys) > TRUE_CACHE_SIZE:
        return
    for key, prompt_of in keys.items():
        for step in work:
            true_jobs(step, prompt_of, key)


def _engine_prompt_of(c: Cluster):
    """Prompt tokens a serverful engine prefills per group: the prompt less the template its engine caches."""
    return lambda g: max(g.prompt_len - c.template_tokens, 0)


class Verl:
    """The serverful colocated baseline (docs/internals.md#simpoliciespy)."""

    def __init__(self, c: Cluster, overlap: bool = False, name: str = ""):
        """overlap: score and train finished groups on finished replicas' devices (`verl-overlap`)."""
        self.c, self.overlap = c, overlap
        self.name = name or ("verl-overlap" if overlap else ("verl-paper" if c.setting == "paper" else "verl"))

    def true_keys(self) -> dict:
        """{key: prompt_of} of the true jobs `decide` reads (`true_jobs`)."""
        return {f"engine{self.c.template_tokens}": _engine_prompt_of(self.c)}

    def decide(self, step: StepWork) -> tuple[StepSchedule, dict]:
        c, pm = self.c, self.c.perf
        jobs = true_jobs(step, _engine_prompt_of(c), f"engine{c.template_tokens}")
        plan, metrics = assign(true_arrays(jobs), c.replicas, c.capacity, c.time_model, "round_robin")
        tmpl, sync = pm.prefill_s(c.template_tokens), pm.weight_sync_s(colocated=True) + c.kv_rebuild_s
        actors = tuple(ActorRun(a, pm.tp, 0.0, sync, 0.0, tmpl, b) for a, b in enumerate(plan.busy_s) if b > 0)
        # colocated: a finished replica's devices already hold the model; no learner cold start
        finish = job_finish_s(plan, jobs, c.time_model) if self.overlap else None
        learner = _learner(c, step, plan.actor_jobs, finish, plan.busy_s, self.overlap, 0.0, True)
        return StepSchedule(True, c.n_devices, actors, None, learner), metrics

    def observe(self, step: StepWork, stages: tuple[float, float, float]) -> None:
        """After the step: its true lengths and (rollout, score, update) seconds; the baseline learns nothing."""


class RLHFuse(Verl):
    """Serverful, round robin, cut-and-migrate on progress, scoring fused into the rollout tail
    (docs/internals.md#simpoliciespy)."""

    name = "rlhfuse"

    def __init__(self, c: Cluster, tau: float):
        super().__init__(c)
        self.name, self.tau = "rlhfuse", tau
        self.mean_len = 256.0

    def decide(self, step: StepWork) -> tuple[StepSchedule, dict]:
        c, pm = self.c, self.c.perf
        prompt_of = _engine_prompt_of(c)
        flat = _jobs(step, [self.mean_len] * len(step.groups), prompt_of)
        plan, _ = assign(flat, c.replicas, c.capacity, c.time_model, "round_robin")
        # busy seconds and metrics only: no move named
        res = play_with_migration(plan, c.time_model, self.tau, true_jobs(step, prompt_of, f"engine{c.template_tokens}"))
        metrics = res.metrics()
        tmpl, sync = pm.prefill_s(c.template_tokens), pm.weight_sync_s(colocated=True)
        actors = tuple(ActorRun(a, pm.tp, 0.0, sync, 0.0, tmpl, b) for a, b in enumerate(res.busy_s) if b > 0)
        freed = sum(metrics[M.BAL_MAKESPAN_S] - b for b in res.busy_s) * pm.tp  # device-seconds idle in the tail
        ref = pm.forward_s(step.tokens, 1)  # the reference forward's device-seconds (PPO's value forward stays)
        fused = min(freed, 0.5 * ref)  # half the reference forward needs the tail's samples
        metrics["rlhfuse/fused_s"] = fused / c.n_devices
        total = step.tokens * pm.learner_s_per_token(c.algo, c.old_logprob)
        learner = _learner(c, step, plan.actor_jobs, {g.prompt_id: 0.0 for g in step.groups}, res.busy_s, False,
                           0.0, True, work_scale=1.0 - fused / total)
        return StepSchedule(True, c.n_devices, actors, None, learner), metrics

    def observe(self, step: StepWork, stages: tuple[float, float, float]) -> None:
        self.mean_len = float(np.mean([x for g in step.groups for x in g.lengths]))


class RLHFless:
    """Serverless functions through the planner, each optimization switchable (docs/internals.md#simpoliciespy)."""

    def __init__(self, c: Cluster, sw: Switches, lam: float, tau: float, prefill_actors: int = 1,
                 name: str = "rlhfless", predictor: PredictorConfig | None = None, max_actors: int = 0,
                 objective: str = "score", deadline_ratio: float = 1.0, wide: Cluster | None = None):
        """max_actors: candidates N go up to this (0 = every replica); with scaling off exactly this many.
        objective, deadline_ratio: the scaler's (`PlanConfig`): "score" weighs time and cost with lam;
        "min_cost_at_deadline" takes the cheapest N whose step is at most deadline_ratio x the serverful plan's.
        wide: the cluster at the wider TP the straggler may run on (with `Switches.wide`; None = no such engine)."""
        self.c, self.sw, self.name = c, sw, name
        pm = c.perf
        self.cfg = PlanConfig(policy="contiguous" if sw.assign else "round_robin", capacity=c.capacity,
                              migrate=sw.migrate, tau=tau, scale=sw.scale, lam=lam, min_actors=1,
                              max_actors=min(max_actors, c.replicas) if max_actors else c.replicas,
                              objective=objective, deadline_ratio=deadline_ratio,
                              gpu_kind=pm.device.price_kind, gpus_per_actor=float(pm.tp),
                              cold_start_s=pm.cold_start_s(), weight_sync_s=pm.weight_sync_s(colocated=False),
                              hybrid_sync_s=self._hybrid_sync_s(), billing=c.billing)
        self.wide = WideActor(wide.time_model, float(wide.perf.tp), wide.capacity, wide.perf.cold_start_s(),
                              wide.perf.weight_sync_s(colocated=False)) if wide is not None and sw.wide else None
        self.predictor = build_predictor(predictor or PredictorConfig(name="ewma"))
        self.prefill_actors = prefill_actors
        self.n_warm = 0  # decode instances pre-warmed for the next step
        self.n_hybrid = 0  # hybrid functions the last step's learner ended with (warm, holding the new weights)
        self.n_kept = 0  # separate decode functions the last step left warm: their keep-alive covered their gap
        self.prefill_kept = self.learner_kept = False  # likewise the prefill function, every learner block
        self.prefill_cold_s = 0.0  # this step's prefill function's cold start on the path (0: pre-warmed or kept)
        self.gaps = (float("inf"), float("inf"))  # idle gap before decode / before scoring, from history
        self.update_s = float("inf")  # the last step's optimizer step: its learner's share to this step's start
        self.freed = 0.0  # separate images: devices the last step's learner ranks freed at their share
        self.share: dict | None = None  # a step's planned jobs, draws and memo, shared with twins (`_planned`)
        self.seen = 0  # steps observed
        self.twin: TwinPredictor | None = None  # the predictor shared with twins (`share_predictor`)

    def _hybrid_sync_s(self) -> float:
        """A hybrid function's switch between its decode engine's layout (TP shards) and its learner block's
        (sharded over the same devices), each way: the in-place reshard the tuned verl pays (each device's TP
        shard over the node link; `PerfModel.weight_sync_s(colocated=True)`, sources in docs/overheads.md)."""
        return self.c.perf.weight_sync_s(colocated=True)

    def _hybrid_join_s(self) -> float:
        """A released decode function going on as a learner block: the in-place reshard plus joining the
        data-parallel learner (`Cluster.hybrid_join_s`). Charged to every released one, also to those that were
        learner blocks last step and may still hold the reference model (an upper bound for those)."""
        return self._hybrid_sync_s() + self.c.hybrid_join_s

    def _prewarm(self, cold_s: float, gap: float) -> float:
        """Seconds billed to have a function warm when needed (pre-warm rule from invocation history): kept
        alive through the expected idle gap when that is shorter than a cold start, else restarted cold_s ahead."""
        return min(cold_s, gap) if self.sw.prewarm else 0.0

    def _prompt_of(self, g) -> int:
        """Prompt tokens a decode actor prefills itself: none with dedup (the prefill function did), else the
        group's prompt less the template its engine caches."""
        return 0 if self.sw.dedup else max(g.prompt_len - self.c.template_tokens, 0)

    def true_keys(self) -> dict:
        """{key: prompt_of} of the true jobs `decide` reads (`true_jobs`)."""
        return {"dedup" if self.sw.dedup else f"engine{self.c.template_tokens}": self._prompt_of}

    def decide(self, step: StepWork) -> tuple[StepSchedule, dict]:
        c, pm, sw = self.c, self.c.perf, self.sw
        key = "dedup" if sw.dedup else f"engine{c.template_tokens}"
        jobs, draws, memo = self._planned(step, key)
        hyb = self.n_hybrid if sw.hybrid else 0
        kept = 0 if sw.hybrid else self.n_kept  # kept warm by their keep-alive (`plan.lifecycle`), no pre-warm
        # a pre-warm before t0 holds devices during the last step's update: only those its learner leaves free
        # (separate images: the devices its ranks freed at their share, `_share_go`)
        room = self._room() if sw.hybrid else self.freed
        pre = (self.n_warm if room == float("inf") else min(self.n_warm, int(room // pm.tp))) if sw.prewarm else 0
        n_warm = max(pre, hyb, kept)  # the hybrid, kept and fresh pre-warmed ones
        bill, left = self._warmth(pm.cold_start_s())
        prefill = None
        if sw.dedup:
            work = self._prefill_s(step, self._unique_tokens(step)) / self.prefill_actors
            # kept: warm, its gap billed last step (`keeps`); pre-warmed: where the budget leaves room for it
            fresh = sw.prewarm and room - pre * pm.tp >= pm.tp * self.prefill_actors and not self.prefill_kept
            warm = fresh or self.prefill_kept
            prefill = FnRun("prefill", pm.tp * self.prefill_actors, left if fresh else (0.0 if warm else
                                                                                         pm.cold_start_s()),
                            work, bill if fresh else 0.0)
            self.prefill_cold_s = prefill.cold_s
        cfg = replace(self.cfg, learner=self._learner_costs(step, prefill), warm_bill_s=bill, hybrid_warm=hyb)
        t_sf = None
        if cfg.objective == "min_cost_at_deadline":  # the serverful step itself is the deadline (`_serverful`)
            t_sf = self._serverful_step_s(step, cfg)
            cfg = replace(cfg, objective="min_cost_under_deadline", deadline_s=cfg.deadline_ratio * t_sf)
        # a pre-warm that cannot reach the step's start (its cold start runs on into it) is a cold actor to the
        # scaler (conservative: it would otherwise plan on a warmth the actor lacks)
        n_plan = n_warm if left <= 0 else max(hyb, kept)
        decision, metrics = choose(jobs, cfg, c.time_model, n_plan, wide=self.wide, draws=draws, memo=memo)
        if t_sf is not None and self._runs_serverful(decision.chosen, t_sf, cfg):
            return self._serverful(step, jobs, cfg, draws, memo, metrics)
        real, busy, finish = self._realized(decision, true_jobs(step, self._prompt_of, key))
        # warm: the plan's predicted busiest, as the scaler assumed (the true busy times are not known ahead)
        actors = self._actors(step, decision.plan.actor_jobs, busy, list(decision.plan.busy_s), n_warm,
                              decision.wide_actor, hyb, kept)
        fresh_used = min(n_warm, len(actors)) - min(hyb + kept, len(actors))  # warm actors neither hybrid nor kept
        # pre-warmed (not hybrid) instances left unused: billed idle; unused hybrid ones stay learner blocks; kept
        # ones unused lapse: billed the rest of their keep-alive (at most the keep-alive: their gap was billed)
        unused_kept = max(kept - len(actors), 0)
        idle = tuple(FnRun("decode", pm.tp, 0.0, 0.0, bill)
                     for _ in range(max(n_warm - hyb - kept - max(fresh_used, 0), 0))) + \
            tuple(FnRun("decode", pm.tp, 0.0, 0.0, c.billing.keep_alive_s) for _ in range(unused_kept))
        lk = self.learner_kept and not sw.hybrid  # kept warm from the last step: no join, nothing more billed
        learner = _learner(c, step, decision.plan.actor_jobs, finish, busy, sw.overlap,
                           0.0 if lk else pm.learner_join_s(), self._learner_prewarms() or lk,
                           prewarm_bill_s=0.0 if lk else self._prewarm(pm.learner_join_s(), self.gaps[1]),
                           size_slack=self._size_slack(),
                           release_cold_s=self._hybrid_join_s() if sw.hybrid else None,
                           warm_spare=max(hyb - len(actors), 0))
        metrics = {k: v for k, v in metrics.items() if not isinstance(v, list)}
        metrics["sim/prewarmed"] = pre
        metrics["sim/realized_makespan_s"] = real.makespan_s
        metrics["sim/hybrid_warm"] = hyb
        plan = StepSchedule(False, 0.0, actors, prefill, learner, idle_warm=idle)
        self.n_hybrid = self._hybrid_after(plan) if sw.hybrid else 0
        self.n_warm = self._warm_pool(jobs, replace(cfg, hybrid_warm=self.n_hybrid), draws, len(actors), memo)
        if not sw.hybrid:
            held = self._learner_devices(plan)
            plan = replace(plan, learner=replace(learner, share_go=self._share_go(cfg.learner, held)))
            self.freed = self._freed_at_share(plan.learner, held)
        return plan, metrics

    def _serverful_step_s(self, step: StepWork, cfg: PlanConfig) -> float:
        """min_cost_at_deadline in the simulator: the serverful step as the serverful system runs it, predicted by
        the same scaler on the same predicted lengths: every replica warm, round robin, the engine prefilling its
        own prompts, weights resharded in place (the plan's functions load them over the NIC), the colocated
        learner with no cold start and no prefill function. The scaler's own reference charges every actor the
        functions' weight load (the runtime's planner calibrates one load for all), so at 70B on paper-sim it
        stood 3.5 s a step above the serverful verl it was meant to be: deadline_ratio 1.0 realised 0.94x."""
        c, pm = self.c, self.c.perf
        if self.sw.oracle:  # the oracle plans on the true lengths, so does its deadline
            jobs = true_jobs(step, _engine_prompt_of(c), f"engine{c.template_tokens}")
        else:
            pred = self._predict(step)
            jobs = _jobs(step, [max(1.0, float(m)) for m in pred.mean], _engine_prompt_of(c))
        mean_prompt = sum(g.prompt_len for g in step.groups) / max(len(step.groups), 1)
        learner = replace(cfg.learner, overlap=False, cold_start_s=0.0, prewarm=False, prewarm_bill_s=None,
                          prefill_s=0.0, prefill_devices=0.0, prompt_tokens=min(c.template_tokens, mean_prompt),
                          release_cold_s=None, size_slack=None)
        ref = replace(cfg, policy="round_robin", objective="score", scale=False, migrate=False, exact_sweep=True,
                      weight_sync_s=pm.weight_sync_s(colocated=True) + c.kv_rebuild_s, hybrid_warm=0,
                      warm_bill_s=0.0, learner=learner)
        d, _ = choose(jobs, ref, c.time_model, c.replicas)
        return d.chosen.step_s

    def _runs_serverful(self, chosen, t_sf: float, cfg: PlanConfig) -> bool:
        """min_cost_at_deadline: run the step serverful when no function plan meets the deadline and serverful is
        the faster (as the scaler takes the fastest plan then), or when it meets the deadline too (ratio >= 1) and
        is predicted cheaper in dollars (held devices at the on-demand price; none listed: never cheaper)."""
        if not chosen.feasible:
            return t_sf <= chosen.step_s
        od = price(self.c.perf.device.price_kind).ondemand_usd_per_h
        usd = self.c.n_devices * t_sf * od / 3600.0 if od else float("inf")
        return t_sf <= cfg.deadline_s * (1 + 1e-9) and usd < chosen.cost_usd

    def _serverful(self, step: StepWork, jobs, cfg: PlanConfig, draws, memo: dict, metrics: dict):
        """The step played serverful (`Verl` on this cluster: held devices, round robin, in-place reshard):
        min_cost_at_deadline's choice when no function plan is predicted to meet the serverful deadline, or none
        that does is predicted cheaper in dollars (the serverful placement is a plan this platform can run, as
        the runtime's scaler offers it; on-demand price of the held devices). The next step's warm pool is sized
        as after any step; no hybrid function is left."""
        plan, m = Verl(self.c).decide(step)
        out = {k: v for k, v in metrics.items() if not isinstance(v, list)}
        out.update(m)
        out.update({"sim/serverful_fallback": 1.0, "sim/hybrid_warm": 0,
                    "sim/realized_makespan_s": max(a.decode_s for a in plan.actors)})
        self.n_hybrid = 0
        self.n_warm = self._warm_pool(jobs, replace(cfg, hybrid_warm=0), draws, len(plan.actors), memo)
        return plan, out

    def _planned(self, step: StepWork, key: str) -> tuple[list[PlanJob], list[list[PlanJob]], dict]:
        """`_planned_jobs` and the step's memo (its plays of each placement on each draw, shared with
        `_warm_pool`). With `share` (`scenario.play_twins`: policies on the same cluster with the same switches,
        played in lock step): where a twin already planned this step from the same prediction, its jobs, draws
        and memo, the same objects (the jobs and draws are built from the prediction, the cluster and the
        switches alone; every memo entry is keyed by the objects and settings it was computed from)."""
        pred = None if self.sw.oracle else self._predict(step)
        if self.share is None:
            return *self._planned_jobs(step, key, pred), {}
        mine = (key, self.sw, None if pred is None else (pred.prompt_ids, pred.mean, dict(pred.quantiles)))
        hit = self.share.get("step")
        if hit is not None and hit[0] is step and hit[1] is self.c and hit[2] == mine:
            return hit[3], hit[4], hit[5]
        jobs, draws = self._planned_jobs(step, key, pred)
        memo: dict = {}
        self.share["step"] = (step, self.c, mine, jobs, draws, memo)
        return jobs, draws, memo

    def _planned_jobs(self, step: StepWork, key: str, pred=None) -> tuple[list[PlanJob], list[list[PlanJob]]]:
        """The jobs the scaler plans with (the predicted means; the true lengths for the oracle) and the drawn
        outcomes it averages over (none for the oracle or without `Switches.draws`); `pred`: the predictor's
        prediction of the step, when already made."""
        if self.sw.oracle:
            return true_jobs(step, self._prompt_of, key), []
        if pred is None:
            pred = self._predict(step)
        jobs = _jobs(step, [max(1.0, float(m)) for m in pred.mean], self._prompt_of)
        if not self.sw.draws:
            return jobs, []
        rng = np.random.default_rng([step.epoch, step.step])  # by the step: every policy and rerun draws alike
        sizes = [len(g.lengths) for g in step.groups]
        return jobs, [_jobs(step, d, self._prompt_of)
                      for d in draw_lengths(pred, sizes, N_DRAWS, rng, self.c.max_response)]

    def _realized(self, decision: ScalingDecision, true: list[PlanJob]) -> tuple[AssignmentPlan | MigrationResult,
                                                                                list[float], dict[str, float] | None]:
        """The decision played with the true lengths: (realised plan, each actor's busy seconds, each group's
        finish on its actor, None without overlap), the straggler's on the wide engine when it runs there."""
        real = realized_plan(decision, true, self.c.time_model, self.cfg.tau)
        busy = list(real.busy_s)
        # without overlap the learner reads no group's finish (`_learner`)
        finish = job_finish_s(decision.plan, true, self.c.time_model) if self.sw.overlap else None
        if decision.wide_actor >= 0:
            by_id = {j.group_id: j for j in true}
            mine = [by_id[j.group_id] for j in decision.plan.actor_jobs[decision.wide_actor]]
            busy[decision.wide_actor], fin = on_wide(mine, self.wide)
            if finish is not None:
                finish.update({j.group_id: float(f) for j, f in zip(mine, fin.tolist())})
        return real, busy, finish

    def _hybrid_after(self, plan: StepSchedule) -> int:
        """Hybrid functions the step's learner ends with: each joined block holds its devices (and, after the
        optimizer step, the new weights) to the step's end; a block of k replicas' devices is k decode actors of
        the next step (the simulator plays the plan as decided, so its learner schedule is this one)."""
        pre = plan.prefill.cold_s + plan.prefill.work_s if plan.prefill is not None else 0.0
        _, blocks, joined = learner_schedule(plan, pre)
        tp = float(self.c.perf.tp)
        return int(sum(np.floor(blocks.devices[joined] / tp + 1e-9)))

    def _warm_pool(self, jobs, cfg: PlanConfig, draws, n_used: int, memo: dict) -> int:
        """Decode instances to pre-warm for the next step: with scaling, the N the scaler picks for this step's
        work when every candidate's actors are warm (a pool sized to the plan, not to the last step's choice,
        so growing N does not put a cold start on the critical path; the next step's work is alike), else the
        instances this step used."""
        if not (self.sw.prewarm and self.sw.scale):
            return n_used
        ahead, _ = choose(jobs, replace(cfg, migrate=False), self.c.time_model, None, draws=draws, memo=memo)
        return ahead.plan.active_actors

    def _learner_costs(self, step: StepWork, prefill: FnRun | None) -> LearnerCosts:
        """What the scaler adds to decode to score the whole step: this cluster's learner (perf model), the
        prefill function, and the prompt tokens the jobs do not carry (all of them with dedup, else the
        template the engines cache)."""
        c, pm, sw = self.c, self.c.perf, self.sw
        mean_prompt = sum(g.prompt_len for g in step.groups) / max(len(step.groups), 1)
        stream, after = learner_split(c)
        return LearnerCosts(whole_step=True, overlap=sw.overlap, devices=float(c.n_devices), s_per_token=stream,
                            after_s_per_token=after, update_fixed_s=pm.update_fixed_s(c.algo, c.minibatches),
                            cold_start_s=pm.learner_join_s(),
                            prewarm=self._learner_prewarms(),
                            prewarm_bill_s=self._prewarm(pm.learner_join_s(), self.gaps[1]) if sw.prewarm else None,
                            prompt_tokens=mean_prompt if sw.dedup else min(c.template_tokens, mean_prompt),
                            prefill_s=prefill.cold_s + prefill.work_s if prefill else 0.0,
                            prefill_devices=prefill.devices if prefill else 0.0, size_slack=self._size_slack(),
                            release_cold_s=self._hybrid_join_s() if sw.hybrid else None,
                            **({} if sw.hybrid else self._share_rule()))

    def _share_rule(self) -> dict:
        """Separate images: the share release's terms (`LearnerCosts.rank_devices`, `share_go`, `share_wait`),
        which the scaler prices and `_share_go` then decides on with the same `plan.lifecycle.share_release`:
        `plan.lifecycle.let_go` on the next learner work after the share (this update's optimizer step + the next
        rollout, from history; unknown before any step), the learner's cold start and the keep-alive; and the next
        step's decode pre-warm waiting for devices (`_warm_pool` never sizes an empty pool)."""
        pm, c = self.c.perf, self.c
        nxt = self.update_s + self.gaps[1] if np.isfinite(self.update_s) else None
        return {"rank_devices": float(pm.tp), "share_go": lifecycle.let_go(nxt, pm.learner_join_s(),
                                                                           c.billing.keep_alive_s),
                "share_wait": self.sw.prewarm}

    def _size_slack(self) -> float | None:
        return SIZE_SLACK if self.sw.overlap and self.sw.size_learner else None

    def _prefill_s(self, step: StepWork, tokens: float) -> float:
        """Prefill of `tokens` prompt tokens batched together; each attends within its own prompt only."""
        mean = sum(step.prompt_lens) / max(len(step.groups), 1)
        return self.c.perf.prefill_s(tokens, context=mean / 2)

    def _unique_tokens(self, step: StepWork) -> int:
        t = self.c.template_tokens
        return t + sum([p - t if p > t else 0 for p in step.prompt_lens])

    def _actors(self, step: StepWork, actor_jobs, busy: list[float], predicted: list[float], n_warm: int,
                wide_actor: int = -1, n_hybrid: int = 0, n_kept: int = 0) -> tuple[ActorRun, ...]:
        """One ActorRun per active actor; the n_warm busiest by the plan's `predicted` busy seconds (narrow TP:
        what is known when they start) warm, as the scaler assumed; the n_hybrid busiest of those hybrid functions
        from the last step's learner (the in-place reshard, billed from t0); `wide_actor` on the wide engine (its
        devices, cold start and weight sync; `busy` holds its time there)."""
        c, pm, sw = self.c, self.c.perf, self.sw
        plen = dict(zip(step.prompt_ids, step.prompt_lens))
        active = [a for a, jobs in enumerate(actor_jobs) if jobs]
        by_busy = sorted(active, key=lambda a: (-predicted[a], a))[:n_warm]
        warm, hybrid = set(by_busy), set(by_busy[:min(n_hybrid, n_warm)])
        kept = set(by_busy[:min(n_kept, n_warm)]) - hybrid  # warm by keep-alive: their gap was billed last step
        cold_s, sync = pm.cold_start_s(), pm.weight_sync_s(colocated=False)
        warm_bill, left = self._warmth(cold_s)
        unique = max(self._unique_tokens(step), 1)
        per_tok = self._prefill_s(step, unique) / unique
        t_prefill = self.prefill_cold_s if sw.dedup else 0.0
        out = []
        for a in sorted(active, key=lambda a: -predicted[a]):  # the prefill function serves the busiest first
            toks = sum([plen[j.group_id] for j in actor_jobs[a]])
            kv_ready = 0.0
            if sw.dedup:
                t_prefill += per_tok * toks / self.prefill_actors
                kv_ready = t_prefill + toks * pm.kv_transfer_s_per_token()
            tmpl = 0.0 if sw.dedup else pm.prefill_s(c.template_tokens)
            is_warm = a in warm
            if a == wide_actor:
                w = self.wide
                # a new function of twice the TP (weights over the network), not a learner block: a warm one is
                # pre-warmed, even in a hybrid function's place (that block is released at t0)
                # separate images: pre-warmed into the devices the last learner freed only where they hold it
                is_warm = is_warm and (sw.hybrid or self.freed >= (n_warm + 1) * pm.tp)
                bill, w_left = self._warmth(w.cold_start_s) if is_warm else (0.0, w.cold_start_s)
                out.append(ActorRun(a, w.gpus, w_left, w.weight_sync_s, kv_ready, tmpl, busy[a], bill))
                continue
            if a in hybrid:  # held by the last step's learner up to t0, the new weights already on its devices
                out.append(ActorRun(a, pm.tp, 0.0, self._hybrid_sync_s(), kv_ready, tmpl, busy[a], 0.0))
                continue
            fresh = is_warm and a not in kept  # pre-warmed (its cold start may run on past t0: `_warmth`)
            out.append(ActorRun(a, pm.tp, left if fresh else (0.0 if is_warm else cold_s), sync, kv_ready, tmpl,
                                busy[a], warm_bill if fresh else 0.0))
        return tuple(sorted(out, key=lambda r: r.instance))

    def _learner_prewarms(self) -> bool:
        """Whether the learner is pre-warmed to be ready at the rollout's end: with overlap its blocks start on
        devices decode functions have freed; without, it is one block of every device, and the devices of the
        last decode function to end free only then (a pre-warm before would hold more devices than exist), so
        its cold start is on the path."""
        return self.sw.prewarm and (self.sw.overlap or self.sw.hybrid)

    def _warmth(self, cold_s: float) -> tuple[float, float]:
        """(seconds billed before t0, cold-start seconds left after t0) of a function pre-warmed for this step.
        Hybrid: the pre-warm rule from history (`_prewarm`), ready at t0. Separate images: started into the
        devices the last step's learner ranks freed at their share (`_share_go`), no earlier (before it the
        learner held every device), at the lifecycle's time (`plan.lifecycle.prewarm_start_s`: the predicted end
        of the update, the last one's optimizer step after the share, less the cold start; floored at the share);
        a cold start longer than that window runs on past t0, on the critical path."""
        if not self.sw.prewarm:
            return 0.0, 0.0
        if self.sw.hybrid:
            return self._prewarm(cold_s, self.gaps[0]), 0.0
        if not np.isfinite(self.update_s):  # no step before: nothing freed, nothing pre-warmed (`freed` is 0)
            return 0.0, cold_s
        start = lifecycle.prewarm_start_s(self.update_s, cold_s, 0.0)  # seconds after the share
        lead = min(max(0.0, self.update_s - start), self.update_s)
        left = cold_s - lead
        return lead, left if left > 1e-9 else 0.0  # a cold start that fits the window: none left (float residue)

    def _share_go(self, lc: LearnerCosts, learner_devices: float) -> bool:
        """Separate images: whether the step's learner ranks but the reducer are let go at their share, the
        runtime's rule (`runtime.streaming.LearnerStream._shared`), on the terms the scaler priced (`lc`, from
        `_share_rule`): `plan.lifecycle.share_release` with the devices the learner's ranks hold
        (`learner_devices`)."""
        return lifecycle.share_release(lc.share_go, lc.share_wait, self.c.n_devices, learner_devices,
                                       lc.rank_devices)

    def _learner_devices(self, plan: StepSchedule) -> float:
        """Devices the step's learner ranks hold at their share: every joined block's (every device without
        overlap)."""
        if not plan.learner.overlap:
            return float(self.c.n_devices)
        pre = plan.prefill.cold_s + plan.prefill.work_s if plan.prefill is not None else 0.0
        _, blocks, joined = learner_schedule(plan, pre)
        return float(blocks.devices[joined].sum())

    def _freed_at_share(self, lp: LearnerPlan, learner_devices: float) -> float:
        """Devices free from the step's share to its end (`plan.lifecycle.free_devices`): all but the reducer's
        when the ranks go at their share, else all but the learner's."""
        held = min(learner_devices, lp.block_devices) if lp.share_go else learner_devices
        return lifecycle.free_devices(self.c.n_devices, held)

    def _room(self) -> float:
        """Devices free through the last step's update for a function kept warm from its rollout into this step:
        none with separate images, whose learner works on every device (`plan.lifecycle.free_devices`; never
        more devices held than exist; a pre-warm may take the devices its ranks free at their share instead:
        `freed`); the hybrid design's warm functions are the learner's own blocks."""
        c = self.c
        return float("inf") if self.sw.hybrid else lifecycle.free_devices(c.n_devices, float(c.n_devices))

    def keeps(self, gaps: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
        """After the step is played: each function's idle seconds to its next work ((kind, instance) -> gap:
        `scenario.kept_gaps`). Separate images (not hybrid): those whose keep-alive covers the gap stay warm into
        the next step when holding bills less than the cold start it saves (`plan.lifecycle.hold_pays`: no cold start there) and are billed the gap, not a fresh
        keep-alive; returns them for the bill, and remembers what the next step finds warm (decode functions by
        count; the prefill function; the learner when every block of it is kept)."""
        rules, pm = self.c.billing, self.c.perf
        cold = {"decode": pm.cold_start_s(), "prefill": pm.cold_start_s(), "learner": pm.learner_join_s()}
        if self.sw.hybrid or rules.billed != "lifetime":
            return {}
        pays = {k: g for k, g in gaps.items() if lifecycle.hold_pays(g, cold.get(k[0], 0.0), rules.keep_alive_s)}
        # held through the gap, a function holds its devices there: a decode or prefill function over the update,
        # which holds every device here, a learner block over the next rollout; only within the device budget
        room = self._room() / self.c.perf.tp  # hybrid (inf) returned above
        kept = {}
        for k in sorted(pays, key=lambda k: pays[k]):
            if k[0] != "learner" and len(kept) + 1 <= room:
                kept[k] = pays[k]
        self.n_kept = sum(1 for k in kept if k[0] == "decode")
        self.prefill_kept = any(k[0] == "prefill" for k in kept)
        learner = [k for k in gaps if k[0] == "learner"]
        self.learner_kept = bool(learner) and all(k in kept for k in learner)
        # the others are let go at once (`plan.lifecycle.release_now`): held, they would bill idle that buys
        # nothing (past the keep-alive), or more than the cold start it saves; a gap of 0 bills no idle
        return {k: kept.get(k, 0.0) for k in gaps}

    def observe(self, step: StepWork, stages: tuple[float, float, float]) -> None:
        """Feed the true lengths to the predictor; remember the idle gaps the pre-warm rule expects next step."""
        rollout, score, update = stages
        self.gaps = (score + update, rollout)
        self.update_s = update
        seen, self.seen = self.seen, self.seen + 1
        if self.sw.oracle:  # the oracle plans on the true lengths: it never reads its predictor
            return
        if self.twin is not None:
            self.twin.learn(step, seen)
            return
        self.predictor.update(observations(step))

    def _predict(self, step: StepWork) -> Prediction:
        """The predictor's prediction of the step's prompts (the twins' one, `TwinPredictor`, when shared)."""
        if self.twin is not None:
            return self.twin.predict(step, self.seen)
        return self.predictor.predict([g.prompt_id for g in step.groups], [""] * len(step.groups))


def observations(step: StepWork) -> list[Observation]:
    """What a predictor learns from a step: each group's true lengths."""
    return [Observation(g.prompt_id, "", tuple(g.lengths), step.epoch, step.step) for g in step.groups]


class TwinPredictor:
    """One predictor for RLHFless twins (`scenario.play_twins`) whose predictors are equal in kind and settings and
    have observed nothing yet (`share_predictor`). Every policy observes each step's true lengths, whatever it
    decided, so such twins' predictors would hold the same state at every step: this one learns each step once
    (the first twin to observe it) and predicts each step once (the first twin to decide it, before any twin
    learnt it), and hands that prediction to the others. The twins take turns step by step (the second decides
    step k after the first observed it), so the prediction is kept by the steps seen before it; a twin asking
    from any other point is a bug, refused."""

    def __init__(self, predictor):
        self.predictor = predictor
        self.learned = 0  # steps learned
        self.pred: tuple[int, Prediction] | None = None  # (steps learned before it, the prediction)

    def predict(self, step: StepWork, seen: int) -> Prediction:
        """The prediction of `step` for a twin that has observed `seen` steps."""
        if self.pred is not None and self.pred[0] == seen:
            return self.pred[1]
        if seen != self.learned:
            raise RuntimeError(f"TwinPredictor: a twin at step {seen} asks a predictor that learnt {self.learned}")
        self.pred = (seen, self.predictor.predict([g.prompt_id for g in step.groups], [""] * len(step.groups)))
        return self.pred[1]

    def learn(self, step: StepWork, seen: int) -> None:
        """Learn `step` once: from the first twin to observe it (`seen` steps observed before it)."""
        if seen == self.learned:
            self.predictor.update(observations(step))
            self.learned += 1


def share_predictor(pols: list) -> list:
    """Give RLHFless twins played in lock step (`scenario.play_twins`) one `TwinPredictor` where their predictors
    are equal in kind and settings and none has observed a step; returns the policies given one (the first's
    predictor is the one they share)."""
    def kind(p):
        return type(p.predictor), getattr(p.predictor, "cfg", None)

    fresh = [p for p in pols if isinstance(p, RLHFless) and not p.sw.oracle and p.seen == 0 and p.twin is None
             and kind(p)[1] is not None]
    shared = []
    for p in fresh:
        lead = next(q for q in fresh if kind(q) == kind(p))
        if lead is not p:
            if lead.twin is None:
                lead.twin = TwinPredictor(lead.predictor)
                shared.append(lead)
            p.twin = lead.twin
            shared.append(p)
    return shared
