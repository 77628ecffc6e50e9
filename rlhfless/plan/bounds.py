"""A true lower bound on the makespan of any plan: what no assignment of these jobs to N actors can beat.

Purpose: `makespan_lower_bound(jobs, n_actors, capacity, time_model)` returns seconds B with
B <= makespan of EVERY assignment of the jobs to n_actors actors of `capacity` slots under the time model
(every policy, the hindsight plan, the optimum). It is the classic max(longest job, total work / N), stated for a
continuous-batching time model with iteration cost f(b) at batch b (`TimeModel.iter_seconds`):
  * g(b) = min over b <= b' <= capacity of f(b'): the largest non-decreasing function below f (f itself when the
    profile never dips); r = min over 1 <= b <= capacity of f(b) / b: the cheapest seconds per token.
  * longest job: an actor holding job j runs j's sequences together (gang admission), so while k of them are
    running its batch is >= k and an iteration costs >= g(k). With j's lengths sorted L_1 >= ... >= L_m,
    its busy time is >= fixed + prefill_j + sum_k L_k (g(k) - g(k - 1))  (the job alone on the actor).
  * total work: every token costs >= r seconds wherever it runs, so the active actors' busy seconds add up to
    >= k fixed + P + W r (P all prefill, W all decode tokens), and the slowest of k <= N actors is
    >= fixed + (P + W r) / N.
  B = the larger of the two. Under the linear per-token model (f(b) = b s, no fixed or prefill cost) both
  terms are exact: B = s max(largest job's tokens, total tokens / N), tight when the jobs split evenly.
With cut-and-migrate (`split_jobs=True`) a job's sequences may end on different actors and the source's prefill
stays behind, so the job term becomes fixed + g(1) x the longest sequence (it still needs that many
iterations, each >= g(1)); the work term holds as is (a KV transfer only adds time).

Non-goals: not the optimum (tests compare it with a brute-force optimum on tiny instances); no queueing
term (the bound stays valid when actors queue, only looser).

Deviations from the paper: the paper compares against an "oracle with perfect length knowledge" without
defining it; ours is this bound, logged beside the same policy fed true lengths (`balancer.hindsight_assign`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlhfless.plan.balancer import JobArrays, _validate
from rlhfless.plan.records import PlanJob
from rlhfless.plan.timemodel import TimeModel


def batch_cost_floors(tm: TimeModel, capacity: int) -> tuple[np.ndarray, float]:
    """(g, r): g (capacity + 1,) with g[0] = 0 and g[b] the non-decreasing floor of f at batch b; r the cheapest
    seconds per token over batches 1..capacity (definitions in the module header)."""
    b = np.arange(1, capacity + 1)
    f = tm.iter_seconds(b)
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
    """Seconds no assignment of `jobs` to `n_actors` actors can beat (rule in the module header).

    split_jobs: True for plans whose sequences may migrate between actors (cut-and-migrate).
    Raises ConfigError like `balancer.assign` for n_actors < 1 or a group larger than capacity.
    """
    ja = jobs if isinstance(jobs, JobArrays) else JobArrays.from_jobs(jobs)
    _validate(ja, n_actors, capacity)
    if len(ja.sizes) == 0:
        return 0.0
    tm = time_model
    g, r = batch_cost_floors(tm, int(capacity))
    prefill = ja.prompt_len * tm.prefill_s_per_token
    if split_jobs:
        longest = float(ja.seq_len.max()) * g[1]
    else:
        longest = float((prefill + job_floor_s(ja, g)).max())
    work = (float(prefill.sum()) + float(ja.seq_len.sum()) * r) / n_actors
    return tm.actor_fixed_s + max(longest, work)
