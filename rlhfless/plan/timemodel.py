"""Time model of a decode actor: a continuous-batching engine simulated event by event.

From a time-per-iteration profile (seconds per iteration vs running batch, piecewise linear), prefill seconds per
prompt token and a fixed overhead, `simulate` gives each actor's busy seconds for an assignment: `capacity` slots,
FIFO gang admission of a job's sequences, one token per running sequence per iteration. The rule it keeps:
`simulate_fast` and the lock-step path give `simulate`'s admissions and peaks value for value (tested). How the
fast paths work: docs/internals.md#plantimemodelpy. Lengths are real numbers of tokens, never rounded.

Deviations from the paper:
1. Any profile table is taken (the paper profiles TPOT on its GPUs); the tiny CPU default is an assumed shape.
2. Prefill is charged to the decode actor per prompt token of each job (one prefix per job).
"""

from __future__ import annotations

import bisect
import heapq
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

import numpy as np

from rlhfless.core.errors import ConfigError, DataError, require
from rlhfless.plan import jit

# Assumed profile of the tiny CPU model (batch size -> seconds per decode iteration); docs/internals.md#plantimemodelpy.
_TINY_CPU_TABLE = ((1, 0.010), (2, 0.011), (4, 0.012), (8, 0.015), (16, 0.021), (32, 0.033),
                   (64, 0.058), (128, 0.110), (256, 0.215))


@dataclass(frozen=True)
class TimeModel:
    """Seconds per decode iteration vs batch size, plus prefill and fixed overheads.

    batch_sizes: profiled batch sizes, strictly increasing integers >= 1.
    s_per_iter: seconds per decode iteration at each profiled batch size (> 0). Between points: linear
        interpolation; below the first point: the first value; above the last: the last segment's slope
        (never negative).
    prefill_s_per_token: seconds per prompt token prefilled (>= 0), charged once per job.
    actor_fixed_s: seconds every decode actor with work spends on fixed setup/teardown per step (>= 0).
    kv_transfer_s_per_token: seconds per context token to move a sequence's KV on migration (>= 0).
    source: where the profile came from (a path or "default_tiny_cpu"), for logs.
    """

    batch_sizes: tuple[int, ...]
    s_per_iter: tuple[float, ...]
    prefill_s_per_token: float = 0.0002
    actor_fixed_s: float = 0.05
    kv_transfer_s_per_token: float = 0.00002
    source: str = "given"
    _x: np.ndarray = field(init=False, repr=False, compare=False)
    _y: np.ndarray = field(init=False, repr=False, compare=False)
    _table: np.ndarray | None = field(init=False, repr=False, compare=False, default=None)  # `iter_seconds_at`

    def __post_init__(self) -> None:
        b, s = tuple(self.batch_sizes), tuple(self.s_per_iter)
        require(len(b) >= 1 and len(b) == len(s), "time_model.batch_sizes",
                f"need one s_per_iter per batch size and at least one point (got {len(b)} and {len(s)})")
        require(all(isinstance(x, (int, np.integer)) and x >= 1 for x in b), "time_model.batch_sizes",
                f"must be integers >= 1 (got {b})")
        require(all(b2 > b1 for b1, b2 in zip(b, b[1:])), "time_model.batch_sizes",
                f"must be strictly increasing (got {b})")
        require(all(np.isfinite(x) and x > 0 for x in s), "time_model.s_per_iter", f"must be > 0 (got {s})")
        for name in ("prefill_s_per_token", "actor_fixed_s", "kv_transfer_s_per_token"):
            v = getattr(self, name)
            require(np.isfinite(v) and v >= 0, f"time_model.{name}", f"must be >= 0 (got {v})")
        object.__setattr__(self, "_x", np.asarray(b, dtype=np.float64))
        object.__setattr__(self, "_y", np.asarray(s, dtype=np.float64))

    def iter_seconds(self, batch: np.ndarray | float) -> np.ndarray:
        """Seconds of one decode iteration at batch size `batch` (array or scalar; 0 for batch 0)."""
        b = np.asarray(batch, dtype=np.float64)
        y = np.interp(b, self._x, self._y)
        if len(self._x) >= 2:
            # a noisy measured profile can dip at its end: never extrapolate a falling cost
            slope = max((self._y[-1] - self._y[-2]) / (self._x[-1] - self._x[-2]), 0.0)
            y = np.where(b > self._x[-1], self._y[-1] + slope * (b - self._x[-1]), y)
        return np.where(b > 0, y, 0.0)

    def iter_seconds_at(self, batch: np.ndarray) -> np.ndarray:
        """`iter_seconds` of whole batch sizes (integers, or floats that hold integers, such as a cumsum of
        +-1.0) by lookup in a table of `iter_seconds(0..n)` kept on the model: the same floats, since
        `iter_seconds` is elementwise (np.interp, the extrapolation and the zero are each a function of one
        size), without interpolating each event of each play again. A negative size falls back to it."""
        idx = np.asarray(batch).astype(np.intp)
        if idx.size == 0 or idx.min() < 0:
            return self.iter_seconds(batch)
        return self.iter_table(int(idx.max()))[idx]

    def iter_table(self, top: int) -> np.ndarray:
        """`iter_seconds(0..n)` for some n >= top, the model's own table (not a copy: read it, never write)."""
        table = self._table
        if table is None or top >= len(table):
            table = self.iter_seconds(np.arange(max(top + 1, 1025, 2 * len(table) if table is not None else 0)))
            object.__setattr__(self, "_table", table)
        return table

    # ---- constructors -------------------------------------------------------------------------------
    def scaled(self, factor: float) -> TimeModel:
        """Every duration times `factor` (> 0): a profile measured elsewhere calibrated to measured busy time."""
        require(factor > 0 and np.isfinite(factor), "time_model.scale", f"must be a finite number > 0 (got {factor})")
        return replace(self, s_per_iter=tuple(float(x) * factor for x in self.s_per_iter),
                       prefill_s_per_token=self.prefill_s_per_token * factor, actor_fixed_s=self.actor_fixed_s * factor)

    @classmethod
    def default_tiny_cpu(cls) -> TimeModel:
        """The shipped assumed profile of the tiny CPU model (its shape: docs/internals.md#plantimemodelpy)."""
        b, s = zip(*_TINY_CPU_TABLE)
        return cls(batch_sizes=b, s_per_iter=s, source="default_tiny_cpu")

    @classmethod
    def per_token(cls, s_per_token: float, **kw: float) -> TimeModel:
        """Linear model: an iteration at batch b costs b * s_per_token, so busy time = tokens x s_per_token.

        Under it an actor's decode time is proportional to its token work, which makes the classic bounds
        (makespan >= max(longest job, total/N)) exact; tests and the LPT guarantee use it.
        """
        kw.setdefault("prefill_s_per_token", 0.0)
        kw.setdefault("actor_fixed_s", 0.0)
        return cls(batch_sizes=(1, 2), s_per_iter=(s_per_token, 2 * s_per_token), source="per_token", **kw)

    @classmethod
    def from_rows(cls, rows: list[dict], context: int | None = None, **kw: float) -> TimeModel:
        """Build from engine-benchmark rows {"batch_size": int, "context": int, "s_per_iter": float}.

        With several contexts per batch size: the rows whose context is nearest `context` are used, or, with
        `context=None`, the mean over all contexts of that batch size. Malformed rows raise `DataError`
        (see `check_profile_rows`).
        """
        check_profile_rows(rows, str(kw.get("source", "time profile")))
        by_b: dict[int, list[tuple[float, float]]] = {}
        for r in rows:
            by_b.setdefault(r["batch_size"], []).append((float(r.get("context") or 0), float(r["s_per_iter"])))
        bs, ys = [], []
        for b in sorted(by_b):
            pts = by_b[b]
            if context is None:
                y = float(np.mean([p[1] for p in pts]))
            else:
                best = min(abs(p[0] - context) for p in pts)
                y = float(np.mean([p[1] for p in pts if abs(p[0] - context) == best]))
            bs.append(b)
            ys.append(y)
        return cls(batch_sizes=tuple(bs), s_per_iter=tuple(ys), **kw)

    @classmethod
    def from_json(cls, path: str | Path, context: int | None = None, **kw: float) -> TimeModel:
        """Read a JSON profile: a list of rows, or {"rows": [...], optional scalar fields of TimeModel, optional
        "profile": the record of how it was measured (`rlhfless profile`), not read here}.

        Refused with a one-line `DataError` naming the file: a missing file, invalid JSON, another top-level
        shape or key, a scalar field that is not a number >= 0, and any malformed row (`check_profile_rows`).
        """
        p = Path(path)
        if not p.is_file():
            raise DataError(f"time profile not found: {p}")
        try:
            obj = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a huge integer, deep nesting
            raise DataError(f"{p}: not valid JSON") from None
        rows = obj
        if isinstance(obj, dict):
            unknown = sorted(set(obj) - {"rows", "profile", *_PROFILE_SCALARS})  # profile: what was measured
            if unknown:
                raise DataError(f"{p}: unknown key '{unknown[0]}'; allowed: rows, {', '.join(_PROFILE_SCALARS)}")
            rows = obj.get("rows")
            for k in _PROFILE_SCALARS:
                if k in obj:
                    if isinstance(obj[k], bool) or not isinstance(obj[k], (int, float)):
                        raise DataError(f"{p}: {k} must be a number of seconds (got {obj[k]!r})")
                    kw.setdefault(k, float(obj[k]))
        try:
            return cls.from_rows(rows, context=context, source=str(p), **kw)
        except ConfigError as exc:
            raise DataError(f"{p}: {exc}") from None


_PROFILE_SCALARS = ("prefill_s_per_token", "actor_fixed_s", "kv_transfer_s_per_token")


def check_profile_rows(rows: object, where: str) -> list[dict]:
    """`rows` as a profile's rows, or a one-line `DataError` starting with `where` and naming the row.

    A non-empty list of objects with batch_size (integer >= 1) and s_per_iter (finite seconds > 0); optional
    context (keys attended: a number >= 0, or null for unknown) and n (integer >= 1 iterations measured); other
    keys are ignored.
    """
    if not isinstance(rows, list) or not rows:
        raise DataError(f"{where}: expected a non-empty list of {{batch_size, context, s_per_iter}} rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "batch_size" not in r or "s_per_iter" not in r:
            raise DataError(f"{where}: row {i} needs keys batch_size and s_per_iter (got {json.dumps(r)[:80]})")
        problem = _row_problem(r)
        if problem:
            raise DataError(f"{where}: row {i}: {problem}")
    return rows


def _row_problem(r: dict) -> str | None:
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))

    s, ctx = r["s_per_iter"], r.get("context")
    if not number(s) or s <= 0:
        return f"s_per_iter must be finite seconds > 0 (got {s!r})"
    if ctx is not None and (not number(ctx) or ctx < 0):
        return f"context must be a number of keys >= 0 (got {ctx!r})"
    for key in ("batch_size", "n"):
        v = r.get(key, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return f"{key} must be an integer >= 1 (got {v!r})"
    return None


@dataclass(frozen=True)
class SimResult:
    """Per-actor outcome of the simulation; arrays are (n_actors,) unless noted.

    decode_s: seconds of decode iterations; peak_batch: max concurrent sequences seen;
    entry_iter, finish_iter: (S,) iteration at which each sequence entered / finished (input order).
    """

    decode_s: np.ndarray
    peak_batch: np.ndarray
    entry_iter: np.ndarray
    finish_iter: np.ndarray


def _gang_fifo_entries(lengths: np.ndarray, sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Admission iteration of each sequence of one actor: jobs FIFO, a job's seqs enter together.

    lengths: (S_a,) tokens per sequence in admission order; sizes: (J_a,) seqs per job (sum = S_a).
    Keeps the iterations at which the slots free: a job of g seqs enters at the g-th earliest. Jobs that fit
    in the empty engine enter at 0 without a loop; the rest cost one insertion per sequence.
    """
    cs = np.cumsum(sizes)
    k = int(np.searchsorted(cs, capacity, side="right"))  # jobs admitted at iteration 0
    n0 = int(cs[k - 1]) if k else 0
    lens = lengths.tolist()
    free = lens[:n0] + [0.0] * (capacity - n0)
    out: list[float] = []
    if bool((sizes == 1).all()):  # per-sequence jobs: a heap with one replace per sequence is fastest
        heapq.heapify(free)
        rep, app = heapq.heapreplace, out.append
        for length in lens[n0:]:
            t = free[0]
            app(t)
            rep(free, t + length)
    else:  # groups: a sorted list; take the g earliest, insert the g new finish times
        free.sort()
        ins, i = bisect.insort, n0
        for g in sizes[k:].tolist():
            t = free[g - 1]
            del free[:g]
            for length in lens[i:i + g]:
                ins(free, t + length)
            out.append(t)
            i += g
        out = np.repeat(out, sizes[k:]).tolist()
    entries = np.zeros(len(lens))
    entries[n0:] = out
    return entries


@dataclass(frozen=True)
class _Lockstep:
    """Queued actors advanced in lock step (`_lockstep_fifo`); row r is actor actors[r], busiest first.

    n_jobs: (A,) jobs per row; popped: (A, jmax, g) the g earliest slot-free iterations that job k (k >= k0 =
    capacity // g, zeros before) waited for, ascending; job k enters at popped[r, k, g - 1]; free: (A, capacity)
    sorted slot-free iterations after each row's last admission.
    """

    actors: np.ndarray
    n_jobs: np.ndarray
    popped: np.ndarray
    free: np.ndarray


def _lockstep_fifo(lengths: np.ndarray, starts: np.ndarray, actors: np.ndarray, g: int, capacity: int,
                   max_batch: int = 16) -> _Lockstep:
    """`_gang_fifo_entries` for many actors at once when every job has g seqs.

    lengths: (S,) grouped by actor, admission order within; starts: (n_actors+1,) first sequence of each actor;
    actors: the (queued) actors to run. All actors advance together, job k of every row in the same step, on an
    (actors, capacity) matrix of sorted slot-free iterations. A step admits b <= `max_batch` jobs per row at
    once: jobs k..k+b-1 take the next b groups of g earliest free slots, which is what the FIFO does whenever
    no slot refilled by jobs before k+i frees earlier than job k+i's own g-th slot (checked for every row), so
    the result equals the one-job-at-a-time loop value for value, in far fewer numpy steps.
    """
    k0 = capacity // g  # jobs admitted at iteration 0
    n_jobs = (starts[actors + 1] - starts[actors]) // g
    rows = np.argsort(-n_jobs, kind="stable")  # busiest first: the rows still queueing are a prefix
    actors, n_jobs = actors[rows], n_jobs[rows]
    n_rows, jmax = len(actors), int(n_jobs[0])
    nb = max(1, min(max_batch, k0))
    lens = np.zeros((n_rows, (jmax + nb) * g))  # nb padding jobs: the look-ahead never runs off the end
    for r, a in enumerate(actors.tolist()):
        lens[r, :starts[a + 1] - starts[a]] = lengths[starts[a]:starts[a + 1]]
    run = np.sort(lens.reshape(n_rows, jmax + nb, g), axis=2)  # a job's lengths ascending: entry + run is sorted
    shortest = run[:, :, 0]
    free = np.zeros((n_rows, capacity))
    free[:, :k0 * g] = run[:, :k0].reshape(n_rows, -1)
    free.sort(axis=1)
    popped = np.zeros((n_rows, jmax, g))
    n_list = n_jobs.tolist()
    k, m = k0, len(n_list)
    while k < jmax:
        while n_list[m - 1] <= k:  # rows without a k-th job are done (rows are sorted busiest first)
            m -= 1
        f = free[:m]
        t = f[:, g - 1:nb * g:g]  # (m, nb) entry of jobs k, k+1, ... if the earlier ones do not interfere
        refill = np.minimum.accumulate(t + shortest[:m, k:k + nb], axis=1)  # earliest slot refilled so far
        bad = (refill[:, :-1] < t[:, 1:]).any(axis=0)
        b = min(int(bad.argmax()) + 1 if bad.any() else nb, n_list[m - 1] - k)
        popped[:m, k:k + b] = f[:, :b * g].reshape(m, b, g)
        f[:, :b * g] = (t[:, :b, None] + run[:m, k:k + b]).reshape(m, b * g)  # the b jobs take the freed slots
        f.sort(axis=1, kind="stable")  # a few sorted runs: timsort merges them in linear time
        k += b
    return _Lockstep(actors, n_jobs, popped, free)


def _lockstep_entries(ls: _Lockstep, starts: np.ndarray, g: int, entry: np.ndarray) -> None:
    """Write each sequence's admission iteration into `entry` (indexed like `lengths`)."""
    for r, a in enumerate(ls.actors.tolist()):
        entry[starts[a]:starts[a + 1]] = np.repeat(ls.popped[r, :ls.n_jobs[r], g - 1], g)


def _lockstep_decode(ls: _Lockstep, g: int, capacity: int, tm: TimeModel) -> tuple[np.ndarray, np.ndarray]:
    """(decode seconds, peak batch) per row of a lock-step run, without sorting events.

    While job k waits, every slot is busy except those already freed: on the interval between the i-th and
    the (i+1)-th of its popped slot-free iterations (the previous job's entry before the first) the batch is
    capacity - i. After the last admission the same holds for the sorted final slot-free iterations.
    """
    k0, n_rows = capacity // g, len(ls.actors)
    fv = tm.iter_seconds_at(capacity - np.arange(capacity))  # fv[i]: one iteration at batch capacity - i
    steps = ls.popped[:, k0:, :]
    entry = steps[:, :, g - 1]
    prev = np.concatenate((np.zeros((n_rows, 1)), entry[:, :-1]), axis=1)
    d = np.diff(steps, axis=2, prepend=prev[:, :, None])
    d[np.arange(k0, k0 + steps.shape[1])[None, :] >= ls.n_jobs[:, None]] = 0.0  # past a row's last job
    last = entry[np.arange(n_rows), ls.n_jobs - k0 - 1]
    dd = np.diff(ls.free, axis=1, prepend=last[:, None])
    decode = (d * fv[:g]).sum(axis=(1, 2)) + (dd * fv).sum(axis=1)
    first = np.minimum(np.where(d > 0, np.arange(g), capacity).min(axis=(1, 2)),
                       np.where(dd > 0, np.arange(capacity), capacity).min(axis=1))
    return decode, capacity - first  # peak: the batch on the first interval of positive length (0 if none)


def simulate(lengths: np.ndarray, seq_actor: np.ndarray, job_sizes: np.ndarray, job_actor: np.ndarray,
             n_actors: int, capacity: int, tm: TimeModel) -> SimResult:
    """Simulate every actor's continuous-batching decode.

    lengths: (S,) tokens per sequence, grouped by actor and in admission order within an actor;
    seq_actor: (S,) actor of each sequence (non-decreasing); job_sizes, job_actor: (J,) the same per job.
    Returns decode seconds per actor (fixed overhead and prefill are added by the caller).
    """
    counts = np.bincount(seq_actor, minlength=n_actors)
    entry = np.zeros(len(lengths))
    starts = np.concatenate(([0], np.cumsum(counts)))
    queued = np.flatnonzero(counts > capacity)
    # lock-step numpy pays off from a few queued actors on (measured: slower than the loop for 1-3)
    _fifo_entries(lengths, starts, queued, job_sizes, job_actor, capacity, entry, min_lockstep=4)
    finish = entry + lengths
    decode, peak = _segments(entry, finish, seq_actor, n_actors, tm)
    return SimResult(decode_s=decode, peak_batch=peak, entry_iter=entry, finish_iter=finish)


def simulate_fast(lengths: np.ndarray, seq_actor: np.ndarray, job_sizes: np.ndarray, job_actor: np.ndarray,
                  n_actors: int, capacity: int, tm: TimeModel) -> SimResult:
    """`simulate` (same arguments and result), in closed form for every actor that never queues (how:
    docs/internals.md#plantimemodelpy)."""
    counts = np.bincount(seq_actor, minlength=n_actors)
    queued = counts > capacity
    decode = np.zeros(n_actors)
    peak = np.zeros(n_actors, dtype=np.int64)
    entry = np.zeros(len(lengths))
    free = ~queued[seq_actor]
    if free.any():
        lens, act = lengths[free], seq_actor[free]
        # one sort by (actor, length): the same float key the event simulation sorts by
        span = float(2.0 ** np.ceil(np.log2(float(lens.max()) + 1.0)))
        off = act * span
        key = np.sort(off + lens)
        act_sorted = np.repeat(np.arange(n_actors), np.bincount(act, minlength=n_actors))
        tau = key - act_sorted * span
        ends = np.cumsum(np.bincount(act, minlength=n_actors))
        step = np.diff(tau, prepend=0.0)
        first = np.concatenate(([True], act_sorted[1:] != act_sorted[:-1]))
        step[first] = tau[first]
        batch = ends[act_sorted] - np.arange(len(tau))
        decode += np.bincount(act_sorted, weights=step * tm.iter_seconds_at(batch), minlength=n_actors)
        peak += np.bincount(act, weights=lens > 0, minlength=n_actors).astype(np.int64)
    if queued.any() and bool((job_sizes == job_sizes[0]).all()):  # groups of one size: no event sort
        g, starts = int(job_sizes[0]), np.concatenate(([0], np.cumsum(counts)))
        ls = _lockstep_fifo(lengths, starts, np.flatnonzero(queued), g, capacity)
        decode[ls.actors], peak[ls.actors] = _lockstep_decode(ls, g, capacity, tm)
        _lockstep_entries(ls, starts, g, entry)
    elif queued.any():
        qa = np.flatnonzero(queued)
        remap = np.cumsum(queued) - 1
        sq, jq = ~free, queued[job_actor]
        sub = simulate(lengths[sq], remap[seq_actor[sq]], job_sizes[jq], remap[job_actor[jq]], len(qa), capacity, tm)
        decode[qa] = sub.decode_s
        peak[qa] = sub.peak_batch
        entry[sq] = sub.entry_iter
    return SimResult(decode_s=decode, peak_batch=peak, entry_iter=entry, finish_iter=entry + lengths)


def admissions(lengths: np.ndarray, seq_actor: np.ndarray, job_sizes: np.ndarray, job_actor: np.ndarray,
               n_actors: int, capacity: int) -> np.ndarray:
    """(S,) `simulate_fast`'s entry_iter alone (same arguments less the time model), the same values by the
    same code: an actor that never queues admits everything at 0, a queued one by the lock-step FIFO (groups of
    one size) or its own FIFO loop. For callers that read only admissions (`balancer.labels_finish_s`, every
    (candidate, draw) the scaler plays): no decode seconds or peaks are computed only to be dropped."""
    counts = np.bincount(seq_actor, minlength=n_actors)
    entry = np.zeros(len(lengths))
    queued = np.flatnonzero(counts > capacity)
    if len(queued):
        starts = np.concatenate(([0], np.cumsum(counts)))
        _fifo_entries(lengths, starts, queued, job_sizes, job_actor, capacity, entry, min_lockstep=1)
    return entry


def _fifo_entries(lengths: np.ndarray, starts: np.ndarray, queued: np.ndarray, job_sizes: np.ndarray,
                  job_actor: np.ndarray, capacity: int, entry: np.ndarray, min_lockstep: int) -> None:
    """Write the admission iteration of every sequence of the `queued` actors into `entry` (S,): by the lock-step
    FIFO when every group has one size and at least `min_lockstep` actors queue, else each actor's own FIFO loop
    (the same entries either way; the choice is speed only), or the compiled FIFO (`timemodel_kernel`) where it runs."""
    k = kernel()
    if k is not None:
        k.fifo_entries(lengths, np.asarray(starts, np.int64), np.asarray(queued, np.int64),
                       np.asarray(job_sizes, np.int64), np.asarray(job_actor, np.int64), capacity, entry)
        return
    if len(queued) >= min_lockstep and bool((job_sizes == job_sizes[0]).all()):
        g = int(job_sizes[0])
        _lockstep_entries(_lockstep_fifo(lengths, starts, queued, g, capacity), starts, g, entry)
        return
    for a in queued:
        sl = slice(starts[a], starts[a + 1])
        entry[sl] = _gang_fifo_entries(lengths[sl], job_sizes[job_actor == a], capacity)


def _segments(entry: np.ndarray, finish: np.ndarray, seq_actor: np.ndarray, n_actors: int,
              tm: TimeModel) -> tuple[np.ndarray, np.ndarray]:
    """Sum of (iterations x s_per_iter(batch)) over the piecewise-constant batch of every actor.

    Events (+1 at entry, -1 at finish) are sorted by (actor, iteration); since each actor's deltas sum to
    zero, one global cumsum gives every actor's running batch size after each event.
    """
    if len(entry) == 0:
        return np.zeros(n_actors), np.zeros(n_actors, dtype=np.int64)
    times = np.concatenate((entry, finish))
    delta = np.concatenate((np.ones(len(entry)), -np.ones(len(entry))))
    actor = np.concatenate((seq_actor, seq_actor))
    span = float(finish.max()) + 1.0
    key = actor * span + times  # by (actor, iteration); one float key sorts fastest
    order = np.argsort(key)
    key, d, a = key[order], delta[order], actor[order]
    batch = np.cumsum(d)
    # segment lengths from the same key that ordered the events, so events the key cannot tell apart form
    # zero-length segments (any order among them is then harmless)
    seg = np.diff(key)
    live = (a[1:] == a[:-1]) & (seg > 0)  # zero-length segments (an exit and an entry at one instant) cost 0
    b = batch[:-1]
    cost = np.where(live, seg * tm.iter_seconds_at(b), 0.0)
    decode = np.bincount(a[:-1], weights=cost, minlength=n_actors)
    peak = np.zeros(n_actors, dtype=np.int64)
    np.maximum.at(peak, a[:-1][live], b[live].astype(np.int64))
    return decode, peak


def finish_seconds(entry: np.ndarray, finish: np.ndarray, seq_actor: np.ndarray, n_actors: int,
                   tm: TimeModel, by_length: np.ndarray | None = None) -> np.ndarray:
    """(S,) decode seconds from its actor's start at which each sequence finishes: the same piecewise-constant
    batch segments as `_segments`, accumulated per actor up to the sequence's finish event (ties: an exit and an
    entry at one instant cost nothing, so any order among them gives the same time). by_length: (S,) the
    sequences in ascending order of finish - entry (their lengths), when the caller has it: where nothing
    queues, the finishes are then ordered without a float sort (`_unqueued_order`)."""
    if len(entry) == 0:
        return np.zeros(0)
    if not entry.any():  # no actor queued (the scaler's usual play): the entries need no sort
        order = None if by_length is None else _unqueued_order(seq_actor, n_actors, by_length)
        return _finish_seconds_unqueued(finish, seq_actor, n_actors, tm, order)
    return _finish_seconds_events(entry, finish, seq_actor, n_actors, tm)


_UNSET = object()
_KERNEL: ModuleType | None | object = _UNSET


def kernel() -> ModuleType | None:
    """The compiled event sums (`plan.timemodel_kernel`) where `plan.jit.on()`, the one switch for the planner's
    kernels, says compiled code runs; else None and the numpy code here, their reference, runs. Decided once."""
    global _KERNEL
    if _KERNEL is _UNSET:
        _KERNEL = None
        if jit.on():
            from rlhfless.plan import timemodel_kernel
            _KERNEL = timemodel_kernel
    return _KERNEL  # type: ignore[return-value]


def warm_kernel() -> None:
    """Load (or compile) the compiled event sums now where they run (before a fork: `migrate.warm_kernel`)."""
    k = kernel()
    if k is not None:
        k.warm()


def _unqueued_order(seq_actor: np.ndarray, n_actors: int, by_length: np.ndarray) -> np.ndarray:
    """(S,) the sequences by actor, shortest first within an actor: a stable sort of the actor ids of
    `by_length` (an integer radix sort where the ids fit 16 bits) instead of a float sort of every finish key.
    Where every entry is 0 a finish is its length, and the key actor x span + finish rounds monotonically, so
    this order sorts the keys too; only sequences with equal keys may come out in another order than the
    stable float sort's, and those `_finish_seconds_unqueued` gives equal times (zero-length segments)."""
    actor = seq_actor[by_length]
    if n_actors <= np.iinfo(np.int16).max:
        actor = actor.astype(np.int16)
    return by_length[np.argsort(actor, kind="stable")]


def _finish_seconds_events(entry: np.ndarray, finish: np.ndarray, seq_actor: np.ndarray, n_actors: int,
                           tm: TimeModel) -> np.ndarray:
    """`finish_seconds` from every entry and finish event sorted together (any entries)."""
    n = len(entry)
    times = np.concatenate((entry, finish))
    delta = np.concatenate((np.ones(n), -np.ones(n)))
    actor = np.concatenate((seq_actor, seq_actor))
    span = float(finish.max()) + 1.0
    key = actor * span + times
    order = np.argsort(key, kind="stable")
    key, d, a = key[order], delta[order], actor[order]
    batch = np.cumsum(d)
    seg = np.diff(key)
    live = (a[1:] == a[:-1]) & (seg > 0)
    cost = np.where(live, seg * tm.iter_seconds_at(batch[:-1]), 0.0)
    cum = np.concatenate(([0.0], np.cumsum(cost)))  # seconds up to each event, all actors in one running sum
    first = np.concatenate(([True], a[1:] != a[:-1]))
    start = np.maximum.accumulate(np.where(first, np.arange(2 * n), 0))  # index of the actor's first event
    at_event = cum - cum[start]
    out = np.empty(2 * n)
    out[order] = at_event
    return out[n:]


def _finish_seconds_unqueued(finish: np.ndarray, seq_actor: np.ndarray, n_actors: int,
                             tm: TimeModel, order: np.ndarray | None = None) -> np.ndarray:
    """`finish_seconds` where every sequence enters at iteration 0, the same floats from half the events: sorted
    by the same key, an actor's entries come first (key actor x span, below every finish of the actor and above
    every event of the actor before), so its j-th finish follows its (j-1)-th (its last entry for j = 0) at
    batch (the actor's sequences - j); the entries' segments cost exactly 0, and adding 0.0 leaves the running
    sum as it was, so the running sum over the finishes alone takes the same values. order: an order that sorts
    the keys (`_unqueued_order`), else a stable sort of them."""
    n = len(finish)
    span = float(finish.max()) + 1.0
    fkey = seq_actor * span + finish
    if order is None:
        order = np.argsort(fkey, kind="stable")
    key, a = fkey[order], seq_actor[order]
    first = np.concatenate(([True], a[1:] != a[:-1]))
    prev = np.where(first, a * span + 0.0, np.concatenate(([0.0], key[:-1])))  # the last entry's key for j = 0
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))  # each actor's first finish
    batch = np.bincount(seq_actor, minlength=n_actors)[a] - (np.arange(n) - start)
    seg = key - prev
    cost = np.where(seg > 0, seg * tm.iter_seconds_at(batch), 0.0)
    run = np.cumsum(cost)
    at = run - np.where(start > 0, run[start - 1], 0.0)
    out = np.empty(n)
    out[order] = at
    return out
