"""Fast candidate sweep: the assignment and per-actor busy seconds of every candidate N, without simulating.

From prefix sums over the jobs sorted longest first, work per candidate grows with its actors, not its sequences.
The rule it keeps: exact for actors that never queue and one predicted length per job (flagged per candidate in
`SweepResult.exact`); queued actors are an approximation whose measured error, and the time-balanced contiguous
chunking, are described in docs/internals.md#plansweeppy.

Deviations from the paper:
1. The paper says neither how chunk boundaries are chosen nor how T(N) is computed for 64 candidates in 30 ms;
   the time-balanced rule and the estimator are ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import rlhfless.plan.partition as partition
from rlhfless.plan.timemodel import TimeModel

PASSES = 2  # refinement passes of the time-balanced rule (mean imbalance, 60 seeded heavy-tailed instances, 4
# actors: 1.583 with 0 passes (equal work), 1.370 with 1, 1.340 with 2, 1.335 with 3, 1.332 with 5)


@dataclass(frozen=True)
class RankCosts:
    """Per-rank decode cost of the closed form, bucketed where f(r) - f(r-1) is constant.

    edges: (K+1,) ranks 0 = e_0 < e_1 < ... < e_K = capacity; slope: (K,) seconds per token of ranks in
    (e_k, e_{k+1}]; coef: (K+1,) the same sum written over prefix sums at the edges
    (sum_k slope_k (P_{k+1} - P_k) = sum_k coef_k P_k); full_rate: f(capacity)/capacity, seconds per token in a
    full batch.
    """

    capacity: int
    edges: np.ndarray
    slope: np.ndarray
    coef: np.ndarray
    full_rate: float


def rank_costs(tm: TimeModel, capacity: int) -> RankCosts:
    """Buckets of the closed form for `tm` at `capacity` slots (exact: f is linear between its profile points)."""
    inner = [b for b in tm.batch_sizes if 1 < b < capacity]
    edges = np.array(sorted({0, 1, capacity, *inner}), dtype=np.int64)
    f = tm.iter_seconds(edges)
    slope = np.diff(f) / np.diff(edges)
    coef = np.concatenate(([0.0], slope)) - np.concatenate((slope, [0.0]))
    return RankCosts(capacity, edges, slope, coef, float(f[-1]) / capacity)


@dataclass(frozen=True)
class Layout:
    """Jobs longest mean first, sequences longest first inside a job, as flat arrays (built once per call).

    order: (J,) job index at each sorted position; seq_len, prefix: (S,), (S+1,) lengths and their prefix
    sums; seq_start: (J+1,) first layout position of each sorted job; work, prompt: (J+1,) prefix sums of
    tokens and prompt tokens over sorted jobs; wmid: (J,) cumulative work at each sorted job's midpoint;
    head, tail: (J,) longest and shortest length of each sorted job; sizes: (J,) seqs per sorted job;
    head_max: (levels, J) sparse table, head_max[k, i] = max(head[i : i + 2**k]) (range maxima in two look-ups).
    """

    order: np.ndarray
    seq_len: np.ndarray
    prefix: np.ndarray
    seq_start: np.ndarray
    work: np.ndarray
    prompt: np.ndarray
    wmid: np.ndarray
    head: np.ndarray
    tail: np.ndarray
    sizes: np.ndarray
    head_max: np.ndarray | None = None
    log2: np.ndarray | None = None

    def range_head_max(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Longest sequence of sorted jobs [lo, hi) (0 where the range is empty)."""
        j = len(self.head)
        if j == 0:
            return np.zeros(np.shape(lo))
        span = np.maximum(hi - lo, 1)
        k = self.log2[span]  # floor(log2(span)), from a table
        flat, row = self.head_max.ravel(), k * j
        best = np.maximum(flat[row + np.minimum(lo, j - 1)], flat[row + np.clip(hi - (1 << k), 0, j - 1)])
        return np.where(hi > lo, best, 0.0)

    @classmethod
    def build(cls, ja) -> Layout:
        order = np.argsort(-ja.mean_len, kind="stable")
        sizes = ja.sizes[order]
        seq_start = np.concatenate(([0], np.cumsum(sizes)))
        n = int(seq_start[-1])
        if len(sizes) and bool((sizes == sizes[0]).all()):
            g = int(sizes[0])  # uniform groups: one row per job, sorted descending in place
            lens = -np.sort(-ja.seq_len.reshape(-1, g)[order], axis=1)
        else:
            idx = np.repeat(ja.offsets[order] - seq_start[:-1], sizes) + np.arange(n)
            raw = ja.seq_len[idx]
            lens = raw[np.lexsort((-raw, np.repeat(np.arange(len(sizes)), sizes)))]
        lens = np.ascontiguousarray(lens, dtype=np.float64).reshape(-1)
        w = ja.work[order]
        work = np.concatenate(([0.0], np.cumsum(w)))
        last = np.maximum(seq_start[1:] - 1, 0)
        head = lens[seq_start[:-1]] if n else np.zeros(0)
        table = np.zeros((max(len(head).bit_length(), 1), len(head)))
        table[0] = head
        for k in range(1, len(table)):
            step = 1 << (k - 1)
            np.maximum(table[k - 1, :-step], table[k - 1, step:], out=table[k, :len(head) - step])
        log2 = np.frexp(np.arange(len(head) + 1, dtype=np.float64))[1] - 1  # floor(log2(x)) for x >= 1
        return cls(order, lens, np.concatenate(([0.0], np.cumsum(lens))), seq_start, work,
                   np.concatenate(([0.0], np.cumsum(ja.prompt_len[order]))), work[:-1] + 0.5 * w,
                   head, lens[last] if n else np.zeros(0), sizes, table, log2)


@dataclass(frozen=True)
class SweepResult:
    """Every candidate's predicted busy seconds, as (R, M) matrices over candidates x actors (M = max N).

    candidates: the N evaluated (row r is candidates[r]; columns >= N are padding with no jobs);
    busy_s: (R, M) predicted busy seconds (fixed + prefill + decode; 0 for an actor without jobs);
    njobs: (R, M) jobs per actor; rank: (J,) admission priority (lower first) shared by all candidates;
    exact: (R,) True when no actor of the candidate queues and every actor's layout is sorted, i.e. its busy
    seconds equal the simulation up to float rounding. Labels: `labels(r)`.
    """

    candidates: tuple[int, ...]
    busy_s: np.ndarray
    njobs: np.ndarray
    rank: np.ndarray
    exact: np.ndarray
    order: np.ndarray
    bounds: np.ndarray | None = None
    label_rows: tuple[np.ndarray, ...] | None = None

    def labels(self, r: int) -> np.ndarray:
        """(J,) actor of each job for candidates[r]."""
        if self.label_rows is not None:
            return self.label_rows[r]
        k = self.candidates[r]
        out = np.empty(len(self.order), dtype=np.int64)
        out[self.order] = np.repeat(np.arange(k), np.diff(self.bounds[r, :k + 1]))
        return out


def _estimate(prefix_at, starts: np.ndarray, ends: np.ndarray, rc: RankCosts) -> np.ndarray:
    """Decode seconds of actors whose layout occupies positions [starts, ends) (any shape; see the header).

    prefix_at(x): prefix sum of layout lengths before position x (vectorised).
    """
    m = ends - starts
    mm = np.minimum(m, rc.capacity)

    def drained_from(ds: np.ndarray) -> np.ndarray:  # closed form of [ds, ds + mm) + full-batch rate elsewhere
        closed = np.einsum("...k,k->...", prefix_at(ds[..., None] + np.minimum(rc.edges, mm[..., None])), rc.coef)
        rest = prefix_at(ends) - prefix_at(starts) - (prefix_at(ds + mm) - prefix_at(ds))
        return closed + rc.full_rate * rest

    return drained_from(np.where(m > rc.capacity, ends - rc.capacity, starts))


def _busy(decode: np.ndarray, njobs: np.ndarray, prompt_tokens: np.ndarray, tm: TimeModel) -> np.ndarray:
    return np.where(njobs > 0, tm.actor_fixed_s + prompt_tokens * tm.prefill_s_per_token + decode, 0.0)


def _chunk_busy(lay: Layout, lo: np.ndarray, hi: np.ndarray, rc: RankCosts, tm: TimeModel) -> np.ndarray:
    """Busy seconds of contiguous chunks holding sorted jobs [lo, hi) (arrays of one shape)."""
    s, e = lay.seq_start[lo], lay.seq_start[hi]
    decode = _estimate(lambda x: lay.prefix[x], s, e, rc)
    decode += _top_fix(lay.range_head_max(lo, hi), lay.prefix[np.minimum(s + 1, e)] - lay.prefix[s], e - s, rc)
    return _busy(decode, hi - lo, lay.prompt[hi] - lay.prompt[lo], tm)


def _top_fix(longest: np.ndarray, first: np.ndarray, m: np.ndarray, rc: RankCosts) -> np.ndarray:
    """Rank-1 correction for a layout that is not sorted: the actor's longest sequence decodes at rank 1, where
    an iteration costs most; swapping it with the layout's first sequence changes the sum by
    (longest - first) * (g(1) - g(p)), g(p) taken as g(2). Zero when the layout is sorted; queued actors
    (estimated anyway) get none."""
    if len(rc.slope) < 2:
        return np.zeros(np.shape(m))
    return np.where((m <= rc.capacity) & (m >= 2), (longest - first) * (rc.slope[0] - rc.slope[1]), 0.0)


def _padded_busy(lay: Layout, bounds: np.ndarray, valid: np.ndarray, rc: RankCosts, tm: TimeModel) -> np.ndarray:
    """(R, M) chunk busy seconds of padded bounds (R, M+1), computed only on the valid (actor < N) cells."""
    cells = np.flatnonzero(valid)
    return _cell_busy(lay, bounds, cells, cells + cells // valid.shape[1], valid.shape, rc, tm)


def _cell_busy(lay: Layout, bounds: np.ndarray, cells: np.ndarray, lo_at: np.ndarray, shape: tuple[int, int],
               rc: RankCosts, tm: TimeModel) -> np.ndarray:
    """`_padded_busy` with the valid cells (flat indices into (R, M)) and their flat positions in `bounds`
    precomputed, for callers that evaluate the same cells many times."""
    out = np.zeros(shape)
    flat = bounds.ravel()
    out.ravel()[cells] = _chunk_busy(lay, flat[lo_at], flat[lo_at + 1], rc, tm)
    return out


def contiguous_bounds(lay: Layout, ns: Sequence[int], rc: RankCosts, tm: TimeModel,
                      passes: int | None = None) -> np.ndarray:
    """Time-balanced contiguous chunks (rule in the module header) for every N in `ns` at once.

    Returns (R, M+1) sorted-job indices, M = max(ns): actor a of candidate ns[r] holds sorted jobs
    [out[r, a], out[r, a+1]); columns beyond N repeat J (no jobs).
    """
    passes = PASSES if passes is None else passes
    n = np.asarray(ns, dtype=np.int64)
    j, m = len(lay.order), int(n.max())
    a = np.arange(1, m, dtype=np.float64)[None, :]
    inside = a < n[:, None]  # the interior boundaries 1..N-1 of each row
    total = float(lay.work[-1])
    bounds = np.full((len(n), m + 1), j, dtype=np.int64)
    bounds[:, 0] = 0
    if total <= 0:  # nothing to balance: equal counts, as partition.contiguous_labels does
        bounds[:, 1:m] = np.where(inside, -(-(a * j).astype(np.int64) // n[:, None]), j)
        return bounds
    bounds[:, 1:m] = np.where(inside, np.searchsorted(lay.wmid, a * total / n[:, None], "left"), j)
    valid = np.arange(m)[None, :] < n[:, None]
    cells = np.flatnonzero(valid)
    lo_at = cells + cells // m
    rows = np.arange(len(n))[:, None]
    base = (rows * (m + 1)).ravel()  # flat start of each row of an (R, M+1) matrix
    cw = np.zeros((len(n), m + 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        for _ in range(passes):
            busy = _cell_busy(lay, bounds, cells, lo_at, valid.shape, rc, tm)
            wb = lay.work[bounds]
            busy[np.diff(wb, axis=1) <= 0] = 0.0  # zero-work chunks carry no time share
            np.cumsum(busy, axis=1, out=cw[:, 1:])
            total_t = cw[:, -1:]
            level = a * total_t / n[:, None]
            # chunk holding level a: #{i >= 1: cw[i] <= a T / N} = #{i: ceil(N cw[i] / T) <= a}, counted with one
            # bincount; element-wise arithmetic only, so a row does not depend on the other candidates swept
            # with it
            u = np.ceil(n[:, None] * cw[:, 1:] / total_t)
            u = np.where(u <= m, u, m).astype(np.int64)  # NaN (no time at all) and padding -> m
            hist = np.bincount((base[:, None] + u).ravel(), minlength=len(n) * (m + 1))
            i = np.minimum(np.cumsum(hist.reshape(len(n), m + 1), axis=1)[:, 1:m], n[:, None] - 1)
            at = base[:, None] + i
            cwf, wbf = cw.ravel(), wb.ravel()
            lo, hi, wlo, whi = cwf[at], cwf[at + 1], wbf[at], wbf[at + 1]
            target = wlo + (level - lo) / (hi - lo) * (whi - wlo)
            ok = inside & (total_t > 0)
            bounds = bounds.copy()
            bounds[:, 1:m] = np.where(ok, np.searchsorted(lay.wmid, np.where(ok, target, 0.0), "left"),
                                      bounds[:, 1:m])
    return bounds


def _contiguous(lay: Layout, ns: tuple[int, ...], rank: np.ndarray, rc: RankCosts, tm: TimeModel) -> SweepResult:
    bounds = contiguous_bounds(lay, ns, rc, tm)
    busy = _padded_busy(lay, bounds, np.arange(bounds.shape[1] - 1)[None, :] < np.array(ns)[:, None], rc, tm)
    seqs = np.diff(lay.seq_start[bounds], axis=1)
    # sorted inside every actor <=> each job's shortest >= the next job's longest, within the actor
    seam = np.concatenate((lay.tail[:-1] < lay.head[1:], [False])).astype(np.int64)
    seams = np.concatenate(([0], np.cumsum(seam)))
    last = np.maximum(bounds[:, 1:] - 1, bounds[:, :-1])
    bad = ((seams[last] - seams[bounds[:, :-1]]) > 0) | (seqs > rc.capacity)
    return SweepResult(ns, busy, np.diff(bounds, axis=1), rank, ~bad.any(axis=1), lay.order, bounds=bounds)


def _general(lay: Layout, labels: np.ndarray, k: int, rc: RankCosts, tm: TimeModel) -> tuple[np.ndarray, bool]:
    """Busy seconds (k,) for any labelling: the layout regrouped by actor, sorted job order kept inside."""
    lab = labels[lay.order]
    grp = np.argsort(lab, kind="stable")  # sorted positions grouped by actor
    cs = np.concatenate(([0], np.cumsum(lay.sizes[grp])))
    pj = np.concatenate(([0.0], np.cumsum(np.diff(lay.work)[grp])))
    gstart = lay.seq_start[grp]
    last = max(len(grp) - 1, 0)

    def prefix_at(x: np.ndarray) -> np.ndarray:
        i = np.minimum(np.searchsorted(cs, x, "right") - 1, last)
        return pj[i] + lay.prefix[gstart[i] + (x - cs[i])] - lay.prefix[gstart[i]]

    njobs = np.bincount(lab, minlength=k)
    jb = np.concatenate(([0], np.cumsum(njobs)))
    decode = _estimate(prefix_at, cs[jb[:-1]], cs[jb[1:]], rc) if len(grp) else np.zeros(k)
    prompt = np.bincount(lab, weights=np.diff(lay.prompt), minlength=k)
    seam = (lay.tail[grp[:-1]] < lay.head[grp[1:]]) & (lab[grp[:-1]] == lab[grp[1:]])
    exact = not bool(seam.any() or (np.diff(cs[jb]) > rc.capacity).any())
    return _busy(decode, njobs, prompt, tm), exact


def _general_many(lay: Layout, labels: np.ndarray, ns: np.ndarray, rc: RankCosts,
                  tm: TimeModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_general` for every candidate at once. labels: (R, J) actor of each job for candidate ns[r].

    Returns (busy (R, M), njobs (R, M), exact (R,)), M = max(ns). Per row the arithmetic is `_general`'s, in the
    same order (row-wise cumulative sums, row-local prefix sums), so each row equals it value for value; the
    rows only share the integer searches, through offsets that keep them apart.
    """
    n_rows, j, m = len(ns), len(lay.order), int(ns.max())
    lab = labels[:, lay.order]
    small = lab.astype(np.int16) if m < 2**15 else lab  # a stable sort of 16-bit keys is a radix sort
    grp = np.argsort(small, axis=1, kind="stable")  # each row's sorted positions grouped by actor
    zeros = np.zeros((n_rows, 1))
    cs = np.concatenate((zeros.astype(np.int64), np.cumsum(lay.sizes[grp], axis=1)), axis=1)  # (R, J+1)
    pj = np.concatenate((zeros, np.cumsum(np.diff(lay.work)[grp], axis=1)), axis=1)
    gstart = lay.seq_start[grp]
    rows = np.arange(n_rows)[:, None]
    span = int(cs[0, -1]) + 1
    keys = (cs + rows * span).ravel()  # rows kept apart: one search for all
    flat_gs, flat_pj = gstart.ravel(), pj.ravel()

    def prefix_at(x: np.ndarray, r: np.ndarray) -> np.ndarray:  # x: positions of row r (broadcast shapes)
        i = np.minimum(np.searchsorted(keys, x + r * span, "right") - 1 - r * (j + 1), j - 1)
        at = r * j + i
        return flat_pj[r * (j + 1) + i] + lay.prefix[flat_gs[at] + (x - cs[r, i])] - lay.prefix[flat_gs[at]]

    key = (rows * m + lab).ravel()
    njobs = np.bincount(key, minlength=n_rows * m).reshape(n_rows, m)
    jb = np.concatenate((zeros.astype(np.int64), np.cumsum(njobs, axis=1)), axis=1)
    cells = np.flatnonzero(np.arange(m)[None, :] < ns[:, None])
    r, a = np.divmod(cells, m)
    lo_seq, hi_seq = cs[r, jb[r, a]], cs[r, jb[r, a + 1]]
    decode = np.zeros(n_rows * m)
    decode[cells] = _estimate(lambda x: prefix_at(x, r.reshape(r.shape + (1,) * (np.ndim(x) - 1))),
                              lo_seq, hi_seq, rc)
    prompt = np.bincount(key, weights=np.tile(np.diff(lay.prompt), n_rows), minlength=n_rows * m)
    busy = _busy(decode.reshape(n_rows, m), njobs, prompt.reshape(n_rows, m), tm)
    srt = np.take_along_axis(lab, grp, axis=1)
    seam = (lay.tail[grp[:, :-1]] < lay.head[grp[:, 1:]]) & (srt[:, :-1] == srt[:, 1:])
    seqs = np.diff(np.take_along_axis(cs, jb, axis=1), axis=1)
    over = np.where(np.arange(m)[None, :] < ns[:, None], seqs, 0) > rc.capacity
    return busy, njobs, ~(seam.any(axis=1) | over.any(axis=1))


def sweep(ja, candidates: Sequence[int], capacity: int, tm: TimeModel,
          policy: str = "contiguous") -> SweepResult:
    """Labels and predicted busy seconds of every candidate N (module header); inputs validated by the caller."""
    ns = tuple(int(k) for k in candidates)
    lay = Layout.build(ja)
    rc = rank_costs(tm, capacity)
    rank = np.empty(len(lay.order), dtype=np.int64)
    rank[lay.order] = np.arange(len(lay.order))
    if policy == "contiguous":
        return _contiguous(lay, ns, rank, rc, tm)
    labels = many_labels(policy, ja, ns)
    if len(lay.order):
        busy, njobs, exact = _general_many(lay, labels, np.array(ns), rc, tm)
    else:
        busy, njobs = np.zeros((len(ns), max(ns))), np.zeros((len(ns), max(ns)), dtype=np.int64)
        exact = np.ones(len(ns), dtype=bool)
    if policy == "round_robin":  # verl admits in arrival order
        rank = np.arange(len(lay.order))
    return SweepResult(ns, busy, njobs, rank, exact, lay.order, label_rows=tuple(labels))


def many_labels(policy: str, ja, ns: Sequence[int]) -> np.ndarray:
    """(R, J) labels of the length-blind or greedy policies for every N in ns (round-robin and LPT in numpy)."""
    if policy == "round_robin":
        return np.arange(len(ja.work))[None, :] % np.asarray(ns)[:, None]
    if policy == "lpt":
        return partition.lpt_labels_many(ja.work, ns)
    return np.array([policy_labels(policy, ja, k) for k in ns]).reshape(len(ns), len(ja.work))


def policy_labels(policy: str, ja, k: int) -> np.ndarray:
    """Job labels of the length-blind or greedy policies (contiguous is `contiguous_bounds`)."""
    if policy == "round_robin":
        return partition.round_robin_labels(ja.work, k)
    if policy == "lpt":
        return partition.lpt_labels(ja.work, k)[0]
    return partition.karmarkar_karp_labels(ja.work, k)
