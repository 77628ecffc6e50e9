"""`migrate.play_with_migration`'s event simulation as one compiled (numba) kernel over flat arrays.

Purpose: the cut-and-migrate simulation is per-event, per-sequence work (a 100-step `paper-sim` plays it 401
times: some 2M heap pops) that the heap's layout pins to that order (equal remainders in a cut move in heap
order), so it cannot be batched in numpy; compiled, the same steps cost a fraction of the interpreter's.
`play(...)` is the same algorithm as `migrate`'s pure-Python one, step for step: the same floating-point
operations in the same order (no fastmath), each actor's heap kept in CPython `heapq`'s exact array layout
(`heap_push` / `heap_pop` are its sift functions; tests/test_plan_migrate_kernel.py checks the arrays), events
taken in `(t, actor index)` order as `min(nxt)` + `nxt.index` take them, and `_decide`'s cut rule with its tie
orders. tests/test_plan_migrate_kernel.py holds its results equal to the pure-Python one's bit for bit.

Non-goals: no parallelism, no fastmath (either would change floats); no decision of its own: `migrate` says which
implementation runs and builds the named result.

Importing this module imports numba (tenths of a second of CPU) and loads or compiles the kernel on its first call
(`warm`); `migrate` imports it only where a play runs. The compiled code is cached beside this file
(`__pycache__`, numba's own cache; NUMBA_CACHE_DIR moves it); where that folder cannot be written numba uses its
user-wide cache folder, and where neither can be written (`CACHED` false) each process would compile it anew,
which costs more CPU than the kernel saves in a 100-step `paper-sim` run, so `migrate.kernel()` then runs the
pure-Python simulation.

Deviations from the paper: none (an implementation of `migrate`'s simulation).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rlhfless.plan import jit

# cached beside this file (or in numba's user-wide cache folder) where the switch found a folder to cache in
CACHED = jit.on()
_JIT = njit(cache=CACHED)


@_JIT
def _sift_to_root(keys: np.ndarray, sids: np.ndarray, pos: int, key: float, sid: int) -> None:
    """CPython heapq's `_siftdown`: (key, sid) put at pos, moved up past every larger parent, tuples compared as
    Python compares them (key first, then sid)."""
    while pos > 0:
        parent = (pos - 1) >> 1
        pk = keys[parent]
        if key < pk or (key == pk and sid < sids[parent]):
            keys[pos] = pk
            sids[pos] = sids[parent]
            pos = parent
            continue
        break
    keys[pos] = key
    sids[pos] = sid


@_JIT
def heap_push(keys: np.ndarray, sids: np.ndarray, n: int, key: float, sid: int) -> None:
    """`heapq.heappush(heap, (key, sid))` on a heap of n entries stored as keys[:n], sids[:n] (room for one
    more)."""
    _sift_to_root(keys, sids, n, key, sid)


@_JIT
def heap_pop(keys: np.ndarray, sids: np.ndarray, n: int) -> None:
    """`heapq.heappop` on a heap of n >= 1 entries (keys[:n], sids[:n]), the popped entry dropped: the last
    entry moved to the root, then CPython's `_siftup` (down to a leaf by the smaller child, then `_siftdown`)."""
    n -= 1
    if n == 0:
        return
    key, sid = keys[n], sids[n]
    pos = 0
    child = 1
    while child < n:
        right = child + 1
        # `not heap[child] < heap[right]`, tuples compared key first, then sid: the smaller child
        if right < n and not (keys[child] < keys[right] or (keys[child] == keys[right] and sids[child] < sids[right])):
            child = right
        keys[pos] = keys[child]
        sids[pos] = sids[child]
        pos = child
        child = 2 * pos + 1
    _sift_to_root(keys, sids, pos, key, sid)  # `_siftdown(heap, 0, pos)`


@_JIT
def _next_event(hk: np.ndarray, hn: np.ndarray, it: np.ndarray, t: np.ndarray, ended: np.ndarray,
                f: np.ndarray, a: int) -> float:
    """`_Actor.next_event`: `max(heap[0][0] - it, 0.0)` as Python's `max` returns it (the first unless the
    second is larger)."""
    if ended[a] or hn[a] == 0:
        return np.inf
    wait = hk[a, 0] - it[a]
    if 0.0 > wait:
        wait = 0.0
    return t[a] + wait * f[hn[a]]


@_JIT
def _max_remaining(a: int, hs: np.ndarray, hn: np.ndarray, it: np.ndarray, start: np.ndarray, pred: np.ndarray,
                   first: np.ndarray, qhead: np.ndarray, qend: np.ndarray) -> float:
    """`migrate._max_remaining` of an actor with at least one unfinished sequence (running or queued)."""
    has_run = hn[a] > 0
    run = 0.0
    for k in range(hn[a]):
        sid = hs[a, k]
        r = pred[sid] - (it[a] - start[sid])
        if k == 0 or r > run:
            run = r
    lo, hi = first[qhead[a]], first[qend[a]]
    queued = 0.0
    for s in range(lo, hi):
        if s == lo or pred[s] > queued:
            queued = pred[s]
    if not has_run:
        return queued
    run = run if run > 1.0 else 1.0
    if hi == lo:
        return run
    return queued if queued > run else run


@_JIT
def _stable_order(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` of float64 keys without NaN: a bottom-up merge sort of indices, each
    merge taking from the left run unless the right one's key is smaller (numba's own stable argsort is the
    same order, but compiling it for two key types was a fifth of the kernel's first compile)."""
    n = keys.shape[0]
    idx = np.arange(n)
    tmp = np.empty(n, np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if keys[idx[j]] < keys[idx[i]]:
                    tmp[k] = idx[j]
                    j += 1
                else:
                    tmp[k] = idx[i]
                    i += 1
                k += 1
            while i < mid:
                tmp[k] = idx[i]
                i += 1
                k += 1
            while j < hi:
                tmp[k] = idx[j]
                j += 1
                k += 1
        idx, tmp = tmp, idx
        width *= 2
    return idx


@_JIT
def _grow(moves: np.ndarray, need: int) -> np.ndarray:
    if need <= moves.shape[0]:
        return moves
    out = np.empty((max(need, 2 * moves.shape[0]), 3), np.int64)
    for i in range(moves.shape[0]):  # loops, not a slice assignment: numba's took 3 s to compile
        for c in range(3):
            out[i, c] = moves[i, c]
    return out


@_JIT
def _cut(tt: float, live: np.ndarray, n_live: int, tau: float, cap: int, kv: float, pred: np.ndarray,
         true: np.ndarray, seq_plen: np.ndarray, first: np.ndarray, hk: np.ndarray, hs: np.ndarray, hn: np.ndarray,
         it: np.ndarray, start: np.ndarray, finished: np.ndarray, total: np.ndarray, qhead: np.ndarray,
         qend: np.ndarray, ended: np.ndarray, end: np.ndarray, moves: np.ndarray, n_moves: int,
         released: np.ndarray, n_rel: int, t: np.ndarray) -> tuple[np.ndarray, int, int]:
    """`_decide` on the candidates among `live` (`play_with_migration`'s `cand`), then `_apply`, at time tt;
    the moves appended to moves[n_moves:], the cut sources to released[n_rel:]. Returns (moves, n_moves, n_rel).

    Destinations are keyed (predicted free at, -free slots, actor), unique by actor, so the least found by a
    scan is the one `_decide`'s heap pops. Each cut is applied as it is decided: a source is never a destination
    and `_apply` reads only sources' state and the destinations' clocks, which pushes do not change."""
    n_dst = 0
    d_avail = np.empty(n_live)
    d_neg = np.empty(n_live, np.int64)
    d_aid = np.empty(n_live, np.int64)
    s_n = np.empty(n_live, np.int64)
    s_aid = np.empty(n_live, np.int64)
    n_src = 0
    n_free = 0
    for i in range(n_live):
        b = live[i]
        if not (finished[b] / total[b] >= tau or hn[b] < cap):  # `cand`: neither a source nor a destination
            continue
        n_unf = hn[b] + (first[qend[b]] - first[qhead[b]])
        if n_unf == 0:
            continue
        free = cap - hn[b]
        if finished[b] / (finished[b] + n_unf) >= tau:
            s_n[n_src] = n_unf
            s_aid[n_src] = b
            n_src += 1
        elif free > 0:
            d_avail[n_dst] = _max_remaining(b, hs, hn, it, start, pred, first, qhead, qend)
            d_neg[n_dst] = -free
            d_aid[n_dst] = b
            n_dst += 1
            n_free += free
    # sources by (unfinished, actor): a stable sort of candidates already in actor order, by count
    order = _stable_order(s_n[:n_src].astype(np.float64))  # counts are far below 2**53: exact as floats
    for oi in range(n_src):
        n_unf, src = s_n[order[oi]], s_aid[order[oi]]
        if n_unf > n_free:  # all or nothing
            continue
        # `_unfinished`: running in heap order (remaining raised to 1), then queued; longest first, stable
        rem = np.empty(n_unf)
        sid = np.empty(n_unf, np.int64)
        fin = np.empty(n_unf)
        running = hn[src]
        for k in range(running):
            s = hs[src, k]
            r = pred[s] - (it[src] - start[s])
            rem[k] = r if r > 1.0 else 1.0
            sid[k] = s
            fin[k] = hk[src, k]
        s = first[qhead[src]]
        for k in range(running, n_unf):
            rem[k] = pred[s]
            sid[k] = s
            s += 1
        by = _stable_order(-rem)  # descending, equal lengths in listed order (`sorted(..., reverse=True)`)
        moves = _grow(moves, n_moves + n_unf)
        for q in range(n_unf):
            k = by[q]
            best = 0
            for j in range(1, n_dst):
                if d_avail[j] < d_avail[best] or (d_avail[j] == d_avail[best] and (
                        d_neg[j] < d_neg[best] or (d_neg[j] == d_neg[best] and d_aid[j] < d_aid[best]))):
                    best = j
            dst = d_aid[best]
            if d_neg[best] < -1:
                if rem[k] > d_avail[best]:  # `max(avail, rem)`
                    d_avail[best] = rem[k]
                d_neg[best] += 1
            else:  # full: out of the scan
                n_dst -= 1
                d_avail[best], d_neg[best], d_aid[best] = d_avail[n_dst], d_neg[n_dst], d_aid[n_dst]
            # `_apply` of this move
            s = sid[k]
            if k < running:
                gen = it[src] - start[s]
                r = fin[k] - it[src]
            else:
                gen = 0.0
                r = true[s]
            start[s] = it[dst] - gen
            if hn[dst] >= hk.shape[1]:
                raise RuntimeError("migrate kernel: a destination above capacity")
            heap_push(hk[dst], hs[dst], hn[dst], it[dst] + r, s)
            hn[dst] += 1
            total[dst] += 1
            t[dst] += kv * (seq_plen[s] + gen)  # the destination stalls for the KV
            moves[n_moves, 0] = s
            moves[n_moves, 1] = src
            moves[n_moves, 2] = dst
            n_moves += 1
        n_free -= n_unf
        released[n_rel] = src
        n_rel += 1
        hn[src] = 0
        qhead[src] = qend[src]
        ended[src] = True
        end[src] = tt
    return moves, n_moves, n_rel


@_JIT
def play(pred: np.ndarray, true: np.ndarray, first: np.ndarray, plen: np.ndarray, job_off: np.ndarray,
         f: np.ndarray, tau: float, cap: int, kv: float
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`migrate.play_with_migration`'s simulation on flat arrays.

    pred, true: (S,) float64 predicted and true length of each sequence (sid: job-major, in the plan's order).
    first: (J+1,) int64 each job's first sid, first[J] = S. plen: (J,) int64 each job's prompt tokens.
    job_off: (A+1,) int64: actor a's jobs are job_off[a]:job_off[a+1], in admission order.
    f: (cap+1,) float64 decode seconds of one iteration at each batch size. tau: the cut fraction.
    cap: slots per actor. kv: KV transfer seconds per token.
    Returns moves (M, 3) int64 rows (sid, source, destination) in order, released (R,) int64 actors in order,
    end (A,) float64 each actor's end of decode (0.0 where it has none: `end or 0.0`), finished (A,) int64.
    """
    n_act = job_off.shape[0] - 1
    n_seq = pred.shape[0]
    hk = np.empty((n_act, max(cap, 1)))
    hs = np.empty((n_act, max(cap, 1)), np.int64)
    hn = np.zeros(n_act, np.int64)
    it = np.zeros(n_act)
    t = np.zeros(n_act)
    finished = np.zeros(n_act, np.int64)
    total = np.zeros(n_act, np.int64)
    ended = np.zeros(n_act, np.bool_)
    end = np.zeros(n_act)
    qhead = job_off[:-1].copy()  # actor a's queue: jobs qhead[a]:qend[a]
    qend = job_off[1:].copy()
    start = np.zeros(n_seq)
    seq_plen = np.empty(n_seq, np.int64)
    for j in range(plen.shape[0]):
        for s in range(first[j], first[j + 1]):
            seq_plen[s] = plen[j]
    moves = np.empty((64, 3), np.int64)
    released = np.empty(n_act, np.int64)
    live = np.empty(n_act, np.int64)
    # counters typed int64 from the start: a literal 0 would have numba compile `_cut` once more for it
    n_moves = np.int64(0)
    n_rel = np.int64(0)
    nxt = np.empty(n_act)
    for a in range(n_act):
        total[a] = first[qend[a]] - first[qhead[a]]
        # `_load`'s first admission: a prefix of the queue, each pushed as (its length, sid), start 0.0
        room = cap
        while qhead[a] < qend[a] and first[qhead[a] + 1] - first[qhead[a]] <= room:
            room -= first[qhead[a] + 1] - first[qhead[a]]
            qhead[a] += 1
        for s in range(first[job_off[a]], first[qhead[a]]):
            heap_push(hk[a], hs[a], hn[a], true[s], s)
            hn[a] += 1
    for a in range(n_act):
        nxt[a] = _next_event(hk, hn, it, t, ended, f, a)
    while True:
        a = np.int64(-1)
        tt = np.inf
        for i in range(n_act):  # `min(nxt)`, then the first actor at it (`nxt.index`)
            if nxt[i] < tt:
                tt = nxt[i]
                a = i
        if a < 0:
            break
        if tt > t[a]:  # `_Actor.advance`
            if hn[a]:
                it[a] += (tt - t[a]) / f[hn[a]]
            t[a] = tt
        done = it[a] + 1e-9
        n_done = 0
        while hn[a] and hk[a, 0] <= done:
            heap_pop(hk[a], hs[a], hn[a])
            hn[a] -= 1
            n_done += 1
        finished[a] += n_done
        if qhead[a] < qend[a]:  # `_Actor.admit`
            it_a = it[a]
            while qhead[a] < qend[a] and first[qhead[a] + 1] - first[qhead[a]] <= cap - hn[a]:
                for s in range(first[qhead[a]], first[qhead[a] + 1]):
                    start[s] = it_a
                    heap_push(hk[a], hs[a], hn[a], it_a + true[s], s)
                    hn[a] += 1
                qhead[a] += 1
        elif hn[a] == 0:
            ended[a] = True
            end[a] = tt
            nxt[a] = np.inf
            continue
        if finished[a] / total[a] >= tau:
            # `_room`: could destinations below tau take all of a's unfinished sequences now?
            free = 0
            for b in range(n_act):
                if b != a and not ended[b] and hn[b] and finished[b] / total[b] < tau:
                    free += cap - hn[b]
            if free >= total[a] - finished[a]:
                n_live = np.int64(0)
                for b in range(n_act):
                    if not ended[b] and (hn[b] or qhead[b] < qend[b]):
                        live[n_live] = b
                        n_live += 1
                        if tt > t[b]:  # `_Actor.advance`
                            if hn[b]:
                                it[b] += (tt - t[b]) / f[hn[b]]
                            t[b] = tt
                before = n_moves
                moves, n_moves, n_rel = _cut(tt, live, n_live, tau, cap, kv, pred, true, seq_plen, first, hk, hs,
                                             hn, it, start, finished, total, qhead, qend, ended, end, moves,
                                             n_moves, released, n_rel, t)
                if n_moves > before:
                    for i in range(n_live):
                        nxt[live[i]] = _next_event(hk, hn, it, t, ended, f, live[i])
        nxt[a] = _next_event(hk, hn, it, t, ended, f, a)
    return moves[:n_moves].copy(), released[:n_rel].copy(), end, finished


def warm() -> None:
    """Load (or compile) the kernel now: a play of one actor with one sequence. Called before
    `sim.scenario.play_policies` forks, so the processes it forks do not each load or compile it."""
    one = np.ones(1)
    play(one, one, np.array([0, 1], np.int64), np.zeros(1, np.int64), np.array([0, 1], np.int64),
         np.ones(2), 0.7, 1, 0.0)
