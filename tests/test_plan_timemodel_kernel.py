"""The compiled event sums (plan/timemodel_kernel.py) against their numpy references in plan/timemodel.py, bit for
bit: queued and unqueued actors, ties, empty actors, one actor, actors in or out of order."""

from __future__ import annotations

import numpy as np
import pytest

from rlhfless.plan import jit
from rlhfless.plan import timemodel as T
from rlhfless.plan.timemodel import TimeModel

if not jit.on():  # decided before numba is imported: where vLLM is installed, numba must never load (`plan.jit`)
    pytest.skip("the compiled kernels are off here (plan.jit.on())", allow_module_level=True)
K = pytest.importorskip("rlhfless.plan.timemodel_kernel")
TMS = [TimeModel(batch_sizes=(1, 8, 64, 256), s_per_iter=(0.01, 0.012, 0.02, 0.05)), TimeModel.default_tiny_cpu(),
       TimeModel(batch_sizes=(1, 2), s_per_iter=(1.0, 1.5))]


def _case(seed: int):
    """A random play: actors (sorted or not, some empty), lengths with ties, entries from the FIFO or none."""
    rng = np.random.default_rng(seed)
    n_actors = int(rng.integers(1, 30)) if seed % 5 else 1
    n = int(rng.integers(1, 600)) if seed % 7 else 1
    actor = rng.integers(0, n_actors, n)
    if seed % 3:
        actor = np.sort(actor)
    lengths = rng.uniform(0, 2000, n)
    lengths = [lengths, np.round(lengths / 40) * 40, np.round(lengths), np.zeros(n) + 5.0][seed % 4]
    return rng, n_actors, n, actor, lengths


@pytest.mark.parametrize("seed", range(40))
def test_radix_order_is_the_stable_argsort(seed):
    """`_order` gives `np.argsort(kind="stable")`'s permutation: ties in index order, keys equal in some digits
    (whole numbers, one value), huge and tiny magnitudes; negative keys and -0.0, which a sort of the bits would
    misplace, through the merge-sort fallback."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 3000))
    keys = [rng.uniform(0, 1e5, m), np.round(rng.uniform(0, 50, m)), np.full(m, 3.5),
            rng.choice([0.0, 1e-300, 5e-324, 1.0, 2.0 ** 60, np.inf], m), rng.uniform(-5, 5, m),
            rng.choice([0.0, -0.0, 1.0], m), rng.integers(0, 30, m) * 1234.5 + rng.uniform(0, 1000, m)]
    for key in keys:
        assert np.array_equal(K._order(key), np.argsort(key, kind="stable"))

@pytest.mark.parametrize("seed", range(120))
def test_finish_events_equal_numpy_bit_for_bit(seed):
    rng, n_actors, n, actor, lengths = _case(seed)
    tm = TMS[seed % 3]
    entry = [rng.integers(0, 50, n).astype(float), np.round(rng.uniform(0, 3000, n), 1), np.zeros(n)][seed % 3]
    entry[rng.random(n) < 0.3] = 0.0
    finish = entry + lengths
    want = T._finish_seconds_events(entry, finish, actor, n_actors, tm)
    got = K.finish_events(entry, finish, actor.astype(np.int64), float(finish.max()) + 1.0, tm.iter_table(n))
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("seed", range(120))
def test_finish_unqueued_equal_numpy_bit_for_bit(seed):
    rng, n_actors, n, actor, finish = _case(seed)
    tm = TMS[seed % 3]
    span, fv, act = float(finish.max()) + 1.0, tm.iter_table(n), actor.astype(np.int64)
    want = T._finish_seconds_unqueued(finish, actor, n_actors, tm)
    assert want.tobytes() == T._finish_seconds_events(np.zeros(n), finish, actor, n_actors, tm).tobytes()
    assert K.finish_unqueued(finish, act, n_actors, span, fv, np.zeros(0, np.int64)).tobytes() == want.tobytes()
    shuffled = rng.permutation(n)  # equal lengths in any order among themselves, as a caller's sort may leave them
    by_length = shuffled[np.argsort(finish[shuffled], kind="stable")]
    got = K.finish_unqueued(finish, act, n_actors, span, fv, by_length.astype(np.int64))
    assert got.tobytes() == want.tobytes()


def test_labels_finish_s_runs_the_kernel_where_the_switch_is_on(monkeypatch):
    """`balancer.labels_finish_s` calls the kernel where `jit.on()` (and the numpy code where it is off): a
    kernel that answers differently shows."""
    from rlhfless.plan import balancer as B
    from rlhfless.plan.records import PlanJob

    monkeypatch.setattr(T, "_KERNEL", T._UNSET)
    assert jit.on() and T.kernel() is K
    ja = B.JobArrays.from_jobs([PlanJob("a", 2, (3.0, 5.0)), PlanJob("b", 1, (4.0,))])
    args = (ja, np.array([0, 0]), np.array([0, 1]), 1, 2, TMS[0])
    monkeypatch.setattr(K, "labels_finish", lambda *a: np.full(2, 7.0))
    assert B.labels_finish_s(*args).tolist() == [7.0, 7.0]
    monkeypatch.setattr(T, "_KERNEL", None)
    assert B.labels_finish_s(*args).tolist() != [7.0, 7.0]


def test_one_switch_for_both_kernels(monkeypatch):
    """RLHFLESS_JIT=0 turns off both compiled kernels (`jit.on()`), the cut simulation's and the event sums'."""
    from rlhfless.plan import migrate

    for mod in (T, migrate):
        monkeypatch.setattr(mod, "_KERNEL", mod._UNSET)
    monkeypatch.setattr(jit, "_ON", None)
    monkeypatch.setenv("RLHFLESS_JIT", "0")
    assert T.kernel() is None and migrate.kernel() is None


def _fifo_case(seed: int):
    """Jobs of one size (the lock-step FIFO's case) or mixed sizes, singletons, lengths with ties, some actors
    queued and some not, empty actors, one actor."""
    rng = np.random.default_rng(seed)
    n_actors = int(rng.integers(1, 12)) if seed % 5 else 1
    capacity = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
    g_max = min(capacity, 8)
    sizes = rng.integers(1, g_max + 1, int(rng.integers(1, 120)))
    if seed % 3 == 0:
        sizes[:] = min(g_max, int(rng.integers(1, 5)))
    elif seed % 3 == 1:
        sizes[:] = 1
    job_actor = np.sort(rng.integers(0, n_actors, len(sizes)))
    lengths = rng.uniform(0, 500, int(sizes.sum()))
    lengths = [lengths, np.round(lengths / 25) * 25, np.round(lengths)][seed % 3]
    return lengths, np.repeat(job_actor, sizes), sizes.astype(np.int64), job_actor, n_actors, capacity


@pytest.mark.parametrize("seed", range(150))
def test_fifo_entries_equal_numpy_bit_for_bit(seed, monkeypatch):
    """`admissions` and `simulate` (through `_fifo_entries`) admit at the same iterations compiled as by the
    lock-step FIFO and the loop, bit for bit."""
    lengths, seq_actor, sizes, job_actor, n_actors, capacity = _fifo_case(seed)
    monkeypatch.setattr(T, "_KERNEL", K)
    got = T.admissions(lengths, seq_actor, sizes, job_actor, n_actors, capacity)
    got_sim = T.simulate(lengths, seq_actor, sizes, job_actor, n_actors, capacity, TMS[0])
    monkeypatch.setattr(T, "_KERNEL", None)
    want = T.admissions(lengths, seq_actor, sizes, job_actor, n_actors, capacity)
    want_sim = T.simulate(lengths, seq_actor, sizes, job_actor, n_actors, capacity, TMS[0])
    assert got.tobytes() == want.tobytes()
    for f in ("decode_s", "peak_batch", "entry_iter", "finish_iter"):
        assert getattr(got_sim, f).tobytes() == getattr(want_sim, f).tobytes()
    loop = np.zeros(len(lengths))  # the per-actor loop itself, whatever `_fifo_entries` would have picked
    starts = np.concatenate(([0], np.cumsum(np.bincount(seq_actor, minlength=n_actors))))
    for a in range(n_actors):
        if starts[a + 1] - starts[a] > capacity:
            sl = slice(starts[a], starts[a + 1])
            loop[sl] = T._gang_fifo_entries(lengths[sl], sizes[job_actor == a], capacity)
    assert got.tobytes() == loop.tobytes()


@pytest.mark.parametrize("seed", range(100))
def test_prefix_end_equals_numpy_bit_for_bit(seed):
    """`overlap._Prefixes.end` compiled (`prefix_end`) and in numpy, every count of blocks: ties in ready and
    arrival times, zero-device blocks (NaN rows and zero-rate segments stepped over), one block, one arrival."""
    from rlhfless.plan.overlap import _Arrivals, _Prefixes

    rng = np.random.default_rng(seed)
    g, k = int(rng.integers(1, 60)) if seed % 4 else 1, int(rng.integers(1, 25)) if seed % 5 else 1
    arrive = np.round(rng.uniform(0, 50, g), int(rng.integers(0, 3)))
    work = rng.uniform(0, 40, g) * (rng.random(g) > 0.1)
    ready = np.sort(np.round(rng.uniform(0, 60, k), int(rng.integers(0, 2))))
    devices = rng.choice([0.0, 1.0, 8.0, 3.5], k)
    if seed % 2:  # whole numbers: the work's curve meets a block's ready time exactly (searchsorted's ties)
        arrive, work, ready = np.round(arrive), np.round(work), np.round(ready)
        devices = rng.choice([0.0, 1.0, 2.0], k)
    rows = _Prefixes(_Arrivals.of(arrive, work), ready, devices)
    assert rows.kernel is K
    got = np.array([rows.end(n) for n in range(1, k + 1)])
    rows.kernel = None
    want = np.array([rows.end(n) for n in range(1, k + 1)])
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("seed", range(80))
def test_labels_finish_equals_numpy_bit_for_bit(seed, monkeypatch):
    """`balancer.labels_finish_s` compiled (`labels_finish`) and in numpy: any labels and ranks, jobs of one
    size or mixed, queued actors or none, with and without the lengths order, empty actors, one actor."""
    from rlhfless.plan import balancer as B
    from rlhfless.plan.records import PlanJob

    rng = np.random.default_rng(seed)
    tm = TMS[seed % 3]
    n_jobs, g = int(rng.integers(1, 80)), int(rng.integers(1, 5))
    sizes = [g] * n_jobs if seed % 2 else rng.integers(1, 5, n_jobs).tolist()
    jobs = [PlanJob(f"g{i}", s, tuple(float(x) for x in np.round(rng.uniform(0, 900, s), int(rng.integers(0, 2)))),
                    int(rng.integers(0, 50))) for i, s in enumerate(sizes)]
    sub, _ = B.JobArrays.from_jobs(jobs).take_seqs(rng.permutation(n_jobs))
    n = int(rng.integers(1, 8)) if seed % 5 else 1
    labels, rank = rng.integers(0, n, n_jobs), rng.permutation(n_jobs)
    shuffled = rng.permutation(len(sub.seq_len))
    by_length = shuffled[np.argsort(sub.seq_len[shuffled], kind="stable")]
    for capacity in (int(sum(sizes)), max(4, int(sum(sizes)) // (2 * n)), 4):
        for by in (None, by_length):
            monkeypatch.setattr(T, "_KERNEL", K)
            got = B.labels_finish_s(sub, labels, rank, n, capacity, tm, by_length=by)
            monkeypatch.setattr(T, "_KERNEL", None)
            want = B.labels_finish_s(sub, labels, rank, n, capacity, tm, by_length=by)
            assert got.tobytes() == want.tobytes()


def test_without_numba_the_numpy_sums_run():
    """Where numba is missing (the GPU machine's image) `labels_finish_s` and the sizing rows run in numpy, with
    the same floats as the kernels here."""
    import subprocess
    import sys
    from pathlib import Path

    from rlhfless.plan import balancer as B
    from rlhfless.plan.records import PlanJob

    code = """
import sys
sys.modules["numba"] = None  # import numba raises ImportError
import numpy as np
from rlhfless.plan import balancer as B, timemodel as T
from rlhfless.plan.records import PlanJob
assert T.kernel() is None
ja = B.JobArrays.from_jobs([PlanJob(f"g{i}", 2, (3.0 + i, 50.0 / (i + 1))) for i in range(9)])
print(B.labels_finish_s(ja, np.arange(9) % 2, np.arange(9), 2, 4, T.TimeModel.default_tiny_cpu()).tobytes().hex())
"""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120)
    assert done.returncode == 0, done.stderr
    ja = B.JobArrays.from_jobs([PlanJob(f"g{i}", 2, (3.0 + i, 50.0 / (i + 1))) for i in range(9)])
    assert T.kernel() is K
    got = B.labels_finish_s(ja, np.arange(9) % 2, np.arange(9), 2, 4, TimeModel.default_tiny_cpu())
    assert done.stdout.strip() == got.tobytes().hex()
