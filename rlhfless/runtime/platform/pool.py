"""The driver's view of its workers: start (cold or pre-warmed), ready, busy, idle, released, dead.

Every state change is stamped on the worker's `WorkerRecord`, so the meter bills exactly what happened. The pool
is shared by both modes; which workers exist and when they go is the policy's decision
(`rlhfless.runtime.modes.policy`).
"""

from __future__ import annotations

import itertools

from rlhfless.runtime.platform.backend import Handle, LocalBackend, WorkerDied  # RayBackend: the same methods
from rlhfless.runtime.records import WorkerRecord, role
from rlhfless.runtime.records import now
from rlhfless.runtime.wire import GROUP_BROKEN_EXIT


def free_units(units: int, held: list[tuple[int, ...]]) -> list[int]:
    """Units 0..units-1 that none of the live workers' unit tuples `held` contains, lowest first (pure)."""
    taken = {u for hs in held for u in hs}
    return [u for u in range(units) if u not in taken]


def claim_units(free: list[int], n: int) -> tuple[int, ...] | None:
    """The n lowest free units, or None when fewer are free (pure). With runtime.device=cuda a unit is a GPU slot
    (`runtime.devices.gpus.GpuLayout`), so lowest-first spreads functions over the GPUs before doubling any up."""
    return tuple(free[:n]) if len(free) >= n else None


class Pool:
    """Workers by id, their records (times relative to the run's start `t0`), and who is idle since when."""

    def __init__(self, backend: LocalBackend, setup: dict, t0: float, units: int,
                 keep_alive_s: float | None = None, prefix: str = ""):
        self.backend = backend
        self.keep_alive_s = keep_alive_s
        """Idle seconds before an idle worker is released (`expire`); None: never (the serverful pool)."""
        self.expired: list[tuple[float, str]] = []
        """(run-relative instant its keep-alive lapsed, worker) of every worker `expire` released."""
        self.released_early: list[tuple[float, str]] = []
        """(run-relative instant, worker) of every worker released before its keep-alive lapsed because the plan
        had no work for it inside the window (`plan.ranks.release_after_share`)."""
        self.setup = setup
        self.t0 = t0
        self.units = units
        self.handles: dict[str, Handle] = {}
        self.records: dict[str, WorkerRecord] = {}
        self.idle_since: dict[str, float] = {}
        self.working: set[str] = set()
        self.waiting: set[str] = set()  # pre-warmed, not yet invoked: keep-alive starts after a first invocation
        self._ids = itertools.count()
        self.prefix = prefix  # the run segment's (`core.rundir.Segment`): names unique across resumes

    def rel(self, t: float) -> float:
        return t - self.t0

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self, kinds: tuple[str, ...], cores: tuple[int, ...], extra: dict | None = None,
              prewarmed: bool = False) -> Handle:
        wid = f"{self.prefix}{role(kinds)}-{next(self._ids)}"
        h = self.backend.start(wid, kinds, cores, {**self.setup, **(extra or {})})
        self.handles[wid] = h
        # its pid comes with `ready` (reading it here would wait for the fork the backend runs behind `start`)
        self.records[wid] = WorkerRecord(wid, kinds, float(len(cores)), cores, self.rel(h.spawned_s),
                                         prewarmed=prewarmed)
        if prewarmed:
            self.waiting.add(wid)
        return h

    def mark_ready(self, h: Handle, msg: dict) -> None:
        h.ready_s = msg["t"]
        rec = self.records[h.worker]
        rec.ready_s = self.rel(msg["t"])
        rec.pid, rec.node = msg.get("pid", rec.pid), h.node  # a Ray actor's pid and node are known only now
        if h.worker not in self.working:  # a worker sent work before it was ready is busy from the start
            self.idle_since[h.worker] = msg["t"]

    def await_ready(self, hs: list[Handle], on_other=None) -> None:
        """Block until every handle in `hs` said ready; a death raises WorkerDied."""
        waiting = {h.worker for h in hs if h.ready_s is None}
        while waiting:
            for h, msg in self.backend.poll([self.handles[w] for w in waiting], None):
                if msg is None:
                    raise WorkerDied(h)
                if msg["op"] == "ready":
                    self.mark_ready(h, msg)
                    waiting.discard(h.worker)
                elif on_other is not None:
                    on_other(h, msg)
                else:
                    h.pending.append(msg)

    def busy(self, h: Handle) -> None:
        self.waiting.discard(h.worker)
        self.working.add(h.worker)
        self.idle_since.pop(h.worker, None)

    def unwait(self, h: Handle) -> None:
        """A pre-warmed worker offered no work now: its keep-alive starts (it is idle from now on)."""
        if h.worker in self.waiting:
            self.waiting.discard(h.worker)
            if h.worker not in self.working:
                self.idle_since[h.worker] = now()

    def idle(self, h: Handle) -> None:
        self.working.discard(h.worker)
        self.idle_since[h.worker] = now()

    def release(self, h: Handle, early: bool = False, reason: str = "other") -> None:
        """Release a live worker now, recording why (`records.RELEASE_REASONS`); `early`: an idle learner rank the
        plan lets go at its share, before its keep-alive lapses (reason "share")."""
        if h.worker not in self.handles:
            return
        self.backend.release(h)
        self._gone(h, killed=False, reason="share" if early else reason)
        if early:
            self.released_early.append((self.rel(now()), h.worker))

    def stop(self, h: Handle) -> None:
        """End a live worker at once, without the graceful `shutdown` (its current work is being discarded: a
        busy decode reads `shutdown` only after its decode, a rank inside a broken all-reduce not at all).
        Recorded as released, not killed: the runtime chose to end it."""
        if h.worker in self.handles:
            self.backend.kill(h)
            self.records[h.worker].stopped = True
            self._gone(h, killed=False, reason="stopped")

    def dead(self, h: Handle) -> None:
        """Record a worker that died (its held time until now stays billed). A learner rank that left because a
        peer died inside the all-reduce is recorded as released: the peer's death is the one to count, and which
        of the two the driver notices first is a race. Such a rank says so on its pipe (`wire.LEFT`, read into
        `h.left`, by `exit_status` at the latest); its exit status (GROUP_BROKEN_EXIT) is the fallback."""
        if h.worker in self.handles:
            status = None if h.left else self.backend.exit_status(h)  # reads what it sent last, LEFT included
            left = h.left or status == GROUP_BROKEN_EXIT
            self.backend.kill(h)  # reap it (it is already gone, or hung)
            self._gone(h, killed=not left, reason="left" if left else "killed")

    def _gone(self, h: Handle, killed: bool, reason: str, at: float | None = None) -> None:
        rec = self.records[h.worker]
        rec.released_s, rec.killed = self.rel(now() if at is None else at), killed
        rec.release_reason = reason  # the decision itself, so readers of workers.jsonl never infer it from times
        if not rec.pid and getattr(h, "starting", None) is not None:  # gone before its `ready`
            rec.pid = h.pid or 0
        self.handles.pop(h.worker, None)
        self.idle_since.pop(h.worker, None)
        self.working.discard(h.worker)
        self.waiting.discard(h.worker)
        try:
            if h.conn is not None:  # a Ray actor released before it connected has none
                h.conn.close()
        except OSError:
            pass

    def lapses(self) -> list[tuple[float, Handle]]:
        """(instant its keep-alive lapses, handle) of every idle worker that may be released (ready, invoked at
        least once: a pre-warmed worker's keep-alive starts after its first invocation), soonest first."""
        if self.keep_alive_s is None:
            return []
        out = []
        for wid, since in self.idle_since.items():
            h = self.handles.get(wid)
            if h is not None and h.ready_s is not None and wid not in self.waiting and wid not in self.working:
                out.append((since + self.keep_alive_s, h))
        return sorted(out, key=lambda x: x[0])

    def next_lapse(self) -> float | None:
        """The soonest instant (clock of `now()`) an idle worker's keep-alive lapses; None if none is idle."""
        ls = self.lapses()
        return ls[0][0] if ls else None

    def expire(self) -> list[str]:
        """Release every idle worker whose keep-alive has lapsed: scale to zero. Keep-alive is an event: the
        worker is recorded as released at the instant its keep-alive lapsed, as a platform releases it on its own
        clock, even when the driver notices later (it was busy elsewhere: planning, logging); callers poll with
        timeouts capped at `next_lapse`, so inside a stage the process ends at that instant too. Returns the ids."""
        t, out = now(), []
        for lapse, h in self.lapses():
            if lapse > t:
                break
            self.backend.release(h)
            self._gone(h, killed=False, reason="lapse", at=min(t, lapse))
            self.expired.append((self.rel(lapse), h.worker))
            out.append(h.worker)
        return out

    def warm_idle(self, kinds: tuple[str, ...]) -> list[Handle]:
        """Ready, idle workers of exactly these kinds that may take work now (kept alive, or pre-warmed and not
        invoked yet), the most recently idle first (the likeliest to hold the latest weights)."""
        hs = [h for h in self.warm(kinds) if h.ready_s is not None and h.worker in self.idle_since
              and h.worker not in self.working]
        return sorted(hs, key=lambda h: -self.idle_since[h.worker])

    def warm(self, kinds: tuple[str, ...]) -> list[Handle]:
        """Live workers of exactly these kinds (ready or still starting), idle ones first."""
        self.expire()
        hs = [h for h in self.handles.values() if h.kinds == kinds]
        return sorted(hs, key=lambda h: (h.worker not in self.idle_since, h.worker))

    # -- units: a budget, never a hint -------------------------------------------------------------------------
    def free_cores(self) -> list[int]:
        """Units no live worker holds (a worker holds its units from its start to its release or death)."""
        self.expire()
        return free_units(self.units, [h.cores for h in self.handles.values()])

    def claim(self, n: int = 1) -> tuple[int, ...] | None:
        """n free units for a new worker, or None: callers start nothing rather than share a unit."""
        return claim_units(self.free_cores(), n)

    def make_room(self, n: int) -> bool:
        """Release idle workers (kept-alive first, longest idle first, then pre-warmed ones not yet invoked) until
        n units are free, as a platform evicts idle capacity; False when the busy ones hold too many."""
        idle = sorted(self.idle_since, key=lambda w: (w in self.waiting, self.idle_since[w]))
        idle += [w for w in self.waiting if w not in self.idle_since]
        while len(self.free_cores()) < n and idle:
            h = self.handles.get(idle.pop(0))
            if h is not None and h.worker not in self.working:
                self.release(h, reason="evicted")
        return len(self.free_cores()) >= n

    def held_units(self) -> int:
        return sum(len(h.cores) for h in self.handles.values())

    def stop_all(self) -> None:
        """Stop every live worker together (`backend.stop_all`: SIGTERM, a short grace, SIGKILL), recorded as
        released: the driver is shutting down on an interrupt, and a busy worker would read `shutdown` only once
        its invocation ends."""
        hs = list(self.handles.values())
        self.backend.stop_all(hs)
        for h in hs:
            self._gone(h, killed=False, reason="stopped")

    def release_all(self) -> None:
        for h in list(self.handles.values()):
            self.release(h, reason="end")

    def live(self) -> list[Handle]:
        return list(self.handles.values())
