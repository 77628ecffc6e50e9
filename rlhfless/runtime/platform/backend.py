"""Mechanism: start a worker process, talk to it, notice when it dies, release it. Knows nothing of RL.

`LocalBackend` runs workers as OS processes on this machine. With start_method "forkserver" they fork from a
server process that imported torch, transformers and the engine once (a snapshot-restored cold start: fork +
model load); with "spawn" every worker starts a fresh interpreter and imports everything (a full cold start).
The fork server's own start (the imports, about as long as one spawn) is platform set-up: measured and
reported (`platform_start_s`), not billed to either mode. The Ray backend (`runtime.platform.raybackend`) implements
the same methods.

`start` returns at once and the fork happens on one starter thread, as a platform's start call returns before the
container is up: a step's N functions are all requested, then all awaited, so their cold starts overlap instead of
queueing behind the driver (each fork is a fork-server round trip, 0.05-0.2 s on a loaded 2-core machine). The fork
server still forks one at a time; that remains in each worker's measured cold start (`ready` - spawn), never hidden.
`release` likewise returns once the worker is told to shut down, and its exit is awaited on the same thread, in
order with the forks: a unit released to make room is free (its process gone or killed) before the fork that
takes it, and N releases overlap their exits instead of the driver joining each in turn.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from rlhfless.core.errors import interrupts_held
from rlhfless.runtime import wire
from rlhfless.runtime.devices.worker import local_main, now
from rlhfless.runtime.wire import LEFT, PRELOAD


STOP_GRACE_S = 3.0
"""How long `stop_all` waits for workers to act on SIGTERM before it kills them."""


@dataclass
class Handle:
    """A started worker: its process, the driver's end of its pipe, and what the driver knows of it."""

    worker: str
    process: object
    conn: object
    cores: tuple[int, ...]
    kinds: tuple[str, ...]
    spawned_s: float
    ready_s: float | None = None
    node: str | None = None
    """Where it runs: None here (one machine); the Ray backend's handles carry their node's IP."""
    pending: list[dict] = field(default_factory=list)
    """Messages that arrived while the driver was waiting for something else (kept in order)."""
    left: bool = False
    """It said it is leaving because its learner group broke (`wire.LEFT`): its end is the restart's doing."""
    starting: Future | None = None
    """The fork still under way on the backend's starter thread (done once the process exists); None: started."""

    def up(self) -> bool:
        """Wait until the process exists; False when its start failed (it never ran: a dead worker)."""
        if self.starting is None:
            return True
        return self.starting.exception() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.up() else None

    @property
    def alive(self) -> bool:
        return self.up() and self.process.is_alive()


class WorkerDied(Exception):
    """The worker's process ended without being released (kill -9, a crash, or the pipe closed)."""

    def __init__(self, handle: Handle):
        super().__init__(f"worker {handle.worker} (pid {handle.pid}) died")
        self.handle = handle


@contextmanager
def without_main():
    """Hide the driver's __main__ while a worker starts: multiprocessing would re-run the driver's script (a
    user's script, pytest, a notebook kernel) in every worker, and workers need nothing from it."""
    main = sys.modules.get("__main__")
    had_file, file_, spec = hasattr(main, "__file__"), getattr(main, "__file__", None), getattr(main, "__spec__", None)
    try:
        main.__spec__ = None
        if had_file:
            del main.__file__
        yield
    finally:
        main.__spec__ = spec
        if had_file:
            main.__file__ = file_


def noted(h, msg: dict) -> dict | None:
    """A message as the driver's code sees it: `wire.LEFT` is the backend's business (it marks the handle and
    is consumed); every other message passes through. Both backends read every message through this."""
    if msg.get("op") == LEFT:
        h.left = True
        return None
    return msg


def _closed(h: Handle, most: int = 1000) -> bool:
    """Whether the worker's end of the pipe is closed (EOF after what it had sent, which is read and dropped but
    for `wire.LEFT`: the worker is being recorded as dead). `most` messages at most, for one that still writes."""
    try:
        for _ in range(most):
            if not h.conn.poll():
                return False
            noted(h, wire.recv(h.conn))
    except (EOFError, OSError, ValueError):  # ValueError: a message cut short by the death
        return True
    return False


def _use_forkserver_preload(modules: list[str]) -> None:
    """Make the process's fork server import `modules`. It is one per process and takes its preload list only
    when it starts, so a server already running with another list (an emulated run's, which holds no torch,
    before a real one in the same process, or the reverse) is stopped first and the next start boots the right
    one; otherwise every worker would import what its server lacks at each cold start (seconds of torch import).
    Called between runs only: the old server's workers were released with their run (they die with it)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None and getattr(server, "_preload_modules", None) != \
            list(modules) and hasattr(server, "_stop"):
        server._stop()
    mp.set_forkserver_preload(list(modules))


def _launch(proc, theirs) -> None:
    """The fork, on the starter thread (an interrupt reaches the main thread only, so the hand-over of the new
    worker's file descriptors to the fork server is never cut); the driver's end of the child's pipe closes after."""
    try:
        with without_main():
            proc.start()
    finally:
        theirs.close()


class LocalBackend:
    def __init__(self, start_method: str = "forkserver", preload: list[str] | None = None):
        """preload: the modules the fork server imports once (default `wire.PRELOAD`; `wire.preload(engine)`
        adds vLLM's for rollout.engine=vllm)."""
        self.start_method = start_method
        self.ctx = mp.get_context(start_method)
        self.platform_start_s = 0.0
        self._starter: ThreadPoolExecutor | None = None  # one thread: `without_main` is process-wide state
        if start_method == "forkserver":
            _use_forkserver_preload(PRELOAD if preload is None else preload)

    def boot(self) -> float:
        """Start the fork server now (imports happen once, off the step loop); returns the seconds it took."""
        if self.start_method != "forkserver":
            return 0.0
        t0 = now()
        p = self.ctx.Process(target=os.getpid)
        with without_main(), interrupts_held():
            p.start()
        p.join()
        self.platform_start_s = now() - t0
        return self.platform_start_s

    def start(self, worker: str, kinds: tuple[str, ...], cores: tuple[int, ...], setup: dict) -> Handle:
        """Start a worker: returns at once, the fork runs on the starter thread (module docstring); messages sent
        meanwhile wait in the pipe, and `await_ready` or `poll` sees its `ready`."""
        ours, theirs = self.ctx.Pipe(duplex=True)
        t = now()
        # spawned_t: an emulated device's cold start runs from the request (`runtime.devices.emulated.Clock`)
        payload = json.dumps({**setup, "kinds": list(kinds), "cores": list(cores), "spawned_t": t})
        proc = self.ctx.Process(target=local_main, args=(theirs, payload, os.getpid()), daemon=True,
                                name=f"rlhfless-{worker}")
        return Handle(worker, proc, ours, tuple(cores), tuple(kinds), t,
                      starting=self._starter_pool().submit(_launch, proc, theirs))

    def send(self, h: Handle, msg: dict) -> None:
        try:
            wire.send(h.conn, msg)
        except (BrokenPipeError, OSError):
            raise WorkerDied(h) from None

    def poll(self, handles: list[Handle], timeout: float | None) -> list[tuple[Handle, dict | None]]:
        """Messages from any of `handles` within `timeout` s; (handle, None) marks a worker that died."""
        out = [(h, h.pending.pop(0)) for h in handles if h.pending]
        if out:
            return out
        failed = [(h, None) for h in handles if h.starting is not None and h.starting.done() and not h.up()]
        if failed:
            return failed
        # a process still being forked has no sentinel yet: its pipe is watched (a death after the fork is EOF)
        forked = [h for h in handles if h.starting is None or h.starting.done()]
        by_obj = {}
        for h in handles:
            by_obj[id(h.conn)] = h
        for h in forked:
            by_obj[h.process.sentinel] = h
        ready = wait([h.conn for h in handles] + [h.process.sentinel for h in forked], timeout)
        seen = set()
        for r in ready:
            h = by_obj[id(r)] if not isinstance(r, int) else by_obj[r]
            if h.worker in seen:
                continue
            seen.add(h.worker)
            try:
                while h.conn.poll():
                    msg = noted(h, wire.recv(h.conn))
                    if msg is not None:
                        out.append((h, msg))
            except (EOFError, OSError):
                out.append((h, None))
                continue
            if isinstance(r, int) and not h.process.is_alive():
                out.append((h, None))
        return out

    def release(self, h: Handle, timeout: float = 5.0) -> None:
        """Ask the worker to stop, and return: its exit is awaited on the starter thread (module docstring), which
        kills it if it does not stop within `timeout`."""
        if not h.up():
            h.conn.close()
            return
        try:
            wire.send(h.conn, {"op": "shutdown"})
        except (BrokenPipeError, OSError):
            pass
        h.conn.close()  # the shutdown is in the pipe already; the worker reads it, then sees EOF
        self._starter_pool().submit(self._reap, h, timeout)

    def _reap(self, h: Handle, timeout: float) -> None:
        h.process.join(timeout)
        if h.process.is_alive():
            self.kill(h)

    def _starter_pool(self) -> ThreadPoolExecutor:
        if self._starter is None:
            self._starter = ThreadPoolExecutor(1, thread_name_prefix="rlhfless-start")
        return self._starter

    def stop_all(self, handles: list[Handle], grace_s: float = STOP_GRACE_S) -> None:
        """Stop these workers together: SIGTERM each (a worker's default action: it exits at once, without a
        traceback), wait up to `grace_s` for all of them, then SIGKILL any left (one blocked in C code, e.g. a
        gloo rendezvous, may not act on SIGTERM until it returns)."""
        handles = [h for h in handles if h.up()]
        for h in handles:
            try:
                os.kill(h.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        left = [h for h in handles if h.process.is_alive()]
        if left:
            wait([h.process.sentinel for h in left], grace_s)
        for h in handles:
            self.kill(h)  # reaps it; SIGKILL only reaches one still alive

    def close(self) -> None:
        """The starter thread ends once its forks are done; the fork server ends with the driver."""
        if self._starter is not None:
            self._starter.shutdown(wait=True)
            self._starter = None

    def exit_status(self, h: Handle) -> int | None:
        """The exit status of a worker whose pipe has closed (it is exiting: wait for that, bounded); None for one
        whose pipe is open: it hangs (an invocation over time), and waiting would only stall the driver."""
        if not h.up():
            return None
        if not _closed(h):
            return h.process.exitcode
        h.process.join(5.0)
        return h.process.exitcode

    def kill(self, h: Handle) -> None:
        if not h.up():
            return
        try:
            os.kill(h.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        h.process.join(5.0)
