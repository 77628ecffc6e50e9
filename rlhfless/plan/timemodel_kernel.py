"""The scaler's per-play sums as compiled (numba) kernels over flat arrays: `timemodel`'s finish seconds and FIFO
admissions, and `overlap`'s learner-sizing rows.

Purpose: the scaler plays every (candidate, draw) through `balancer.labels_finish_s` (6.6k plays in a 100-step
extended `paper-sim` run) and sizes each learner a few rows at a time (36.7k rows), each a dozen or more small
numpy calls on a few thousand events or a few dozen arrivals, so their per-call cost, not the arithmetic,
dominated; one compiled loop does the same sums.

Each kernel is its numpy reference's algorithm with the same floating-point operations in the same order (no
fastmath): the events in the order a stable sort of the same float keys gives (a stable sort's permutation is
unique, so any stable sort gives it: a radix sort checked against it, `migrate_kernel._stable_order`, or a
counting sort by actor where the caller has the sequences by length), np.cumsum's sequential running sum,
`cum - cum[start]` per actor. The references: `timemodel._finish_seconds_events`, `_finish_seconds_unqueued`,
`_fifo_entries`, `balancer.labels_finish_s` and `overlap._Prefixes.end`; tests/test_plan_timemodel_kernel.py
holds each kernel equal to its reference bit for bit.

Non-goals: no parallelism, no fastmath (either would change floats); no decision of its own: `plan.jit.on()` says
whether compiled kernels run and `timemodel.kernel()` hands them to the callers. Imported only where they run (it
imports numba); compiled code is cached as `migrate_kernel`'s is.

Deviations from the paper: none (an implementation of `timemodel`'s and `overlap`'s sums).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlhfless.plan.migrate_kernel import _stable_order


@njit(cache=True)
def _order(key: np.ndarray) -> np.ndarray:
    """`np.argsort(key, kind="stable")` of float64 keys: an LSD radix sort of their bits (11 a pass, a pass
    skipped where every key has the same digit), stable by construction and in order for keys >= +0.0, whose
    bits rise with their values; the result is checked (each key below the next, or equal with the lower index
    first: the stable sort's unique permutation) and a negative key or -0.0 falls back to the merge sort
    (`migrate_kernel._stable_order`)."""
    m = key.shape[0]
    bits = key.view(np.uint64)
    ix = np.arange(m)
    tmp = np.empty(m, np.int64)
    cnt = np.empty(2048, np.int64)
    for shift in range(0, 64, 11):
        cnt[:] = 0
        for i in range(m):
            cnt[(bits[i] >> shift) & 2047] += 1
        if cnt[(bits[0] >> shift) & 2047] == m:
            continue
        acc = 0
        for d in range(2048):
            c = cnt[d]
            cnt[d] = acc
            acc += c
        for i in range(m):
            j = ix[i]
            d = (bits[j] >> shift) & 2047
            tmp[cnt[d]] = j
            cnt[d] += 1
        ix, tmp = tmp, ix
    for i in range(1, m):
        if key[ix[i]] < key[ix[i - 1]] or (key[ix[i]] == key[ix[i - 1]] and ix[i] < ix[i - 1]):
            return _stable_order(key)
    return ix

@njit(cache=True)
def finish_events(entry: np.ndarray, finish: np.ndarray, seq_actor: np.ndarray, span: float,
                  fv: np.ndarray) -> np.ndarray:
    """`timemodel._finish_seconds_events`: entry, finish (S,) float64; seq_actor (S,) int64; span =
    finish.max() + 1.0; fv: iteration seconds by batch size, len > S. Returns (S,) the decode seconds at each
    finish."""
    n = entry.shape[0]
    key = np.empty(2 * n)
    for i in range(n):
        key[i] = seq_actor[i] * span + entry[i]
        key[n + i] = seq_actor[i] * span + finish[i]
    order = _order(key)
    out = np.empty(n)
    cum = 0.0  # cum[j]: the running sum of the costs of the segments before event j, every actor in one sum
    base = 0.0  # cum at the actor's first event
    batch = 0  # the running batch after the previous event (+1 per entry, -1 per finish, all actors)
    prev_key, prev_a = 0.0, -1
    for j in range(2 * n):
        o = order[j]
        k = key[o]
        a = seq_actor[o - n] if o >= n else seq_actor[o]
        if j > 0:
            seg = k - prev_key
            cost = seg * fv[batch] if a == prev_a and seg > 0 else 0.0
            cum = cost if j == 1 else cum + cost  # np.cumsum's first value is cost[0] itself
        if a != prev_a:
            base = cum
        if o >= n:
            out[o - n] = cum - base
            batch -= 1
        else:
            batch += 1
        prev_key, prev_a = k, a
    return out


@njit(cache=True)
def finish_unqueued(finish: np.ndarray, seq_actor: np.ndarray, n_actors: int, span: float, fv: np.ndarray,
                    by_length: np.ndarray) -> np.ndarray:
    """`timemodel._finish_seconds_unqueued`: finish (S,) float64 (every entry 0), seq_actor (S,) int64, span =
    finish.max() + 1.0, fv as `finish_events`'; by_length: (S,) the sequences by ascending length (their order
    stably by actor then sorts the keys: `timemodel._unqueued_order`), or empty for a stable sort of the keys."""
    n = finish.shape[0]
    counts = np.zeros(n_actors, np.int64)
    for i in range(n):
        counts[seq_actor[i]] += 1
    key = np.empty(n)
    for i in range(n):
        key[i] = seq_actor[i] * span + finish[i]
    if by_length.shape[0] == n:  # a counting sort by actor of the length order: a stable sort of the actor ids
        pos = np.empty(n_actors, np.int64)
        acc = 0
        for a in range(n_actors):
            pos[a] = acc
            acc += counts[a]
        order = np.empty(n, np.int64)
        for i in range(n):
            s = by_length[i]
            a = seq_actor[s]
            order[pos[a]] = s
            pos[a] += 1
    else:
        order = _order(key)
    out = np.empty(n)
    run = 0.0
    base = 0.0  # run[start - 1]: the running sum before the actor's first finish (0.0 for the first actor)
    prev_key, prev_a, start = 0.0, -1, 0
    for j in range(n):
        o = order[j]
        k = key[o]
        a = seq_actor[o]
        if a != prev_a:
            prev_key = a * span + 0.0  # the actor's last entry
            start = j
            base = run if j > 0 else 0.0
        seg = k - prev_key
        cost = seg * fv[counts[a] - (j - start)] if seg > 0 else 0.0
        run = cost if j == 0 else run + cost
        out[o] = run - base
        prev_key, prev_a = k, a
    return out


@njit(cache=True)
def _sift_down(h: np.ndarray, n: int, pos: int, v: float) -> None:
    """v put at pos of the min-heap h[:n], moved down past every smaller child."""
    child = 2 * pos + 1
    while child < n:
        if child + 1 < n and h[child + 1] < h[child]:
            child += 1
        if not h[child] < v:
            break
        h[pos] = h[child]
        pos, child = child, 2 * child + 1
    h[pos] = v


@njit(cache=True)
def _pop(h: np.ndarray, n: int) -> float:
    """Pop the smallest of the min-heap h[:n] (n >= 1); the caller's count drops by one."""
    top = h[0]
    _sift_down(h, n - 1, 0, h[n - 1])
    return top


@njit(cache=True)
def _push(h: np.ndarray, n: int, v: float) -> None:
    """Push v onto the min-heap h[:n] (room for one more)."""
    pos = n
    while pos > 0:
        parent = (pos - 1) >> 1
        if not v < h[parent]:
            break
        h[pos] = h[parent]
        pos = parent
    h[pos] = v


@njit(cache=True)
def fifo_entries(lengths: np.ndarray, starts: np.ndarray, queued: np.ndarray, job_sizes: np.ndarray,
                 job_actor: np.ndarray, capacity: int, entry: np.ndarray) -> None:
    """`timemodel._fifo_entries`: each queued actor's admission iterations into entry (S,), jobs FIFO, a job's
    g seqs entering together at the g-th earliest slot-free iteration, then freeing their slots at that
    iteration + their lengths (`_gang_fifo_entries`' rule and float additions; its sorted list and heap hold the
    same values as the min-heap of slot-free iterations here). lengths (S,) float64 grouped by actor; starts
    (A+1,) first sequence of each actor; queued: the actors to run; job_sizes, job_actor (J,) int64 (an actor's
    jobs in its admission order); g <= capacity."""
    n_actors = starts.shape[0] - 1
    jpos = np.zeros(n_actors + 1, np.int64)  # the jobs by actor, each actor's in their order (a counting sort)
    for j in range(job_actor.shape[0]):
        jpos[job_actor[j] + 1] += 1
    for a in range(n_actors):
        jpos[a + 1] += jpos[a]
    fill = jpos[:-1].copy()
    sizes = np.empty(job_actor.shape[0], np.int64)
    for j in range(job_actor.shape[0]):
        sizes[fill[job_actor[j]]] = job_sizes[j]
        fill[job_actor[j]] += 1
    h = np.empty(capacity + 1)
    for a in queued:
        i, j = starts[a], jpos[a]
        n0 = 0  # jobs that fit the empty engine enter at 0
        while j < jpos[a + 1] and n0 + sizes[j] <= capacity:
            n0 += sizes[j]
            j += 1
        for q in range(n0):
            entry[i + q] = 0.0
            h[q] = lengths[i + q]
        for q in range(n0, capacity):
            h[q] = 0.0
        for q in range(capacity // 2 - 1, -1, -1):  # heapify: sift each parent down
            _sift_down(h, capacity, q, h[q])
        i += n0
        n = capacity
        while j < jpos[a + 1]:
            g = sizes[j]
            t = 0.0
            for q in range(g):  # the g earliest free slots; the job enters at the g-th
                t = _pop(h, n)
                n -= 1
            for q in range(g):
                entry[i + q] = t
                _push(h, n, t + lengths[i + q])
                n += 1
            i += g
            j += 1

@njit(cache=True)
def prefix_end(arr: np.ndarray, suffix: np.ndarray, last: float, seg: np.ndarray, rate: np.ndarray,
               offset: np.ndarray, at_ready: np.ndarray, k: int) -> float:
    """`overlap._Prefixes.end(k)`: the work end on the first k (>= 1) blocks by ready time, given the arrivals
    (arr, suffix: (G,) ascending, G >= 1; last), each arrival's place among the ready times (seg), and the
    blocks' cumulative rate, offset and at_ready (B,) -- the same float operations elementwise; the maximum
    over the arrivals is exact in any order. NaN where rate[k - 1] is not positive; -0.0 where the maximum is
    a zero or last is NaN (the caller then runs numpy's code: its choice between signed zeros is not copied)."""
    if not rate[k - 1] > 0:
        return np.nan
    k_all = rate.shape[0]
    best = -np.inf
    for i in range(arr.shape[0]):
        m = min(seg[i], k) - 1
        y = (arr[i] * rate[m] - offset[m] if m >= 0 else 0.0) + suffix[i]
        lo, hi = 0, k_all  # np.searchsorted(at_ready, y, side="left")
        while lo < hi:
            mid = (lo + hi) >> 1
            if at_ready[mid] < y:
                lo = mid + 1
            else:
                hi = mid
        m = max(min(lo, k) - 1, 0)
        while rate[m] <= 0:  # a zero-rate segment cannot carry work: step to the next with a rate
            m = min(m + 1, k_all - 1)
        v = (y + offset[m]) / rate[m]
        if v != v:
            return np.nan
        if v > best:
            best = v
    if best == 0.0 or last != last:
        return -0.0
    return best if best > last else last

@njit(cache=True)
def labels_finish(order: np.ndarray, sizes_all: np.ndarray, offsets: np.ndarray, seq_len: np.ndarray,
                  prompt_len: np.ndarray, labels: np.ndarray, n_actors: int, capacity: int, fv: np.ndarray,
                  fixed_s: float, prefill_s: float, by_length: np.ndarray) -> np.ndarray:
    """`balancer.labels_finish_s` after its lexsort (order: the jobs by (label, rank)), the same steps: the
    sequences gathered in that order, `fifo_entries`, `finish_unqueued` or `finish_events`, each job's last
    finish plus its actor's fixed seconds and prefill (np.bincount's sum: in job order from 0.0). sizes_all,
    offsets (J+1,), prompt_len, labels: ja's and the labelling's (J,) arrays; seq_len (S,), S >= 1; fv as
    `finish_events`'; by_length (S,) ja's sequences by length, or empty."""
    n_jobs, n = order.shape[0], seq_len.shape[0]
    sizes = np.empty(n_jobs, np.int64)
    jactor = np.empty(n_jobs, np.int64)
    lengths = np.empty(n)
    sactor = np.empty(n, np.int64)
    at = np.empty(n, np.int64)  # ja position -> play position
    counts = np.zeros(n_actors, np.int64)
    p = 0
    for j in range(n_jobs):
        o = order[j]
        sizes[j], jactor[j] = sizes_all[o], labels[o]
        counts[labels[o]] += sizes_all[o]
        for q in range(sizes_all[o]):
            lengths[p] = seq_len[offsets[o] + q]
            sactor[p] = labels[o]
            at[offsets[o] + q] = p
            p += 1
    starts = np.zeros(n_actors + 1, np.int64)
    n_queued = 0
    for a in range(n_actors):
        starts[a + 1] = starts[a] + counts[a]
        n_queued += counts[a] > capacity
    queued = np.empty(n_queued, np.int64)
    n_queued = 0
    for a in range(n_actors):
        if counts[a] > capacity:
            queued[n_queued] = a
            n_queued += 1
    entry = np.zeros(n)
    if n_queued:
        fifo_entries(lengths, starts, queued, sizes, jactor, capacity, entry)
    finish = np.empty(n)
    top = -np.inf
    later = False  # `finish_seconds`' `entry.any()`
    for i in range(n):
        finish[i] = entry[i] + lengths[i]
        top = max(top, finish[i])
        later = later or entry[i] != 0.0
    span = top + 1.0
    if later:
        fin = finish_events(entry, finish, sactor, span, fv)
    else:
        by = np.empty(by_length.shape[0], np.int64)
        for i in range(by_length.shape[0]):
            by[i] = at[by_length[i]]
        fin = finish_unqueued(finish, sactor, n_actors, span, fv, by)
    acc = np.zeros(n_actors)
    for j in range(n_jobs):
        acc[labels[j]] += prompt_len[j]
    out = np.empty(n_jobs)
    p = 0
    for j in range(n_jobs):
        best = fin[p]
        for q in range(1, sizes[j]):
            best = max(best, fin[p + q])
        p += sizes[j]
        out[order[j]] = best + (fixed_s + acc[jactor[j]] * prefill_s)
    return out

def warm() -> None:
    """Load (or compile) the kernels now (before `sim.scenario.play_policies` forks): one tiny call each."""
    one, act = np.ones(1), np.zeros(1, np.int64)
    finish_events(np.zeros(1), one, act, 2.0, np.ones(2))
    finish_unqueued(one, act, 1, 2.0, np.ones(2), np.zeros(1, np.int64))
    fifo_entries(one, np.array([0, 1], np.int64), act, np.ones(1, np.int64), act, 1, np.zeros(1))
    prefix_end(one, one, 1.0, np.ones(1, np.int64), one, np.zeros(1), np.zeros(1), 1)
    labels_finish(act, np.ones(1, np.int64), np.array([0, 1], np.int64), one, one, act, 1, 1, np.ones(2), 0.0, 0.0,
                  np.zeros(0, np.int64))
