"""Length-aware prompt assignment: jobs with predicted lengths -> N decode actors, with predicted busy time.

`assign(jobs, n_actors, capacity, time_model, policy)` returns `(AssignmentPlan, metrics)` for one step; each
policy (round_robin, contiguous, lpt, karmarkar_karp) is also callable alone. Labels come from `plan.partition`
(contiguous: refined to equal busy time by `plan.sweep`), busy seconds from `plan.timemodel.simulate_fast`.
The rule it keeps: a job keeps a group's n_seqs sequences together (shared prefix) on one actor.
`hindsight_assign` is the same policy fed the true lengths: a reference for what prediction error costs, NOT a
bound (that is `plan.bounds.makespan_lower_bound`). Admission order: docs/internals.md#planbalancerpy.

Deviations from the paper:
1. Round-robin (baseline), LPT and Karmarkar-Karp ship beside the paper's contiguous chunks, for comparison.
2. Contiguous boundaries equalise predicted busy TIME (rule in `sweep`; the paper does not state its rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import chain, repeat
from operator import itemgetter

import numpy as np

from rlhfless.core import metrics as M
from rlhfless.core.errors import ConfigError, DataError
import rlhfless.plan.sweep as sw
from rlhfless.plan.records import AssignmentPlan, PlanJob
from rlhfless.plan.timemodel import TimeModel, simulate_fast

POLICIES = ("round_robin", "contiguous", "lpt", "karmarkar_karp")


@dataclass(frozen=True)
class JobArrays:
    """Jobs as flat arrays, built once and reusable across many N (the scaler's sweep).

    sizes, prompt_len, work, mean_len: (J,) seqs, prompt tokens, predicted tokens, tokens per seq;
    seq_len: (S,) per-sequence predicted tokens, job-major; offsets: (J+1,) first sequence of each job.
    """

    jobs: tuple[PlanJob, ...]
    sizes: np.ndarray
    prompt_len: np.ndarray
    work: np.ndarray
    mean_len: np.ndarray
    seq_len: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_jobs(cls, jobs: Sequence[PlanJob]) -> JobArrays:
        jobs = tuple(jobs)
        if not set(map(type, jobs)) <= {PlanJob}:  # the usual case checked in C; subclasses are fine
            bad = next((j for j in jobs if not isinstance(j, PlanJob)), None)
            if bad is not None:
                raise DataError(f"assignment input must be PlanJob records (got {type(bad).__name__})")
        sizes = np.array([j.n_seqs for j in jobs], dtype=np.int64)
        prompt = np.array([j.prompt_len for j in jobs], dtype=np.float64)
        lens = [j.predicted_len for j in jobs]
        if set(map(type, lens)) - {tuple}:  # a float stands for every sequence of its job
            lens = [x if isinstance(x, tuple) else repeat(x, j.n_seqs) for x, j in zip(lens, jobs)]
        seq_len = np.fromiter(chain.from_iterable(lens), dtype=np.float64, count=int(sizes.sum()))
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        work = np.add.reduceat(seq_len, offsets[:-1]) if len(jobs) else np.zeros(0)
        return cls(jobs, sizes, prompt, work, work / np.maximum(sizes, 1), seq_len, offsets)

    def take(self, idx: Sequence[int]) -> JobArrays:
        """The jobs at positions `idx`, in that order: the arrays `from_jobs` builds of them, gathered rather than
        read job by job again (the scaler plays each candidate's order of one outcome's jobs)."""
        return self.take_seqs(idx)[0]

    def take_seqs(self, idx: Sequence[int]) -> tuple[JobArrays, np.ndarray]:
        """`take(idx)` and (S',) the position in these arrays of each sequence it gathered."""
        idx = np.asarray(idx, dtype=np.int64)
        sizes = self.sizes[idx]
        before = np.cumsum(sizes) - sizes
        src = np.repeat(self.offsets[idx] - before, sizes) + np.arange(int(sizes.sum()))
        seq_len = self.seq_len[src]
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        work = np.add.reduceat(seq_len, offsets[:-1]) if len(idx) else np.zeros(0)  # as `from_jobs` sums
        jobs = tuple(map(self.jobs.__getitem__, idx.tolist()))  # in C: every candidate and draw gathers ~500
        return JobArrays(jobs, sizes, self.prompt_len[idx], work, work / np.maximum(sizes, 1), seq_len,
                         offsets), src


def validate_jobs(ja: JobArrays, n_actors: int, capacity: int) -> None:
    if isinstance(n_actors, bool) or not isinstance(n_actors, (int, np.integer)) or n_actors < 1:
        raise ConfigError(f"n_actors: must be an integer >= 1 (got {n_actors!r})")
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ConfigError(f"capacity: must be an integer >= 1 concurrent sequences (got {capacity!r})")
    if len(ja.sizes) and ja.sizes.max() > capacity:
        big = ja.jobs[int(np.argmax(ja.sizes))]
        raise ConfigError(
            f"capacity: {capacity} concurrent sequences cannot hold group {big.group_id!r} of n_seqs="
            f"{big.n_seqs} (its samples share a prefix and are admitted together); use capacity >= "
            f"{int(ja.sizes.max())} or split the group into per-sequence jobs"
        )


def build_plan(ja: JobArrays, labels: np.ndarray, rank: np.ndarray, n_actors: int, capacity: int,
               tm: TimeModel, policy: str) -> AssignmentPlan:
    """Simulate a labelling. labels: (J,) actor per job; rank: (J,) admission priority (lower first)."""
    order = np.lexsort((rank, labels))
    sizes, jactor = ja.sizes[order], labels[order]
    starts = ja.offsets[order]
    before = np.cumsum(sizes) - sizes
    seq_idx = np.repeat(starts - before, sizes) + np.arange(int(sizes.sum()))
    sim = simulate_fast(ja.seq_len[seq_idx], np.repeat(jactor, sizes), sizes, jactor, n_actors, capacity, tm)
    njobs = np.bincount(labels, minlength=n_actors)
    prefill = np.bincount(labels, weights=ja.prompt_len, minlength=n_actors) * tm.prefill_s_per_token
    busy = np.where(njobs > 0, tm.actor_fixed_s + prefill + sim.decode_s, 0.0)
    bounds = np.concatenate(([0], np.cumsum(njobs)))
    jobs = tuple(ja.jobs[i] for i in order.tolist()) if len(order) < 2 else itemgetter(*order.tolist())(ja.jobs)
    b = bounds.tolist()
    actor_jobs = tuple(jobs[b[a]:b[a + 1]] for a in range(n_actors))
    makespan = float(busy.max()) if n_actors else 0.0
    return AssignmentPlan(
        policy=policy, n_actors=n_actors, capacity=capacity, actor_jobs=actor_jobs,
        busy_s=tuple(busy.tolist()), makespan_s=makespan, idle_device_s=float((makespan - busy).sum()),
        peak_batch=tuple(sim.peak_batch.tolist()),
    )


def plan_metrics(plan: AssignmentPlan) -> dict[str, float]:
    """Balancer metrics of a plan (names from rlhfless.core.metrics)."""
    return {
        M.BAL_IMBALANCE: plan.imbalance,
        M.BAL_MAKESPAN_S: plan.makespan_s,
        M.BAL_IDLE_DEVICE_S: plan.idle_device_s,
        M.BAL_ACTIVE_ACTORS: float(plan.active_actors),
    }


def _labels(policy: str, ja: JobArrays, n: int, capacity: int, tm: TimeModel) -> tuple[np.ndarray, np.ndarray]:
    """(labels (J,), admission rank (J,)): the same labels the scaler's sweep uses for this N."""
    if policy == "contiguous":
        res = sw.sweep(ja, (n,), capacity, tm, policy)
        return res.labels(0), res.rank
    labels = sw.policy_labels(policy, ja, n)
    if policy == "round_robin":  # verl admits in arrival order
        return labels, np.arange(len(ja.work))
    rank = np.empty(len(ja.work), dtype=np.int64)
    # length-aware policies admit the longest predicted first: long sequences start early, the tail is shorter
    rank[np.argsort(-ja.mean_len, kind="stable")] = np.arange(len(ja.work))
    return labels, rank


def assign(jobs: Sequence[PlanJob] | JobArrays, n_actors: int, capacity: int, time_model: TimeModel,
           policy: str = "contiguous") -> tuple[AssignmentPlan, dict[str, float]]:
    """Assign jobs to n_actors decode actors of `capacity` slots each with `policy`; return (plan, metrics).

    Raises ConfigError for an unknown policy, n_actors < 1, or a capacity smaller than some job's n_seqs.
    """
    if policy not in POLICIES:
        raise ConfigError(f"plan.policy: unknown assignment policy {policy!r}; allowed: {', '.join(POLICIES)}")
    ja = jobs if isinstance(jobs, JobArrays) else JobArrays.from_jobs(jobs)
    validate_jobs(ja, n_actors, capacity)
    labels, rank = _labels(policy, ja, int(n_actors), int(capacity), time_model)
    plan = build_plan(ja, labels, rank, int(n_actors), int(capacity), time_model, policy)
    return plan, plan_metrics(plan)


def _policy(name: str) -> Callable[..., tuple[AssignmentPlan, dict[str, float]]]:
    def run(jobs, n_actors, capacity, time_model):
        return assign(jobs, n_actors, capacity, time_model, policy=name)

    run.__name__ = name
    run.__doc__ = f"`assign(..., policy={name!r})`: returns (AssignmentPlan, metrics)."
    return run


round_robin = _policy("round_robin")
contiguous = _policy("contiguous")
lpt = _policy("lpt")
karmarkar_karp = _policy("karmarkar_karp")


def with_lengths(jobs: Sequence[PlanJob], true_len: Callable[[PlanJob], float | tuple[float, ...]]) -> list[PlanJob]:
    """The same jobs with `predicted_len` replaced by `true_len(job)` (a float or a per-sequence tuple)."""
    return [replace(j, predicted_len=true_len(j)) for j in jobs]


def hindsight_assign(jobs: Sequence[PlanJob], true_len: Callable[[PlanJob], float | tuple[float, ...]],
                     n_actors: int, capacity: int, time_model: TimeModel,
                     policy: str = "contiguous") -> tuple[AssignmentPlan, dict[str, float]]:
    """The same policy fed the true lengths (hindsight): what the decision would have been with a perfect
    predictor. Not a bound: see `rlhfless.plan.bounds.makespan_lower_bound` for one."""
    return assign(with_lengths(jobs, true_len), n_actors, capacity, time_model, policy)


def evaluate_plan(plan: AssignmentPlan, true_jobs: Sequence[PlanJob], time_model: TimeModel) -> AssignmentPlan:
    """Re-simulate a plan's placement and admission order with other (e.g. true) lengths, matched by group_id."""
    by_id = {j.group_id: j for j in true_jobs}
    missing = [j.group_id for jobs in plan.actor_jobs for j in jobs if j.group_id not in by_id]
    if missing:
        raise DataError(f"evaluate_plan: no true lengths for group(s) {missing[:5]}")
    flat = [by_id[j.group_id] for jobs in plan.actor_jobs for j in jobs]
    labels = np.repeat(np.arange(plan.n_actors), [len(js) for js in plan.actor_jobs])
    ja = JobArrays.from_jobs(flat)
    validate_jobs(ja, plan.n_actors, plan.capacity)
    return build_plan(ja, labels, np.arange(len(flat)), plan.n_actors, plan.capacity, time_model, plan.policy)


def job_finish_s(plan: AssignmentPlan, true_jobs: Sequence[PlanJob], time_model: TimeModel) -> dict[str, float]:
    """Seconds from its actor's start at which each job's last sequence finishes (fixed overhead and the actor's
    prefill first, as `build_plan` charges them), re-simulated with `true_jobs`' lengths (matched by group_id)."""
    by_id = {j.group_id: j for j in true_jobs}
    flat = [by_id[j.group_id] for jobs in plan.actor_jobs for j in jobs]
    if not flat:
        return {}
    labels = np.repeat(np.arange(plan.n_actors), [len(js) for js in plan.actor_jobs])
    fin = labels_finish_s(JobArrays.from_jobs(flat), labels, np.arange(len(flat)), plan.n_actors, plan.capacity,
                          time_model)
    return {j.group_id: float(x) for j, x in zip(flat, fin.tolist())}


_NO_ORDER = np.zeros(0, np.int64)


def labels_finish_s(ja: JobArrays, labels: np.ndarray, rank: np.ndarray, n_actors: int, capacity: int,
                    tm: TimeModel, by_length: np.ndarray | None = None) -> np.ndarray:
    """(J,) seconds from its actor's start at which each job (ja order) finishes under a labelling, simulated as
    `build_plan` does (admission by rank within an actor; fixed overhead and the actor's prefill first).
    by_length: (S,) ja's sequences in ascending order of length, when the caller has it (the scaler sorts each
    drawn outcome once for its 21 candidates' plays): `finish_seconds` then orders an unqueued play's
    finishes by actor alone."""
    from rlhfless.plan.timemodel import admissions, finish_seconds, kernel

    if len(labels) == 0:
        return np.zeros(0)
    order = np.lexsort((rank, labels))
    k = kernel()
    if k is not None and len(ja.seq_len):  # the steps below compiled, the same floats (`timemodel_kernel`)
        by = _NO_ORDER if by_length is None else np.asarray(by_length, np.int64)
        return k.labels_finish(order, np.asarray(ja.sizes, np.int64), np.asarray(ja.offsets, np.int64),
                               np.asarray(ja.seq_len, np.float64), np.asarray(ja.prompt_len, np.float64),
                               np.asarray(labels, np.int64), n_actors, capacity, tm.iter_table(len(ja.seq_len)),
                               float(tm.actor_fixed_s), float(tm.prefill_s_per_token), by)
    sizes, jactor = ja.sizes[order], labels[order]
    before = np.cumsum(sizes) - sizes
    seq_idx = np.repeat(ja.offsets[order] - before, sizes) + np.arange(int(sizes.sum()))
    sactor = np.repeat(jactor, sizes)
    lengths = ja.seq_len[seq_idx]
    entry = admissions(lengths, sactor, sizes, jactor, n_actors, capacity)  # `simulate_fast`'s, its decode unread
    if by_length is not None:  # the same sequences in this play's order (seq_idx: play position -> ja position)
        at = np.empty(len(seq_idx), dtype=np.intp)
        at[seq_idx] = np.arange(len(seq_idx))
        by_length = at[by_length]
    fin = finish_seconds(entry, entry + lengths, sactor, n_actors, tm, by_length=by_length)
    head = tm.actor_fixed_s + np.bincount(labels, weights=ja.prompt_len, minlength=n_actors) * tm.prefill_s_per_token
    out = np.empty(len(order))
    out[order] = np.maximum.reduceat(fin, np.concatenate(([0], np.cumsum(sizes)[:-1]))) + head[jactor]
    return out
