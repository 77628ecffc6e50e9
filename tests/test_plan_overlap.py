"""The overlapped learner's fluid queue (`learner_drain`) against a plain event-by-event reference, and the sized
learner (`size_blocks`): within its slack, minimal in its order, never dearer; the hybrid functions' blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core.errors import DataError
from rlhfless.plan.overlap import (
    Blocks,
    LearnerCosts,
    learner_blocks,
    learner_drain,
    learner_invocations,
    sequential_tails,
    size_blocks,
    whole_step_tail,
)


def reference_drain(arrive, work, ready, devices) -> float:
    """Event by event: between consecutive arrivals / ready times the backlog falls at the ready devices' rate."""
    events = sorted([(a, 0, w) for a, w in zip(arrive, work)] + [(r, 1, d) for r, d in zip(ready, devices)])
    t, q, cap, left = events[0][0], 0.0, 0.0, sum(1 for _ in arrive)
    for when, kind, x in events:
        if q > 0 and cap > 0 and q <= cap * (when - t) and left == 0:
            return t + q / cap
        q = max(q - cap * (when - t), 0.0)
        t = when
        if kind == 0:
            q, left = q + x, left - 1
        else:
            cap += x
    if q > 0 and cap <= 0:
        raise DataError("no device")
    return t + (q / cap if q > 0 else 0.0)


@pytest.mark.parametrize("seed", range(5))
def test_drain_matches_the_event_reference(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        g, b = rng.integers(1, 10), rng.integers(1, 7)
        arrive, work = rng.uniform(0, 10, g).round(1), rng.exponential(5, g)
        ready, dev = rng.uniform(0, 12, b).round(1), rng.integers(1, 4, b).astype(float)
        end, joined = learner_drain(arrive, work, ready, dev)
        assert end == pytest.approx(reference_drain(arrive, work, ready, dev), rel=1e-9, abs=1e-9)
        assert (joined == (ready < end - 1e-12)).all()


def test_drain_by_hand_and_errors():
    # 4 device-s at t=0 on 2 devices ready at 1: ends at 3; a second group of 2 at 2.5 adds a second (1 s)
    assert learner_drain(np.array([0.0]), np.array([4.0]), np.array([1.0]), np.array([2.0]))[0] == pytest.approx(3)
    end, joined = learner_drain(np.array([0.0, 2.5]), np.array([4.0, 2.0]), np.array([1.0, 9.0]),
                                np.array([2.0, 4.0]))
    assert end == pytest.approx(4.0) and joined.tolist() == [True, False]
    with pytest.raises(DataError, match="no device"):
        learner_drain(np.array([0.0]), np.array([1.0]), np.array([]), np.array([]))


def test_sized_learner_is_within_slack_minimal_and_cheaper():
    rng = np.random.default_rng(7)
    for _ in range(200):
        g, b = rng.integers(2, 30), rng.integers(2, 12)
        arrive, work = np.sort(rng.exponential(5, g)), rng.exponential(3, g)
        blocks = Blocks(np.sort(rng.uniform(0, 8, b)), np.full(b, 8.0), np.full(b, 2.0))
        full_end, full_joined = learner_drain(arrive, work, blocks.ready_s, blocks.devices)
        for slack in (0.0, 0.01, 0.1):
            s = size_blocks(arrive, work, blocks, slack)
            end, joined = learner_drain(arrive, work, s.ready_s, s.devices)
            assert end <= full_end * (1 + slack) + 1e-9
            k = len(s.ready_s)
            assert (s.ready_s == blocks.ready_s[:k]).all()  # the earliest ready ones
            if k > 1:  # one block fewer would miss the slack
                assert learner_drain(arrive, work, blocks.ready_s[:k - 1], blocks.devices[:k - 1])[0] > \
                    full_end * (1 + slack) + 1e-12
            billed = sum(i.gpus * i.duration_s for i in learner_invocations(s, joined, end))
            full = sum(i.gpus * i.duration_s for i in learner_invocations(blocks, full_joined, full_end))
            assert billed <= full + 1e-9 or end > full_end  # held to a later end is the slack's price


def test_hybrid_blocks_start_after_the_reshard_and_warm_spare_ones_hold_the_weights():
    # two decode actors released at 10 s and 20 s (8 devices each), a prefill function at 5 s, 16 spare devices;
    # first group at 3 s; a new learner function needs 6 s. Hybrid: the decode actors go on as ranks after a
    # 0.05 s reshard (the prefill function is another image: 6 s); one spare block is a hybrid function kept
    # from the last step: ready at the first arrival (3 s, before a cold start could end), billed 3 s ahead
    b = learner_blocks(np.array([10.0, 20.0, 5.0]), np.array([8.0, 8.0, 8.0]), 16.0, 8.0, 3.0, 6.0, True,
                       np.array([0.05, 0.05, 6.0]), warm_spare=1)
    assert b.ready_s.tolist() == pytest.approx([10.05, 20.05, 11.0, 3.0, 6.0])
    assert b.cold_s.tolist() == pytest.approx([0.05, 0.05, 6.0, 3.0, 6.0])
    # without hybrid every block pays the cold start; warm_spare is capped at the spare blocks
    c = learner_blocks(np.array([10.0, 20.0, 5.0]), 8.0, 16.0, 8.0, 3.0, 6.0, True, warm_spare=5)
    assert c.ready_s.tolist() == pytest.approx([16.0, 26.0, 11.0, 3.0, 3.0])
    assert learner_blocks(np.array([10.0]), 8.0, 16.0, 8.0, 3.0, 6.0, True).ready_s.tolist() == \
        pytest.approx([16.0, 6.0, 6.0])


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 500.0), st.lists(st.floats(0.0, 50.0), min_size=1, max_size=40), st.floats(0.5, 200.0),
       st.booleans(), st.floats(0.0, 30.0), st.one_of(st.none(), st.floats(0.0, 30.0)), st.floats(0.0, 20.0),
       st.floats(0.0, 40.0), st.floats(0.0, 9.0))
def test_sequential_tail_in_scalars_equals_the_fluid_queue(rollout_end, work, budget, prewarm, cold, bill, upd,
                                                           after, prefill_s):
    """Without overlap `whole_step_tail` takes a scalar form (`_sequential_tail`); it must give the same floats
    as the general path: the one block of every device, `learner_drain` over arrivals at the rollout's end,
    `learner_invocations`."""
    from rlhfless.plan.overlap import (
        _sequential_tail,
        _sequential_top,
        learner_drain,
        learner_invocations,
        prewarm_billed,
        sequential_blocks,
    )

    lc = LearnerCosts(whole_step=True, overlap=False, cold_start_s=cold, prewarm=prewarm, prewarm_bill_s=bill,
                      update_fixed_s=upd, prefill_s=prefill_s, prefill_devices=1.0)
    work = np.array(work)
    b = prewarm_billed(sequential_blocks(rollout_end + (0.0 if prewarm else cold), budget, cold), 0, prewarm, bill)
    arrive, w = np.full(len(work), rollout_end), work
    if after > 0:
        arrive, w = np.append(arrive, rollout_end), np.append(work, after)
    top = _sequential_top(work, budget, after)
    if float(w.sum()) <= 0:
        assert top is None
        return
    fast = _sequential_tail(rollout_end, top, budget, lc)
    work_end, joined = learner_drain(arrive, w, b.ready_s, b.devices)
    end = max(work_end, rollout_end) + upd
    assert fast == (end, learner_invocations(b, joined, end))
    # and through whole_step_tail, released actors and the prefill function included
    rel = np.array([rollout_end * 0.5, rollout_end])
    step, invs = whole_step_tail(rel, np.zeros(len(work)), work, 1.0, budget, lc, None, 0, after)
    assert (step, invs[-len(fast[1]):] if fast[1] else []) == (fast[0], fast[1])
    # and for several rollout ends at once (the scaler's candidates), each as whole_step_tail gives it alone
    ends = [rollout_end, rollout_end * 0.5, rollout_end + 1.0]
    assert sequential_tails(ends, work, budget, lc, after) == \
        [whole_step_tail(np.array([e]), np.zeros(len(work)), work, 1.0, budget, lc, None, 0, after) for e in ends]
    # separate images, ranks let go at their share: the scalar form cuts the one block as the general path does
    from dataclasses import replace

    from rlhfless.plan.overlap import learner_billed

    shared = replace(lc, rank_devices=1.0, share_go=True)
    assert _sequential_tail(rollout_end, top, budget, shared) == \
        (end, learner_billed(b, joined, max(work_end, rollout_end), end, budget, shared))


def _sizing_case(seed: int):
    """(rng, k, arrive (G,), work (G,), their arrivals, ready (k,) sorted, devices (k,)): a learner sizing case with ties in arrival and ready
    times, zero-work groups and zero-device blocks."""
    from rlhfless.plan.overlap import _Arrivals

    rng = np.random.default_rng(seed)
    g, k = int(rng.integers(1, 60)), int(rng.integers(1, 25))
    arrive = np.round(rng.uniform(0, 50, g), int(rng.integers(0, 3)))
    work = rng.uniform(0, 40, g) * (rng.random(g) > 0.1)
    ready = np.sort(np.round(rng.uniform(0, 60, k), 1))
    devices = rng.choice([0.0, 1.0, 8.0, 3.5], k)
    return rng, k, arrive, work, _Arrivals.of(arrive, work), ready, devices


@pytest.mark.parametrize("seed", range(40))
def test_every_prefix_end_at_once_equals_the_drain_of_that_prefix(seed):
    """`size_blocks` reads the work end of every count of blocks from one array computation (`_prefix_ends`):
    bit for bit `_drain` on the first k blocks, zero-device blocks and ties in ready time included."""
    from rlhfless.plan.overlap import _drain, _prefix_ends

    rng, k, arrive, work, w, ready, devices = _sizing_case(seed)
    ends = _prefix_ends(w, ready, devices)
    # `size_blocks` asks only the counts its search tries, one row at a time: each row the same floats
    some = rng.permutation(np.arange(1, k + 1))[:int(rng.integers(1, k + 1))]
    assert _prefix_ends(w, ready, devices, some).tobytes() == ends[some - 1].tobytes()
    for n in range(1, k + 1):
        assert _prefix_ends(w, ready, devices, [n]).tobytes() == ends[n - 1:n].tobytes()
    for n in range(1, k + 1):
        if float(np.sum(devices[:n])) > 0:
            assert ends[n - 1] == _drain(w, ready[:n], devices[:n], presorted=True)[0]
        else:
            assert np.isnan(ends[n - 1]) or w.total <= 0 or len(w.arr) == 0


@pytest.mark.parametrize("seed", range(40))
def test_sizing_rows_and_end_equal_the_drains(seed):
    """`size_blocks`' rows one at a time (`_Prefixes`, the shared parts computed once) equal `_prefix_ends`' bit
    for bit, and the work end `_sized` hands `whole_step_tail` is `_drain` on the blocks it keeps, joined
    flags included (the tail no longer drains them again)."""
    from rlhfless.plan.overlap import Blocks, _Prefixes, _drain, _prefix_ends, _sized

    rng, k, arrive, work, w, ready, devices = _sizing_case(seed)
    rows = _Prefixes(w, ready, devices)
    assert np.array([rows.end(n) for n in range(1, k + 1)]).tobytes() == _prefix_ends(w, ready, devices).tobytes()
    if float(np.sum(devices)) <= 0:
        return
    perm = rng.permutation(k)  # blocks in any order: the sizing sorts them by ready time
    b = Blocks(ready[perm], devices[perm], rng.uniform(0, 3, k))
    for slack in (0.0, 0.01, 0.3):
        kept, end = _sized(arrive, work, b, slack)
        alone = size_blocks(arrive, work, b, slack)
        assert all(np.array_equal(getattr(kept, f), getattr(alone, f)) for f in ("ready_s", "devices", "cold_s"))
        if end is not None:
            d_end, d_joined = _drain(w, kept.ready_s, kept.devices)
            assert end == d_end and np.array_equal(kept.ready_s < end - 1e-12, d_joined)


def _share_invocations_plain(b, joined, share_s, end_s, rank_devices, t0=0.0):
    """`share_invocations` with every rank's invocation built (and checked) on its own."""
    from rlhfless.plan.records import Invocation

    spans = []
    for k in np.flatnonzero(joined):
        d = float(b.devices[k])
        n = max(1, int(np.floor(d / rank_devices + 1e-9))) if rank_devices > 0 else 1
        spans += [(max(float(b.ready_s[k] - b.cold_s[k]), 0.0), float(b.cold_s[k]), d / n)] * n
    out = []
    for r, (start, cold, d) in enumerate(spans):
        end = end_s if r == len(spans) - 1 else max(share_s, start)
        out.append(Invocation("learner", r, t0 + start, t0 + end, True, d, min(cold, end - start)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_share_invocations_equal_the_ranks_built_one_by_one(seed):
    """The ranks of one block are built once and copied renumbered: field for field (repr included)
    the invocations built and checked one by one, in the same order; a bad span still raises."""
    from rlhfless.plan.overlap import share_invocations

    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    ready = rng.uniform(0, 20, k)
    b = Blocks(ready, rng.choice([8.0, 16.0, 4.0, 6.0], k), np.minimum(rng.uniform(0, 5, k), ready))
    joined = rng.random(k) > 0.3
    share = float(rng.uniform(20, 30))
    t0 = float(rng.uniform(0, 3))
    for rank_devices in (0.0, 4.0, 8.0):
        got = share_invocations(b, joined, share, share + 2.0, rank_devices, t0)
        want = _share_invocations_plain(b, joined, share, share + 2.0, rank_devices, t0)
        assert got == want and repr(got) == repr(want)
    with pytest.raises(DataError):  # a share before a rank's start and an end before the share
        share_invocations(b, np.ones(k, bool), -1.0, -2.0, 4.0)
