"""Planner benchmark: how long one planning decision and one full scaler sweep take.

Purpose: `run_planner_bench(...)` builds a heavy-tailed workload (default 1,024 groups x 8 samples = 8,192
sequences; group means log-normal, samples log-normal around their group's mean, 1..max_len tokens) and
measures, side by side in one process:
  * plan_ms_p50 / plan_ms_p90: ONE `assign(jobs, n_actors, capacity, time_model, policy)` call, from the list of
    PlanJob records to the finished AssignmentPlan: job arrays, the policy's labels, the continuous-batching
    simulation of every actor, and the plan record (default policy contiguous, 16 actors, capacity 256);
  * plan_cpu_ms_p50 / p90: the same call measured in CPU time of this process (on a shared machine wall time
    also counts waiting for a core);
  * policy_ms_p50: the same for every policy;
  * sweep_ms_p50 / sweep_ms_p90: ONE `choose(...)` over candidates 1..n_candidates (default 64): an assignment,
    simulation and costing per candidate, then the choice;
  * migrate_sim_ms: one `simulate_with_migration` of the default plan at tau (evaluation tool, not per step).
Non-goals: no assertion on wall time (tests never assert it); no multi-process timing.
Deviations from the paper: the paper reports "scheduling overhead under 30 ms" without saying what it covers.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from rlhfless.plan.balancer import POLICIES, assign
from rlhfless.plan.config import PlanConfig
from rlhfless.plan.migrate import simulate_with_migration
from rlhfless.plan.records import PlanJob
from rlhfless.plan.scaler import choose


def heavy_tailed_jobs(n_groups: int = 1024, group_size: int = 8, seed: int = 0, max_len: int = 2048,
                      prompt_len: int = 200) -> list[PlanJob]:
    """A heavy-tailed GRPO workload: n_groups jobs of group_size sequences with per-sample lengths."""
    rng = np.random.default_rng(seed)
    means = rng.lognormal(5.5, 0.9, n_groups)
    lens = np.clip(means[:, None] * rng.lognormal(0.0, 0.35, (n_groups, group_size)), 1, max_len).round()
    return [PlanJob(f"g{i}", group_size, tuple(lens[i].tolist()), prompt_len) for i in range(n_groups)]


def _pct(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 90))


def _timed(fn, repeats: int, clock=time.perf_counter) -> list[float]:  # noqa: ANN001 - zero-arg callable
    fn()  # warm-up (imports, caches)
    out = []
    for _ in range(repeats):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def run_planner_bench(n_groups: int = 1024, group_size: int = 8, n_actors: int = 16, n_candidates: int = 64,
                      policy: str = "contiguous", capacity: int = 256, repeats: int = 21, sweep_repeats: int = 5,
                      seed: int = 0) -> dict:
    """Measure planning and sweep times (see the module header for what each key covers)."""
    jobs = heavy_tailed_jobs(n_groups, group_size, seed)
    cfg = PlanConfig(policy=policy, capacity=capacity, min_actors=1, max_actors=n_candidates)
    tm = cfg.time_model()
    p50, p90 = _pct(_timed(lambda: assign(jobs, n_actors, capacity, tm, policy), repeats))
    # CPU seconds of this process: wall time on a shared machine also counts waiting for a core
    c50, c90 = _pct(_timed(lambda: assign(jobs, n_actors, capacity, tm, policy), repeats, time.process_time))
    per_policy = {}
    for pol in POLICIES:
        per_policy[pol] = _pct(_timed(lambda pol=pol: assign(jobs, n_actors, capacity, tm, pol), repeats))[0]
    s50, s90 = _pct(_timed(lambda: choose(jobs, cfg, tm), sweep_repeats))
    sc50 = _pct(_timed(lambda: choose(jobs, cfg, tm), sweep_repeats, time.process_time))[0]
    plan, _ = assign(jobs, n_actors, capacity, tm, policy)
    t = time.perf_counter()
    res, _ = simulate_with_migration(plan, tm, cfg.tau)
    mig_ms = (time.perf_counter() - t) * 1e3
    decision, _ = choose(jobs, cfg, tm)
    return {
        "plan_ms_p50": p50, "plan_ms_p90": p90, "plan_cpu_ms_p50": c50, "plan_cpu_ms_p90": c90,
        "policy_ms_p50": per_policy,
        "sweep_ms_p50": s50, "sweep_ms_p90": s90, "sweep_cpu_ms_p50": sc50, "migrate_sim_ms": mig_ms,
        "what": f"plan_ms: one assign() of {n_groups * group_size} sequences ({n_groups} groups x {group_size}) "
                f"into {n_actors} actors with policy {policy}, records in -> plan out, simulation included; "
                f"sweep_ms: one choose() over N=1..{n_candidates}",
        "sequences": n_groups * group_size, "groups": n_groups, "n_actors": n_actors, "candidates": n_candidates,
        "policy": policy, "capacity": capacity, "repeats": repeats, "sweep_repeats": sweep_repeats,
        "time_model": tm.source, "scaler_choice": decision.n_actors, "plan_makespan_s": plan.makespan_s,
        "migrate_makespan_s": res.makespan_s, "migrations": len(res.moves),
        "python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
    }
