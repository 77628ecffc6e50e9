"""Cut-and-migrate: move an actor's stragglers elsewhere once most of its sequences are done.

`plan_migrations(progress, tau)` is the pure decision the runtime and the simulator share;
`simulate_with_migration(plan, time_model, tau, true_jobs)` plays a plan with it on one decode clock, so the
scaler and the simulator can quantify migration. The rule it keeps: an actor with a finished fraction >= tau is
cut only if ALL its unfinished sequences fit in the free slots of actors below tau, and then releases at once;
they go longest remaining first, each to the destination predicted free earliest; finished actors are never
destinations, so nothing ping-pongs. The rule in full and the KV stall: docs/internals.md#planmigratepy.

Deviations from the paper:
1. The paper cuts at tau (about 0.7) and moves stragglers to actors with free slots; the atomic-source rule, the
   earliest-free destination and the KV-stall model are ours (the paper's are not published).
2. Cuts are kept in a plan only where the time model says they help the objective (`plan.scaler`).

Which simulation runs (`kernel()`): the compiled kernel (`plan.migrate_kernel`, numba) where `plan.jit.on()` (numba
imports, can cache the compiled code, RLHFLESS_JIT is not 0 and no vLLM is installed), else the pure-Python one here
(`_play_python`), the same results bit for bit.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import accumulate, chain
from operator import attrgetter, itemgetter
from types import ModuleType

import numpy as np

from rlhfless.core import metrics as M
from rlhfless.core.errors import ConfigError
from rlhfless.plan import jit
from rlhfless.plan.records import (
    ActorProgress,
    AssignmentPlan,
    Migration,
    MigrationPlan,
    MigrationResult,
    PlanJob,
    SeqProgress,
)
from rlhfless.plan.timemodel import TimeModel, warm_kernel as warm_events


_PREDICTED_REMAINING = attrgetter("predicted_remaining")


def _check_tau(tau: float) -> None:
    if not (isinstance(tau, (int, float)) and 0.0 < tau <= 1.0):
        raise ConfigError(f"plan.tau: the finished fraction that triggers a cut must lie in (0, 1] (got {tau!r})")


def plan_migrations(progress: Sequence[ActorProgress], tau: float) -> tuple[MigrationPlan, dict[str, float]]:
    """Decide which unfinished sequences move where (rule in the module header). Pure; returns (plan, metrics).

    The runtime passes `ActorProgress`; the simulation decides with `_decide`, the same rule on its own actors
    with integer sids (tests/test_plan_migrate.py holds the two equal)."""
    _check_tau(tau)
    free = {p.actor_id: p.free_slots for p in progress
            if p.n_unfinished and p.finished_fraction < tau and p.free_slots > 0}
    sources = sorted((p for p in progress if p.n_unfinished and p.finished_fraction >= tau),
                     key=lambda p: (p.n_unfinished, p.actor_id))
    moves: list[Migration] = []
    released: list[int] = []
    tokens = 0.0
    # destinations keyed (predicted free at, -free slots, id), the least first: a move only raises its
    # destination's key, so a heap pops the same `min` a scan of every destination would
    dests = [(p.max_remaining, -free[p.actor_id], p.actor_id) for p in progress if p.actor_id in free]
    heapq.heapify(dests)
    n_free = sum(free.values())
    for src in sources:
        # all or nothing: a partial cut would not let the source release, so it would save nothing
        if src.n_unfinished > n_free:
            continue
        # longest first; reverse keeps equal lengths in their listed order, as the negated key did
        for seq in sorted(src.unfinished, key=_PREDICTED_REMAINING, reverse=True):
            # earliest free, not most free slots: that piled stragglers onto the long-sequence actors
            avail, neg_free, dst = heapq.heappop(dests)
            if neg_free < -1:  # still a free slot after this one
                heapq.heappush(dests, (max(avail, seq.predicted_remaining), neg_free + 1, dst))
            n_free -= 1
            moves.append(Migration(seq.seq_id, src.actor_id, dst))
            tokens += seq.prompt_len + seq.generated
        released.append(src.actor_id)
    mp = MigrationPlan(moves=tuple(moves), released=tuple(released))
    return mp, {M.BAL_MIGRATIONS: float(len(moves)), M.BAL_MIGRATED_TOKENS: tokens,
                M.BAL_RELEASED_ACTORS: float(len(released))}


class _Seqs:
    """Per-sequence facts of a simulation, indexed by an integer sid (job-major, in the plan's order); a
    sequence's id (`<group>/<k>`, as in the moves) is built only for the result (`name`): the decisions and
    moves inside the simulation carry sids, and per-job facts are found by bisection (`job`)."""

    def __init__(self) -> None:
        self.group: list[str] = []  # per job: its group id
        self.first: list[int] = []  # per job: its first sid
        self.plen: list[int] = []  # per job: its prompt tokens
        self.true: list[float] = []
        self.pred: list[float] = []
        self.start_it: list[float] = []  # actor iteration counter value at which the seq had 0 tokens

    def job(self, sid: int) -> int:
        return bisect_right(self.first, sid) - 1

    def name(self, sid: int) -> str:
        j = self.job(sid)
        return f"{self.group[j]}/{sid - self.first[j]}"


class _Actor:
    """Decode state of one simulated actor on the decode clock.

    `it` counts iterations this actor has run (fractional between events); a running seq is stored as
    (iteration at which it finishes, sid) in a heap, so advancing the clock is O(1) and an event O(log n).
    """

    __slots__ = ("aid", "it", "t", "heap", "queue", "finished", "total", "end")  # read at every event

    def __init__(self, aid: int) -> None:
        self.aid = aid
        self.it = 0.0
        self.t = 0.0
        self.heap: list[tuple[float, int]] = []
        self.queue: deque[Sequence[int]] = deque()  # jobs (ranges of sids), admitted FIFO and together
        self.finished = 0
        self.total = 0
        self.end: float | None = None

    def admit(self, capacity: int, seqs: _Seqs) -> None:
        queue, heap = self.queue, self.heap
        if not queue or len(queue[0]) > capacity - len(heap):
            return
        # locals: this runs for every job admitted in every simulated step (the same pushes in the same order:
        # the heap's layout orders equal remainders in a cut)
        it, start, true, push = self.it, seqs.start_it, seqs.true, heapq.heappush
        while queue and len(queue[0]) <= capacity - len(heap):
            for sid in queue.popleft():
                start[sid] = it
                push(heap, (it + true[sid], sid))

    def advance(self, t: float, f: list[float]) -> None:
        """Move the clock to t (no event of this actor lies in between, so its batch is constant)."""
        if t > self.t:
            if self.heap:
                self.it += (t - self.t) / f[len(self.heap)]
            self.t = t

    def next_event(self, f: list[float]) -> float:
        if self.end is not None or not self.heap:
            return np.inf
        return self.t + max(self.heap[0][0] - self.it, 0.0) * f[len(self.heap)]


Cut = tuple[int, int, int]
"""One move inside the simulation: (sid, source actor, destination actor); a `Migration` (named) only in the
result, so a cut decided and applied builds no string and no record per sequence."""

_FIRST = itemgetter(0)


def _max_remaining(act: _Actor, seqs: _Seqs) -> float | None:
    """`ActorProgress.max_remaining` of a simulated actor: the largest predicted remaining of its running
    sequences (the largest raised to 1, as each one is listed by `_unfinished`) and of its queued ones."""
    it, start, pred = act.it, seqs.start_it, seqs.pred
    heap, queue = act.heap, act.queue
    # lists, not generators, into max: the same values, read at every cut check for every destination
    run = max([pred[sid] - (it - start[sid]) for _, sid in heap]) if heap else None
    queued = [pred[s] for job in queue for s in job]
    queued = max(queued) if queued else None
    if run is None:
        return queued
    run = run if run > 1.0 else 1.0
    return run if queued is None else max(run, queued)


def _unfinished(act: _Actor, seqs: _Seqs) -> list[tuple[float, int]]:
    """(predicted remaining, sid) of an actor's unfinished sequences, listed as `ActorProgress.unfinished` lists
    them: the running ones in heap order (remaining raised to 1 token), then the queued ones (their prediction)."""
    it, start, pred = act.it, seqs.start_it, seqs.pred
    out = []
    for _, sid in act.heap:
        r = pred[sid] - (it - start[sid])
        out.append((r if r > 1.0 else 1.0, sid))
    out.extend([(pred[s], s) for job in act.queue for s in job])
    return out


def _decide(cand: list[_Actor], tau: float, capacity: int, seqs: _Seqs) -> tuple[list[Cut], list[int]]:
    """`plan_migrations` on the simulation's own actors, with sids: the same rule, the same moves in the same
    order (tests/test_plan_migrate.py checks it against `plan_migrations`), without a `SeqProgress` per
    unfinished sequence or a `Migration` per move (building them was most of a cut check's time). Only a
    source that is cut lists its sequences; only a destination needs its longest remaining."""
    dests, sources, n_free = [], [], 0
    for b in cand:
        n_unf = len(b.heap) + sum(map(len, b.queue))
        if not n_unf:
            continue
        free = capacity - len(b.heap)
        if b.finished / (b.finished + n_unf) >= tau:
            sources.append((n_unf, b.aid, b))
        elif free > 0:
            # destinations keyed (predicted free at, -free slots, id), the least first (`plan_migrations`)
            dests.append((_max_remaining(b, seqs), -free, b.aid))
            n_free += free
    heapq.heapify(dests)
    sources.sort(key=itemgetter(0, 1))
    cuts: list[Cut] = []
    released: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    for n_unf, src, b in sources:
        if n_unf > n_free:  # all or nothing (`plan_migrations`)
            continue
        # longest first; a stable sort keeps equal lengths in their listed order, as `plan_migrations` does
        for rem, sid in sorted(_unfinished(b, seqs), key=_FIRST, reverse=True):
            avail, neg_free, dst = pop(dests)
            if neg_free < -1:
                push(dests, (max(avail, rem), neg_free + 1, dst))
            cuts.append((sid, src, dst))
        n_free -= n_unf
        released.append(src)
    return cuts, released


def _load(plan: AssignmentPlan, true_jobs: Sequence[PlanJob] | None) -> tuple[list[_Actor], _Seqs]:
    seqs, actors = _Seqs(), []
    # whole lists at once: this runs for every sequence of every simulated step and candidate
    flat = [j for jobs in plan.actor_jobs for j in jobs]
    sizes = [j.n_seqs for j in flat]
    seqs.group = [j.group_id for j in flat]
    seqs.plen = [j.prompt_len for j in flat]
    seqs.first = firsts = list(accumulate(sizes, initial=0))[:-1]
    seqs.pred = list(chain.from_iterable([j.lengths() for j in flat]))
    if true_jobs:
        truth = {j.group_id: j for j in true_jobs}
        seqs.true = list(chain.from_iterable([truth[g].lengths() for g in seqs.group]))
    else:
        seqs.true = seqs.pred  # read only
    k, true, push, cap = 0, seqs.true, heapq.heappush, plan.capacity
    for a, jobs in enumerate(plan.actor_jobs):
        act = _Actor(a)
        # a job's sids are a range (read as a list is: iterated, measured); built once, never copied
        act.queue.extend([range(firsts[i], firsts[i] + sizes[i]) for i in range(k, k + len(jobs))])
        act.total = sum(sizes[k:k + len(jobs)])
        k += len(jobs)
        actors.append(act)
        # `_Actor.admit` at iteration 0, the same pushes in the same order: a prefix of the queue (one range of
        # sids), each at 0.0 + its length (= its length) and its start already 0.0
        queue, room, end = act.queue, cap, None
        while queue and len(queue[0]) <= room:
            room -= len(queue[0])
            end = queue.popleft().stop
        if end is not None:
            heap, lo = act.heap, firsts[k - len(jobs)]
            for x in zip(true[lo:end], range(lo, end)):
                push(heap, x)
    seqs.start_it = [0.0] * len(seqs.true)
    return actors, seqs


def _apply(cuts: list[Cut], released: list[int], actors: list[_Actor], t: float, tm: TimeModel,
           seqs: _Seqs) -> None:
    """Move sequences (running or queued); each destination stalls for the KV transfer. A cut moves every
    unfinished sequence of its source (all or nothing, `_decide`), so a source is left with none: its heap and
    queue are emptied whole, not filtered. Every destination is live and `play_with_migration` moved every live
    actor's clock to t before deciding, so none is advanced here (`_Actor.advance(t)` would do nothing)."""
    sources = [actors[a] for a in released]
    finish_of = {sid: fi for act in sources for fi, sid in act.heap}
    start, true, plen, job_of, push = seqs.start_it, seqs.true, seqs.plen, seqs.job, heapq.heappush
    kv = tm.kv_transfer_s_per_token
    for sid, s, d in cuts:
        src, dst = actors[s], actors[d]
        finish = finish_of.get(sid)
        gen = src.it - start[sid] if finish is not None else 0.0
        rem = finish - src.it if finish is not None else true[sid]
        start[sid] = dst.it - gen
        push(dst.heap, (dst.it + rem, sid))
        dst.total += 1
        dst.t += kv * (plen[job_of(sid)] + gen)  # the destination stalls for the KV
    for act in sources:
        act.heap, act.queue, act.end = [], deque(), t


def _room(actors: list[_Actor], tau: float, capacity: int, a: int) -> bool:
    """Cheap pre-check: could destinations take all of actor a's unfinished sequences now?"""
    need = actors[a].total - actors[a].finished
    # a list, not a generator, into sum: this runs at every event of an actor at or above tau
    free = sum([capacity - len(b.heap) for b in actors
                if b.aid != a and b.end is None and b.heap and b.finished / b.total < tau])
    return free >= need


def simulate_with_migration(plan: AssignmentPlan, time_model: TimeModel, tau: float,
                            true_jobs: Sequence[PlanJob] | None = None) -> tuple[MigrationResult, dict[str, float]]:
    """Simulate `plan` with cut-and-migrate at `tau`; decisions use the plan's predicted lengths, execution uses
    `true_jobs` (matched by group_id; None = the predictions are the truth). Returns (result, metrics)."""
    return play_with_migration(plan, time_model, tau, true_jobs).named()


class Played:
    """A plan played with cuts (`play_with_migration`): each actor's busy seconds and the number of moves, and
    the named result (`simulate_with_migration`'s, a `Migration` per move) only when asked: most callers (the
    scaler's outcome draws, a cut row it declines) read only busy seconds and the count.

    ends[a]: actor a's end of decode (`end or 0.0`); finished[a]: its finished sequences; cuts: (sid, source,
    destination) in order (the kernel's as an (M, 3) array: listing its rows cost more than playing them);
    seqs: names the sids (`_Seqs.name`)."""

    def __init__(self, plan: AssignmentPlan, tm: TimeModel, ends: list[float], finished: list[int], seqs: _Seqs,
                 cuts: Sequence[Sequence[int]], released: list[int]) -> None:
        self.busy_s = _busy(plan, ends, tm)
        self.n_moves = len(cuts)
        self._state = (plan, tm, ends, finished, seqs, cuts, released)

    def named(self) -> tuple[MigrationResult, dict[str, float]]:
        plan, tm, ends, finished, seqs, cuts, released = self._state
        name = seqs.name
        if isinstance(cuts, np.ndarray):  # the kernel's (M, 3) rows: Python ints in the records, as built here
            cuts = cuts.tolist()
        return _named_result(plan, ends, finished, tm, [Migration(name(sid), a, b) for sid, a, b in cuts], released)

    def metrics(self) -> dict[str, float]:
        """`simulate_with_migration`'s metrics (balancer/*), no move named."""
        return _metrics(self.busy_s, self.n_moves, len(self._state[-1]))


_UNSET = object()
_KERNEL: ModuleType | None | object = _UNSET


def kernel() -> ModuleType | None:
    """The compiled simulation (`plan.migrate_kernel`), or None where the pure-Python one runs: RLHFLESS_JIT=0,
    numba missing (the GPU image has none), or no folder to cache the compiled code in (compiling it in every
    process costs more than it saves). Decided once per process; numba is imported here, not at import."""
    global _KERNEL
    if _KERNEL is _UNSET:
        _KERNEL = None
        if jit.on():  # the one switch for every compiled kernel
            from rlhfless.plan import migrate_kernel
            _KERNEL = migrate_kernel if migrate_kernel.CACHED else None
    return _KERNEL  # type: ignore[return-value]


def warm_kernel() -> None:
    """Import numba and load (or compile) the kernels now where they run (this one and `timemodel`'s event sums):
    before a fork, so that the forked processes share them instead of each loading or compiling them
    (`sim.scenario.play_policies`)."""
    k = kernel()
    if k is not None:
        k.warm()
    warm_events()


def play_with_migration(plan: AssignmentPlan, time_model: TimeModel, tau: float,
                        true_jobs: Sequence[PlanJob] | None = None, arrays: PlanArrays | None = None,
                        true_len: np.ndarray | None = None) -> Played:
    """`simulate_with_migration`, its moves named only on request (`Played.named`); compiled or pure Python
    (`kernel()`), the same results. For a caller that plays one plan several times (`plan.scaler`: on the
    predictions and on each draw), the kernel's inputs built once: `arrays` = `PlanArrays(plan, time_model)`,
    `true_len` = (S,) float64 the true_jobs' lengths in the plan's order (a group's last job, as matched here;
    `JobArrays.take_seqs`' seq_len); the pure-Python simulation reads the records themselves."""
    _check_tau(tau)
    k = kernel()
    if k is None:
        return _play_python(plan, time_model, tau, true_jobs)
    return _play_kernel(k, plan, time_model, tau, true_jobs, arrays, true_len)


class PlanArrays:
    """A plan's kernel inputs that do not depend on the outcome played (`migrate_kernel.play`'s pred, first,
    plen, job_off and f; seqs names the sids). Read only: shared by every play of the plan. `pred`: the
    plan's predicted lengths in its order where the caller holds them (`JobArrays.seq_len`), else read here."""

    __slots__ = ("seqs", "pred", "first", "plen", "job_off", "f")

    def __init__(self, plan: AssignmentPlan, time_model: TimeModel, pred: np.ndarray | None = None) -> None:
        flat = [j for jobs in plan.actor_jobs for j in jobs]
        self.seqs = _Seqs()
        self.seqs.group = [j.group_id for j in flat]
        firsts = list(accumulate([j.n_seqs for j in flat], initial=0))
        self.seqs.first = firsts[:-1]
        self.first = np.array(firsts, np.int64)
        if pred is None:
            pred = np.fromiter(chain.from_iterable([_lengths(j) for j in flat]), np.float64, firsts[-1])
        self.pred = pred
        self.plen = np.array([j.prompt_len for j in flat], np.int64)
        self.job_off = np.array(list(accumulate(map(len, plan.actor_jobs), initial=0)), np.int64)
        self.f = np.asarray(time_model.iter_seconds_at(np.arange(plan.capacity + 1)), np.float64)



def _play_kernel(k: ModuleType, plan: AssignmentPlan, time_model: TimeModel, tau: float,
                 true_jobs: Sequence[PlanJob] | None, arrays: PlanArrays | None = None,
                 true_len: np.ndarray | None = None) -> Played:
    """The plan as the kernel's flat arrays (`migrate_kernel.play`; `arrays`, `true_len`: built by the caller,
    as in `play_with_migration`), played there."""
    a = arrays if arrays is not None else PlanArrays(plan, time_model)
    if not true_jobs:
        true = a.pred
    elif true_len is not None:
        true = true_len
    else:
        truth = {j.group_id: j for j in true_jobs}
        true = np.fromiter(chain.from_iterable([_lengths(truth[g]) for g in a.seqs.group]), np.float64)
    moves, released, end, finished = k.play(a.pred, true, a.first, a.plen, a.job_off, a.f, float(tau),
                                            int(plan.capacity), float(time_model.kv_transfer_s_per_token))
    return Played(plan, time_model, end.tolist(), finished.tolist(), a.seqs, moves, released.tolist())


def _lengths(job: PlanJob) -> Sequence[float]:
    """`PlanJob.lengths()` without its per-value `float`: `np.fromiter(..., float64)` converts each value as
    `float` does (a tuple of floats, the usual case, is passed as it is)."""
    lens = job.predicted_len
    return lens if type(lens) is tuple else (lens,) * job.n_seqs


def _play_python(plan: AssignmentPlan, time_model: TimeModel, tau: float,
                 true_jobs: Sequence[PlanJob] | None = None) -> Played:
    """`play_with_migration` in pure Python: the reference the kernel is held to, and where numba is missing."""
    f = time_model.iter_seconds_at(np.arange(plan.capacity + 1)).tolist()
    actors, seqs = _load(plan, true_jobs)
    moves: list[Cut] = []
    released: list[int] = []
    nxt = [a.next_event(f) for a in actors] or [np.inf]
    pop, inf, cap = heapq.heappop, np.inf, plan.capacity
    while (t := min(nxt)) < inf:
        a = nxt.index(t)
        act = actors[a]
        heap = act.heap
        if t > act.t:  # `_Actor.advance`, inlined: this loop runs once per event of every simulated step
            if heap:
                act.it += (t - act.t) / f[len(heap)]
            act.t = t
        done, n_done = act.it + 1e-9, 0
        while heap and heap[0][0] <= done:
            pop(heap)
            n_done += 1
        act.finished += n_done
        if act.queue:
            act.admit(cap, seqs)
        elif not heap:
            act.end = t
            nxt[a] = inf
            continue
        if act.finished / act.total >= tau and _room(actors, tau, cap, a):
            live = [b for b in actors if b.end is None and (b.heap or b.queue)]
            for b in live:
                b.advance(t, f)
            # the decision reads only sources (at or above tau) and destinations (free slots): actors that are
            # neither (below tau and full, e.g. still queueing) need no per-sequence progress
            cand = [b for b in live if b.finished / b.total >= tau or len(b.heap) < plan.capacity]
            cuts, cut_free = _decide(cand, tau, cap, seqs)
            if cuts:
                _apply(cuts, cut_free, actors, t, time_model, seqs)
                moves.extend(cuts)
                released.extend(cut_free)
                for b in live:
                    nxt[b.aid] = b.next_event(f)
        heap = act.heap  # `_Actor.next_event`, inlined (a cut replaces the heap and may release this actor)
        if act.end is not None or not heap:
            nxt[a] = inf
        else:
            wait = heap[0][0] - act.it
            nxt[a] = act.t + (wait if wait > 0.0 else 0.0) * f[len(heap)]
    return Played(plan, time_model, [a.end or 0.0 for a in actors], [a.finished for a in actors], seqs,
                  moves, released)




def _busy(plan: AssignmentPlan, ends: list[float], tm: TimeModel) -> list[float]:
    busy = []
    for end, jobs in zip(ends, plan.actor_jobs):
        # prefill and fixed overhead are added after the decode simulation, as in the plan
        prefill = sum(j.prompt_len for j in jobs) * tm.prefill_s_per_token
        busy.append(tm.actor_fixed_s + prefill + end if jobs else 0.0)
    return busy


def _result(plan: AssignmentPlan, actors: list[_Actor], tm: TimeModel, moves: list[Migration],
            released: list[int]) -> tuple[MigrationResult, dict[str, float]]:
    """The named result of simulated actors (tests/test_sim_exact.py's reference simulation builds it so)."""
    return _named_result(plan, [a.end or 0.0 for a in actors], [a.finished for a in actors], tm, moves, released)


def _named_result(plan: AssignmentPlan, ends: list[float], finished: list[int], tm: TimeModel,
                  moves: list[Migration], released: list[int]) -> tuple[MigrationResult, dict[str, float]]:
    busy = _busy(plan, ends, tm)
    metrics = _metrics(busy, len(moves), len(released))
    res = MigrationResult(tuple(busy), metrics[M.BAL_MAKESPAN_S], metrics[M.BAL_IDLE_DEVICE_S], tuple(moves),
                          tuple(released), tuple(finished))
    return res, metrics


def _metrics(busy: list[float], n_moves: int, n_released: int) -> dict[str, float]:
    makespan = max(busy) if busy else 0.0
    mean = sum(busy) / len(busy) if busy else 0.0
    return {M.BAL_MIGRATIONS: float(n_moves), M.BAL_RELEASED_ACTORS: float(n_released), M.BAL_MAKESPAN_S: makespan,
            M.BAL_IDLE_DEVICE_S: float(sum(makespan - b for b in busy)),
            M.BAL_IMBALANCE: makespan / mean if mean > 0 else 1.0}
