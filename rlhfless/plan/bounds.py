"""A true lower bound on the makespan of any plan: what no assignment of these jobs to N actors can beat.

`makespan_lower_bound(jobs, n_actors, capacity, time_model)` returns seconds B <= the makespan of EVERY
assignment of the jobs to n_actors actors of `capacity` slots (every policy, the hindsight plan, the optimum):
the classic max(longest job, total work / N), stated for a continuous-batching time model with iteration cost
f(b) at batch b. The rule it keeps: B is a bound, never an estimate (each term counts only costs no plan avoids;
tests compare it with a brute-force optimum on tiny instances). The two terms, the split_jobs variant for
cut-and-migrate and when B is tight: docs/internals.md#planboundspy.

Deviations from the paper:
1. The paper compares against an "oracle with perfect length knowledge" without defining it; ours is this
   bound, logged beside the same policy fed true lengths (`balancer.hindsight_assign`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlhfless.plan.balancer import JobArrays, validate_jobs
from rlhfless.plan.records import PlanJob
from rlhfless.plan.timemodel import TimeModel


def batch_cost_floors(tm: TimeModel, capacity: int) -> tuple[np.ndarray, float]:
    """(g, r): g (capacity + 1,) with g[0] = 0 and g[b] the non-decreasing floor of f at batch b; r the cheapest
    seconds per token over batches 1..capacity (docs/internals.md#planboundspy)."""
    b = np.arange(1, capacity + 1)
    f = tm.iter_seconds(b)
    # g(k) = min of f over batches >= k: while k of a job's sequences run, an iteration costs at least that
    g = np.minimum.accumulate(f[::-1])[::-1]
    return np.concatenate(([0.0], g)), float((f / b).min())


def job_floor_s(ja: JobArrays, g: np.ndarray) -> np.ndarray:
    """(J,) decode seconds of each job alone on an actor under the floor g: sum_k L_k (g(k) - g(k-1)), L desc."""
    job = np.repeat(np.arange(len(ja.sizes)), ja.sizes)
    order = np.lexsort((-ja.seq_len, job))
    rank = np.arange(len(order)) - ja.offsets[job[order]]  # 0 for each job's longest sequence
    dg = np.diff(g)
    return np.bincount(job[order], weights=ja.seq_len[order] * dg[rank], minlength=len(ja.sizes))


def makespan_lower_bound(jobs: Sequence[PlanJob] | JobArrays, n_actors: int, capacity: int,
                         time_model: TimeModel, split_jobs: bool = False) -> float:
    """Seconds no assignment of `jobs` to `n_actors` actors can beat (docs/internals.md#planboundspy).

    split_jobs: True for plans whose sequences may migrate between actors (cut-and-migrate).
    Raises ConfigError like `balancer.assign` for n_actors < 1 or a group larger than capacity.
    """
    ja = jobs if isinstance(jobs, JobArrays) else JobArrays.from_jobs(jobs)
    validate_jobs(ja, n_actors, capacity)
    if len(ja.sizes) == 0:
        return 0.0
    tm = time_model
    g, r = batch_cost_floors(tm, int(capacity))
    prefill = ja.prompt_len * tm.prefill_s_per_token
    if split_jobs:  # a migrated job leaves its prefill behind; its longest sequence still needs g(1) per token
        longest = float(ja.seq_len.max()) * g[1]
    else:
        longest = float((prefill + job_floor_s(ja, g)).max())
    # every decode token costs >= r seconds wherever it runs, so N actors share at least this much
    work = (float(prefill.sum()) + float(ja.seq_len.sum()) * r) / n_actors
    return tm.actor_fixed_s + max(longest, work)
