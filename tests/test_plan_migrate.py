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


def _simulated(spec):
    """Simulated actors and their sequences from spec: per actor (finished, running preds, queued preds, clock);
    few distinct predictions and start points, so equal remainders (ties in a cut's order) are common."""
    import heapq

    from rlhfless.plan.migrate import _Actor, _Seqs

    seqs, actors = _Seqs(), []
    for a, (finished, running, queued, it) in enumerate(spec):
        act = _Actor(a)
        act.it, act.finished = float(it), finished
        for k, pred in enumerate(running + queued):
            sid = len(seqs.pred)
            seqs.group.append(f"g{a}_{k}")
            seqs.first.append(sid)
            seqs.plen.append(3 + k)
            seqs.pred.append(float(pred))
            seqs.true.append(float(pred))
            seqs.start_it.append(float(it) * (k % 3) / 3)  # generated 0 .. 2/3 of the clock so far
            if k < len(running):
                heapq.heappush(act.heap, (seqs.start_it[sid] + seqs.true[sid] * (1 + k % 2), sid))
            else:
                act.queue.append([sid])
        act.total = finished + len(running) + len(queued)
        actors.append(act)
    return actors, seqs


def _progress(act, capacity, seqs):
    """The actor as a runtime reports it: every unfinished sequence listed (running in heap order, each
    remaining raised to 1 token, then queued), the form `plan_migrations` reads."""
    out = []
    for _, sid in act.heap:
        gen = act.it - seqs.start_it[sid]
        rem = seqs.pred[sid] - gen
        out.append(SeqProgress(seqs.name(sid), int(gen), rem if rem > 1.0 else 1.0, seqs.plen[sid]))
    out += [SeqProgress(seqs.name(s), 0, seqs.pred[s], seqs.plen[s]) for job in act.queue for s in job]
    return ActorProgress(act.aid, act.finished, tuple(out), capacity - len(act.heap))


_ACTORS = st.lists(st.tuples(st.integers(0, 12), st.lists(st.sampled_from([0.5, 4.0, 8.0, 20.0]), max_size=8),
                             st.lists(st.sampled_from([4.0, 8.0, 30.0]), max_size=3), st.sampled_from([0, 3, 6])),
                   min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(_ACTORS, st.floats(0.05, 1.0))
def test_simulation_decision_equals_plan_migrations(spec, tau):
    """The simulation decides cuts on its own actors with integer sids (`_decide`): the same moves, in the same
    order, and the same released actors as `plan_migrations` on the progress a runtime would report."""
    from rlhfless.plan.migrate import _decide

    actors, seqs = _simulated(spec)
    cuts, released = _decide(actors, tau, 8, seqs)
    mp, _ = plan_migrations([_progress(a, 8, seqs) for a in actors], tau)
    assert [(seqs.name(sid), src, dst) for sid, src, dst in cuts] == [(m.seq_id, m.src, m.dst) for m in mp.moves]
    assert released == list(mp.released)


@settings(max_examples=100, deadline=None)
@given(_ACTORS)
def test_simulated_max_remaining_equals_listing_every_sequence(spec):
    """The simulation's longest predicted remaining of an actor, without listing its sequences: the value
    `ActorProgress.max_remaining` gives over every sequence listed."""
    from rlhfless.plan.migrate import _max_remaining

    actors, seqs = _simulated(spec)
    for act in actors:
        listed = _progress(act, 8, seqs)
        assert _max_remaining(act, seqs) == (listed.max_remaining if listed.unfinished else None)
