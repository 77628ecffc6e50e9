"""Cut-and-migrate: the pure decision (exact cases, invariants) and the simulation with cuts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core import metrics as M
from rlhfless.core.errors import ConfigError
from rlhfless.plan.balancer import assign
from rlhfless.plan.migrate import plan_migrations, simulate_with_migration
from rlhfless.plan.records import ActorProgress, PlanJob, SeqProgress
from rlhfless.plan.timemodel import TimeModel


def _seqs(prefix, rems):
    return tuple(SeqProgress(f"{prefix}{i}", 10, float(r), 5) for i, r in enumerate(rems))


def test_exact_decision():
    progress = [
        ActorProgress(0, finished=8, unfinished=_seqs("a", [50, 300]), free_slots=6),  # 0.8 >= tau: source
        ActorProgress(1, finished=1, unfinished=_seqs("b", [100] * 4), free_slots=1),  # destination, 1 slot
        ActorProgress(2, finished=2, unfinished=_seqs("c", [100] * 6), free_slots=3),  # destination, 3 slots
        ActorProgress(3, finished=5, unfinished=(), free_slots=8),                     # done: released, not a dst
    ]
    mp, metrics = plan_migrations(progress, tau=0.7)
    # longest remaining first, each to the destination free earliest: 1 and 2 both end in 100 -> more free
    # slots (2) takes a1, which keeps it busy until 300; a0 then goes to 1 (free at 100)
    assert [(m.seq_id, m.src, m.dst) for m in mp.moves] == [("a1", 0, 2), ("a0", 0, 1)]
    assert mp.released == (0,)
    assert metrics[M.BAL_MIGRATIONS] == 2
    assert metrics[M.BAL_MIGRATED_TOKENS] == 2 * (5 + 10)


def test_stragglers_spread_over_the_actors_free_earliest_not_onto_the_critical_path():
    # actor 1 holds long sequences (few, so the most free slots), actors 2 and 3 short ones: the old rule (most
    # free slots) sent every straggler to actor 1; now 3 (free at 12) takes a0 (40), 2 (free at 15) takes a1
    # (30) and, still free earliest (30 < 40), a2 and a3
    progress = [
        ActorProgress(0, finished=8, unfinished=_seqs("a", [40, 30, 20, 10]), free_slots=4),
        ActorProgress(1, finished=0, unfinished=_seqs("b", [500, 500]), free_slots=6),
        ActorProgress(2, finished=1, unfinished=_seqs("c", [15, 15, 15, 15]), free_slots=4),
        ActorProgress(3, finished=1, unfinished=_seqs("d", [12, 12, 12, 12]), free_slots=4),
    ]
    mp, _ = plan_migrations(progress, tau=0.6)
    assert [(m.seq_id, m.dst) for m in mp.moves] == [("a0", 3), ("a1", 2), ("a2", 2), ("a3", 2)]
    assert mp.released == (0,)


def test_source_is_cut_only_if_everything_fits():
    progress = [
        ActorProgress(0, finished=9, unfinished=_seqs("a", [1, 2, 3]), free_slots=5),
        ActorProgress(1, finished=0, unfinished=_seqs("b", [9]), free_slots=2),
    ]
    mp, metrics = plan_migrations(progress, tau=0.7)
    assert mp.moves == () and mp.released == ()
    assert metrics[M.BAL_MIGRATIONS] == 0


def test_below_tau_nothing_moves_and_bad_tau_errors():
    progress = [ActorProgress(0, 1, _seqs("a", [5, 5]), 4), ActorProgress(1, 0, _seqs("b", [5]), 7)]
    assert plan_migrations(progress, tau=0.7)[0].moves == ()
    for tau in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match=r"plan.tau: .*\(0, 1\]"):
            plan_migrations(progress, tau=tau)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 6), st.integers(0, 8)), min_size=1, max_size=6),
       st.floats(0.05, 1.0))
def test_decision_invariants(spec, tau):
    progress = [ActorProgress(a, fin, _seqs(f"x{a}_", [10] * unf), free) for a, (fin, unf, free) in enumerate(spec)]
    mp, _ = plan_migrations(progress, tau)
    by_id = {p.actor_id: p for p in progress}
    moved = [m.seq_id for m in mp.moves]
    assert len(moved) == len(set(moved))
    for m in mp.moves:
        assert by_id[m.src].finished_fraction >= tau > by_id[m.dst].finished_fraction
        assert m.seq_id in {s.seq_id for s in by_id[m.src].unfinished}
    for a in mp.released:  # a released source moved every unfinished sequence
        assert sum(m.src == a for m in mp.moves) == len(by_id[a].unfinished)
    for p in progress:  # no destination got more than its free slots
        assert sum(m.dst == p.actor_id for m in mp.moves) <= p.free_slots


def test_simulation_without_cut_equals_plan_and_cut_saves_device_time():
    tm = TimeModel.default_tiny_cpu()
    jobs = [PlanJob(f"g{i}", 4, (20.0, 30.0, 40.0, 50.0 if i % 5 else 900.0)) for i in range(20)]
    plan, _ = assign(jobs, 4, 32, tm, "round_robin")
    res, m = simulate_with_migration(plan, tm, tau=1.0)
    assert res.busy_s == pytest.approx(plan.busy_s) and res.moves == ()
    res, m = simulate_with_migration(plan, tm, tau=0.7)
    assert m[M.BAL_MIGRATIONS] > 0 and len(res.released) > 0
    assert sum(res.busy_s) < sum(plan.busy_s)  # released actors stop billing
    # every sequence still finishes exactly once: moves only relocate (a sequence may move twice)
    assert sum(res.finished) == 80


def test_simulation_uses_true_lengths_for_execution():
    tm = TimeModel.per_token(0.01)
    pred = [PlanJob(f"g{i}", 1, 100.0) for i in range(4)]
    true = [PlanJob(f"g{i}", 1, 100.0 * (i + 1)) for i in range(4)]
    plan, _ = assign(pred, 2, 4, tm, "round_robin")
    res, _ = simulate_with_migration(plan, tm, tau=1.0, true_jobs=true)
    assert res.busy_s == pytest.approx((0.01 * (100 + 300), 0.01 * (200 + 400)))


def _scan_decision(progress, tau):
    """The decision rule written as a scan of every destination per move (the form the heap in `plan_migrations`
    replaced): the reference its moves must equal."""
    free = {p.actor_id: p.free_slots for p in progress
            if p.n_unfinished and p.finished_fraction < tau and p.free_slots > 0}
    sources = sorted((p for p in progress if p.n_unfinished and p.finished_fraction >= tau),
                     key=lambda p: (p.n_unfinished, p.actor_id))
    avail = {p.actor_id: p.max_remaining for p in progress if p.actor_id in free}
    moves, released = [], []
    for src in sources:
        if src.n_unfinished > sum(free.values()):
            continue
        for seq in sorted(src.unfinished, key=lambda s: -s.predicted_remaining):
            dst = min(free, key=lambda a: (avail[a], -free[a], a))
            avail[dst] = max(avail[dst], seq.predicted_remaining)
            free[dst] -= 1
            if free[dst] == 0:
                del free[dst]
            moves.append((seq.seq_id, src.actor_id, dst))
        released.append(src.actor_id)
    return moves, released


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(1, 6), max_size=8), st.integers(0, 8)),
                min_size=1, max_size=8),
       st.floats(0.05, 1.0))
def test_decision_equals_the_scan_over_destinations(spec, tau):
    # few distinct remaining lengths, so ties in (free at, free slots) between destinations are common
    progress = [ActorProgress(a, fin, _seqs(f"x{a}_", [5.0 * r for r in rems]), free)
                for a, (fin, rems, free) in enumerate(spec)]
    mp, _ = plan_migrations(progress, tau)
    moves, released = _scan_decision(progress, tau)
    assert [(m.seq_id, m.src, m.dst) for m in mp.moves] == moves
    assert list(mp.released) == released


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 50.0), min_size=0, max_size=12), st.lists(st.floats(0.0, 60.0), max_size=6),
       st.floats(0.0, 40.0))
def test_live_max_remaining_equals_listing_every_sequence(running, queued, it):
    """The simulation's view of an actor gives the longest predicted remaining without listing its sequences:
    the same value as the maximum over `_running` (each raised to 1) and the queued predictions."""
    import heapq

    from rlhfless.plan.migrate import _Actor, _Live, _Seqs

    if not running and not queued:
        return
    seqs, act = _Seqs(), _Actor(0)
    act.it = it
    for k, pred in enumerate(running + queued):
        seqs.job.append(0)
        seqs.true.append(pred)
        seqs.pred.append(pred)
        seqs.plen.append(3)
        seqs.start_it.append(it * (k % 3) / 3)  # generated 0 .. 2/3 of the clock so far
    seqs.group.append("g")
    seqs.first.append(0)
    for sid in range(len(running)):
        heapq.heappush(act.heap, (seqs.start_it[sid] + seqs.true[sid], sid))
    if queued:
        act.queue.append(list(range(len(running), len(running) + len(queued))))
    live = _Live(act, 16, seqs)
    _, _, rem = live._running()
    assert live.max_remaining == max(rem + [seqs.pred[s] for job in act.queue for s in job])
