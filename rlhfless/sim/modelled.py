"""The simulator's prediction of a run on emulated devices (`runtime.device=emulated`), step by step and per role.

`validate_emulated(run_dir)` plays each step from the run's recorded decisions with the simulator's durations
(`sim.perf.PerfModel`, its time model and KV capacity) and puts the period and billed device-seconds per role
beside what the runtime measured and billed (divided by `runtime.time_scale`), term by term. The rule it keeps:
decisions come from the record, durations from the model, never the other way round. Decisions, durations, billing
and PPO's play: docs/internals.md#simmodelledpy.
`modelled_report(out, arms, scale)` is what a comparison on emulated devices reports (its `modelled` block): every
arm per step in modelled seconds, its bill split into cold starts, busy and held idle, by role.
Non-goals: migrations (a step with migrated rows is played without them), retries.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError
from rlhfless.plan import PlanJob, assign
from rlhfless.plan.balancer import job_finish_s
from rlhfless.core.rundir import RunDir
from rlhfless.sim.workload import GroupWork, StepWork, replay_trace

KINDS = ("decode", "learner")
PPO_KINDS = ("decode", "learner", "values", "critic")
"""The billed roles validated: GRPO's, and PPO's (the actor is the learner; the critic image runs values then
critic)."""


def _perf(run: Path, paper: bool = False):
    """The run's engine (`sim.devicemodel.engine_of`: with `paper`, a serverful pool of the paper's verl), whether
    its ranks leave at their share and spend the exchange, and its functions' TP (`runtime.emulated_tp`)."""
    from rlhfless.sim.devicemodel import LengthTable, engine_of

    p = RunDir(run).emulated_lengths
    if not p.is_file():
        raise DataError(f"validate: {p} not found (a runtime.device=emulated run writes it)")
    t = LengthTable.load(p)
    return engine_of(t, paper), t.shares, t.exchange, t.tp


def _decode(tm, cap: int, work: StepWork, groups: list[int]) -> tuple[float, dict[int, float]]:
    """(busy seconds, finish time of each group) of one decode function's groups: the planner's time model."""
    jobs = [PlanJob(str(g), len(work.groups[g].lengths), tuple(float(x) for x in work.groups[g].lengths),
                    work.groups[g].prompt_len) for g in groups]
    if not jobs:
        return 0.0, {}
    c = max(cap, max(j.n_seqs for j in jobs))
    plan = assign(jobs, 1, c, tm, "contiguous")[0]
    return float(plan.makespan_s), {int(k): v for k, v in job_finish_s(plan, jobs, tm).items()}


def _kept(g: GroupWork, skip: bool) -> bool:
    return not skip or not g.rewards or len(set(g.rewards)) > 1


def _cold_ready(run: dict, i: dict, rel, engine: bool) -> float:
    """When an invocation's function can start it: its request, or, on its first use, the end of its cold start,
    which runs from its spawn (`runtime.devices.emulated.Clock`: earlier than the request when it was pre-warmed)."""
    t = rel(i["requested_s"])
    if i["cold"]:
        spawned = run.get("spawn", {}).get(i["worker"], i["requested_s"])
        t = max(t, rel(spawned) + _cold_s(run, i["kind"], i["step"], engine))
    return t


def _cold_s(run: dict, first_kind: str, step: int, engine: bool) -> float:
    """A function's modelled cold start (`sim.devicemodel.cold_start_s`): a GRPO learner rank started in a step
    after the first (first invoked as a learner then) resumes a trained policy and reads its optimiser shard."""
    from rlhfless.sim.devicemodel import cold_start_s

    resumes = run["algo"] == "grpo" and first_kind == "learner" and step > 1
    return cold_start_s(run["pm"], ("decode",) if engine else (), run["learners"] if resumes else 0)


def _play_decode(run: dict, work: StepWork, dec: list[dict], rel, serverful: bool) -> tuple[dict, dict, dict]:
    """The step's decode functions: (finish time of each group, each function's end, each worker's span)."""
    pm = run["pm"]
    finish: dict[int, float] = {}
    ends, spans = {}, {}
    for i in dec:
        start = _cold_ready(run, i, rel, engine=True)
        if not i["cold"] and i["extra"].get("sync_s", 0) > 0:  # a warm replica behind: serverless over the
            start += pm.weight_sync_s(colocated=serverful)  # network; a PPO pool worker reshards from the actor
        busy, fin = _decode(run["tm"], run["cap"], work, i["groups"])
        finish.update({g: start + t for g, t in fin.items()})
        ends[i["worker"]] = start + busy
        spans[i["worker"]] = [rel(i["requested_s"]), start + busy, "decode"]
    return finish, ends, spans


def _play_learner(run: dict, work: StepWork, lrn: list[dict], rel, finish: dict, ends: dict, spans: dict,
                  overlap: bool) -> list[float]:
    """Each rank's compute end: its groups in arrival order (overlap) or after the rollout, from its ready time
    (a hybrid rank: its own decode's end). Adds the ranks to `spans`."""
    pm, rollout = run["pm"], max(ends.values())
    out = []
    for i in lrn:
        t = max(_cold_ready(run, i, rel, engine=bool(run["hybrid"])), ends.get(i["worker"], 0.0))
        for g in sorted(i["groups"], key=lambda g: finish.get(g, rollout)):
            gw = work.groups[g]
            work_s = pm.learner_s_per_token("grpo") * gw.tokens / pm.tp if _kept(gw, run["skip_zero"]) else 0.0
            t = max(t, finish.get(g, rollout) if overlap else rollout) + work_s
        out.append(t)
        first = spans.get(i["worker"], [rel(i["requested_s"]), 0.0, "learner"])[0]
        spans[i["worker"]] = [first, t, "learner" if i["worker"] not in ends else "hybrid"]
    return out


def _bill(spans: dict, ends: dict, learn_end: float, keep: float, released: frozenset,
          shares: bool = False, early: frozenset = frozenset(), cut: dict | None = None, exchange_s: float = 0.0
          ) -> tuple[dict[str, float], dict[str, float]]:
    """Serverless device-seconds by role (docs/internals.md#simmodelledpy): each worker from its request to its last
    invocation's end (a rank's: the optimiser step's; with `shares`, a rank but the reducer's: its share, the end
    of its groups or of the rollout, whichever is later: the share needs every reward, plus its part of the
    gradient exchange `exchange_s`), plus the keep-alive when
    released in the step (none when released at its share: `early`; to its release, if sooner, when the runtime let
    it go for another reason: `cut`, modelled seconds), to the step's end when kept alive; a hybrid worker's time is
    decode's to its decode end, the learner's after. Returns (billed by role, each kept worker's keep-alive lapse)."""
    billed = {k: 0.0 for k in KINDS}
    lapse: dict[str, float] = {}
    cut = cut or {}
    ranks = [w for w, (_, _, role) in spans.items() if role != "decode"]
    reducer = max(ranks, key=lambda w: spans[w][1]) if ranks else None  # the last share in steps
    rollout = max(ends.values(), default=0.0)  # learn_end (with every reward: the normaliser) follows the rollout
    for worker, (a, b, role) in spans.items():
        if role != "decode":
            b = learn_end if not shares or worker == reducer else max(b, rollout) + exchange_s
        end = _end(worker, b, learn_end, keep, released, early, cut)
        if worker not in released:
            lapse[worker] = b + keep
        if role == "hybrid":
            billed["decode"] += ends[worker] - a
            billed["learner"] += end - ends[worker]
        else:
            billed[role] += end - a
    return billed, lapse


def _end(worker: str, last: float, learn_end: float, keep: float, released: frozenset, early: frozenset,
         cut: dict) -> float:
    """Where a worker's bill ends in its step: at its last invocation's end when released at its share; at its
    release (no later than its keep-alive's lapse) when released for another reason than a lapse (evicted for a
    unit, a new learner group: decisions, read from the record); at the lapse when it lapsed in the step; at the
    step's end when kept alive past it (and at its last end with no keep-alive)."""
    if worker in early:
        return last
    if worker in cut:
        return min(last + keep, max(last, cut[worker]))
    if worker in released:
        return last + keep
    return learn_end if keep > 0 else last


def _held(alive: dict, mine: dict, learn_end: float, carry: dict, gone_at: dict, cut: dict,
          billed: dict) -> dict[str, float]:
    """The workers held at the step's start (kept alive from the last step, or pre-warmed in it): billed from the
    step's start, to the role of their last invocation (the meter's rule: idle after work is that work's
    keep-alive). One invoked in the step (`mine`: its first request), to that request; one not invoked, to its
    keep-alive's lapse (carried from the step it was last invoked in: `carry`, modelled seconds from this step's
    start; the recorded release when none was carried), to its release when let go sooner for another reason
    (`cut`), or to the step's end when still held. Adds to `billed`; returns the lapses carried on."""
    nxt: dict[str, float] = {}
    for w, (role, units) in alive.items():
        if w in mine:
            billed[role] = billed.get(role, 0.0) + max(0.0, mine[w]) * units
            continue
        lapse = carry.get(w)
        if w in gone_at:
            end = gone_at[w] if lapse is None else min(cut[w], lapse) if w in cut else lapse
        else:
            end = learn_end
            if lapse is not None:
                nxt[w] = lapse - learn_end
        billed[role] = billed.get(role, 0.0) + min(max(0.0, end), learn_end) * units
    return nxt


def _chunks(n_groups: int, G: int, chunk_seqs: int) -> list[list[int]]:
    """The value forward's chunks (`learn.critic.value_chunks`, restated: sim/ imports no torch)."""
    m = max(1, chunk_seqs // G) if chunk_seqs else n_groups
    return [list(range(k, min(k + m, n_groups))) for k in range(0, n_groups, m)]


def _play_ppo(run: dict, work: StepWork, invs: list[dict], rel, finish: dict, ends: dict, serverful: bool,
              overlap: bool) -> tuple[float, dict[str, float]]:
    """PPO after the rollout (`runtime.ppo_stages`), with the emulated worker's durations (`sim.devicemodel.ppo_split`,
    `ppo_update_s`): the value function's chunks (sent as their groups finish with overlap, else after the rollout),
    the actor's old log-probs ahead from the rollout's end (one rank) or split across its ranks, the actor's update
    once the values are in (its returns, then its training and optimiser steps), the critic's once the returns are.
    With several ranks a role starts when its last rank is ready (its group's all-reduce is a barrier) and a worker
    holding an actor rank and a critic rank (the serverful pool) runs them in turn. Returns (the step's learn end,
    each invocation's predicted end by worker and kind)."""
    from rlhfless.sim.devicemodel import ppo_split, ppo_update_s

    pm, rollout, W = run["pm"], max(ends.values()), run.get("ppo_world", 1)
    fwd, _ = ppo_split(pm)
    tok = sum(g.tokens for g in work.groups)
    update = ppo_update_s(pm, tok, W, run["ppo_epochs"], run["ppo_steps"])
    v = next(i for i in invs if i["kind"] == "values")
    actors = [i for i in invs if i["kind"] == "learner"]
    critics = [i for i in invs if i["kind"] == "critic"]

    def ready(i: dict, engine: bool) -> float:
        t = max(_cold_ready(run, i, rel, engine), ends.get(i["worker"], 0.0))  # a hybrid take: after its decode
        return t + (pm.weight_sync_s(colocated=serverful) if i["extra"].get("sync_s", 0) > 0 else 0.0)

    t = ready(v, engine=False)
    for gs in _chunks(len(work.groups), work.groups[0].n if hasattr(work.groups[0], "n") else
                      len(work.groups[0].lengths), run["values_chunk"]):
        sent = max(finish.get(g, rollout) for g in gs) if overlap else rollout
        t = max(t, sent) + fwd * sum(work.groups[g].tokens for g in gs)
    values_end = max(t, rollout)
    ta = max(max(ready(a, engine=bool(run["hybrid"])) for a in actors), rollout)
    if any(a["extra"].get("old_ahead") for a in actors):  # one rank: its forward ran beside the value function
        returns = max(values_end, ta + fwd * tok)
    else:
        returns = max(values_end, ta) + fwd * tok / W
    actor_end = returns + update + (pm.weight_sync_s(colocated=True) if serverful else 0.0)
    # a critic rank on a worker that also held an actor rank starts after it (one request at a time)
    after = {a["worker"]: actor_end for a in actors}
    critic_start = max(max(ready(c, engine=False), after.get(c["worker"], 0.0)) for c in critics)
    critic_end = max(returns, values_end, critic_start) + update
    end_of = {(v["worker"], "values"): values_end}
    end_of.update({(a["worker"], "learner"): actor_end for a in actors})
    end_of.update({(c["worker"], "critic"): critic_end for c in critics})
    return max(actor_end, critic_end), end_of


def _bill_segments(invs: list[dict], rel, end_of: dict, learn_end: float, keep: float, released: frozenset,
                   start_of: dict, cut: dict | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Serverless device-seconds by role, as the meter splits a multi-kind worker (`meter.role_split`): each instant
    to the kind of its last invocation requested by then; a worker from its start (its first request, or its spawn
    when pre-warmed in the step) to its last invocation's end, plus the keep-alive when released in the step (to its
    release, if sooner, when let go for another reason: `cut`), to the step's end when kept alive. Returns (billed
    by role, each kept worker's keep-alive lapse)."""
    billed: dict[str, float] = {}
    lapse: dict[str, float] = {}
    mine: dict[str, list[dict]] = {}
    for i in invs:
        mine.setdefault(i["worker"], []).append(i)
    for w, xs in mine.items():
        xs.sort(key=lambda i: i["requested_s"])
        last = max(end_of.get((w, _role(i["kind"])), rel(i["finished_s"])) for i in xs)
        end = _end(w, last, learn_end, keep, released, frozenset(), cut or {})
        if w not in released:
            lapse[w] = last + keep
        cuts = [min(start_of.get(w, rel(xs[0]["requested_s"])), rel(xs[0]["requested_s"]))] + \
            [rel(i["requested_s"]) for i in xs[1:]] + [end]
        for i, a, b in zip(xs, cuts, cuts[1:]):
            billed[_role(i["kind"])] = billed.get(_role(i["kind"]), 0.0) + max(0.0, b - a)
    return billed, lapse


def _role(kind: str) -> str:
    return "decode" if kind == "reward" else kind


def _ahead(spawned_next: dict, rel, learn_end: float) -> float:
    """Device-seconds of the functions pre-warmed in this step for the next one (a decision, from the record:
    spawned in the step's window, first invoked in a later step), billed from their spawn to the step's end."""
    return sum(max(0.0, learn_end - rel(t)) * u for t, u in spawned_next.values())


def predict_step(run: dict, work: StepWork, invs: list[dict], scale: float, t0: float,
                 released: frozenset = frozenset(), spawned: dict | None = None,
                 spawned_next: dict | None = None, early: frozenset = frozenset(), held: dict | None = None) -> dict:
    """One step played (docs/internals.md#simmodelledpy); every time in modelled seconds from the step's first decode
    request. `released`: the workers the runtime released within the step (a decision, read from the record): each is
    billed to its last invocation's end plus the keep-alive, as a platform whose idle timeout is an event bills it
    (the runtime's difference is the `release_lag_s` term); the others are held to the step's end when kept
    alive. `held` (decisions, from the record): `alive`, the workers held at the step's start ({worker: (the role
    their idle bills to, units)}), billed from the step's start (`_held`); `gone_at`, the modelled instant each
    released worker went, and `cut`, those let go for another reason than a lapse or their share; `carry`, the
    keep-alive lapses carried from the previous step's play. The result's `carry` is this step's, for the next."""
    pm, rt, spawned, held = run["pm"], run["rt"], spawned or {}, held or {}
    rel = lambda t: (t - t0) / scale  # noqa: E731 (a record's real time -> modelled seconds into the step)
    keep = float(rt.get("keep_alive_s") or 0.0) / scale
    cut = {w: rel(t) for w, t in held.get("cut", {}).items()}
    serverful = rt.get("mode") == "serverful"
    finish, ends, spans = _play_decode(run, work, [i for i in invs if i["kind"] == "decode"], rel, serverful)
    rollout = max(ends.values())
    overlap = bool(rt.get("overlap")) if rt.get("overlap") is not None else not serverful
    if run["algo"] == "ppo":
        learn_end, end_of = _play_ppo(run, work, invs, rel, finish, ends, serverful, overlap)
        end_of.update({(w, "decode"): e for w, e in ends.items()})
        out = {"period": learn_end, "rollout": rollout, "learn_end": learn_end}
        if serverful:
            return {**out, "billed": len({i["worker"] for i in invs}) * pm.tp * learn_end, "by_role": None}
        billed, lapse = _bill_segments(invs, rel, end_of, learn_end, keep, released,
                                       {w: rel(t) for w, t in spawned.items()}, cut)
        billed = {k: v * pm.tp for k, v in billed.items()}  # a function of TP units is billed each of them
    else:
        rank_end = _play_learner(run, work, [i for i in invs if i["kind"] == "learner"], rel, finish, ends, spans,
                                 overlap)
        opt = pm.update_fixed_s("grpo") + (pm.weight_sync_s(colocated=True) + run["kv_s"] if serverful else 0.0)
        # every rank's share (serverless) or the pool's all-reduce carries the exchange before the step
        learn_end = max(rank_end, default=rollout) + run["exchange_s"] + opt
        out = {"period": learn_end, "rollout": rollout, "learn_end": learn_end}
        if serverful:  # the pool: W replicas of TP units x the period
            return {**out, "billed": len({i["worker"] for i in invs}) * pm.tp * learn_end, "by_role": None}
        billed, lapse = _bill(spans, ends, learn_end, keep, released, run.get("shares", False), early, cut,
                              run["exchange_s"])
        billed = {k: v * pm.tp for k, v in billed.items()}  # a function of TP units is billed each of them
    billed["decode"] = billed.get("decode", 0.0) + _ahead(spawned_next or {}, rel, learn_end)
    first: dict[str, float] = {}
    for i in invs:
        first[i["worker"]] = min(first.get(i["worker"], float("inf")), rel(i["requested_s"]))
    carry = _held(held.get("alive", {}), first, learn_end, held.get("carry", {}),
                  {w: rel(t) for w, t in held.get("gone_at", {}).items()}, cut, billed)
    carry.update({w: t - learn_end for w, t in lapse.items()})
    return {**out, "billed": sum(billed.values()), "by_role": billed, "carry": carry}


def validate_emulated(run_dir: str | Path, skip_first: bool = True) -> dict:
    """Predicted beside measured per step (docs/internals.md#simmodelledpy); step 1 is skipped by default (the
    platform's first cold starts and the fork server's warm-up)."""
    from rlhfless.core.configbase import load_yaml

    p = Path(run_dir)
    cfg = load_yaml(RunDir(p).config)
    rt = cfg.get("runtime") or {}
    if rt.get("device") != "emulated":
        raise DataError(f"validate: {p} is not a runtime.device=emulated run")
    scale = float(rt.get("time_scale", 1.0))
    eng, shares, exchange, fn_tp = _perf(p, rt.get("mode") == "serverful" and
                                         rt.get("emulated_engine", "tuned") == "paper")
    pm = eng.pm
    algo = cfg.get("algo") or {}
    run = {"pm": pm, "tm": eng.tm, "cap": eng.capacity, "kv_s": eng.kv_s, "rt": rt, "hybrid": rt.get("hybrid", True),
           "learners": int(rt.get("learner_units") or int(rt.get("units") or 1) // fn_tp),
           "skip_zero": bool(algo.get("skip_zero_variance_groups", False)), "algo": algo.get("name", "grpo"),
           "shares": shares and rt.get("mode") != "serverful", "exchange_s": 0.0}
    if exchange:  # each learner rank's part of the gradient all-reduce (`runtime.devices.emulated`)
        units = int(rt.get("units") or 1)
        if rt.get("mode") == "serverful":  # the pool's data-parallel group: one rank per replica of TP units
            world = int(rt.get("serverful_workers") or units // pm.tp)
        else:
            world = int(rt.get("learner_units") or units // fn_tp)  # ranks of TP units each
        run["exchange_s"] = pm.grad_exchange_s(world)
    if run["algo"] == "ppo":  # the emulated worker's optimiser steps and passes (`runtime.devices.emulated.ppo_steps`)
        rows = int((cfg.get("rollout") or {}).get("prompts_per_step", 1)) * int(algo.get("group_size", 1))
        run["ppo_world"] = int(rt.get("learner_units") or 1)  # the actor's and critic's ranks (`ppo_ranks`)
        run.update(ppo_epochs=int(algo.get("ppo_epochs", 1)), values_chunk=int((cfg.get("critic") or {}).get(
            "values_chunk", 0)), ppo_steps=int(algo.get("ppo_epochs", 1)) * min(int(algo.get("ppo_mini_batches", 1)),
                                                                                 rows))
    kinds = PPO_KINDS if run["algo"] == "ppo" else KINDS
    rd = RunDir(p)
    for f in (rd.workers, rd.invocations):  # without them the bill's terms change silently: refused, not guessed
        if not f.is_file():
            raise DataError(f"validate: {f} not found (the runtime writes it; a run folder without it cannot be "
                            "validated: copy the whole folder)")
    trace = rd.rollouts
    if trace is None:
        raise DataError(f"validate: no trace at {rd.trace}")
    work = {s.step: s for s in replay_trace(trace)}
    metrics = rd.read_step_metrics()
    workers = rd.read_workers()
    run["spawn"] = {w["worker"]: w["spawned_s"] for w in workers}
    by_step: dict[int, list[dict]] = {}
    for i in rd.read_invocations():
        if i.get("ok", True) and i.get("attempt", 1) == 1 and i["kind"] in kinds:
            by_step.setdefault(i["step"], []).append(i)
    first_step: dict[str, int] = {}
    for i in rd.read_invocations():
        first_step[i["worker"]] = min(first_step.get(i["worker"], i["step"]), i["step"])
    rows, carry, last_end = [], {}, None
    every = sorted(rd.read_invocations(), key=lambda i: i["requested_s"])
    for s in sorted(metrics):
        later = {w for w, k in first_step.items() if k > s}  # pre-warmed in step s for a later one
        if s not in work or not any(i["kind"] == "decode" for i in by_step.get(s, [])):
            continue
        invs = by_step[s]
        t0 = min(i["requested_s"] for i in invs if i["kind"] == "decode")
        m = metrics[s]
        ws = m.get("runtime/window_start_s", t0)
        end = ws + m.get("runtime/window_s", m["timing_s/step"])
        gone = frozenset(w["worker"] for w in workers if w.get("released_s") is not None and w["released_s"] < end)
        pre = {w["worker"]: w["spawned_s"] for w in workers if w.get("prewarmed") and ws <= w["spawned_s"] < end}
        mine = {i["worker"] for i in invs}
        # pre-warmed for a later step: invoked then, or never (the run ended first: its last step pre-warms too)
        nxt = {w["worker"]: (w["spawned_s"], w["units"]) for w in workers
               if ws <= w["spawned_s"] < end and w["worker"] not in mine and (w["worker"] in later or (
                   w["worker"] not in first_step and w.get("prewarmed") and "decode" in w["kinds"]))}
        early = _released_at_share(p, workers, gone & mine) if run["shares"] and run["algo"] != "ppo" else frozenset()
        held = _held_record(workers, every, ws, t0, end, carry)
        pred = predict_step(run, work[s], invs, scale, t0, gone, pre, nxt, early, held)
        carry, prev_last, this_last = pred.get("carry", {}), last_end, max(i["finished_s"] for i in invs)
        last_end = this_last
        if skip_first and s == 1:  # played for the keep-alive it carries into step 2, not validated
            continue
        meas = {"period": m["timing_s/step"] / scale, "billed": m["cost/device_seconds"] / scale,
                "by_role": {k: float(m.get(f"function/{k}/billed_s") or 0.0) / scale for k in kinds}}
        gap = max(0.0, m.get("runtime/window_s", m["timing_s/step"]) - m["timing_s/step"])
        terms = _terms(workers, invs, run, scale, ws, end, gap, float(rt.get("keep_alive_s") or 0.0), early,
                       run["algo"] == "ppo", t0, frozenset(held["cut"]))
        if rt.get("mode") == "serverful":  # the pool holds every unit through the step's unmodelled seconds
            terms["control_plane_in_step_s"] = len({i["worker"] for i in invs}) * pm.tp * (meas["period"] -
                                                                                       pred["period"])
        else:
            terms.update(_boundary_terms(workers, invs, scale, t0, end, prev_last, held))
        rows.append({"step": s, "predicted": pred, "measured": meas, "terms": terms, "released_at_share": sorted(early),
                     "step_terms": _step_terms(invs, pred, meas, scale, t0, ws + gap, end)})
    if not rows:
        raise DataError(f"validate: {p}: no step to validate (need 2 or more steps)")
    return summarize(rows, scale, rt.get("mode", "serverless"), kinds)


def _held_record(workers: list[dict], invs: list[dict], ws: float, t0: float, end: float, carry: dict) -> dict:
    """A step's decisions about the workers held across its start, from the record (real times; `predict_step`'s
    `held`): `alive`, each worker spawned before the step's window and not released before it, with the role its
    idle bills to (its last invocation's requested before the step's first request, else its image's first kind:
    `meter.role_split`) and its units; `gone_at`, the release of each worker released in the window; `cut`, those
    released for another reason than a lapse or their share (evicted for a unit, regrouped, ...)."""
    role: dict[str, str] = {}
    for i in invs:  # sorted by request: the last one before t0 wins
        if i["requested_s"] < t0:
            role[i["worker"]] = _role(i["kind"])
    alive = {w["worker"]: (role.get(w["worker"], w["kinds"][0]), float(w["units"])) for w in workers
             if w["spawned_s"] < ws and (w.get("released_s") is None or w["released_s"] >= ws)}
    gone_at = {w["worker"]: w["released_s"] for w in workers
               if w.get("released_s") is not None and ws <= w["released_s"] < end}
    cut = {w: t for w, t in gone_at.items()
           if next(x for x in workers if x["worker"] == w).get("release_reason") not in ("lapse", "share")}
    return {"alive": alive, "gone_at": gone_at, "cut": cut, "carry": carry}


def _released_at_share(run_dir: Path, workers: list[dict], gone: frozenset) -> frozenset:
    """The step's workers released by its end (`gone`) that the runtime let go at their share
    (`plan.ranks.release_after_share`), or at their invocation's end (`plan.lifecycle.release_now`, reason
    "plan"): the decision as the pool recorded it (`WorkerRecord.release_reason`).
    A run folder written before that field existed is refused, not guessed from timestamps: a guess misreads
    under load or at another time scale (issue 30); re-run it to validate it."""
    if any(w.get("released_s") is not None and w.get("release_reason") is None for w in workers):
        raise DataError(f"validate: {run_dir}: workers.jsonl records no release_reason (written before the runtime "
                        "recorded why it released a worker); re-run it: the ranks let go at their share are read "
                        "from the record, never guessed from timing")
    return frozenset(w["worker"] for w in workers
                     if w["worker"] in gone and w.get("release_reason") in ("share", "plan"))


def _step_terms(invs: list[dict], pred: dict, meas: dict, scale: float, t0: float, start: float, end: float) -> dict:
    """The step time's difference (measured - simulated), in modelled seconds, split by where the record puts it:
    * before_first_request_s: from the step's start to its first decode request (planning, the rollout's setup);
    * after_last_invocation_s: from the end of the step's last invocation to the step's end (the driver's work
      after the update: starting the next step's pre-warmed functions, releasing, bookkeeping);
    * in_step_s: the rest, between the first request and the last invocation's end (messages, process starts
      beyond the modelled cold start, requests issued late), less the model's own error there.
    All are the control plane's real seconds / scale, except the model's error inside `in_step_s`."""
    last = max(i["finished_s"] for i in invs)
    before, after = max(0.0, t0 - start) / scale, max(0.0, end - last) / scale
    return {"before_first_request_s": before, "after_last_invocation_s": after,
            "in_step_s": meas["period"] - pred["period"] - before - after}


def _terms(workers: list[dict], invs: list[dict], run: dict, scale: float, a: float, b: float, gap: float,
           keep_alive_s: float = 0.0, early: frozenset = frozenset(), billed_from_spawn: bool = False,
           t0: float | None = None, cut: frozenset = frozenset()) -> dict:
    """The control plane's share of the bill in one step's window [a, b), in modelled seconds (real / scale):
    * between_steps_s: the driver's work between the previous step and this one (logging, traces: the first `gap`
      seconds of the window), billed to every worker held then;
    * cold_start_overhead_s: cold starts beyond the modelled ones (fork, imports, the ready message) of the
      workers spawned on demand in the window (a pre-warmed one's extra start is absorbed in its wait for work);
    * release_lag_s: from a worker's last invocation's end to its release, beyond the keep-alive, for the workers
      released in the window: the shutdown message and the exit, and a keep-alive the runtime checks later than
      it lapses; a rank let go at its share (`early`) from its share, with no keep-alive; a worker let go sooner
      for another reason (`cut`: evicted for a unit, regrouped; the model bills it to that release) only past its
      keep-alive.
    * held_before_request_s: from a worker's spawn in the window (after the between-steps gap) to its first
      request: the driver's own milliseconds between the two (its starts return at once: `runtime.backend`; the
      model bills a function from its request); with
      `billed_from_spawn` (PPO's model bills a pre-warmed worker from its spawn) only the workers not pre-warmed;
      and, for a worker held across the step's start (kept alive, or pre-warmed in the last step), from the gap's
      end to the step's first request `t0` (the model bills it from `t0`: its step's start).
    All but release_lag_s are real seconds the model has no term for; that one is also where the runtime's release
    rule departs from a platform's."""
    last: dict[str, float] = {}
    for i in invs:
        last[i["worker"]] = max(last.get(i["worker"], 0.0), i["finished_s"])
    opened: dict[str, dict] = {}  # each worker's first invocation of the step (its cold one, if any)
    for i in sorted(invs, key=lambda i: i["requested_s"]):
        opened.setdefault(i["worker"], i)

    def modelled(w: dict) -> float:
        i = opened.get(w["worker"], {"kind": "decode" if "decode" in w["kinds"] else "", "step": 1})
        return _cold_s(run, i["kind"], i["step"], "decode" in w["kinds"])

    cold = sum((w["cold_start_s"] / scale - modelled(w)) * w["units"] for w in workers
               if w.get("ready_s") is not None and not w.get("prewarmed") and a <= w["spawned_s"] < b)
    def tail(w: dict) -> float:  # real seconds past what the model bills after its last invocation
        t = w["released_s"] - last[w["worker"]] - (0.0 if w["worker"] in early else keep_alive_s)
        return max(0.0, t) if w["worker"] in cut else t

    lag = sum(tail(w) * w["units"] / scale for w in workers
              if w.get("released_s") is not None and w["worker"] in last and a <= w["released_s"] < b)
    held = sum(max(0.0, min(a + gap, w.get("released_s") or float("inf")) - max(a, w["spawned_s"])) * w["units"]
               for w in workers) / scale
    first: dict[str, float] = {}
    for i in invs:
        first[i["worker"]] = min(first.get(i["worker"], float("inf")), i["requested_s"])
    before = sum(max(0.0, first[w["worker"]] - max(w["spawned_s"], a + gap)) * w["units"] for w in workers
                 if w["worker"] in first and a <= w["spawned_s"] < b and not (billed_from_spawn and w.get("prewarmed"))
                 ) / scale
    if t0 is not None:  # held across the step's start: from the gap's end to the step's first request
        before += sum(max(0.0, min(t0, w.get("released_s") or float("inf")) - (a + gap)) * w["units"]
                      for w in workers if w["spawned_s"] < a and (w.get("released_s") or float("inf")) >= a) / scale
    return {"between_steps_s": held, "cold_start_overhead_s": cold, "release_lag_s": lag,
            "held_before_request_s": before}


def _boundary_terms(workers: list[dict], invs: list[dict], scale: float, t0: float, end: float,
                    prev_last: float | None, held: dict) -> dict:
    """The control plane's seconds at the step's two boundaries that the model's step (from its first request to its
    learn end) leaves out or counts twice, in modelled seconds:
    * held_after_last_invocation_s: the workers still held at the window's end, from the step's last invocation's
      end to the window's end (the driver's work after the update; the model bills them to its learn end);
    * keep_alive_in_gap_s (negative): a worker kept from the last step that lapses in this one unused; the model
      carries its keep-alive from the last step's learn end to this step's first request with no gap between, but
      the runtime's keep-alive clock ran through the control plane's real seconds between the two (billed by the
      terms above), so the model counts them twice: a time-scale distortion, 1/scale times the driver's seconds.
    Real seconds here grow with the machine's load and are magnified by 1/scale."""
    last = max(i["finished_s"] for i in invs)
    after = sum((end - max(last, w["spawned_s"])) * w["units"] for w in workers
                if w["spawned_s"] < end and (w.get("released_s") is None or w["released_s"] >= end)) / scale
    gap = 0.0
    if prev_last is not None:
        mine = {i["worker"] for i in invs}
        for w, (_, units) in held.get("alive", {}).items():
            lapse = held.get("carry", {}).get(w)
            if w not in mine and w in held.get("gone_at", {}) and w not in held.get("cut", {}) and lapse:
                gap -= min(max(0.0, lapse), (t0 - prev_last) / scale) * units
    return {"held_after_last_invocation_s": after, "keep_alive_in_gap_s": gap}


def _err(sim: float, meas: float) -> dict:
    return {"simulated": sim, "measured": meas, "rel_error": abs(sim / meas - 1.0) if meas else float("nan")}


def summarize(rows: list[dict], scale: float, mode: str, kinds: tuple[str, ...] = KINDS) -> dict:
    """Means over the validated steps, with the unexplained remainder named: the control plane's real seconds
    (measured - simulated period), in real milliseconds per step, which the scale magnifies."""
    mean = lambda f: float(np.mean([f(r) for r in rows]))  # noqa: E731
    out = {"mode": mode, "time_scale": scale, "steps": [r["step"] for r in rows],
           "step_time_s": _err(mean(lambda r: r["predicted"]["period"]), mean(lambda r: r["measured"]["period"])),
           "cost_device_s": _err(mean(lambda r: r["predicted"]["billed"]), mean(lambda r: r["measured"]["billed"]))}
    if mode != "serverful":
        out["by_role"] = {k: _err(mean(lambda r: r["predicted"]["by_role"].get(k, 0.0)),
                                  mean(lambda r: r["measured"]["by_role"].get(k, 0.0))) for k in kinds}
    names = sorted({k for r in rows for k in r["terms"]})
    out["cost_terms_device_s"] = {k: mean(lambda r: r["terms"].get(k, 0.0)) for k in names}
    out["cost_terms_device_s"]["unexplained"] = (out["cost_device_s"]["measured"] - out["cost_device_s"]["simulated"]
                                                 - sum(out["cost_terms_device_s"].values()))
    out["step_time_terms_s"] = {k: mean(lambda r: r["step_terms"][k]) for k in rows[0]["step_terms"]}
    gap = out["step_time_s"]["measured"] - out["step_time_s"]["simulated"]
    out["control_plane_real_ms_per_step"] = gap * scale * 1000.0
    out["rollout_s_simulated"] = mean(lambda r: r["predicted"]["rollout"])
    out["learn_end_s_simulated"] = mean(lambda r: r["predicted"]["learn_end"])
    out["released_at_share"] = {r["step"]: r.get("released_at_share", []) for r in rows}  # the decisions it read
    return out


def emulated_dirs(run_dir: str | Path) -> dict[str, Path]:
    """The emulated runs in `run_dir`: itself, or the arms of a comparison; {} when none is emulated."""
    from rlhfless.core.configbase import load_yaml

    p = Path(run_dir)
    cands = {p.name: p} if RunDir(p).config.is_file() else {d.name: d for d in sorted(p.iterdir())
                                                                 if RunDir(d).config.is_file()} if p.is_dir() else {}
    return {n: d for n, d in cands.items() if ((load_yaml(RunDir(d).config).get("runtime") or {}).get("device")
                                              == "emulated")}


def validate_dir(run_dir: str | Path) -> dict:
    """`rlhfless simulate --validate` on emulated runs: every run validated, and the largest errors over them."""
    arms = {n: {"arm": n, **validate_emulated(d)} for n, d in emulated_dirs(run_dir).items()}
    if not arms:
        raise DataError(f"validate: {run_dir}: no runtime.device=emulated run")
    return {"run_dir": str(run_dir), "modes": {}, "emulated": arms, "errors_from": "emulated",
            "step_time_error": max(a["step_time_s"]["rel_error"] for a in arms.values()),
            "cost_error": max(a["cost_device_s"]["rel_error"] for a in arms.values())}


def arm_line(a: dict) -> str:
    """One emulated run's validation in a line (modelled seconds per step)."""
    def r(x: dict) -> str:
        return f"{x['simulated']:.1f}/{x['measured']:.1f}"

    t = ", ".join(f"{k} {v:.1f}" for k, v in a["cost_terms_device_s"].items())
    t += "; step time terms: " + ", ".join(f"{k} {v:.1f}" for k, v in a.get("step_time_terms_s", {}).items())
    return (f"emulated {a['arm']}: step {r(a['step_time_s'])} s ({a['step_time_s']['rel_error']:.1%}), billed "
            f"{r(a['cost_device_s'])} device-s ({a['cost_device_s']['rel_error']:.1%}); terms: {t}; control plane "
            f"{a['control_plane_real_ms_per_step']:.0f} real ms/step (simulated/measured, modelled s per step)")


# ---- the post-run report of a comparison on emulated devices (comparison.json's `modelled` block) ------------
def step_split(run_dir: Path) -> dict[int, dict]:
    """Per step, from an arm's records (real seconds): its wall time, its bill (all, by role), and the bill split
    into cold starts (workers spawned in the step's window), busy time by invocation kind (clipped to the window)
    and held idle (the rest: warm, waiting for work or for release)."""
    run = RunDir(run_dir)
    rows, workers, invs = run.read_metrics(), run.read_workers(), run.read_invocations()
    out = {}
    for m in rows:
        if "timing_s/step" not in m or "runtime/window_s" not in m:
            continue
        a, b = m["runtime/window_start_s"], m["runtime/window_start_s"] + m["runtime/window_s"]
        busy: dict[str, float] = {}
        for i in invs:
            t = max(0.0, min(b, i["finished_s"]) - max(a, i["started_s"])) * i["units"]
            if t > 0:
                busy[i["kind"]] = busy.get(i["kind"], 0.0) + t
        started = [w for w in workers if w.get("ready_s") is not None and a <= w["spawned_s"] < b]
        cold = sum(w["cold_start_s"] * w["units"] for w in started)
        billed = m["cost/device_seconds"]
        roles = {k.split("/")[1]: v for k, v in m.items() if k.startswith("function/") and k.endswith("/billed_s")}
        out[m["step"]] = {"step_time_s": m["timing_s/step"], "billed_device_s": billed, "by_role": roles,
                          "cold_start_device_s": cold, "busy_device_s": busy,
                          "held_idle_device_s": billed - cold - sum(busy.values()),
                          "roles": _role_split(roles, busy, started, invs)}
    return out


def _role_split(billed: dict[str, float], busy: dict[str, float], started: list[dict], invs: list[dict]) -> dict:
    """The bill of each role (the meter's `function/<role>/billed_s`) split into cold starts, busy and held idle:
    a worker's cold start is the role of its first invocation (a hybrid function started for decode is decode's,
    as the meter bills it); reward runs on the decode function. The serverful pool is one role."""
    first: dict[str, tuple[float, str]] = {}
    for i in invs:
        if i["worker"] not in first or i["started_s"] < first[i["worker"]][0]:
            first[i["worker"]] = (i["started_s"], i["kind"])

    def kinds(role: str) -> tuple[str, ...]:
        return tuple(busy) if role == "pool" else (role, "reward") if role == "decode" else (role,)

    out = {}
    for role, bill in billed.items():
        cold = sum(w["cold_start_s"] * w["units"] for w in started
                   if role == "pool" or first.get(w["worker"], (0, "decode"))[1] in kinds(role))
        out[role] = {"billed": bill, "cold": cold, "busy": sum(v for k, v in busy.items() if k in kinds(role))}
    for r in out.values():
        r["held_idle"] = r["billed"] - r["cold"] - r["busy"]
    return out


def modelled_arm(run_dir: Path, scale: float) -> dict:
    """One arm per step in modelled seconds (real / time_scale): the mean over steps 2.. (step 1 starts every
    worker of the platform cold; it is kept apart as `first_step`)."""
    steps = step_split(run_dir)
    later = [v for k, v in steps.items() if k > 1] or list(steps.values())

    def mean(f) -> float:
        return float(np.mean([f(v) for v in later])) / scale

    kinds = sorted({k for v in later for k in v["busy_device_s"]})
    roles = sorted({k for v in later for k in v["by_role"]})
    first = steps.get(1)
    return {"steps_averaged": [k for k in steps if k > 1] or list(steps),
            "step_time_s": mean(lambda v: v["step_time_s"]), "billed_device_s": mean(lambda v: v["billed_device_s"]),
            "billed_device_s_by_role": {r: mean(lambda v: v["by_role"].get(r, 0.0)) for r in roles},
            "cold_start_device_s": mean(lambda v: v["cold_start_device_s"]),
            # the same run on a platform that bills no cold start (snapshot restore: `plan.lifecycle.billed_in`,
            # STARTING not billed): the bill less its cold starts, the step time unchanged
            "billed_without_cold_device_s": mean(lambda v: v["billed_device_s"] - v["cold_start_device_s"]),
            "busy_device_s": {k: mean(lambda v: v["busy_device_s"].get(k, 0.0)) for k in kinds},
            "held_idle_device_s": mean(lambda v: v["held_idle_device_s"]),
            "per_role": {r: {k: mean(lambda v: v["roles"].get(r, {}).get(k, 0.0)) for k in
                             ("billed", "cold", "busy", "held_idle")} for r in sorted({r for v in later
                                                                                      for r in v["roles"]})},
            "first_step": None if first is None else {"step_time_s": first["step_time_s"] / scale,
                                                      "billed_device_s": first["billed_device_s"] / scale}}


def modelled_report(out: Path, arms: list[str], scale: float) -> dict:
    """Every arm of a comparison in modelled seconds per step, and its ratios over the serverful control (verl with
    the tuned engine: step_time_ratio, cost_ratio) and over verl as the paper ran it (arm `serverful-paper-engine`,
    when run: step_time_ratio_paper_engine, cost_ratio_paper_engine)."""
    per = {a: modelled_arm(out / a, scale) for a in arms}
    for base, suffix in ((per.get("serverful"), ""), (per.get("serverful-paper-engine"), "_paper_engine")):
        if base:
            for m in per.values():
                m["step_time_ratio" + suffix] = m["step_time_s"] / base["step_time_s"]
                m["cost_ratio" + suffix] = m["billed_device_s"] / base["billed_device_s"]
    return {"time_scale": scale, "per_step": per}
