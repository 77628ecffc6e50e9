"""Whole-step model: scoring and the learner's forward/backward on freed devices, overlapped with the decode tail.

Pure functions the scaler (T(N), C(N) of the whole step) and the simulator share: `LearnerCosts`,
`learner_blocks` (which devices the learner gets, from when), `learner_drain` (when the last group's work is
done) and `learner_invocations` / `share_invocations` (the learner's billed spans: blocks held to the step's end,
or ranks let go at their share). The rule it keeps: one optimizer step after the last
group, with the reduction order fixed by group index, so the overlapped update equals the sequential one. Every
modelling assumption (fluid data-parallel work, blocks, hybrid functions, pre-warm) is listed in
docs/internals.md#planoverlappy. Units are a budget: decode, prefill and learner never hold more than `devices`.

Deviations from the paper:
1. The overlap is ours: the paper runs scoring and training after the rollout. Still on-policy and synchronous.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlhfless.core.errors import DataError, require
from rlhfless.plan import lifecycle
from rlhfless.plan.ranks import reducer
from rlhfless.plan.records import Invocation
from rlhfless.plan.timemodel import kernel


@dataclass(frozen=True)
class LearnerCosts:
    """What the scaler adds to the decode stage to score the whole step (`plan.learner.*`).

    Defaults: the tiny model on this machine's cores (2.74e-4 core-seconds per trained token, from
    `rlhfless.sim.perf` FITTED["cpu-core"]: 1.37e-4 s per token on 2 cores), no optimizer-step constant.
    """

    whole_step: bool = False
    """Score candidates on the whole step (prefill, decode, scoring + update, their bills); False = decode only
    (the scaler without the whole-step scorer)."""
    overlap: bool = True
    """Finished groups are scored and their forward/backward run on freed devices during the decode tail."""
    devices: float = 0.0
    """Device budget of the step (decode + prefill + learner); 0 = max_actors x gpus_per_actor."""
    s_per_token: float = 2.74e-4
    """Device-seconds of scoring + forward/backward per token (prompt + response) the learner processes (>= 0)."""
    update_fixed_s: float = 0.0
    """Seconds of the one optimizer step (gradient all-reduce + optimizer) after the last group (>= 0)."""
    cold_start_s: float = 3.0
    """Seconds a learner block needs to start on freed devices (container + weights), >= 0."""
    prewarm: bool = True
    """Spare devices start the learner ahead, ready when the first group arrives (billed from their start)."""
    prewarm_bill_s: float | None = None
    """Seconds a pre-warmed block is billed ahead of its ready time (kept alive through a gap shorter than its
    cold start, or restarted a cold start ahead); None = its cold start."""
    prompt_tokens: float = 0.0
    """Prompt tokens per sequence the learner processes besides the jobs' prompt_len (a dedup plan gives decode
    actors no prompt to prefill, but the learner still reads it), >= 0."""
    prefill_s: float = 0.0
    """Seconds of a prefill function before the decode actors have their KV (0 = none)."""
    prefill_devices: float = 0.0
    """Devices the prefill function holds (>= 0)."""
    size_slack: float | None = None
    """With overlap: start only the learner blocks the backlog needs, the fewest (earliest ready first) whose work
    ends within this fraction of the work end with every block (`size_blocks`); None = every free device is a
    block (the runtime's learner has a fixed rank count and does not size itself)."""
    after_s_per_token: float = 0.0
    """Device-seconds per token that can start only after the rollout (verl's mini-batch updates under learner
    parity: only the forwards stream), on top of `s_per_token` (>= 0)."""
    release_cold_s: float | None = None
    """Seconds a learner block needs on the devices a decode actor released; None = cold_start_s (a new learner
    function). A hybrid function (`runtime.hybrid`) goes on as the learner rank itself: only the in-place reshard
    of the weights it decoded with into the learner's layout (the prefill function is another image: it keeps
    cold_start_s)."""
    rank_devices: float = 0.0
    """Separate images: devices of one learner rank (a replica's), whose ranks but the reducer may be let go at
    their share, the learner's work end (`share_invocations`, when `plan.lifecycle.share_release` says so on
    `share_go` and `share_wait`), the reducer alone holding through the optimizer step; 0 = every block holds its
    devices to the step's end (hybrid functions, or none let go), >= 0."""
    share_go: bool = False
    """With rank_devices: the ranks go at their share whatever the devices (`plan.lifecycle.let_go` said so)."""
    share_wait: bool = False
    """With rank_devices: a pre-warm of the next step waits for devices, so the ranks go at their share where
    they leave fewer than one rank's devices free."""

    def __post_init__(self) -> None:
        require(self.release_cold_s is None or self.release_cold_s >= 0, "plan.learner.release_cold_s",
                f"must be >= 0 or None (got {self.release_cold_s})")
        require(self.size_slack is None or self.size_slack >= 0, "plan.learner.size_slack",
                f"must be >= 0 or None (got {self.size_slack})")
        require(self.prewarm_bill_s is None or self.prewarm_bill_s >= 0, "plan.learner.prewarm_bill_s",
                f"must be >= 0 or None (got {self.prewarm_bill_s})")
        for f in ("devices", "s_per_token", "after_s_per_token", "update_fixed_s", "cold_start_s", "prompt_tokens",
                  "prefill_s", "prefill_devices", "rank_devices"):
            v = getattr(self, f)
            require(v >= 0, f"plan.learner.{f}", f"must be >= 0 (got {v})")


def learner_drain(arrive_s: np.ndarray, work_ds: np.ndarray, ready_s: np.ndarray,
                  devices: np.ndarray) -> tuple[float, np.ndarray]:
    """When a fluid data-parallel learner has done all its work, and which blocks took part.

    arrive_s, work_ds: (G,) when each group's work arrives and its device-seconds; ready_s, devices: (B,) when
    each block of devices can work and how many devices it has. Work is processed at a rate equal to the devices
    of the blocks ready so far (docs/internals.md#planoverlappy): a work-conserving fluid queue with capacity curve
    C(t) = sum_j devices_j * max(0, t - ready_j), so the work ends at max_i C^-1(C(arrive_i) + work arriving at or
    after arrive_i), and never before the last arrival. Returns (work_end_s, joined (B,) bool: ready before
    work_end_s; with no work at all, the last arrival and no block). Raises DataError when work is left and no
    block is.
    """
    return _drain(_Arrivals.of(arrive_s, work_ds), ready_s, devices)


@dataclass(frozen=True)
class _Arrivals:
    """The work side of `learner_drain`, sorted once for the many block sets `size_blocks` tries: arrivals
    (G,) ascending, the work arriving at or after each (suffix sums), the total and the last arrival."""

    arr: np.ndarray
    suffix: np.ndarray
    total: float
    last: float

    @staticmethod
    def of(arrive_s: np.ndarray, work_ds: np.ndarray) -> _Arrivals:
        arr, work = np.asarray(arrive_s, float), np.asarray(work_ds, float)
        total = float(work.sum())
        if len(arr) == 0 or total <= 0:
            return _Arrivals(arr, work, total, float(arr.max()) if len(arr) else 0.0)
        ao = np.argsort(arr, kind="stable")
        arr, work = arr[ao], work[ao]
        suffix = np.cumsum(work[::-1])[::-1]
        live = suffix > 0
        return _Arrivals(arr[live], suffix[live], total, float(arr[-1]))


def _drain(w: _Arrivals, ready_s: np.ndarray, devices: np.ndarray,
           presorted: bool = False) -> tuple[float, np.ndarray]:
    """`learner_drain` of sorted arrivals; `presorted`: ready_s is already ascending (the stable sort is then
    the identity and is skipped)."""
    ready = np.asarray(ready_s, float)
    if len(w.arr) == 0 or w.total <= 0:
        return w.last, np.zeros(len(ready), dtype=bool)
    if presorted:
        r, d = ready, np.asarray(devices, float)
    else:
        bo = np.argsort(ready, kind="stable")
        r, d = ready[bo], np.asarray(devices, float)[bo]
    if len(r) == 0 or float(d.sum()) <= 0:
        raise DataError(f"learner_drain: {w.total:.3g} device-seconds of work left and no device to run it")
    rate, offset = np.cumsum(d), np.cumsum(d * r)  # after the m-th block: C(t) = t * rate[m] - offset[m]
    at_ready = r * rate - offset  # C at each block's ready time (non-decreasing)

    def cap(t):
        m = np.searchsorted(r, t, side="right") - 1
        return np.where(m >= 0, t * rate[np.maximum(m, 0)] - offset[np.maximum(m, 0)], 0.0)

    def inverse(y):  # the first t with C(t) = y > 0: on the last segment starting at or below y
        m = np.searchsorted(at_ready, y, side="left") - 1
        m = np.maximum(m, 0)
        while True:  # a zero-rate segment (devices 0) cannot carry work: step to the next with a rate
            bad = rate[m] <= 0
            if not bad.any():
                return (y + offset[m]) / rate[m]
            m = np.where(bad, m + 1, m)

    end = max(float(np.max(inverse(cap(w.arr) + w.suffix))), w.last)  # every group is in
    return end, ready < end - 1e-12


def _prefix_ends(w: _Arrivals, r: np.ndarray, d: np.ndarray, ks: np.ndarray | None = None) -> np.ndarray:
    """(K,) `_drain`'s work end on the first k blocks of ascending ready times r with devices d, for every k in
    1..K at once, the same floats: a prefix's cumulative sums are the full ones' prefix (np.cumsum adds in
    order), and a search in a prefix is the full search capped at k. NaN where the first k blocks hold no
    device (`_drain` refuses those; `size_blocks` never asks). `ks`: only these prefix lengths (each row is
    computed on its own, elementwise, so a row's floats do not depend on the others asked with it)."""
    k_all = len(r)
    ks = np.arange(1, k_all + 1) if ks is None else np.asarray(ks, dtype=np.intp)
    if len(w.arr) == 0 or w.total <= 0:
        return np.full(len(ks), w.last)
    rate, offset = np.cumsum(d), np.cumsum(d * r)
    at_ready = r * rate - offset
    ks = ks[:, None]  # (K, 1): the prefix length
    m = np.minimum(np.searchsorted(r, w.arr, side="right")[None, :], ks) - 1  # cap(t) on each prefix
    mm = np.maximum(m, 0)
    y = np.where(m >= 0, w.arr * rate[mm] - offset[mm], 0.0) + w.suffix
    m = np.maximum(np.minimum(np.searchsorted(at_ready, y, side="left"), ks) - 1, 0)  # inverse(y) on each
    valid = rate[ks[:, 0] - 1] > 0  # the prefix's last cumulative rate: some device among its blocks
    while True:  # a zero-rate segment cannot carry work: step to the next with a rate, as `_drain`
        bad = (rate[m] <= 0) & valid[:, None]
        if not bad.any():
            break
        m = np.where(bad, np.minimum(m + 1, k_all - 1), m)
    with np.errstate(divide="ignore", invalid="ignore"):
        ends = np.max((y + offset[m]) / rate[m], axis=1)
    return np.where(valid, np.maximum(ends, w.last), np.nan)


class _Prefixes:
    """`_prefix_ends` one row at a time for the few counts `size_blocks` tries, the parts every row shares
    (the blocks' cumulative sums and where each arrival falls among the ready times) computed once: each row
    is then the same elementwise operations on the same floats as `_prefix_ends` (test_plan_overlap checks
    bit for bit)."""

    def __init__(self, w: _Arrivals, r: np.ndarray, d: np.ndarray):
        self.w, self.r = w, r
        self.rate, self.offset = np.cumsum(d), np.cumsum(d * r)
        self.at_ready = r * self.rate - self.offset
        self.seg = np.searchsorted(r, w.arr, side="right")  # capped at k per row: cap(t) on the first k blocks
        self.kernel = kernel()

    def end(self, k: int) -> float:
        """`_prefix_ends(w, r, d, [k])[0]` (k >= 1; NaN where the first k blocks hold no device); compiled
        (`timemodel_kernel.prefix_end`, the same floats) where the planner's kernels run."""
        w, rate, offset = self.w, self.rate, self.offset
        if len(w.arr) == 0 or w.total <= 0:
            return float(w.last)
        if self.kernel is not None:
            e = self.kernel.prefix_end(w.arr, w.suffix, w.last, self.seg, rate, offset, self.at_ready, k)
            if e != 0.0:  # a zero: numpy's below picks between signed zeros as the reference does
                return e
        m = np.minimum(self.seg, k) - 1
        mm = np.maximum(m, 0)
        y = np.where(m >= 0, w.arr * rate[mm] - offset[mm], 0.0) + w.suffix
        m = np.maximum(np.minimum(np.searchsorted(self.at_ready, y, side="left"), k) - 1, 0)
        if not rate[k - 1] > 0:
            return float("nan")
        k_all = len(self.r)
        while True:  # a zero-rate segment cannot carry work: step to the next with a rate, as `_drain`
            bad = rate[m] <= 0
            if not bad.any():
                break
            m = np.where(bad, np.minimum(m + 1, k_all - 1), m)
        return float(np.maximum(np.max((y + offset[m]) / rate[m]), w.last))


def size_blocks(arrive_s: np.ndarray, work_ds: np.ndarray, b: Blocks, slack: float,
                arrivals: _Arrivals | None = None) -> Blocks:
    """The fewest blocks, earliest ready first, whose work ends at most `slack` x the work end with every block
    later (a learner that starts only what its backlog needs: a block ready but idle until the optimizer step is
    billed for nothing). Binary search over the count; the work end never falls as blocks are removed. The work
    end of each count the search tries is one row of `_prefix_ends` (the scaler sizes the learner of every
    candidate and draw: some 5 rows of 20 asked, not all 20), equal to `_drain` on that count. `arrivals`:
    `_Arrivals.of(arrive_s, work_ds)` when the caller has it (`whole_step_tail` drains the same work after)."""
    return _sized(arrive_s, work_ds, b, slack, arrivals)[0]


def _sized(arrive_s: np.ndarray, work_ds: np.ndarray, b: Blocks, slack: float,
           arrivals: _Arrivals | None = None) -> tuple[Blocks, float | None]:
    """`size_blocks` and the work end on the blocks it keeps (None where it kept them all unsearched): the
    search has already computed that end (the kept blocks in ready order are the first `lo` of the sorted
    ones, so `_drain` on them is row `lo`), which `whole_step_tail` would otherwise drain again."""
    order = np.argsort(b.ready_s, kind="stable")
    if len(order) <= 1 or float(np.sum(work_ds)) <= 0:
        return b, None
    # the work side is the same for every count tried
    w = arrivals if arrivals is not None else _Arrivals.of(arrive_s, work_ds)
    r, d = np.asarray(b.ready_s, float)[order], np.asarray(b.devices, float)[order]
    rows = _Prefixes(w, r, d)
    end_all = rows.end(len(order))  # every block: `_drain(w, b.ready_s, b.devices)`
    if not np.isfinite(end_all):
        end_all, _ = _drain(w, b.ready_s, b.devices)  # no device at all: `_drain` says so
    limit = end_all * (1.0 + slack) + 1e-12
    lo, hi, end = 1, len(order), end_all
    while lo < hi:  # only the counts the search tries (about log2 of them), each one row of `_prefix_ends`
        k = (lo + hi) // 2
        e = rows.end(k) if float(np.sum(b.devices[order[:k]])) > 0 else None
        if e is not None and e <= limit:
            hi, end = k, e
        else:
            lo = k + 1
    keep = np.sort(order[:lo])
    return Blocks(b.ready_s[keep], b.devices[keep], b.cold_s[keep]), end


@dataclass(frozen=True)
class Blocks:
    """Learner blocks: ready_s, devices, cold_s (B,) each (cold_s: billed cold start before ready_s)."""

    ready_s: np.ndarray
    devices: np.ndarray
    cold_s: np.ndarray


def learner_blocks(release_s: np.ndarray, release_devices: np.ndarray | float, spare_devices: float,
                   block_devices: float, first_arrival_s: float, cold_s: float, prewarm: bool,
                   release_cold_s: np.ndarray | float | None = None, warm_spare: int = 0) -> Blocks:
    """The learner's blocks: the devices of each released function (release_s, release_devices:
    (A,) seconds from the step's start and devices; a decode actor or the prefill function) after its
    release_cold_s ((A,) or a scalar; None = cold_s: a new learner function; a hybrid decode function goes on as
    a rank after the in-place reshard only), and the spare devices in blocks of block_devices, pre-warmed to be
    ready at the first arrival (else cold from then). A spare remainder smaller than a block is one more block.
    warm_spare: the first this many spare blocks are hybrid functions kept from the last step's learner beyond
    this step's decode need: they hold the weights, so they are ready at the first arrival even when it comes
    before a cold start could end, and bill from the step's start or a cold start ahead of it, whichever is
    later (the pre-warm rule: kept alive from the step's start when that bills less than releasing it there and
    starting a learner function again in time). The assumptions behind them: docs/internals.md#planoverlappy."""
    rel = np.asarray(release_s, float)
    rel_dev = np.broadcast_to(np.asarray(release_devices, float), rel.shape)
    rel_cold = np.broadcast_to(np.asarray(cold_s if release_cold_s is None else release_cold_s, float), rel.shape)
    n_spare = int(np.floor(spare_devices / block_devices + 1e-9)) if block_devices > 0 else 0
    rest = spare_devices - n_spare * block_devices
    spare = [block_devices] * n_spare + ([rest] if rest > 1e-9 else [])
    # pre-warmed from the step's start at the earliest: before it, the previous step's learner held every device
    spare_ready = max(first_arrival_s, cold_s) if prewarm else first_arrival_s + cold_s
    warm = min(max(int(warm_spare), 0), n_spare)
    ready = np.full(len(spare), spare_ready)
    cold = np.full(len(spare), float(cold_s))
    ready[:warm], cold[:warm] = first_arrival_s, min(first_arrival_s, cold_s)
    return Blocks(np.concatenate((rel + rel_cold, ready)), np.concatenate((rel_dev, np.array(spare, float))),
                  np.concatenate((rel_cold, cold)))


def prewarm_billed(b: Blocks, first_warm: int, prewarm: bool, bill_s: float | None) -> Blocks:
    """The blocks with the pre-warmed ones (index first_warm on: the spare blocks, or the single sequential one)
    billed bill_s ahead of ready instead of their cold start, when prewarm, bill_s is set and it is shorter."""
    if not prewarm or bill_s is None:
        return b
    cold = b.cold_s.copy()
    cold[first_warm:] = np.minimum(cold[first_warm:], bill_s)
    return Blocks(b.ready_s, b.devices, cold)


def sequential_blocks(rollout_end_s: float, devices: float, cold_s: float) -> Blocks:
    """No overlap: every device is one learner block ready at the end of the rollout (pre-warmed: its cold start
    ran before, billed)."""
    return Blocks(np.array([rollout_end_s]), np.array([float(devices)]), np.array([float(cold_s)]))


def learner_invocations(b: Blocks, joined: np.ndarray, end_s: float, t0: float = 0.0) -> list[Invocation]:
    """One billed `learner` invocation per joined block: from its start (ready - cold) to the step's end. The
    blocks are read as Python floats (the same IEEE doubles as numpy's scalars, the same operations): the scaler
    builds some 20 a tail, thousands of tails a run."""
    ready, cold, dev = b.ready_s.tolist(), b.cold_s.tolist(), b.devices.tolist()
    out = []
    for k in np.flatnonzero(joined):  # k stays numpy's integer: the invocation's id as before
        start = max(ready[k] - cold[k], 0.0)
        out.append(Invocation("learner", k, t0 + start, t0 + end_s, True, dev[k], min(cold[k], end_s - start)))
    return out


def share_invocations(b: Blocks, joined: np.ndarray, share_s: float, end_s: float, rank_devices: float,
                      t0: float = 0.0) -> list[Invocation]:
    """The learner's billed invocations when its ranks go at their share (`LearnerCosts.rank_devices`): each
    joined block cut into ranks of `rank_devices` (the runtime's learner ranks: one data-parallel rank per
    replica's devices), numbered in block order; every rank ends at the share `share_s` (the fluid learner's work
    end: every share comes in then, in rank order) but the reducer (`plan.ranks.reducer`: the last share in),
    which sums the shares and runs the optimizer step to `end_s`. Seconds after t0; a rank's cold start is its
    block's. The simulator bills it, the scaler prices it (`learner_billed`)."""
    # the blocks read as Python values (each the value numpy's scalar of the same index gives, the same
    # operations), then each block's ranks: the first built and checked, the others copies renumbered in this
    # loop (some 20 ranks a tail, 9,900 tails in 100 paper-sim steps)
    starts, colds, devs = (b.ready_s - b.cold_s).tolist(), b.cold_s.tolist(), b.devices.tolist()
    spans = []  # per joined block: (start, cold start, a rank's devices, ranks)
    for k in np.flatnonzero(joined).tolist():
        d = float(devs[k])
        n = max(1, int(np.floor(d / rank_devices + 1e-9))) if rank_devices > 0 else 1
        spans.append((max(float(starts[k]), 0.0), float(colds[k]), d / n, n))
    if not spans:
        return []
    last = reducer(list(range(sum([s[3] for s in spans]))))
    out, r0, new = [], 0, object.__new__
    for start, cold, d, n in spans:
        proto = None  # the block's first rank but the reducer: its ranks are equal but for the id
        for r in range(r0, r0 + n):
            if proto is not None and r != last:
                inv = new(Invocation)
                inv.__dict__.update(proto, actor_id=r)  # `dataclasses.replace` without the checks it passed
                out.append(inv)
                continue
            end = end_s if r == last else max(share_s, start)
            inv = Invocation("learner", r, t0 + start, t0 + end, True, d, min(cold, end - start))
            out.append(inv)
            proto = inv.__dict__ if r != last else None
        r0 += n
    return out


def learner_billed(b: Blocks, joined: np.ndarray, share_s: float, end_s: float, budget: float,
                   lc: LearnerCosts) -> list[Invocation]:
    """The learner's invocations as the scaler prices them: cut into ranks let go at their share where
    `plan.lifecycle.share_release` says so on `lc` (separate images: rank_devices > 0; the joined blocks hold
    their devices of the `budget`), else every joined block held to the step's end (`learner_invocations`)."""
    held = float(b.devices[joined].sum())
    if lc.rank_devices > 0 and lifecycle.share_release(lc.share_go, lc.share_wait, budget, held, lc.rank_devices):
        return share_invocations(b, joined, share_s, end_s, lc.rank_devices)
    return learner_invocations(b, joined, end_s)


def job_learner_tokens(sizes: np.ndarray, prompt_len: np.ndarray, work: np.ndarray, lc: LearnerCosts) -> np.ndarray:
    """(J,) tokens the learner processes per job: predicted response tokens + every sequence's prompt (the
    job's prompt_len plus the `prompt_tokens` the jobs do not carry)."""
    return work + sizes * (prompt_len + lc.prompt_tokens)


def whole_step_tail(release_s: np.ndarray, arrive_s: np.ndarray, work_ds: np.ndarray,
                    devices_per_actor: float | np.ndarray, budget: float, lc: LearnerCosts,
                    block_devices: float | None = None, warm_spare: int = 0,
                    after_ds: float = 0.0) -> tuple[float, list[Invocation]]:
    """The scaler's whole step after decode: (step seconds, the learner's and prefill's invocations to bill).

    release_s: (A,) each active decode actor's release (seconds from the step's start); devices_per_actor: the
    devices each holds (a scalar, or (A,) when one runs wider); arrive_s, work_ds: (G,) when each group's learner
    work arrives (its predicted finish) and its device-seconds; block_devices: devices per spare learner block
    (default: devices_per_actor, a scalar); warm_spare: spare blocks that are hybrid functions kept warm from the
    last step's learner (`learner_blocks`); after_ds: device-seconds that arrive at the rollout's end
    (`LearnerCosts.after_s_per_token`).
    """
    rel = np.asarray(release_s, float)
    rollout_end = float(rel.max()) if len(rel) else lc.prefill_s
    invs = [Invocation("prefill", 0, 0.0, lc.prefill_s, False, lc.prefill_devices)] \
        if lc.prefill_s > 0 and lc.prefill_devices > 0 else []
    if lc.overlap:
        with_pf = lc.prefill_s > 0 and lc.prefill_devices > 0
        held = np.broadcast_to(np.asarray(devices_per_actor, float), rel.shape)
        rels = np.concatenate((rel, [lc.prefill_s])) if with_pf else rel
        devs = np.concatenate((held, [lc.prefill_devices])) if with_pf else held
        spare = max(budget - float(devs.sum()), 0.0)
        first = float(np.min(arrive_s)) if len(arrive_s) else rollout_end
        block = float(devices_per_actor) if block_devices is None else block_devices
        rcold = lc.cold_start_s if lc.release_cold_s is None else lc.release_cold_s
        rcolds = np.concatenate((np.full(len(rel), rcold), [lc.cold_start_s])) if with_pf else rcold
        b = learner_blocks(rels, devs, spare, block, first, lc.cold_start_s, lc.prewarm, rcolds, warm_spare)
        b = prewarm_billed(b, len(rels), lc.prewarm, lc.prewarm_bill_s)
        arrive = np.asarray(arrive_s, float)
        if after_ds > 0:  # the post-rollout work joins before the blocks are sized for it, as the simulator's
            arrive, work_ds = np.append(arrive, rollout_end), np.append(np.asarray(work_ds, float), after_ds)
        w = _Arrivals.of(arrive, work_ds)  # sorted once: the sizing and the drain read the same work
        sized = None
        if lc.size_slack is not None:  # the sizing's search already drained the blocks it keeps
            b, sized = _sized(arrive, work_ds, b, lc.size_slack, arrivals=w)
    else:
        return sequential_tails([rollout_end], work_ds, budget, lc, after_ds)[0]
    if sized is None:
        work_end, joined = _drain(w, b.ready_s, b.devices)  # `learner_drain(arrive, work_ds, ...)`
    else:
        work_end, joined = sized, b.ready_s < sized - 1e-12  # as `_drain` flags them
    end = max(work_end, rollout_end) + lc.update_fixed_s
    return end, invs + learner_billed(b, joined, max(work_end, rollout_end), end, budget, lc)


def sequential_tails(rollout_ends: Sequence[float], work_ds: np.ndarray, budget: float, lc: LearnerCosts,
                     after_ds: float = 0.0) -> list[tuple[float, list[Invocation]]]:
    """`whole_step_tail` without overlap (lc.overlap False) of the same work after each of several rollout ends
    (the scaler's candidates: only the rollout's end differs between them), the work side summed once."""
    invs = [Invocation("prefill", 0, 0.0, lc.prefill_s, False, lc.prefill_devices)] \
        if lc.prefill_s > 0 and lc.prefill_devices > 0 else []
    top = _sequential_top(work_ds, budget, after_ds)
    out = []
    for rollout_end in rollout_ends:
        fast = _sequential_tail(rollout_end, top, budget, lc) if top is not None else None
        if fast is None:
            fast = _sequential_drain(rollout_end, work_ds, budget, lc, after_ds)
        out.append((fast[0], invs + fast[1]))
    return out


def _sequential_drain(rollout_end: float, work_ds: np.ndarray, budget: float, lc: LearnerCosts,
                      after_ds: float) -> tuple[float, list[Invocation]]:
    """The learner's end and invocations without overlap, through the general fluid queue."""
    b = sequential_blocks(rollout_end + (0.0 if lc.prewarm else lc.cold_start_s), budget, lc.cold_start_s)
    b = prewarm_billed(b, 0, lc.prewarm, lc.prewarm_bill_s)
    arrive = np.full(len(work_ds), rollout_end)
    if after_ds > 0:
        arrive, work_ds = np.append(arrive, rollout_end), np.append(np.asarray(work_ds, float), after_ds)
    work_end, joined = learner_drain(arrive, work_ds, b.ready_s, b.devices)
    end = max(work_end, rollout_end) + lc.update_fixed_s
    return end, learner_billed(b, joined, max(work_end, rollout_end), end, budget, lc)


def _sequential_top(work_ds: np.ndarray, budget: float, after_ds: float) -> float | None:
    """The work side of `_sequential_tail`: all the work, summed as `_Arrivals` sums it (None where the general
    path must decide: no work, no device, negative or not finite)."""
    work = np.asarray(work_ds, float)
    if after_ds > 0:
        work = np.append(work, after_ds)
    if len(work) == 0 or not budget > 0 or not float(work.sum()) > 0 or float(work.min()) < 0:
        return None
    top = float(np.cumsum(work[::-1])[-1])  # the work arriving at or after the first arrival, summed as _Arrivals
    return top if top > 0 and np.isfinite(top) else None


def _sequential_tail(rollout_end: float, top: float, budget: float,
                     lc: LearnerCosts) -> tuple[float, list[Invocation]] | None:
    """`whole_step_tail` without overlap in scalars, the same floats: every group arrives at the rollout's end
    on the one block of every device (`sequential_blocks`), so `learner_drain`'s fluid queue reduces to one
    segment, C(t) = t * budget - budget * ready: the work ends where C reaches C(rollout_end) plus all the work
    (`top`: the suffix sum over every arrival, its largest; each rounding is monotone, so the maximum over
    arrivals is this one), never before the rollout's end. The scaler prices every candidate of every step with
    it (as numpy on arrays of one block it was most of the sweep). Returns (end, the learner's invocations), or
    None where the general path must decide (a ready time that is not finite)."""
    ready = rollout_end + (0.0 if lc.prewarm else lc.cold_start_s)
    if not np.isfinite(ready):
        return None
    budget = float(budget)
    offset = budget * ready
    at_arrival = rollout_end * budget - offset if rollout_end >= ready else 0.0  # C(rollout_end)
    work_end = max((at_arrival + top + offset) / budget, rollout_end)
    end = max(work_end, rollout_end) + lc.update_fixed_s
    cold = float(lc.cold_start_s)
    if lc.prewarm and lc.prewarm_bill_s is not None:
        cold = float(np.minimum(cold, lc.prewarm_bill_s))  # `prewarm_billed`
    if not ready < work_end - 1e-12:
        return end, []
    if lc.rank_devices > 0 and lifecycle.share_release(lc.share_go, lc.share_wait, budget, budget, lc.rank_devices):
        one = Blocks(np.array([ready]), np.array([budget]), np.array([cold]))  # `learner_billed`'s cut
        return end, share_invocations(one, np.array([True]), max(work_end, rollout_end), end, lc.rank_devices)
    start = max(ready - cold, 0.0)  # `learner_invocations` at t0 = 0
    return end, [Invocation("learner", 0, 0.0 + start, 0.0 + end, True, budget, min(cold, end - start))]
