"""Number-partitioning rules behind the assignment policies: per-job work in, actor labels out.

Pure functions the balancer wraps with validation, the time model and typed plans: round_robin (i mod n,
verl-like), contiguous_labels (jobs sorted longest first, cut into n chunks of about equal token work), lpt
(longest-processing-time greedy; `lpt_labels_many` runs every candidate n at once) and karmarkar_karp (multiway
largest differencing). The rule it keeps: work is tokens (n_seqs x predicted length), with no capacity and no
time model here. Each rule in full: docs/internals.md#planpartitionpy.

Deviations from the paper:
1. The paper does not say how chunk boundaries are chosen; equal token work (refined to equal busy time by
   `plan.sweep`) is ours.
2. LPT and KK are comparison baselines (KK is what verl uses for TRAINING micro-batches, not rollout).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import count
from operator import itemgetter

import numpy as np


def round_robin_labels(work: np.ndarray, n: int) -> np.ndarray:
    """(J,) work -> (J,) actor labels i mod n."""
    return np.arange(len(work)) % n


def contiguous_labels(mean_len: np.ndarray, work: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Equal-token-work contiguous chunks over jobs sorted by mean length (descending).

    mean_len, work: (J,) tokens per sequence and tokens per job. Returns (labels (J,), sorted order (J,)).
    """
    order = np.argsort(-mean_len, kind="stable")
    w = work[order]
    total = float(w.sum())
    labels = np.empty(len(work), dtype=np.int64)
    if total <= 0:  # nothing to balance: fall back to equal counts
        labels[order] = (np.arange(len(work)) * n) // max(len(work), 1)
        return labels, order
    # chunk floor(n m / W) at each job's midpoint m: a job heavier than W/n fills a chunk alone (maybe one empty)
    mid = np.cumsum(w) - 0.5 * w
    labels[order] = np.minimum((mid * n / total).astype(np.int64), n - 1)
    return labels, order


def lpt_labels(work: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Longest-processing-time greedy. Returns (labels (J,), processing order (J,)); ties -> lower actor."""
    order = np.argsort(-work, kind="stable")
    labels = np.empty(len(work), dtype=np.int64)
    heap = [(0.0, a) for a in range(n)]
    wl = work.tolist()
    for j in order.tolist():
        load, a = heap[0]
        labels[j] = a
        heapq.heapreplace(heap, (load + wl[j], a))
    return labels, order


def lpt_labels_many(work: np.ndarray, ns: Sequence[int]) -> np.ndarray:
    """`lpt_labels` for every n in `ns` at once: (J,) work -> (R, J) labels, row r for ns[r].

    The jobs are placed in the same order for all rows, each into its row's least-loaded actor (first minimum:
    the lower actor, as the heap's ties); actors >= n start at +inf so they are never chosen. One numpy step
    per job instead of one heap operation per job and candidate; the same loads, added in the same order.
    """
    n = np.asarray(ns, dtype=np.int64)
    order = np.argsort(-work, kind="stable")
    loads = np.where(np.arange(int(n.max()))[None, :] < n[:, None], 0.0, np.inf)
    labels = np.empty((len(n), len(work)), dtype=np.int64)
    rows = np.arange(len(n))
    for j, w in zip(order.tolist(), work[order].tolist()):
        a = loads.argmin(axis=1)
        labels[:, j] = a
        loads[rows, a] += w
    return labels


def _kk_merge(a: list, b: list, n: int) -> list:
    """Merge two sparse n-bin partitions (lists of (sum, node) sorted by sum desc): big bin with small bin."""
    la, lb = len(a), len(b)
    if la + lb <= n:  # bins are sparse (non-empty only), so early merges are plain unions
        out = a + b
    else:
        out = []
        for k in range(n):
            j = n - 1 - k  # a's k-th largest pairs with b's k-th smallest (zeros pad b's tail)
            x = a[k] if k < la else None
            y = b[j] if j < lb else None
            if x is None:
                if y is not None:
                    out.append(y)
            elif y is None:
                out.append(x)
            else:
                out.append((x[0] + y[0], (x[1], y[1])))
    out.sort(key=itemgetter(0), reverse=True)
    return out


def _flatten(node: object) -> list[int]:
    """Job indices held by a KK bin (nodes are job ints or (left, right) pairs)."""
    out, stack = [], [node]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(x)
        else:
            out.append(x)
    return out


def karmarkar_karp_labels(work: np.ndarray, n: int) -> np.ndarray:
    """Multiway Karmarkar-Karp (largest differencing). (J,) work -> (J,) labels; bins ordered by load desc."""
    labels = np.zeros(len(work), dtype=np.int64)
    if len(work) == 0 or n == 1:
        return labels
    tie = count()
    heap = []
    for j, w in enumerate(work.tolist()):
        # spread of a single-job partition: w - 0 (the other n-1 bins are empty)
        heap.append((-w, next(tie), [(w, j)]))
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        m = _kk_merge(a, b, n)
        spread = m[0][0] - (m[-1][0] if len(m) == n else 0.0)
        heapq.heappush(heap, (-spread, next(tie), m))
    for a, (_, node) in enumerate(heap[0][2]):
        labels[_flatten(node)] = a
    return labels
