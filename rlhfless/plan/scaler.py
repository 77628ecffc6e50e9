"""Cost-aware actor scaling: how many decode actors to start this step, and whether to cut and migrate.

`choose(jobs, cfg, time_model, n_warm)` prices every candidate N in min_actors..max_actors (assignment, per-actor
busy seconds from the fast sweep or a simulation, cold starts and weight syncs, billed cost under cfg.billing),
scores each and returns a `ScalingDecision`; the chosen N's plan is always simulated exactly. The rule it keeps:
T(N) and C(N) come from the same time model and billing rules the runtime's meter and the simulator read.
Objectives, warm and hybrid instances, outcome draws, whole-step scoring, cut-and-migrate and the wide actor are
described in docs/internals.md#planscalerpy.

Deviations from the paper:
1. Time and cost are normalised by the best candidate (the paper says only "normalised, weight lambda").
2. The constrained objectives (deadline, budget, cost at a deadline) are ours.
3. Cuts are kept only where the same score prefers them (the paper always cuts at tau).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace

import numpy as np

from rlhfless.core import metrics as M
import rlhfless.plan.sweep as sw
from rlhfless.plan.balancer import JobArrays, validate_jobs, assign, build_plan, evaluate_plan, labels_finish_s
from rlhfless.plan.config import PlanConfig
from rlhfless.plan.cost import billed_seconds_array, price, step_cost
from rlhfless.plan.migrate import PlanArrays, Played, kernel, play_with_migration, simulate_with_migration
from rlhfless.plan.overlap import LearnerCosts, job_learner_tokens, sequential_tails, whole_step_tail
from rlhfless.plan.records import (
    AssignmentPlan,
    Invocation,
    MigrationResult,
    PlanJob,
    ScalingCandidate,
    ScalingDecision,
)
from rlhfless.plan.timemodel import TimeModel
from rlhfless.plan.wide import WideActor, on_wide, straggler


def _hybrid_count(cfg: PlanConfig, n_warm: int | None) -> int:
    """Hybrid functions among the warm pool (cfg.hybrid_warm, at most the pool)."""
    return cfg.hybrid_warm if n_warm is None else min(cfg.hybrid_warm, max(n_warm, 0))


def decode_invocations(plan: AssignmentPlan, busy_s: Sequence[float], n_warm: int | None,
                       cfg: PlanConfig, warm_by: Sequence[float] | None = None) -> list[Invocation]:
    """Predicted decode invocations of a plan: one per active actor, the busiest n_warm of them (by `warm_by`,
    default busy_s) warm (None: every one, a pool pre-warmed to this plan's size); a warm one is billed from
    cfg.warm_bill_s before the step (kept alive through the idle gap, or restarted ahead of it), and so is each
    of the n_warm instances the plan leaves unused (ids from n_actors on: released at the step's start). The
    busiest cfg.hybrid_warm of the warm ones are hybrid functions from the last step's learner: hybrid_sync_s
    instead of weight_sync_s, billed from the step's start; unused hybrid ones stay learner ranks (`_tail`)."""
    active = [a for a, jobs in enumerate(plan.actor_jobs) if jobs]
    rank_by = busy_s if warm_by is None else warm_by
    by_busy = sorted(active, key=lambda a: (-rank_by[a], a))
    warm = by_busy if n_warm is None else by_busy[:max(n_warm, 0)]
    h = _hybrid_count(cfg, n_warm)
    hybrid, warm = set(warm[:h]), set(warm)
    fresh_used = len(warm) - len(hybrid)
    unused = 0 if n_warm is None or cfg.warm_bill_s <= 0 else max(n_warm - h - fresh_used, 0)
    kv = cfg.learner.prefill_s if cfg.learner.whole_step else 0.0  # KV from the prefill function
    invs = []
    for a in active:
        cold = a not in warm
        cold_s = cfg.cold_start_s if cold else 0.0
        sync = cfg.hybrid_sync_s if a in hybrid else cfg.weight_sync_s
        start = 0.0 if cold or a in hybrid else -cfg.warm_bill_s
        invs.append(Invocation("decode", a, start, max(cold_s + sync, kv) + busy_s[a], cold, cfg.gpus_per_actor,
                               cold_s))
    return invs + [Invocation("decode", plan.n_actors + k, -cfg.warm_bill_s, 0.0, False, cfg.gpus_per_actor)
                   for k in range(unused)]


def _budget(cfg: PlanConfig) -> float:
    return cfg.learner.devices or cfg.max_actors * cfg.gpus_per_actor


def _tail(ja: JobArrays, labels: np.ndarray, rank: np.ndarray, n: int, dur: np.ndarray, head: np.ndarray,
          cfg: PlanConfig, tm: TimeModel, wide: tuple[WideActor, int] | None = None,
          own: np.ndarray | None = None, n_warm: int | None = 0) -> tuple[float, list[Invocation]]:
    """Whole-step seconds and the learner's + prefill's invocations of one labelling; dur, head: (n,) each
    actor's duration and the seconds before its decode began (0 duration: inactive); own: (J,) each job's
    finish on its actor when already simulated (`labels_finish_s`), else simulated here. A group that finishes
    past its actor's busy time was cut and migrated: it arrives at the end of the rollout (its new actor is not
    tracked), the rule the simulator applies (`rlhfless.sim.policies._learner`). Hybrid functions of the warm
    pool (cfg.hybrid_warm) beyond the active actors stay learner blocks (warm spare, `learner_blocks`)."""
    lc = cfg.learner
    tokens = job_learner_tokens(ja.sizes.astype(float), ja.prompt_len, ja.work, lc)
    warm_spare = max(_hybrid_count(cfg, n_warm) - int((dur > 0).sum()), 0)
    after_ds = float(tokens.sum()) * lc.after_s_per_token
    if not lc.overlap:  # every group's work waits for the rollout's end: no job's finish is read
        return whole_step_tail(dur[dur > 0], np.zeros(len(tokens)), tokens * lc.s_per_token, cfg.gpus_per_actor,
                               _budget(cfg), lc, cfg.gpus_per_actor, warm_spare, after_ds)
    busy = np.where(dur > 0, dur - head, 0.0)
    own = labels_finish_s(ja, labels, rank, n, cfg.capacity, tm) if own is None else own.copy()
    gpus = np.full(n, cfg.gpus_per_actor)
    if wide is not None:  # the wide actor's groups finish on its own engine (admission by rank, as built)
        w, a = wide
        idx = np.flatnonzero(labels == a)
        idx = idx[np.argsort(rank[idx], kind="stable")]
        own[idx] = on_wide([ja.jobs[i] for i in idx.tolist()], w)[1]
        gpus[a] = w.gpus
    own = np.where(own <= busy[labels] + 1e-9, own, busy.max(initial=0.0))
    fin = own + head[labels]
    return whole_step_tail(dur[dur > 0], fin, tokens * lc.s_per_token, gpus[dur > 0], _budget(cfg), lc,
                           cfg.gpus_per_actor, warm_spare, after_ds)


def _memo_tail(ja: JobArrays, labels: np.ndarray, rank: np.ndarray, n: int, dur: np.ndarray, head: np.ndarray,
               cfg: PlanConfig, tm: TimeModel, wide: tuple[WideActor, int] | None, own: np.ndarray | None,
               n_warm: int | None, memo: dict | None) -> tuple[float, list[Invocation]]:
    """`_tail`, once per distinct input in `memo`: a step's decision and its warm pool cost every (candidate,
    draw) with their own warm instances, and where those leave every actor's duration and the warm spare alike
    (4 in 10 of extended's tails) the tail is the same; read only (callers concatenate the invocations)."""
    if memo is None:
        return _tail(ja, labels, rank, n, dur, head, cfg, tm, wide, own, n_warm)
    warm_spare = max(_hybrid_count(cfg, n_warm) - int((dur > 0).sum()), 0)  # all _tail reads of n_warm
    key = ("tail", id(ja), id(tm), _learner_key(cfg.learner, memo), id(wide[0]) if wide else None,
           wide[1] if wide else None, n, cfg.capacity, cfg.gpus_per_actor, _budget(cfg), warm_spare,
           labels.tobytes(), rank.tobytes(), dur.tobytes(), head.tobytes(), None if own is None else own.tobytes())
    hit = memo.get(key)
    objs = (ja, tm, wide[0] if wide else None)
    if hit is not None and all(a is b for a, b in zip(hit[0], objs)):  # the objects themselves: ids stay theirs
        return hit[1]
    out = _tail(ja, labels, rank, n, dur, head, cfg, tm, wide, own, n_warm)
    memo[key] = (objs, out)
    return out


def _learner_key(lc: LearnerCosts, memo: dict) -> tuple:
    """The learner's costs by value (each field's repr: -0.0 and 0.0 apart, every float exact), once per object
    in `memo`: twins (`sim.scenario.play_twins`) build equal costs as objects of their own."""
    hit = memo.get(("learner", id(lc)))
    if hit is not None and hit[0] is lc:
        return hit[1]
    key = tuple(repr(getattr(lc, f.name)) for f in fields(lc))
    memo[("learner", id(lc))] = (lc, key)  # the object itself: its id stays its own while the memo holds it
    return key


def _costed(plan: AssignmentPlan, busy_s: Sequence[float], migrations: int, cfg: PlanConfig,
            n_warm: int | None, tm: TimeModel, wide: tuple[WideActor, int] | None = None,
            played: tuple[JobArrays, np.ndarray] | None = None, memo: dict | None = None) -> ScalingCandidate:
    """T and C of a plan whose actors are busy `busy_s` (score filled in later by `choose`); `wide`: (engine,
    actor) when that actor runs on the wide engine (busy_s already its wide busy time); `played`: (jobs in the
    plan's order with an outcome's lengths, each job's finish on its actor) from `_play` (None = the plan's own
    predictions, simulated here). The warm
    actors are the plan's predicted busiest either way (what a runtime knows when it starts them). `memo`: tails
    already costed (`_memo_tail`)."""
    invs = decode_invocations(plan, busy_s, n_warm, cfg, warm_by=plan.busy_s)
    if wide is not None:
        w, a = wide
        kv = cfg.learner.prefill_s if cfg.learner.whole_step else 0.0
        # the wide engine is a new function (weights over the network), never a learner block: warm = pre-warmed
        cold_s = [w.cold_start_s if i.cold else 0.0 for i in invs]
        invs = [i if i.actor_id != a else
                Invocation("decode", a, 0.0 if i.cold else -cfg.warm_bill_s, max(c + w.weight_sync_s, kv) + busy_s[a],
                           i.cold, w.gpus, c) for i, c in zip(invs, cold_s)]
    step = max((i.end_s for i in invs), default=0.0)
    if cfg.learner.whole_step:
        dur = np.zeros(plan.n_actors)
        for i in invs:
            if i.actor_id < plan.n_actors:  # not an unused pre-warmed instance
                dur[i.actor_id] = i.end_s
        head = dur - np.asarray(busy_s, float)
        labels = _plan_labels(plan)
        ja, own = played if played is not None else (JobArrays.from_jobs([j for js in plan.actor_jobs for j in js]),
                                                     None)
        step, tail = _memo_tail(ja, labels, np.arange(len(labels)), plan.n_actors, dur, head, cfg, tm, wide, own,
                                n_warm, memo)
        invs = invs + tail
    cost = step_cost(invs, price(cfg.gpu_kind), cfg.billing)
    return ScalingCandidate(plan.n_actors, plan.active_actors, step, cost.gpu_seconds, cost.usd, float("nan"), True,
                            migrations)


def _plan_labels(plan: AssignmentPlan) -> np.ndarray:
    """(J,) the actor of each job, in the plan's order (actor by actor, admission order within)."""
    return np.repeat(np.arange(plan.n_actors), [len(js) for js in plan.actor_jobs])


def _outcome_arrays(outcome: Sequence[PlanJob],
                    memo: dict | None) -> tuple[JobArrays, dict[str, int], np.ndarray]:
    """An outcome's jobs as arrays, each group's position (the last job of a group id, as a dict by id keeps)
    and its sequences in ascending order of length (`labels_finish_s`' by_length), once per outcome in `memo`
    (every candidate plays the same outcomes)."""
    key = ("outcome", id(outcome))
    hit = memo.get(key) if memo is not None else None
    if hit is not None and hit[0] is outcome:
        return hit[1:]
    ja, index = JobArrays.from_jobs(outcome), {j.group_id: i for i, j in enumerate(outcome)}
    by_length = np.argsort(ja.seq_len, kind="stable")
    if memo is not None:
        memo[key] = (outcome, ja, index, by_length)  # the outcome itself: its id stays its own while held
    return ja, index, by_length


def _play(plan: AssignmentPlan, outcome: Sequence[PlanJob], tm: TimeModel,
          memo: dict | None = None) -> tuple[list[float], JobArrays, np.ndarray]:
    """The plan's placement and admission order played with an outcome's lengths (matched by group_id), once:
    (each actor's busy seconds, the jobs in the plan's order with those lengths, (J,) each job's finish on its
    actor). Busy = its last job's finish (`labels_finish_s` charges the fixed overhead and prefill first, as
    `build_plan`), 0 for an idle actor. `memo`: the outcome's arrays, shared with the other candidates."""
    base, index, base_by_length = _outcome_arrays(outcome, memo)
    ja, src = base.take_seqs([index[j.group_id] for js in plan.actor_jobs for j in js])
    at = np.full(len(base.seq_len), -1, dtype=np.intp)  # base position -> this play's position (-1: not played)
    at[src] = np.arange(len(src))
    by_length = at[base_by_length]
    labels = _plan_labels(plan)
    whole = len(src) == len(base.seq_len) and int(at.min(initial=0)) >= 0  # every sequence played once
    own = labels_finish_s(ja, labels, np.arange(len(labels)), plan.n_actors, plan.capacity, tm,
                          by_length=by_length if whole else None)
    busy = np.zeros(plan.n_actors)
    np.maximum.at(busy, labels, own)
    return busy.tolist(), ja, own


def _placement(plan: AssignmentPlan, memo: dict | None) -> tuple:
    """The plan's placement (each actor's groups in admission order: the same order split differently plays
    differently) and capacity, the key of its plays; once per plan object in `memo` (a step's decision and its
    warm pool cost the same plans)."""
    hit = memo.get(("placed", id(plan))) if memo is not None else None
    if hit is not None and hit[0] is plan:
        return hit[1]
    placed = (tuple(tuple([j.group_id for j in js]) for js in plan.actor_jobs), plan.capacity)
    if memo is not None:
        memo[("placed", id(plan))] = (plan, placed)  # the plan itself: its id stays its own while the memo holds it
    return placed


def _row(plan: AssignmentPlan, cfg: PlanConfig, tm: TimeModel, n_warm: int | None,
         draws: Sequence[Sequence[PlanJob]], cuts: Played | None = None, wide: WideActor | None = None,
         memo: dict | None = None) -> ScalingCandidate:
    """T and C of a plan (with its cuts at tau when `cuts`, the predicted cut simulation; its straggler on the
    wide engine when `wide`). With `draws` (outcomes of the step's lengths drawn from the prediction): the means
    over the draws of T and C, each draw played with the plan's placement and admission order, cuts decided on
    the predictions (module header); without: the plan played with its own predicted lengths. `memo`: plays
    already simulated (by draw and placement), shared between calls that differ only in warm instances."""
    a = straggler(plan, plan.busy_s) if wide is not None else -1
    on = (wide, a) if wide is not None else None
    if not draws:
        busy = list(cuts.busy_s if cuts is not None else plan.busy_s)
        if wide is not None:
            busy[a] = on_wide(plan.actor_jobs[a], wide)[0]
        return _costed(plan, busy, cuts.n_moves if cuts is not None else 0, cfg, n_warm, tm, on,
                       (_plan_jobs(plan, memo), None) if cfg.learner.whole_step else None)
    rows = []
    placed = _placement(plan, memo)
    for d in draws:
        key = (id(d), placed) if memo is not None else None
        if key is not None and key in memo:
            busy, ja, own = memo[key]
            busy = list(busy)
        else:
            busy, ja, own = _play(plan, d, tm, memo)
            if key is not None:
                memo[key] = (tuple(busy), ja, own)
        moves = 0
        if cuts is not None:
            res = _memo_cuts(plan, tm, cfg.tau, d, memo, ja.seq_len)  # busy seconds and the count: no move named
            busy, moves = list(res.busy_s), res.n_moves
        elif wide is not None:
            first = sum(len(js) for js in plan.actor_jobs[:a])  # the straggler's jobs with this outcome's lengths
            busy[a] = on_wide(ja.jobs[first:first + len(plan.actor_jobs[a])], wide)[0]
        rows.append(_costed(plan, busy, moves, cfg, n_warm, tm, on, (ja, own), memo))
    return ScalingCandidate(plan.n_actors, plan.active_actors, _mean([r.step_s for r in rows]),
                            _mean([r.gpu_seconds for r in rows]), _mean([r.cost_usd for r in rows]),
                            float("nan"), True, int(round(_mean([float(r.migrations) for r in rows]))))


def _mean(xs: list[float]) -> float:
    """`float(np.mean(xs))` of a few floats (a row's draws) in Python, the same float: numpy's sum of fewer than
    8 values adds them in order onto 0.0 (its pairwise blocks start at 8), then divides by the count
    (test_plan_scaler holds it equal bit for bit, signed zeros and infinities included)."""
    if not 0 < len(xs) < 8:
        return float(np.mean(xs))
    total = 0.0
    for x in xs:
        total += x
    return total / len(xs)


def with_cuts(plan: AssignmentPlan, cfg: PlanConfig, tm: TimeModel, n_warm: int | None,
              draws: Sequence[Sequence[PlanJob]] = (), memo: dict | None = None) -> tuple[ScalingCandidate, Played]:
    """The plan with cut-and-migrate at cfg.tau: its candidate row (T, C, migrations; over `draws` when given)
    and the cuts simulated on the predictions (what a runtime decides with; `Played.named()` for the moves);
    `memo` as in `_row`."""
    res = _memo_cuts(plan, tm, cfg.tau, None, memo)
    return _row(plan, cfg, tm, n_warm, draws, cuts=res, memo=memo), res


def _memo_cuts(plan: AssignmentPlan, tm: TimeModel, tau: float, outcome: Sequence[PlanJob] | None,
               memo: dict | None, true_len: np.ndarray | None = None) -> Played:
    """`play_with_migration(plan, tm, tau, outcome)`, once per plan, outcome (None: the predictions), tau and time
    model in `memo`: twins (`sim.scenario.play_twins`) that choose the same N weigh cuts on the same plan object
    (the step's memo builds each plan once) and the same draws; the result is read only. The plan's kernel
    inputs are built once per plan and time model in `memo` too, and `true_len` (the outcome's lengths in the
    plan's order, `_play`'s seq_len) is handed over rather than gathered again from the records."""
    if memo is None:
        return play_with_migration(plan, tm, tau, outcome)
    key = ("cuts", id(plan), id(outcome), tau, id(tm))
    hit = memo.get(key)
    if hit is not None and hit[0] is plan and hit[1] is outcome and hit[2] is tm:
        return hit[3]
    res = play_with_migration(plan, tm, tau, outcome, _plan_arrays(plan, tm, memo), true_len)
    memo[key] = (plan, outcome, tm, res)  # the objects themselves: their ids stay theirs while the memo holds them
    return res


def _plan_arrays(plan: AssignmentPlan, tm: TimeModel, memo: dict) -> PlanArrays | None:
    """`PlanArrays(plan, tm)`, once per plan and time model object in `memo` (played on the predictions and on
    each draw); None where the pure-Python simulation runs (it reads the records)."""
    if kernel() is None:
        return None
    key = ("kernel-in", id(plan), id(tm))
    hit = memo.get(key)
    if hit is not None and hit[0] is plan and hit[1] is tm:
        return hit[2]
    arrays = PlanArrays(plan, tm, _plan_jobs(plan, memo).seq_len)
    memo[key] = (plan, tm, arrays)  # the objects themselves: their ids stay theirs while the memo holds them
    return arrays


def evaluate_candidate(ja: JobArrays, n: int, cfg: PlanConfig, tm: TimeModel, n_warm: int | None,
                       draws: Sequence[Sequence[PlanJob]] = ()) -> tuple[ScalingCandidate, AssignmentPlan]:
    """T(n) and C(n) of one candidate, simulated (with cuts at tau when cfg.migrate and cfg.simulate_migration)."""
    plan, _ = assign(ja, n, cfg.capacity, tm, cfg.policy)
    if cfg.migrate and cfg.simulate_migration:
        return with_cuts(plan, cfg, tm, n_warm, draws)[0], plan
    return _row(plan, cfg, tm, n_warm, draws), plan


def _scores(cands: list[ScalingCandidate], lam: float) -> list[float]:
    return _score_arrays(np.array([c.step_s for c in cands]), np.array([c.cost_usd for c in cands]), lam).tolist()


def _score_arrays(t: np.ndarray, c: np.ndarray, lam: float) -> np.ndarray:
    """lam * T/min T + (1 - lam) * C/min C over candidates (a zero minimum makes that ratio 1)."""
    tn = t / t.min() if t.min() > 0 else np.ones_like(t)
    cn = c / c.min() if c.min() > 0 else np.ones_like(c)
    return lam * tn + (1.0 - lam) * cn


# relative slack of the deadline test: a candidate equal to the reference plan (the same actors, the same
# finishes) sums its seconds in another order and may come out an ulp above it
DEADLINE_RTOL = 1e-9


def _feasible(step_s: np.ndarray, cost_usd: np.ndarray, cfg: PlanConfig) -> np.ndarray:
    if cfg.objective in ("min_cost_under_deadline", "min_cost_at_deadline"):
        return step_s <= cfg.deadline_s * (1.0 + DEADLINE_RTOL)
    if cfg.objective == "min_time_under_budget":
        return cost_usd <= cfg.budget_usd
    return np.ones(len(step_s), dtype=bool)


def _pick(cands: list[ScalingCandidate], cfg: PlanConfig) -> tuple[ScalingCandidate, bool]:
    if cfg.objective == "score":
        return min(cands, key=lambda c: (c.score, c.n_actors)), True
    feasible = [c for c in cands if c.feasible]
    if cfg.objective in ("min_cost_under_deadline", "min_cost_at_deadline"):
        if feasible:
            return min(feasible, key=lambda c: (c.cost_usd, c.step_s, c.n_actors)), True
        return min(cands, key=lambda c: (c.step_s, c.cost_usd, c.n_actors)), False
    if feasible:
        return min(feasible, key=lambda c: (c.step_s, c.cost_usd, c.n_actors)), True
    return min(cands, key=lambda c: (c.cost_usd, c.step_s, c.n_actors)), False


def _memo_sweep(ja: JobArrays, cfg: PlanConfig, tm: TimeModel, memo: dict | None) -> sw.SweepResult:
    """`sweep.sweep` of the candidates, once per jobs, candidates, capacity, time model and policy in `memo` (a
    step's decision and its warm pool sweep the same jobs; the result is read only)."""
    key = ("sweep", id(ja), tuple(cfg.candidates()), cfg.capacity, cfg.policy, id(tm))
    hit = memo.get(key) if memo is not None else None
    if hit is not None and hit[0] is ja and hit[1] is tm:
        return hit[2]
    res = sw.sweep(ja, cfg.candidates(), cfg.capacity, tm, cfg.policy)
    if memo is not None:
        memo[key] = (ja, tm, res)  # the objects themselves: their ids stay theirs while the memo holds them
    return res


def _memo_plan(ja: JobArrays, res: sw.SweepResult, n: int, cfg: PlanConfig, tm: TimeModel,
               memo: dict | None) -> AssignmentPlan:
    """`build_plan` of the sweep's placement for n actors, once per sweep result in `memo` (a step's decision
    and its warm pool place the same jobs alike, and the warm pool reads only the plan; plans are read only)."""
    key = ("plan", id(res), n)
    hit = memo.get(key) if memo is not None else None
    if hit is not None and hit[0] is res:
        return hit[1]
    labels = res.labels(res.candidates.index(n))
    plan = build_plan(ja, labels, res.rank, n, cfg.capacity, tm, cfg.policy)
    if memo is not None:
        memo[key] = (res, plan)  # the result itself: its id stays its own while the memo holds it
        memo[("plan-jobs", id(plan))] = (plan, ja, (labels, res.rank))  # `_plan_jobs` gathers them when asked
    return plan


def _plan_jobs(plan: AssignmentPlan, memo: dict | None) -> JobArrays:
    """The plan's jobs as arrays in its order (`JobArrays.from_jobs` of them), once per plan in `memo`: its
    rows on the predictions cost it and `_plan_arrays` plays it. A plan `_memo_plan` built gathers them from the
    step's arrays in `build_plan`'s order (`JobArrays.take`: the same arrays) instead of reading each job."""
    hit = memo.get(("plan-jobs", id(plan))) if memo is not None else None
    if hit is None or hit[0] is not plan:
        ja = JobArrays.from_jobs([j for js in plan.actor_jobs for j in js])
    elif isinstance(hit[2], tuple):
        labels, rank = hit[2]
        ja = hit[1].take(np.lexsort((rank, labels)))  # build_plan's order
    else:
        return hit[1]
    if memo is not None:
        memo[("plan-jobs", id(plan))] = (plan, ja, None)  # the plan itself: its id stays its own while held
    return ja


def sweep_candidates(ja: JobArrays, cfg: PlanConfig, tm: TimeModel,
                     n_warm: int | None, memo: dict | None = None) -> tuple[list[ScalingCandidate], sw.SweepResult]:
    """T(N) and C(N) of every candidate from the fast sweep, costed like `decode_invocations` + `cost_step`,
    and scored for cfg's objective as `_scored` would; `memo`: as `choose`'s (the sweep is shared)."""
    res = _memo_sweep(ja, cfg, tm, memo)
    busy, active = res.busy_s, res.njobs > 0  # (R, M): candidate row x actor slot
    m = busy.shape[1]
    # the busiest n_warm active actors are warm (ties: lower actor id), as in decode_invocations; the busiest
    # hybrid_warm of them are hybrid functions from the last step's learner
    order = np.argsort(np.where(active, -busy, np.inf), axis=1, kind="stable")
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(m)[None, :], axis=1)
    cold = active & (pos >= n_warm) if n_warm is not None else np.zeros_like(active)
    h = _hybrid_count(cfg, n_warm)
    hybrid = active & (pos < h)
    cold_s = np.where(cold, cfg.cold_start_s, 0.0)
    kv = cfg.learner.prefill_s if cfg.learner.whole_step else 0.0
    dur = np.maximum(cold_s + np.where(hybrid, cfg.hybrid_sync_s, cfg.weight_sync_s), kv) + busy
    # a pre-warmed actor was kept alive (or restarted) warm_bill_s ahead; a hybrid one was a learner block until
    # the step's start, billed to the learner, so its decode bill starts there
    held = dur + np.where(cold | hybrid, 0.0, cfg.warm_bill_s)
    billed = np.where(active, billed_seconds_array(held, cold, cold_s, cfg.billing), 0.0)
    gpu_s = (billed * cfg.gpus_per_actor).sum(axis=1)
    if n_warm is not None and cfg.warm_bill_s > 0:  # pre-warmed (not hybrid) instances a candidate leaves unused
        idle = billed_seconds_array(np.array([cfg.warm_bill_s]), np.array([False]), 0.0, cfg.billing)[0]
        fresh_used = (active & ~cold & ~hybrid).sum(axis=1)
        gpu_s = gpu_s + np.maximum(n_warm - h - fresh_used, 0) * idle * cfg.gpus_per_actor
    step = np.where(active, dur, 0.0).max(axis=1)
    if cfg.learner.whole_step:
        step, gpu_s = _sweep_whole_step(ja, res, dur, active, gpu_s, cfg, tm, n_warm, memo)
    usd = gpu_s * price(cfg.gpu_kind).serverless_usd_per_s
    n_active = active.sum(axis=1)
    rows = zip(res.candidates, n_active.tolist(), step.tolist(), gpu_s.tolist(), usd.tolist(),
               _score_arrays(step, usd, cfg.lam).tolist(), _feasible(step, usd, cfg).tolist(), res.exact.tolist())
    return [ScalingCandidate(k, a, t, g, c, sc, f, 0, e) for k, a, t, g, c, sc, f, e in rows], res


def _sweep_whole_step(ja: JobArrays, res: sw.SweepResult, dur: np.ndarray, active: np.ndarray, gpu_s: np.ndarray,
                      cfg: PlanConfig, tm: TimeModel, n_warm: int | None = 0,
                      memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Whole-step T and device-seconds of every swept candidate (decode's already in gpu_s), as `_costed`;
    `memo`: tails already costed (`_memo_tail`)."""
    step, total = np.empty(len(res.candidates)), gpu_s.copy()
    if not cfg.learner.overlap:  # every candidate's tail is the same work after its own rollout end (`_tail`)
        # each row's last active actor among its first n slots (the maximum of the positive durations is the
        # row's maximum where any is positive; max is exact), else the prefill's end
        first_n = np.arange(dur.shape[1])[None, :] < np.asarray(res.candidates)[:, None]
        last = np.where(active & first_n, dur, 0.0).max(axis=1, initial=0.0)
        ends = np.where(last > 0, last, cfg.learner.prefill_s).tolist()
        for r, (end, tail_gpu_s) in enumerate(_sequential_costs(ja, ends, cfg, memo)):
            step[r] = end
            total[r] += tail_gpu_s
        return step, total
    for r, n in enumerate(res.candidates):
        d = np.where(active[r], dur[r], 0.0)[:n]
        step[r], invs = _memo_tail(ja, res.labels(r), res.rank, n, d, d - res.busy_s[r, :n], cfg, tm, None, None,
                                   n_warm, memo)
        total[r] += step_cost(invs, price(cfg.gpu_kind), cfg.billing).gpu_seconds
    return step, total


def _sequential_costs(ja: JobArrays, ends: list[float], cfg: PlanConfig,
                      memo: dict | None) -> list[tuple[float, float]]:
    """(step seconds, the tail's billed device-seconds) after each rollout end without overlap
    (`sequential_tails`, priced by `step_cost`), once per distinct end in `memo` (by its repr: -0.0 and 0.0
    apart): the twins' and the warm pool's sweeps end a third of paper-sim's candidates' rollouts alike, and
    each end's tail is computed on its own (`sequential_tails` shares only the work side)."""
    lc = cfg.learner
    base = None if memo is None else ("seqtail", id(ja), _learner_key(lc, memo), _budget(cfg), cfg.gpu_kind,
                                      id(cfg.billing))
    out: list = [None] * len(ends)
    miss = []
    for r, e in enumerate(ends):
        hit = memo.get(base + (repr(e),)) if base is not None else None
        if hit is not None and hit[0] is ja and hit[1] is cfg.billing:  # the objects themselves: ids stay theirs
            out[r] = hit[2]
        else:
            miss.append(r)
    if miss:
        tokens = job_learner_tokens(ja.sizes.astype(float), ja.prompt_len, ja.work, lc)
        tails = sequential_tails([ends[r] for r in miss], tokens * lc.s_per_token, _budget(cfg), lc,
                                 float(tokens.sum()) * lc.after_s_per_token)
        for r, (end, invs) in zip(miss, tails):
            out[r] = (end, step_cost(invs, price(cfg.gpu_kind), cfg.billing).gpu_seconds)
            if base is not None:
                memo[base + (repr(ends[r]),)] = (ja, cfg.billing, out[r])
    return out


def _with_deadline(ja: JobArrays, cfg: PlanConfig, tm: TimeModel,
                   draws: Sequence[Sequence[PlanJob]] = ()) -> tuple[PlanConfig, AssignmentPlan]:
    """min_cost_at_deadline: the deadline is deadline_ratio x the serverful plan's step (module header), over
    the same draws as the candidates; returns (cfg with deadline_s, the serverful plan)."""
    ref_cfg = replace(cfg, policy="round_robin", objective="score", scale=False, migrate=False, exact_sweep=True)
    ref, plan = evaluate_candidate(ja, cfg.max_actors, ref_cfg, tm, cfg.max_actors, draws)
    return replace(cfg, deadline_s=cfg.deadline_ratio * ref.step_s), plan


def _offer_reference(cands: list[ScalingCandidate], plan_of, ref: AssignmentPlan, cfg: PlanConfig, tm: TimeModel,
                     n_warm: int | None, draws: Sequence[Sequence[PlanJob]], memo: dict | None):
    """min_cost_at_deadline: the serverful placement (round robin over max_actors) is a plan the runtime can run
    as well; priced with this step's warm functions, it stands in for the policy's own max_actors plan where it
    is faster. So with every function warm the deadline (ratio >= 1) is always met: the reference is a candidate.
    Returns (the table re-scored, plan_of)."""
    row = _row(ref, cfg, tm, n_warm, draws, memo=memo)
    own = next((c for c in cands if c.n_actors == ref.n_actors), None)
    if own is None or row.step_s >= own.step_s:
        return cands, plan_of
    table = _scored([c for c in cands if c is not own] + [row], cfg)
    return sorted(table, key=lambda c: c.n_actors), lambda n: ref if n == ref.n_actors else plan_of(n)


def _candidates(ja: JobArrays, cfg: PlanConfig, tm: TimeModel, n_warm: int | None,
                draws: Sequence[Sequence[PlanJob]], memo: dict | None):
    """The scored table of every candidate N and a function giving N's plan: simulated per candidate (exact
    sweep or simulated cuts), the sweep's plans played on each draw (draws), or the vectorised sweep alone
    (whose chosen plan is then built from its own labels)."""
    exact = cfg.exact_sweep or (cfg.migrate and cfg.simulate_migration)
    if exact:
        evaluated = [evaluate_candidate(ja, n, cfg, tm, n_warm, draws) for n in cfg.candidates()]
    else:
        validate_jobs(ja, cfg.max_actors, cfg.capacity)
        if not draws and cfg.objective == "score":
            cands, res = sweep_candidates(ja, cfg, tm, n_warm, memo)  # already scored

            return cands, lambda n: _memo_plan(ja, res, n, cfg, tm, memo)
        # a constraint (deadline, budget) is tested on each placement played exactly, as its reference is: the
        # sweep's estimate of a queueing actor can land either side of it (a plan equal to the reference missed
        # its own deadline); the sweep still places every candidate
        res = _memo_sweep(ja, cfg, tm, memo)
        plans = [_memo_plan(ja, res, n, cfg, tm, memo) for n in res.candidates]
        evaluated = [(_row(p, cfg, tm, n_warm, draws, memo=memo), p) for p in plans]
    plans_by_n = {c.n_actors: p for c, p in evaluated}
    return _scored([c for c, _ in evaluated], cfg), plans_by_n.__getitem__


def _memo_arrays(jobs: Sequence[PlanJob], memo: dict | None) -> JobArrays:
    """`JobArrays.from_jobs(jobs)`, once per jobs object in `memo` (the same jobs are chosen for twice a step)."""
    hit = memo.get(("arrays", id(jobs))) if memo is not None else None
    if hit is not None and hit[0] is jobs:
        return hit[1]
    ja = JobArrays.from_jobs(jobs)
    if memo is not None:
        memo[("arrays", id(jobs))] = (jobs, ja)
    return ja


def choose(jobs: Sequence[PlanJob] | JobArrays, cfg: PlanConfig, time_model: TimeModel | None = None,
           n_warm: int | None = 0, wide: WideActor | None = None,
           draws: Sequence[Sequence[PlanJob]] = (), memo: dict | None = None) -> tuple[ScalingDecision, dict]:
    """Pick the number of decode actors for this step and whether it cuts and migrates (rule in the module
    header); returns (decision, metrics). `draws`: outcomes of the step's lengths drawn from the prediction
    (the same groups as `jobs`, per-sequence lengths; `rlhfless.predictor.spread.draw_lengths`): every
    candidate's T and C are then the means over them (module header, "Outcomes"); () = the predictions alone.
    `memo`: a dict kept across calls on the same jobs and draws (e.g. the same step with another n_warm), so
    each placement is played on each draw once; the caller owns it (None = none).

    metrics holds scalars (scaler/*, balancer/* of the chosen plan) and `scaler/candidates`: a list of plain
    rows (n_actors, active_actors, step_s, gpu_seconds, cost_usd, score, feasible, migrations, exact).
    """
    tm = time_model or cfg.time_model()
    ja = jobs if isinstance(jobs, JobArrays) else _memo_arrays(jobs, memo)
    ref = None
    if cfg.objective == "min_cost_at_deadline":
        validate_jobs(ja, cfg.max_actors, cfg.capacity)
        cfg, ref = _with_deadline(ja, cfg, tm, draws)
    cands, plan_of = _candidates(ja, cfg, tm, n_warm, draws, memo)
    if ref is not None:
        cands, plan_of = _offer_reference(cands, plan_of, ref, cfg, tm, n_warm, draws, memo)
    best, _ = _pick(cands, cfg)
    plan = plan_of(best.n_actors)
    cut, migration, reason = None, None, ""
    if cfg.migrate:
        cands, best, cut, migration, reason = _decide_cuts(cands, best, plan, cfg, tm, n_warm, draws, memo)
    wide_actor, wide_row = -1, None
    if wide is not None and migration is None:
        cands, best, wide_actor, wide_row = _decide_wide(cands, best, plan, cfg, tm, n_warm, wide, draws, memo)
    decision = ScalingDecision(best.n_actors, cfg.objective, tuple(cands), plan, best.feasible, migration, cut,
                               wide_actor, wide_row, reason)
    return decision, decision_metrics(decision)


def _decide_wide(cands: list[ScalingCandidate], best: ScalingCandidate, plan: AssignmentPlan, cfg: PlanConfig,
                 tm: TimeModel, n_warm: int | None, wide: WideActor, draws: Sequence[Sequence[PlanJob]] = (),
                 memo: dict | None = None):
    """Run the straggler on the wide engine only where the objective prefers it (the rule of `_decide_cuts`)
    and the device budget holds it. Returns (table, chosen row, wide actor or -1, the wide row or None)."""
    a = straggler(plan, plan.busy_s)
    held = sum(cfg.gpus_per_actor for jobs in plan.actor_jobs if jobs)
    if a < 0 or held - cfg.gpus_per_actor + wide.gpus > _budget(cfg) + 1e-9:
        return cands, best, -1, None
    wide_row = _row(plan, cfg, tm, n_warm, draws, wide=wide, memo=memo)
    plain_row = _row(plan, cfg, tm, n_warm, draws, memo=memo)
    others = [c for c in cands if c.n_actors != best.n_actors]
    *_, plain, widened = _scored(others + [plain_row, wide_row], cfg)
    if _pick([plain, widened], cfg)[0] is not widened:  # ties keep every actor narrow
        return cands, best, -1, wide_row
    cands = sorted(_scored(others + [wide_row], cfg), key=lambda c: c.n_actors)
    return cands, next(c for c in cands if c.n_actors == plan.n_actors), a, wide_row


def _decide_cuts(cands: list[ScalingCandidate], best: ScalingCandidate, plan: AssignmentPlan, cfg: PlanConfig,
                 tm: TimeModel, n_warm: int | None, draws: Sequence[Sequence[PlanJob]] = (),
                 memo: dict | None = None):
    """Keep cuts at tau in the chosen plan only where the objective prefers them (module header).

    Returns (table, chosen row, the chosen N's row with cuts, the cuts kept or None, `cut_reason`). The table
    changes only when the decision differs from how it was scored (without cuts, or with them under
    simulate_migration): then the chosen row is replaced and the table re-scored.
    """
    cut_row, cut_res = with_cuts(plan, cfg, tm, n_warm, draws, memo)
    plain_row = _row(plan, cfg, tm, n_warm, draws, memo=memo)
    others = [c for c in cands if c.n_actors != best.n_actors]
    *_, plain, cut = _scored(others + [plain_row, cut_row], cfg)
    keep = _pick([plain, cut], cfg)[0] is cut  # ties keep the plan without cuts
    if keep != cfg.simulate_migration:
        cands = sorted(_scored(others + [cut_row if keep else plain_row], cfg), key=lambda c: c.n_actors)
        best = next(c for c in cands if c.n_actors == plan.n_actors)
    # moves named only when kept
    return cands, best, cut, (cut_res.named()[0] if keep else None), cut_reason(plain, cut, keep)


def cut_reason(plain: ScalingCandidate, cut: ScalingCandidate, keep: bool) -> str:
    """Why the cuts at tau were kept or not, decided here rather than guessed from the log afterwards (one of
    `CUT_REASONS`): no actor reaches tau with rows left to move, the cuts make the step neither faster nor
    cheaper, they miss the deadline the plan without them meets, or the objective prefers the cheaper / faster
    plan without them (their step and cost are logged beside: balancer/migrate_predicted_*)."""
    if keep:
        return "kept"
    if cut.migrations == 0:
        return "nothing_to_move"
    if cut.step_s >= plain.step_s and cut.cost_usd >= plain.cost_usd:
        return "no_gain"
    if plain.feasible and not cut.feasible:
        return "misses_deadline"
    return "dearer" if cut.cost_usd > plain.cost_usd else "slower"


CUT_REASONS = ("kept", "nothing_to_move", "no_gain", "misses_deadline", "dearer", "slower")
"""`balancer/migrate_reason`'s values (`cut_reason`)."""


def _scored(cands: list[ScalingCandidate], cfg: PlanConfig) -> list[ScalingCandidate]:
    """The candidates with their score and feasibility for cfg's objective (normalised over this list)."""
    return [_with(c, s, cfg) for c, s in zip(cands, _scores(cands, cfg.lam))]


def _with(c: ScalingCandidate, score: float, cfg: PlanConfig) -> ScalingCandidate:
    feasible = bool(_feasible(np.array([c.step_s]), np.array([c.cost_usd]), cfg)[0])
    return ScalingCandidate(c.n_actors, c.active_actors, c.step_s, c.gpu_seconds, c.cost_usd, score, feasible,
                            c.migrations, c.exact)


def decision_metrics(d: ScalingDecision) -> dict:
    """Scaler metrics of a decision (names from rlhfless.core.metrics); balancer/* describe the plan as chosen,
    with its cuts when it includes them."""
    c = d.chosen
    done = d.migration if d.migration is not None else d.plan
    out = {
        M.SCALER_NUM_ACTORS: float(d.n_actors),
        M.SCALER_STEP_S: c.step_s,
        M.SCALER_COST_USD: c.cost_usd,
        M.SCALER_GPU_S: c.gpu_seconds,
        M.PLAN_PREDICTED_DEVICE_S: d.predicted_device_s,
        M.SCALER_SCORE: c.score,
        M.SCALER_CONSTRAINT_MET: float(d.constraint_met),
        M.BAL_IMBALANCE: done.imbalance,
        M.BAL_MAKESPAN_S: done.makespan_s,
        M.BAL_IDLE_DEVICE_S: done.idle_device_s,
        M.BAL_MIGRATIONS: float(c.migrations),
        M.SCALER_CANDIDATES: d.table_rows(),
    }
    if d.wide_option is not None:  # a wide engine was offered: whether the straggler runs on it
        out[M.SCALER_WIDE_USED] = float(d.wide_actor >= 0)
    if d.cut_option is not None:  # plan.migrate: the chosen N with cuts at tau was weighed
        out.update({M.BAL_MIGRATE_USED: float(d.migration is not None), M.BAL_MIGRATE_REASON: d.cut_reason,
                    M.BAL_RELEASED_ACTORS: float(len(d.migration.released)) if d.migration is not None else 0.0,
                    M.BAL_MIGRATE_STEP_S: d.cut_option.step_s, M.BAL_MIGRATE_COST_USD: d.cut_option.cost_usd})
    return out


def realized_plan(decision: ScalingDecision, true_jobs: Sequence[PlanJob], time_model: TimeModel,
             tau: float) -> AssignmentPlan | MigrationResult:
    """The decision's placement (and its cuts at tau, when it includes them) re-simulated with `true_jobs`'
    lengths (matched by group_id); the cuts are decided on the predictions, as a runtime would."""
    if decision.migration is None:
        return evaluate_plan(decision.plan, true_jobs, time_model)
    return simulate_with_migration(decision.plan, time_model, tau, true_jobs)[0]
