"""The local runtime's step, arm by arm, as a model: what validation predicts a `runtime.mode=compare` run with.

`fit_constants` measures this machine's constants on calibration steps; `predict` plays each step by the runtime's
rules (keep-alive, hybrid learner ranks, pre-warm, the meter's billing) into the period and billed core-seconds by
component, which `measure` reads from the records. The rule it keeps: constants from calibration steps only,
decisions from the record. It refuses a run with a prefill or reference function, or separate images kept alive.
Per-arm rules and constants: docs/internals.md#simarmmodelpy.

Deviations from the runtime:
1. The reward stage (on the decode worker, milliseconds) is folded into decode.
2. A rank starts at its ready time (the runtime sends learn_begin at once).
3. A warm worker behind the weights version loads the state inside its decode (decode's fixed time).
4. A step's warm workers come from the previous step as the model played it (`predict` plays every earlier step).
5. Warm first: the decode functions with the lowest groups; the last step's ranks before its idle decode functions.
6. A rank waiting with no worker starts on a unit freed by a lapse at that instant.
7. Decode functions pre-warmed during the previous optimiser step are played cold.
8. Separate images: a rank's share is in one fitted end interval (`opt_s`, which the meter counts busy on every
   rank: the share's write, the reducer's reduce and step) after its last group's compute or the rollout's end,
   whichever is later (the runtime sends the end of the rollout then); the reducer's reduce is not played apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError
from rlhfless.core.rundir import CONFIG, INVOCATIONS, METRICS, WORKERS, RunDir
from rlhfless.plan import PlanJob, TimeModel, assign
from rlhfless.plan.balancer import job_finish_s
from rlhfless.plan.billing import rule_set
from rlhfless.plan import lifecycle
from rlhfless.plan.lifecycle import PREWARM_HISTORY, planned_start_s
from rlhfless.plan.ranks import reducer
from rlhfless.plan.schedule import microbatches
from rlhfless.sim.calibrate import cpu_decode_model
from rlhfless.sim.hardware import tiny_model
from rlhfless.sim.workload import GroupWork, StepWork, replay_trace

KINDS = ("decode", "learner")


@dataclass(frozen=True)
class Inv:
    """One invocation: its worker, groups, and run-relative seconds."""

    worker: str
    groups: tuple[int, ...]
    requested: float
    started: float
    finished: float
    compute_s: float = 0.0
    busy_s: float | None = None  # its compute intervals' seconds (a learner rank's); None: the whole span


@dataclass(frozen=True)
class StepRec:
    """One recorded step of an arm: its work, invocations by kind, the workers it started, its bill."""

    step: int
    work: StepWork
    decode: tuple[Inv, ...]
    learner: tuple[Inv, ...]
    workers: tuple[dict, ...]  # workers.jsonl rows of the workers whose first invocation is in this step
    billed: float  # cost/device_seconds of the step's window
    predicted_makespan_s: float
    t0: float  # the step's first decode request
    period: float | None  # to the next step's first decode request (None for the last step)


@dataclass(frozen=True)
class Arm:
    name: str
    mode: str  # serverful | serverless
    overlap: bool
    units: int
    learners: int
    capacity: int
    microbatch: int
    skip_zero_variance: bool
    prewarm_buffer_s: float
    steps: tuple[StepRec, ...]
    prewarm: bool = True
    hybrid: bool = False  # serverless: the hybrid image (`runtime.hybrid`)
    keep_alive_s: float = 0.0  # serverless: `runtime.keep_alive_s`


@dataclass(frozen=True)
class Constants:
    """This machine's constants, measured on calibration steps (docs/internals.md#simarmmodelpy)."""

    cold_s: dict[str, float]
    release_s: dict[str, float]
    decode: tuple[float, float, float]  # fixed s per invocation, s per iteration, s per byte (bytes at 1 B/s)
    learn: tuple[float, float]  # s per kept group, s per kept token
    ctx: float  # mean context of a decode iteration (tokens)
    gap_s: float = 0.0  # serverful: rollout (or own decode) end to the learner rank's start
    opt_s: float = 0.0
    driver_s: float = 0.0

    def time_model(self, capacity: int) -> TimeModel:
        bw = 1.0 / self.decode[2] if self.decode[2] > 0 else 1e30
        return cpu_decode_model(tiny_model(), 1e30, bw, self.decode[1]).time_model(capacity, self.ctx)


@dataclass
class Split:
    """One step's period and billed core-seconds, split as `run.compare.core_seconds_per_step`."""

    period: float
    billed: float
    cold: float
    busy: dict[str, float] = field(default_factory=dict)
    learn_end: float = 0.0
    rollout: float = 0.0

    @property
    def held_idle(self) -> float:
        return self.billed - self.cold - sum(self.busy.values())


# ---- reading ---------------------------------------------------------------------------------------------
def read_arm(path: str | Path, name: str | None = None) -> Arm:
    """One arm's run dir. Missing records are a DataError naming the file; so is a run with a function the
    model does not play (docs/internals.md#simarmmodelpy)."""
    from rlhfless.core.configbase import load_yaml

    p = Path(path)
    for f in (CONFIG, METRICS, INVOCATIONS, WORKERS):  # workers.jsonl: written at the end
        if not (p / f).is_file():
            raise DataError(f"validate: {p / f} not found (an arm of a `runtime.mode=compare` run writes it)")
    cfg = load_yaml(RunDir(p).config)
    rt, plan, algo = cfg.get("runtime") or {}, cfg.get("plan") or {}, cfg.get("algo") or {}
    mode = rt.get("mode", "serverless")
    overlap = (mode != "serverful") if rt.get("overlap") is None else bool(rt["overlap"])
    if rt.get("ship_prefix_kv", "never") != "never" or (float(algo.get("kl_coef") or 0) > 0 and not overlap):
        raise DataError(f"validate: {p}: the arm model has no prefill or reference function (module header)")
    run = RunDir(p)
    workers = {w["worker"]: w for w in run.read_workers()}
    units = int(rt.get("units") or 0) or len({c for w in workers.values() for c in (w.get("cores") or [])}) or 1
    learners = int(rt.get("learner_units") or 0) or units
    if mode == "serverful":  # the pool's W workers, one unit each
        units = int(rt.get("serverful_workers") or 0) or units
    # a config written before the hybrid image existed has no `hybrid` key: separate images, as it ran
    # the keep-alive the runtime ran with: runtime.keep_alive_s, or the idle timeout of its billing preset
    keep = rule_set(rt.get("billing", "lifetime"), float(rt.get("billing_granularity_s") or 0.001),
                    float(rt.get("keep_alive_s") or 0.0)).keep_alive_s
    hybrid = mode == "serverless" and bool(rt.get("hybrid", False))
    if mode == "serverless" and not hybrid and keep > 0:
        raise DataError(f"validate: {p}: the arm model does not play separate images kept alive "
                        "(runtime.hybrid=false with runtime.keep_alive_s > 0; module header)")
    return Arm(name or p.name, mode, overlap, units, learners, max(int(plan.get("capacity", 256)), 1),
               int(rt.get("learner_microbatch_groups") or 1), bool(algo.get("skip_zero_variance_groups", False)),
               float(rt.get("prewarm_buffer_s", 0.05)), _read_steps(p, workers), bool(rt.get("prewarm", True)),
               hybrid, keep)


def _read_steps(p: Path, workers: dict[str, dict]) -> tuple[StepRec, ...]:
    """Every step with metrics, a trace and a decode invocation; first attempts of successful invocations."""
    run = RunDir(p)
    metrics = run.read_step_metrics()
    trace = run.rollouts
    if trace is None:
        raise DataError(f"validate: no trace at {p / 'traces' / 'rollouts.jsonl'}[.gz]")
    work = {s.step: s for s in replay_trace(trace)}
    by_step: dict[int, dict[str, list[Inv]]] = {}
    first_step: dict[str, int] = {}
    for i in run.read_invocations():
        if i.get("ok", True) and i.get("attempt", 1) == 1:
            by_step.setdefault(i["step"], {}).setdefault(i["kind"], []).append(_inv(i))
            first_step[i["worker"]] = min(first_step.get(i["worker"], i["step"]), i["step"])
    t0 = {s: min(i.requested for i in k["decode"]) for s, k in by_step.items() if k.get("decode")}
    out = []
    for s in sorted(x for x in metrics if x in work and x in t0):
        m, k = metrics[s], by_step[s]
        out.append(StepRec(s, work[s], tuple(k.get("decode", ())), tuple(k.get("learner", ())),
                           tuple(w for n, w in workers.items() if first_step.get(n) == s),
                           float(m.get("cost/device_seconds") or 0), float(m.get("balancer/makespan_s") or 0.0),
                           t0[s], t0[s + 1] - t0[s] if s + 1 in t0 else None))
    return tuple(out)


def _inv(i: dict) -> Inv:
    busy = sum(b - a for a, b in i["busy"]) if i.get("busy") else None  # the record's `InvocationRecord.busy_s`
    return Inv(i["worker"], tuple(i.get("groups") or ()), i["requested_s"], i["started_s"], i["finished_s"],
               float((i.get("extra") or {}).get("compute_s") or 0.0), busy)


# ---- work features ---------------------------------------------------------------------------------------
def _jobs(groups: list[tuple[int, GroupWork]]) -> list[PlanJob]:
    return [PlanJob(str(i), len(g.lengths), tuple(float(x) for x in g.lengths), 0) for i, g in groups]


def decode_features(arm: Arm, rec: StepRec, inv: Inv, ctx: float) -> tuple[float, float, float]:
    """(1, iterations, bytes) of one decode function's groups: the planner's time model at unit costs."""
    jobs = _jobs([(g, rec.work.groups[g]) for g in inv.groups])
    cap = max(arm.capacity, max(j.n_seqs for j in jobs))
    ones = TimeModel((1, cap), (1.0, 1.0), 0.0, 0.0, source="unit")
    per_byte = cpu_decode_model(tiny_model(), 1e30, 1.0, 0.0).time_model(cap, ctx)
    return 1.0, assign(jobs, 1, cap, ones, "contiguous")[0].makespan_s, assign(jobs, 1, cap, per_byte,
                                                                             "contiguous")[0].makespan_s


def kept(arm: Arm, g: GroupWork) -> bool:
    """GRPO skips a group whose rewards are all equal (no gradient): its learner compute is ~0."""
    return not arm.skip_zero_variance or not g.rewards or len(set(g.rewards)) > 1


def rank_groups(arm: Arm, n_groups: int) -> list[list[int]]:
    """Group indices per learner rank (`plan.schedule.microbatches`: fixed by index)."""
    return [[g for chunk in r for g in chunk] for r in microbatches(n_groups, arm.microbatch, arm.learners)]


def learn_features(arm: Arm, work: StepWork, groups: list[int]) -> tuple[float, float]:
    k = [work.groups[g] for g in groups if kept(arm, work.groups[g])]
    return float(len(k)), float(sum(g.tokens for g in k))


def context(arm: Arm, steps: list[StepRec]) -> float:
    gs = [g for r in steps for g in r.work.groups]
    return float(np.mean([g.prompt_len for g in gs]) + np.mean([x for g in gs for x in g.lengths]) / 2)


# ---- constants -------------------------------------------------------------------------------------------
def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    scale = np.maximum(X.max(axis=0), 1e-12)
    return nnls(X / scale, y)[0] / scale


def fit_constants(arm: Arm, steps: list[StepRec]) -> Constants:
    """Measure the constants on `steps` (docs/internals.md#simarmmodelpy); the two residuals from the model played on
    them."""
    if not steps:
        raise DataError(f"validate: {arm.name}: no calibration steps")
    ctx = context(arm, list(arm.steps))  # the trace's mean context (an input, not a measurement)
    cold, rel = _lifetimes(arm, steps)
    X = np.array([decode_features(arm, r, i, ctx) for r in steps for i in r.decode])
    y = np.array([i.finished - i.started for r in steps for i in r.decode])
    dec = tuple(float(x) for x in _nnls(X, y))
    L = np.array([learn_features(arm, r.work, list(i.groups)) for r in steps for i in r.learner])
    ly = np.array([i.compute_s for r in steps for i in r.learner])
    learn = tuple(float(x) for x in _nnls(L, ly))
    gaps = []
    for r in steps:
        if arm.mode == "serverful" and r.learner:
            ends = {i.worker: i.finished for i in r.decode}
            gaps += ([i.started - ends[i.worker] for i in r.learner if i.worker in ends] if arm.overlap
                     else [min(i.started for i in r.learner) - max(ends.values())])
    c = Constants(cold, rel, dec, learn, ctx, float(np.mean(gaps)) if gaps else 0.0)
    played = predict(arm, steps, c)
    meas = [measure(arm, r) for r in steps]
    opt = float(np.mean([m.learn_end - p.learn_end for m, p in zip(meas, played)]))
    with_opt = Constants(cold, rel, dec, learn, ctx, c.gap_s, opt)
    played = predict(arm, steps, with_opt)
    drv = [m.period - p.period for r, m, p in zip(steps, meas, played) if r.period is not None]
    return Constants(cold, rel, dec, learn, ctx, c.gap_s, opt, float(np.mean(drv)) if drv else 0.0)


def _lifetimes(arm: Arm, steps: list[StepRec]) -> tuple[dict[str, float], dict[str, float]]:
    """Per kind: the mean cold start of the workers started in `steps` (a hybrid worker counts for both kinds),
    and the mean lag from a worker's last invocation to its release, by that invocation's kind (serverless with
    keep-alive 0 only: a pool worker, or a worker kept alive, is held to the step's end instead)."""
    cold, rel = {}, {}
    last: dict[str, tuple[float, str]] = {}
    for r in steps:
        for kind in KINDS:
            for i in getattr(r, kind):
                if i.finished >= last.get(i.worker, (-np.inf, ""))[0]:
                    last[i.worker] = (i.finished, kind)
    for kind in KINDS:
        ws = [w for r in steps for w in r.workers if kind in (w.get("kinds") or ()) and w.get("ready_s") is not None]
        cold[kind] = float(np.mean([w["cold_start_s"] for w in ws])) if ws else 0.0
        lags = [w["released_s"] - last[w["worker"]][0] for r in steps for w in r.workers
                if last.get(w["worker"], (0, ""))[1] == kind and w.get("released_s")]
        rel[kind] = float(np.mean(lags)) if lags and arm.mode == "serverless" and arm.keep_alive_s == 0 else 0.0
    return cold, rel


# ---- the model -------------------------------------------------------------------------------------------
def predict(arm: Arm, steps: list[StepRec], c: Constants) -> list[Split]:
    """`steps` played by the arm's rules (docs/internals.md#simarmmodelpy). Every recorded step before the last of
    them is played too, in order (unreported): the workers kept warm into a step and the pre-warm history come from the
    steps before it, not from the previous one asked for (`steps` are alternate steps)."""
    asked = {r.step: r for r in steps}
    play = {**{r.step: r for r in arm.steps if r.step <= max(asked, default=0)}, **asked}
    history: list[float] = []
    kept: list[float] = []
    out: dict[int, Split] = {}
    for n in sorted(play):
        if arm.mode == "serverful":
            out[n] = _serverful_step(arm, play[n], c)
        else:
            out[n], kept = _serverless_step(arm, play[n], c, history, kept)
    return [out[r.step] for r in steps]


def _decode_s(arm: Arm, r: StepRec, inv: Inv, c: Constants) -> float:
    return float(np.dot(decode_features(arm, r, inv, c.ctx), c.decode))


def _compute_s(arm: Arm, work: StepWork, groups: list[int], c: Constants) -> float:
    return float(np.dot(learn_features(arm, work, groups), c.learn))


def _serverful_step(arm: Arm, r: StepRec, c: Constants) -> Split:
    ends = {i.worker: _decode_s(arm, r, i, c) for i in r.decode}
    ranks = rank_groups(arm, len(r.work.groups))
    comp = [_compute_s(arm, r.work, gs, c) for gs in ranks]
    if arm.overlap and len(ranks) == len(r.decode):
        # rank k is pool worker k; its groups are the ones it decoded (both contiguous by index)
        starts = [ends[i.worker] + c.gap_s for i in sorted(r.decode, key=lambda i: min(i.groups, default=0))]
    else:
        starts = [max(ends.values()) + c.gap_s] * len(ranks)
    learn_end = max(s + x for s, x in zip(starts, comp)) + c.opt_s
    period = learn_end + c.driver_s
    # busy as the meter counts it: each rank's compute intervals and its optimiser step, not its wait
    busy = {"decode": sum(ends.values()), "learner": sum(comp) + len(ranks) * c.opt_s}
    return Split(period, arm.units * period, 0.0, busy, learn_end, max(ends.values()))  # the pool: W x period


def _serverless_decode(arm: Arm, r: StepRec, c: Constants, warm: int) -> tuple[dict[int, float], list[float],
                                                                                 float, int]:
    """The step's decode functions at 0, the `warm` ones with the lowest groups kept from the last step (no cold
    start), the rest cold: (finish time of each group, each function's decode end, busy seconds, cold ones). A
    group is streamed when its last sequence ends (the planner's time model)."""
    tm = c.time_model(arm.capacity)
    finish: dict[int, float] = {}
    ends, busy = [], 0.0
    for k, inv in enumerate(sorted(r.decode, key=lambda i: min(i.groups, default=0))):
        cold = 0.0 if k < warm else c.cold_s["decode"]
        jobs = _jobs([(g, r.work.groups[g]) for g in inv.groups])
        cap = max(arm.capacity, max(j.n_seqs for j in jobs))
        for gid, t in job_finish_s(assign(jobs, 1, cap, tm, "contiguous")[0], jobs, tm).items():
            finish[int(gid)] = cold + c.decode[0] + t
        d = _decode_s(arm, r, inv, c)
        busy += d
        ends.append(cold + d)
    return finish, ends, busy, max(0, len(ends) - warm)


def _serverless_step(arm: Arm, r: StepRec, c: Constants, history: list[float], kept: list[float]
                     ) -> tuple[Split, list[float]]:
    """One step (docs/internals.md#simarmmodelpy) from the workers kept alive into it (`kept`: each one's idle-since
    instant, on this step's clock, so <= 0); returns it and the idle-since instants of the workers alive at its end."""
    n = len(r.decode)
    warm = min(len(kept), n)
    finish, ends, dec_busy, dec_cold = _serverless_decode(arm, r, c, warm)
    rollout = max(ends)
    ranks = rank_groups(arm, len(r.work.groups))
    expected = planned_start_s(r.predicted_makespan_s, history)
    prewarm_at = lifecycle.prewarm_start_s(expected, c.cold_s["learner"], arm.prewarm_buffer_s) if arm.prewarm else float("inf")
    if r.predicted_makespan_s > 0:  # the runtime's history: measured (here: played) rollout over the plan's
        history.append(rollout / r.predicted_makespan_s)
        del history[:-PREWARM_HISTORY]
    surplus = kept[warm:] if arm.hybrid else []  # warm beyond the decode need: idle, their keep-alive running
    start, cold_rank, holder = learner_ranks(arm, ranks, finish, ends, prewarm_at, surplus, c.release_s["decode"])
    ready = [t + (c.cold_s["learner"] if cold else 0.0) for t, cold in zip(start, cold_rank)]
    comp, comp_end = [], []
    for gs, t in zip(ranks, ready):
        x = 0.0
        for g in sorted(gs, key=lambda g: finish.get(g, rollout)):  # in the order they arrive
            dt = _compute_s(arm, r.work, [g], c)
            t, x = max(t, finish.get(g, rollout)) + dt, x + dt
        comp.append(x)
        comp_end.append(t)
    learn_end = max(comp_end) + c.opt_s
    period = learn_end + c.driver_s
    # a rank's share is in after its end interval (`opt_s`, counted busy for every rank below, as the meter counts
    # each rank's learner end) from its last group's compute or the rollout's end (`end` is sent then)
    shares = [max(t, rollout) + c.opt_s for t in comp_end]
    billed, carry = _bill(arm, c, ends, surplus, holder, start, learn_end, period, shares)
    cold = dec_cold * c.cold_s["decode"] + sum(cold_rank) * c.cold_s["learner"]
    # busy as the meter counts it: a rank's compute intervals and its optimiser step, never its wait for groups
    split = Split(period, billed, cold, {"decode": dec_busy, "learner": sum(comp) + len(ranks) * c.opt_s},
                  learn_end, rollout)
    return split, carry


def _bill(arm: Arm, c: Constants, ends: list[float], surplus: list[float], holder: list[tuple[str, int]],
          start: list[float], learn_end: float, period: float, shares: list[float]) -> tuple[float, list[float]]:
    """The step's billed seconds (every worker from its spawn, a kept one from the step's start, to its release or
    the step's end) and the idle-since instants of the workers alive at the next step's start, on its clock.
    Keep-alive is an event: an idle worker is released the instant its keep-alive lapses (`Pool.expire`), mid-step
    included; with keep-alive 0 at its last invocation's end plus the release lag. Separate images: every rank but
    the reducer (`plan.ranks.reducer`: the last share in, of `shares`, each rank's share time) ends its invocation
    at its share and is let go there (`plan.lifecycle.let_go`, as `LearnerStream._shared`); the reducer steps and
    is held to the learner's end. The hybrid image's ranks are held to the learner's end."""
    keep = arm.keep_alive_s

    def life(since: float, lag: float) -> tuple[float, list[float]]:  # billed to, and carried (idle since)
        if keep == 0:
            return min(period, since + lag), []
        return (period, [since - period]) if since + keep > period else (since + keep, [])

    taken = {h: k for k, h in enumerate(holder)}
    rank_end, carry = life(learn_end, c.release_s["learner"])
    # the runtime asks let_go of the next learner work after the share; `read_arm` refuses separate images kept
    # alive, so with keep-alive 0 the answer is "go" whatever that work is (passed as unknown)
    go = not arm.hybrid and lifecycle.let_go(None, c.cold_s["learner"], keep)
    last = reducer(sorted(range(len(holder)), key=lambda k: (shares[k], k))) if go and holder else -1
    billed = 0.0
    for k, h in enumerate(holder):  # a rank's worker held from its start (or the step's) to its share or the end
        end = life(shares[k], c.release_s["learner"])[0] if go and k != last else rank_end
        billed += end - (start[k] if h[0] == "new" else 0.0)
    carry = carry * (1 if go else len(holder))  # let go at their share: only the reducer can be kept
    for src, idle in (("decode", ends), ("kept", surplus)):
        for j, since in enumerate(idle):
            if (src, j) not in taken:  # never a rank: idle from its end (or the last step) to its lapse
                to, more = life(since, c.release_s["decode"])
                billed += max(0.0, to)
                carry += more
    return billed, carry


def learner_ranks(arm: Arm, ranks: list[list[int]], finish: dict[int, float], ends: list[float], prewarm_at: float,
                  kept: list[float] = (), release_s: float = 0.0) -> tuple[list[float], list[bool],
                                                                            list[tuple[str, int]]]:
    """Each rank's start, whether it starts cold, and the worker it runs on: ("decode", j) a decode function
    that went on as it, ("kept", i) a warm worker beyond the decode need (`kept`: their idle-since instants),
    ("new", k) a function started for it. The runtime's rules (`LearnerStream`), in time order:
      * a decode function's end (hybrid): it becomes the free rank with the most finished groups if a rank has
        finished groups waiting now (`take`); else it idles (keep-alive 0: released at its end plus `release_s`,
        its unit free then) until a rank takes it or its keep-alive lapses (its unit free then);
      * a rank's first finished group: it takes an idle warm worker (the most recently idle), else a cold start
        onto a free unit, else it waits (for a decode function's end or a unit);
      * the pre-warm time: every rank still without a worker starts cold onto a free unit, in rank order, and so
        does any later unit freed while one waits;
      * the rollout's end: every rank has its groups.
    A decode end comes first on a tie (the runtime takes before it pumps)."""
    import heapq

    keep, rollout = arm.keep_alive_s, max(ends)
    work = [min([finish.get(g, rollout) for g in gs] + [rollout]) for gs in ranks]
    start: list[float | None] = [None] * len(ranks)
    cold, holder = [False] * len(ranks), [("new", k) for k in range(len(ranks))]
    idle = {("kept", i): t for i, t in enumerate(kept) if keep > 0 and t + keep > 0}  # worker -> idle since
    free = [0.0] * max(0, arm.units - len(ends) - len(kept))
    events = [(e, 0, "end", j) for j, e in enumerate(ends)] + [(w, 1, "work", k) for k, w in enumerate(work)]
    events += [(i + keep, 2, "lapse", ("kept", j)) for j, i in enumerate(kept) if ("kept", j) in idle]
    events += [(prewarm_at, 3, "prewarm", 0)] if np.isfinite(prewarm_at) else []
    heapq.heapify(events)
    prewarm_due = False

    def begin(k: int, t: float, h: tuple[str, int], is_cold: bool) -> None:
        start[k], cold[k], holder[k] = t, is_cold, h

    def cold_starts(t: float, ks: list[int]) -> None:
        for k in ks:
            if not free or free[0] > t:
                return
            free.pop(0)
            begin(k, t, ("new", k), True)

    while events and any(x is None for x in start):
        t, _, what, x = heapq.heappop(events)
        has_work = [k for k in range(len(ranks)) if start[k] is None and work[k] <= t]
        if what == "end" and arm.hybrid and has_work:
            begin(max(has_work, key=lambda k: (sum(finish.get(g, np.inf) <= t for g in ranks[k]), -k)), t,
                  ("decode", x), False)
        elif what == "end":  # no work for it now: idle, released at its lapse (keep-alive 0: at its end + lag)
            if arm.hybrid and keep > 0:
                idle[("decode", x)] = t
                heapq.heappush(events, (t + keep, 2, "lapse", ("decode", x)))
            else:
                heapq.heappush(events, (t + (release_s if keep == 0 else rollout - t), 2, "free", 0))
        elif what == "lapse" and x in idle and idle[x] + keep <= t:
            del idle[x]
            heapq.heappush(events, (t, 2, "free", 0))
        elif what == "free":
            free.append(t)
            free.sort()
        prewarm_due = prewarm_due or what == "prewarm"
        for k in sorted(has_work, key=lambda k: (work[k], k)):  # ranks with groups waiting: warm first, else cold
            if start[k] is None and idle:
                h = max(idle, key=lambda w: idle[w])
                del idle[h]
                begin(k, t, h, False)
            elif start[k] is None:
                cold_starts(t, [k])
        if prewarm_due:
            cold_starts(t, [k for k in range(len(ranks)) if start[k] is None])
    for k in range(len(ranks)):  # no unit came (not within the units budget): idle capacity evicted at the end
        if start[k] is None:
            begin(k, rollout, ("new", k), True)
    return [float(t) for t in start], cold, holder


# ---- the record, split the same way ----------------------------------------------------------------------
def measure(arm: Arm, r: StepRec) -> Split:
    """The step's measured period, bill and split (cold starts of the workers it started; busy: invocation spans,
    a learner rank's compute intervals where it reports them, as the meter counts it)."""
    busy = {"decode": sum(i.finished - i.started for i in r.decode),
            "learner": sum(i.finished - i.started if i.busy_s is None else i.busy_s for i in r.learner)}
    cold = sum(float(w["cold_start_s"]) * float(w.get("units") or 1.0) for w in r.workers
               if w.get("ready_s") is not None)
    learn_end = max((i.finished for i in r.learner), default=r.t0) - r.t0
    rollout = max((i.finished for i in r.decode), default=r.t0) - r.t0
    return Split(r.period if r.period is not None else float("nan"), r.billed, cold, busy, learn_end, rollout)


# ---- the report ------------------------------------------------------------------------------------------
ARMS = ("serverful", "serverful-overlap", "serverless")


def arm_dirs(run_dir: str | Path) -> dict[str, Path]:
    """The arms of a comparison dir that carry runtime records (empty for any other dir)."""
    p = Path(run_dir)
    return {a: p / a for a in ARMS if RunDir(p / a).workers.is_file() and RunDir(p / a).invocations.is_file()}


def split_steps(steps: list[StepRec]) -> tuple[list[StepRec], list[StepRec]]:
    """(calibration, validation): alternate steps. The neighbours' load on shared cores drifts over minutes (up to
    2x in step time within one arm here), so a first-half/second-half split would validate the load, not the
    model; alternate steps see the same load."""
    if len(steps) < 4:
        raise DataError(f"validate: {len(steps)} steps; need >= 4 to calibrate on alternate steps")
    return steps[0::2], [r for r in steps[1::2] if r.period is not None]


def _row(sim: float, meas: float, billed: float | None = None) -> dict:
    out = {"simulated": sim, "measured": meas, "rel_error": abs(sim / meas - 1.0) if meas else float("nan")}
    if billed:  # a component's error as a share of the step's measured bill: what it adds to the cost error
        out["of_billed"] = (sim - meas) / billed
    return out


def compare_splits(sim: list[Split], meas: list[Split]) -> dict:
    """Mean per step of the period, the bill and its split, simulated against measured."""
    def mean(xs, f):
        return float(np.mean([f(x) for x in xs]))

    billed = mean(meas, lambda s: s.billed)
    kinds = sorted({k for s in sim + meas for k in s.busy})
    return {
        "step_time_s": _row(mean(sim, lambda s: s.period), mean(meas, lambda s: s.period)),
        "cost_device_s": _row(mean(sim, lambda s: s.billed), billed),
        "core_s_per_step": {
            "cold_start": _row(mean(sim, lambda s: s.cold), mean(meas, lambda s: s.cold), billed),
            "busy": {k: _row(mean(sim, lambda s: s.busy.get(k, 0.0)), mean(meas, lambda s: s.busy.get(k, 0.0)),
                             billed) for k in kinds},
            "held_idle": _row(mean(sim, lambda s: s.held_idle), mean(meas, lambda s: s.held_idle), billed)},
        "rollout_s": _row(mean(sim, lambda s: s.rollout), mean(meas, lambda s: s.rollout)),
        "learner_end_s": _row(mean(sim, lambda s: s.learn_end), mean(meas, lambda s: s.learn_end)),
    }


def load_factors(sim: list[Split], meas: list[Split]) -> list[float]:
    """Per step: its measured decode seconds over the model's for the same groups: how much slower the machine
    ran that step than on the calibration steps (1.3: 30% slower), read off the one stage the model predicts from
    the trace alone. On shared cores the neighbours' load moves it by +-35% from step to step (docs/simulator.md).
    Pure."""
    return [m.busy["decode"] / s.busy["decode"] if s.busy.get("decode") else 1.0 for s, m in zip(sim, meas)]


def at_measured_load(sim: list[Split], meas: list[Split]) -> dict:
    """The error term the machine's load accounts for: each step's prediction scaled by its `load_factors`
    (everything on a loaded core slows alike, to a first approximation) against the measurement. What remains is
    the model's own error; what it removes is load the calibration steps did not see. An explanation, never the
    prediction: the factor is read from the step being predicted."""
    f = load_factors(sim, meas)

    def mean(xs):
        return float(np.mean(xs))

    return {"decode_load_factor": f,
            "step_time_s": _row(mean([s.period * x for s, x in zip(sim, f)]), mean([m.period for m in meas])),
            "cost_device_s": _row(mean([s.billed * x for s, x in zip(sim, f)]), mean([m.billed for m in meas]))}


def validate_arm(arm: Arm, calib: Arm | None = None) -> dict:
    """One arm: constants from `calib` (all its steps) or from alternate steps of `arm`; the rest played and
    compared."""
    steps = list(arm.steps)
    cal, val = (list(calib.steps), [r for r in steps if r.period is not None]) if calib else split_steps(steps)
    c = fit_constants(calib or arm, cal)
    sim, meas = predict(arm, val, c), [measure(arm, r) for r in val]
    rep = {**compare_splits(sim, meas), "at_measured_load": at_measured_load(sim, meas)}
    return {"arm": arm.name, "mode": arm.mode, "overlap": arm.overlap, "units": arm.units,
            "learner_ranks": arm.learners, "steps_calibrated": len(cal), "steps_validated": len(val),
            "calibrated_on": f"{calib.name} (another run)" if calib else "alternate steps (1, 3, 5, ...)",
            "constants": {"cold_start_s": c.cold_s, "release_lag_s": c.release_s,
                          "decode_fixed_s": c.decode[0], "decode_s_per_iter": c.decode[1],
                          "decode_s_per_byte": c.decode[2], "learn_s_per_group": c.learn[0],
                          "learn_s_per_token": c.learn[1], "gap_s": c.gap_s, "opt_s": c.opt_s,
                          "driver_s": c.driver_s},
            **rep}


def validate_arms(run_dir: str | Path, calibrate_from: str | Path | None = None) -> dict[str, dict]:
    """Every arm of a comparison dir (`arm_dirs`), by name; an arm the model cannot play (a prefill or reference
    function, too few steps) is {"arm", "skipped": why}, not a failure of the others."""
    other = arm_dirs(calibrate_from) if calibrate_from else {}
    out = {}
    for a, p in arm_dirs(run_dir).items():
        try:
            out[a] = validate_arm(read_arm(p), read_arm(other[a]) if a in other else None)
        except DataError as exc:
            out[a] = {"arm": a, "skipped": str(exc)}
    return out
