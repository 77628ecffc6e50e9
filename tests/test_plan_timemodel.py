"""Time model: exact continuous-batching timelines, the vectorised FIFO vs the loop reference, profile I/O."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.plan import timemodel as T
from rlhfless.plan.timemodel import TimeModel, simulate

TM = TimeModel(batch_sizes=(1, 2), s_per_iter=(1.0, 1.5), prefill_s_per_token=0.0, actor_fixed_s=0.0)


def _sim(lengths, sizes, capacity, tm=TM, actors=None):
    lengths = np.asarray(lengths, dtype=float)
    sizes = np.asarray(sizes, dtype=np.int64)
    job_actor = np.zeros(len(sizes), dtype=np.int64) if actors is None else np.asarray(actors, dtype=np.int64)
    seq_actor = np.repeat(job_actor, sizes)
    return simulate(lengths, seq_actor, sizes, job_actor, int(job_actor.max()) + 1, capacity, tm)


def test_batch_shrinks_and_actor_speeds_up():
    # two seqs (2 and 4 tokens) together: 2 iterations at batch 2 (1.5 s) then 2 at batch 1 (1 s)
    r = _sim([2, 4], [1, 1], capacity=2)
    assert r.decode_s[0] == pytest.approx(2 * 1.5 + 2 * 1.0)
    assert r.peak_batch[0] == 2


def test_queue_waits_for_a_free_slot():
    r = _sim([2, 3], [1, 1], capacity=1)
    assert r.entry_iter.tolist() == [0.0, 2.0]
    assert r.decode_s[0] == pytest.approx(5.0)
    assert r.peak_batch[0] == 1


def test_group_is_admitted_together():
    # job A = (1, 3), job B = (1, 1), capacity 2: B waits until both of A's slots are free (iteration 3)
    r = _sim([1, 3, 1, 1], [2, 2], capacity=2)
    assert r.entry_iter.tolist() == [0.0, 0.0, 3.0, 3.0]
    assert r.decode_s[0] == pytest.approx(1 * 1.5 + 2 * 1.0 + 1 * 1.5)


def test_interpolation_and_extrapolation():
    tm = TimeModel(batch_sizes=(1, 4, 8), s_per_iter=(1.0, 2.5, 4.5))
    assert tm.iter_seconds(2) == pytest.approx(1.5)
    assert tm.iter_seconds(16) == pytest.approx(4.5 + 8 * 0.5)  # last slope continues
    assert tm.iter_seconds(0) == 0.0


def test_per_token_model_is_linear_in_tokens():
    tm = TimeModel.per_token(0.01)
    r = _sim([5, 7, 11, 2], [2, 2], capacity=2, tm=tm)
    assert r.decode_s[0] == pytest.approx(0.01 * 25)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(2, 12), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_vectorised_fifo_matches_loop_reference(n_actors, cap_groups, g, seed):
    rng = np.random.default_rng(seed)
    capacity = cap_groups * g
    counts = rng.integers(0, 3 * cap_groups, n_actors)
    actors = np.repeat(np.arange(n_actors), counts)
    if len(actors) == 0:
        return
    lengths = rng.lognormal(3, 1, len(actors) * g)
    sizes = np.full(len(actors), g)
    r = _sim(lengths, sizes, capacity, actors=actors)
    seq_actor = np.repeat(actors, g)
    for a in range(n_actors):
        sl = seq_actor == a
        if sl.sum() > capacity:
            ref = T._gang_fifo_entries(lengths[sl], sizes[actors == a], capacity)
            np.testing.assert_allclose(r.entry_iter[sl], ref)
    assert (r.peak_batch <= capacity).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 10), st.integers(1, 4), st.sampled_from([1, 3, 16]), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_batched_lockstep_equals_the_one_job_loop_value_for_value(n_actors, cap_groups, g, max_batch, ties, seed):
    # several jobs per step only where the FIFO provably takes the same slots: entries must be identical
    rng = np.random.default_rng(seed)
    capacity = cap_groups * g + int(rng.integers(0, g))  # also capacities that are not a multiple of g
    jobs = rng.integers(cap_groups + 1, 6 * cap_groups + 2, n_actors)  # every actor queues
    lengths = rng.integers(0, 6, jobs.sum() * g).astype(float) if ties else rng.lognormal(3, 1, jobs.sum() * g)
    starts = np.concatenate(([0], np.cumsum(jobs * g)))
    ls = T._lockstep_fifo(lengths, starts, np.arange(n_actors), g, capacity, max_batch=max_batch)
    entry = np.zeros(len(lengths))
    T._lockstep_entries(ls, starts, g, entry)
    for a in range(n_actors):
        sl = slice(starts[a], starts[a + 1])
        np.testing.assert_array_equal(entry[sl], T._gang_fifo_entries(lengths[sl], np.full(jobs[a], g), capacity))


def test_json_profile_rows_and_context(tmp_path):
    rows = [{"batch_size": 1, "context": 128, "s_per_iter": 0.01}, {"batch_size": 1, "context": 1024, "s_per_iter": 0.03},
            {"batch_size": 8, "context": 128, "s_per_iter": 0.02}, {"batch_size": 8, "context": 1024, "s_per_iter": 0.06}]
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(rows))
    assert TimeModel.from_json(p).s_per_iter == pytest.approx((0.02, 0.04))
    assert TimeModel.from_json(p, context=100).s_per_iter == pytest.approx((0.01, 0.02))
    p.write_text(json.dumps({"rows": rows, "prefill_s_per_token": 0.001}))
    assert TimeModel.from_json(p).prefill_s_per_token == 0.001


def test_bad_profiles_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        TimeModel.from_json(tmp_path / "missing.json")
    p = tmp_path / "bad.json"
    p.write_text(json.dumps([{"batch_size": 1}]))
    with pytest.raises(DataError, match="s_per_iter"):
        TimeModel.from_json(p)
    with pytest.raises(ConfigError, match="strictly increasing"):
        TimeModel(batch_sizes=(4, 2), s_per_iter=(1.0, 2.0))
    with pytest.raises(ConfigError, match="s_per_iter"):
        TimeModel(batch_sizes=(1,), s_per_iter=(-1.0,))


@pytest.mark.parametrize("bad, message", [
    ([{"batch_size": 1, "s_per_iter": -0.01}], r"row 0: s_per_iter must be finite seconds > 0 \(got -0.01\)"),
    ([{"batch_size": 1, "s_per_iter": 0.01}, {"batch_size": 2, "s_per_iter": "fast"}], "row 1: s_per_iter must be"),
    ([{"batch_size": 2.5, "s_per_iter": 0.01}], "row 0: batch_size must be an integer >= 1"),
    ([{"batch_size": 0, "s_per_iter": 0.01}], "row 0: batch_size must be an integer >= 1"),
    ([{"batch_size": 1, "s_per_iter": 0.01, "context": -5}], "row 0: context must be a number of keys >= 0"),
    ([{"batch_size": 1, "s_per_iter": 0.01, "n": 0}], "row 0: n must be an integer >= 1"),
    ([{"s_per_iter": 0.01}], "row 0 needs keys batch_size and s_per_iter"),
    ([], "expected a non-empty list"),
    ({"rows": [{"batch_size": 1, "s_per_iter": 0.01}], "actor_fixed_s": -1}, "time_model.actor_fixed_s: must be >= 0"),
    ({"rows": [{"batch_size": 1, "s_per_iter": 0.01}], "actor_fixed_s": "1"}, "actor_fixed_s must be a number"),
    ({"rows": [{"batch_size": 1, "s_per_iter": 0.01}], "prefil_s_per_token": 0.1}, "unknown key 'prefil_s_per_token'"),
    ("rows", "expected a non-empty list"),
])
def test_malformed_profile_is_refused_naming_file_and_row(tmp_path, bad, message):
    """Both readers of a profile (the planner's TimeModel.from_json and the engine's load_profile) refuse it."""
    from rlhfless.rollout.tpot import load_profile

    p = tmp_path / "profile.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=message) as err:
        TimeModel.from_json(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)
    if isinstance(bad, list):
        with pytest.raises(DataError, match=message):
            load_profile(p)
    p.write_text("[{")
    for read in (TimeModel.from_json, load_profile):
        with pytest.raises(DataError, match="profile.json: not valid JSON"):
            read(p)


def test_shipped_profile_loads_through_both_readers():
    from pathlib import Path

    from rlhfless.rollout.tpot import load_profile

    p = Path(__file__).parents[1] / "data" / "profiles" / "tpot_tiny_cpu.json"
    assert len(load_profile(p)) == len(json.loads(p.read_text()))
    assert TimeModel.from_json(p).s_per_iter[0] > 0


@pytest.mark.parametrize("seed", range(60))
def test_finish_seconds_without_a_queue_equals_the_sort_of_every_event(seed):
    """Where every sequence enters at iteration 0, `finish_seconds` sorts the finishes alone; bit for bit what
    sorting every entry and finish together gives (ties, rounded lengths, actors unordered or empty)."""
    rng = np.random.default_rng(seed)
    tm = TimeModel(batch_sizes=(1, 8, 64, 256), s_per_iter=(0.01, 0.012, 0.02, 0.05))
    n_actors, n = int(rng.integers(1, 25)), int(rng.integers(1, 400))
    actor = rng.integers(0, n_actors, n) if seed % 2 else np.sort(rng.integers(0, n_actors, n))
    finish = rng.uniform(1, 3000, n)
    finish = [finish, np.round(finish), np.round(finish / 50) * 50][seed % 3]
    fast = T.finish_seconds(np.zeros(n), finish, actor, n_actors, tm)
    assert np.array_equal(fast, T._finish_seconds_events(np.zeros(n), finish, actor, n_actors, tm))
    # given the sequences by length (`by_length`: an order with equal lengths shuffled among themselves, as
    # any caller's sort may leave them), the finishes are ordered by actor alone: the same floats
    shuffled = rng.permutation(n)
    by_length = shuffled[np.argsort(finish[shuffled], kind="stable")]
    ordered = T.finish_seconds(np.zeros(n), finish, actor, n_actors, tm, by_length=by_length)
    assert ordered.tobytes() == fast.tobytes()


@pytest.mark.parametrize("seed", range(20))
def test_finish_seconds_by_length_where_keys_round_together(seed):
    """Lengths so far apart that actor x span + length rounds distinct lengths to one key: the order by actor
    and length (`_unqueued_order`) still gives the stable float sort's times bit for bit."""
    rng = np.random.default_rng(seed)
    tm = TimeModel(batch_sizes=(1, 8, 64, 256), s_per_iter=(0.01, 0.012, 0.02, 0.05))
    n_actors, n = int(rng.integers(2, 40)), int(rng.integers(2, 300))
    actor = np.sort(rng.integers(0, n_actors, n))
    finish = rng.choice([1.0, 1.5, 2.0 ** 40, 2.0 ** 40 + 1.0, 3.0e15, 3.0e15 + 2.0, 7.25], n)
    by_length = np.argsort(finish, kind="stable")
    want = T.finish_seconds(np.zeros(n), finish, actor, n_actors, tm)
    got = T.finish_seconds(np.zeros(n), finish, actor, n_actors, tm, by_length=by_length)
    assert got.tobytes() == want.tobytes()


def test_iter_seconds_at_is_iter_seconds_bit_for_bit():
    """The table lookup the event sums use (`iter_seconds_at`) gives `iter_seconds`' floats for every whole
    batch size, past the profile's last point too, as the table grows; a negative size falls back to it."""
    rng = np.random.default_rng(7)
    models = [TimeModel.default_tiny_cpu(), TimeModel.per_token(0.003)]
    for _ in range(50):
        b = np.cumsum(rng.integers(1, 300, rng.integers(1, 8)))
        models.append(TimeModel(tuple(int(x) for x in b), tuple(float(x) for x in rng.random(len(b)) * 0.05 + 1e-4)))
    for tm in models:
        for sizes in (np.arange(5), np.arange(1500)[::-1].astype(float), rng.integers(0, 6000, 9),
                      np.cumsum(rng.choice([1.0, -1.0], 400)) + 400.0):
            assert tm.iter_seconds_at(sizes).tobytes() == tm.iter_seconds(sizes).tobytes()
    tm = models[0]
    assert tm.iter_seconds_at(np.array([-1.0, 2.0])).tobytes() == tm.iter_seconds(np.array([-1.0, 2.0])).tobytes()
    assert tm.iter_seconds_at(np.zeros(0)).shape == (0,)
