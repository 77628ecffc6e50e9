"""The simulator's speed-ups (issue 41) are exact: the reports equal those of the straightforward implementation.

The straightforward forms live here: the cut-and-migrate simulation that lists every live actor's sequences as
`ActorProgress` at each cut check and decides with the public `plan_migrations` (moves by name, every move
named), the checked `PlanJob` constructor, a plan and a whole-step tail built anew on every request (each of the
sweep's candidates on its own), the learner sized by a binary search that drains each count on its own, and
each job's finish from every entry and finish event sorted together. A short paper-sim case (both designs)
played with them patched in must give the shipped report bit for bit, and every scaling decision of it (each
candidate row, which the report does not show) the same rows. The reference is built here from that code path
each run, never read from a stored file: a change to the model itself (a bill, a time) moves both sides alike.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

import rlhfless.plan.scaler as scaler
import rlhfless.plan.overlap as overlap
import rlhfless.plan.timemodel as timemodel
import rlhfless.sim.policies as policies
import rlhfless.sim.step as step
from rlhfless.plan import balancer
from rlhfless.plan.cost import billed_seconds
from rlhfless.plan.migrate import _result, plan_migrations, simulate_with_migration
from rlhfless.plan.records import ActorProgress, PlanJob, SeqProgress
from rlhfless.sim.scenario import case_configs, run_case


def _load(plan, true_jobs):
    """Every sequence by an integer sid (job-major, the plan's order) and its name `<group>/<k>`."""
    truth = {j.group_id: j for j in true_jobs} if true_jobs else {}
    seqs = SimpleNamespace(name=[], true=[], pred=[], plen=[], start=[])
    actors = []
    for a, jobs in enumerate(plan.actor_jobs):
        act = SimpleNamespace(aid=a, it=0.0, t=0.0, heap=[], queue=deque(), finished=0, total=0, end=None)
        for j in jobs:
            first = len(seqs.true)
            seqs.name += [f"{j.group_id}/{k}" for k in range(j.n_seqs)]
            seqs.pred += list(j.lengths())
            seqs.true += list((truth[j.group_id] if truth else j).lengths())
            seqs.plen += [j.prompt_len] * j.n_seqs
            act.queue.append(list(range(first, first + j.n_seqs)))
            act.total += j.n_seqs
        actors.append(act)
    seqs.start = [0.0] * len(seqs.true)
    for act in actors:
        _admit(act, plan.capacity, seqs)
    return actors, seqs


def _admit(act, capacity, seqs):
    while act.queue and len(act.queue[0]) <= capacity - len(act.heap):
        for sid in act.queue.popleft():
            seqs.start[sid] = act.it
            heapq.heappush(act.heap, (act.it + seqs.true[sid], sid))


def _advance(act, t, f):
    if t > act.t:
        if act.heap:
            act.it += (t - act.t) / f[len(act.heap)]
        act.t = t


def _next(act, f):
    if act.end is not None or not act.heap:
        return np.inf
    return act.t + max(act.heap[0][0] - act.it, 0.0) * f[len(act.heap)]


def _progress(act, capacity, seqs):
    """What a runtime reports of the actor: every unfinished sequence (running in heap order, then queued)."""
    out = []
    for _, sid in act.heap:
        gen = act.it - seqs.start[sid]
        rem = seqs.pred[sid] - gen
        out.append(SeqProgress(seqs.name[sid], int(gen), rem if rem > 1.0 else 1.0, seqs.plen[sid]))
    out += [SeqProgress(seqs.name[s], 0, seqs.pred[s], seqs.plen[s]) for job in act.queue for s in job]
    return ActorProgress(act.aid, act.finished, tuple(out), capacity - len(act.heap))


def _apply(mp, actors, t, tm, seqs, f):
    sid_of = {n: i for i, n in enumerate(seqs.name)}
    sources = {m.src for m in mp.moves}
    finish_of = {sid: fi for a in sources for fi, sid in actors[a].heap}
    moved = set()
    for m in mp.moves:
        sid, src, dst = sid_of[m.seq_id], actors[m.src], actors[m.dst]
        finish = finish_of.get(sid)
        gen = src.it - seqs.start[sid] if finish is not None else 0.0
        rem = finish - src.it if finish is not None else seqs.true[sid]
        _advance(dst, t, f)
        seqs.start[sid] = dst.it - gen
        heapq.heappush(dst.heap, (dst.it + rem, sid))
        dst.total += 1
        dst.t += tm.kv_transfer_s_per_token * (seqs.plen[sid] + gen)
        moved.add(sid)
    for a in sources:
        act = actors[a]
        act.heap = [x for x in act.heap if x[1] not in moved]
        heapq.heapify(act.heap)
        act.queue = deque(job for job in ([s for s in j if s not in moved] for j in act.queue) if job)
    for a in mp.released:
        actors[a].end = t


def _room(actors, tau, capacity, a):
    """Could actors below tau take all of actor a's unfinished sequences now (the check before a decision)?"""
    need = actors[a].total - actors[a].finished
    return need <= sum(capacity - len(b.heap) for b in actors
                       if b.aid != a and b.end is None and b.heap and b.finished / b.total < tau)


def reference_simulation(plan, tm, tau, true_jobs=None):
    """`simulate_with_migration` written plainly: an event per actor in time order; at an actor's event at or
    above tau with room for its sequences, every live actor advanced and listed, and `plan_migrations`
    decides; after a cut every live actor's next event is new."""
    f = tm.iter_seconds(np.arange(plan.capacity + 1)).tolist()
    actors, seqs = _load(plan, true_jobs)
    moves, released = [], []
    nxt = [_next(a, f) for a in actors] or [np.inf]
    while (t := min(nxt)) < np.inf:
        a = nxt.index(t)
        act = actors[a]
        _advance(act, t, f)
        while act.heap and act.heap[0][0] <= act.it + 1e-9:
            heapq.heappop(act.heap)
            act.finished += 1
        _admit(act, plan.capacity, seqs)
        if not act.heap:
            act.end, nxt[a] = t, np.inf
            continue
        if act.finished / act.total >= tau and _room(actors, tau, plan.capacity, a):
            live = [b for b in actors if b.end is None and (b.heap or b.queue)]
            for b in live:
                _advance(b, t, f)
            mp, _ = plan_migrations([_progress(b, plan.capacity, seqs) for b in live], tau)
            if mp.moves:
                _apply(mp, actors, t, tm, seqs, f)
                moves += mp.moves
                released += mp.released
                for b in live:
                    nxt[b.aid] = _next(b, f)
        nxt[a] = _next(act, f)
    return _result(plan, actors, tm, list(moves), released)


class _ReferencePlayed:
    """`migrate.Played` of the reference simulation."""

    def __init__(self, plan, tm, tau, true_jobs=None, arrays=None, true_len=None):  # the kernel's inputs unread
        self._named = reference_simulation(plan, tm, tau, true_jobs)
        self.busy_s, self.n_moves = list(self._named[0].busy_s), len(self._named[0].moves)

    def named(self):
        return self._named

    def metrics(self):
        return self._named[1]


def _checked(group_id, n_seqs, predicted_len, prompt_len=0):
    return PlanJob(group_id, n_seqs, predicted_len, prompt_len)


def _built_anew(ja, res, n, cfg, tm, memo):
    return balancer.build_plan(ja, res.labels(res.candidates.index(n)), res.rank, n, cfg.capacity, tm, cfg.policy)


def _tail_anew(ja, labels, rank, n, dur, head, cfg, tm, wide, own, n_warm, memo):
    return scaler._tail(ja, labels, rank, n, dur, head, cfg, tm, wide, own, n_warm)


def _sweep_tails_one_by_one(ja, res, dur, active, gpu_s, cfg, tm, n_warm=0, memo=None):
    """`_sweep_whole_step` with each candidate's tail costed on its own (`_tail`)."""
    step, total = np.empty(len(res.candidates)), gpu_s.copy()
    for r, n in enumerate(res.candidates):
        d = np.where(active[r], dur[r], 0.0)[:n]
        step[r], invs = scaler._tail(ja, res.labels(r), res.rank, n, d, d - res.busy_s[r, :n], cfg, tm, n_warm=n_warm)
        total[r] += _gpu_s_anew(invs, cfg.billing)
    return step, total


def _gpu_s_anew(invs, rules):
    """A step's billed device-seconds, invocation by invocation through `billed_seconds` (what `step_cost`
    inlines), summed in order from 0.0 as `cost_step` sums them."""
    total = 0.0
    for inv in invs:
        total = total + billed_seconds(inv, rules) * inv.gpus
    return total


def _size_blocks_by_drains(arrive_s, work_ds, b, slack, arrivals=None):
    """`size_blocks` as a binary search that drains each count it tries on its own (its arrivals sorted here,
    whatever the caller passes)."""
    order = np.argsort(b.ready_s, kind="stable")
    if len(order) <= 1 or float(np.sum(work_ds)) <= 0:
        return b
    w = overlap._Arrivals.of(arrive_s, work_ds)
    limit = overlap._drain(w, b.ready_s, b.devices)[0] * (1.0 + slack) + 1e-12
    lo, hi = 1, len(order)
    while lo < hi:
        k = (lo + hi) // 2
        keep = order[:k]
        if float(np.sum(b.devices[keep])) > 0 and \
                overlap._drain(w, b.ready_s[keep], b.devices[keep], presorted=True)[0] <= limit:
            hi = k
        else:
            lo = k + 1
    keep = np.sort(order[:lo])
    return overlap.Blocks(b.ready_s[keep], b.devices[keep], b.cold_s[keep])


def _sized_by_drains(arrive_s, work_ds, b, slack, arrivals=None):
    """`overlap._sized` without the work end its search computed: the tail drains the kept blocks again."""
    return _size_blocks_by_drains(arrive_s, work_ds, b, slack, arrivals), None


def _finish_seconds_by_events(entry, finish, seq_actor, n_actors, tm, by_length=None):
    """`finish_seconds` from every entry and finish event sorted together, whatever order the caller knows."""
    return timemodel._finish_seconds_events(entry, finish, seq_actor, n_actors, tm)


def _report(cfg) -> str:
    out = run_case(cfg, jobs=1)
    return json.dumps(out, sort_keys=True)


def _patch_plain(monkeypatch):
    """The straightforward forms (module docstring) in place of the shipped ones."""
    monkeypatch.setattr(scaler, "simulate_with_migration", reference_simulation)
    monkeypatch.setattr(scaler, "play_with_migration", _ReferencePlayed)
    monkeypatch.setattr(policies, "play_with_migration", _ReferencePlayed)
    monkeypatch.setattr(policies, "true_arrays", balancer.JobArrays.from_jobs)  # built anew for every policy and step
    monkeypatch.setattr(PlanJob, "trusted", staticmethod(_checked))
    monkeypatch.setattr(PlanJob, "trusted_many", staticmethod(lambda *cols: [_checked(*row) for row in zip(*cols)]))
    monkeypatch.setattr(scaler, "_memo_plan", _built_anew)
    monkeypatch.setattr(scaler, "_memo_tail", _tail_anew)
    monkeypatch.setattr(scaler, "_sweep_whole_step", _sweep_tails_one_by_one)
    monkeypatch.setattr(overlap, "size_blocks", _size_blocks_by_drains)
    monkeypatch.setattr(overlap, "_sized", _sized_by_drains)
    monkeypatch.setattr(step, "size_blocks", _size_blocks_by_drains)
    monkeypatch.setattr(timemodel, "finish_seconds", _finish_seconds_by_events)


@pytest.mark.parametrize("design,steps", [("paper", 3), ("extended", 2)])
def test_report_equals_the_straightforward_implementation(design, steps, monkeypatch):
    cfg = case_configs("paper-sim", steps, [f"design={design}"])[0]
    shipped = _report(cfg)
    policies._TRUE_CACHE.clear()
    _patch_plain(monkeypatch)
    assert _report(cfg) == shipped


@pytest.mark.parametrize("design", ["paper", "extended"])
def test_every_scaling_decision_equals_the_straightforward_one(design, monkeypatch):
    """Each decision of a short case whole, every candidate row's step time and bill included (the report
    shows only the chosen ones): replayed with the plain forms patched in, each call with the memo its step
    shared, it must be equal field for field."""
    calls, choose = [], scaler.choose

    def recording(*args, **kw):
        calls.append((args, kw))
        return choose(*args, **kw)

    with monkeypatch.context() as m:
        m.setattr(policies, "choose", recording)
        run_case(case_configs("paper-sim", 2, [f"design={design}"])[0], jobs=1)
    shipped = _replay(calls)
    _patch_plain(monkeypatch)
    plain = _replay(calls)
    assert len(shipped) >= 4 and shipped == plain


def _replay(calls):
    """`choose` of each recorded call in order; the calls that shared a memo share a fresh one."""
    memos, out = {}, []
    for args, kw in calls:
        memo = kw.get("memo")
        kw = dict(kw, memo=memos.setdefault(id(memo), {}) if memo is not None else None)
        out.append(scaler.choose(*args, **kw)[0])
    return out


def test_reference_simulation_cuts_on_paper_sim():
    """The reference plays real cuts on a paper-sim plan (else the report test compares no migration)."""
    cfg = case_configs("paper-sim", 1, [])[0]
    from rlhfless.sim.scenario import clusters, workload

    work, _ = workload(cfg)
    cb, _, _ = clusters(cfg, work)
    jobs = policies.true_jobs(work[0], lambda g: 0)
    flat = policies._jobs(work[0], [256.0] * len(work[0].groups), lambda g: 0)
    plan, _ = balancer.assign(flat, cb.replicas, cb.capacity, cb.time_model, "round_robin")
    ref, _ = reference_simulation(plan, cb.time_model, cfg.tau, jobs)
    shipped, _ = simulate_with_migration(plan, cb.time_model, cfg.tau, jobs)
    assert len(ref.moves) > 100 and ref.released
    assert shipped == ref
