"""How the pool records a worker's end: a death of its own (SIGKILL, a crash) is `killed`; a learner rank that
left because a peer died inside the all-reduce (GROUP_BROKEN_EXIT) is not, whichever of the two the driver
notices first (the race that made the serverful SIGKILL test count 4 deaths for 3 kills on a loaded machine)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

from rlhfless.runtime.backend import Handle, LocalBackend
from rlhfless.runtime.pool import Pool
from rlhfless.runtime.records import WorkerRecord, now
from rlhfless.runtime.worker import GROUP_BROKEN_EXIT


def _serve(conn, code: int | None) -> None:
    if code is not None:
        os._exit(code)
    conn.recv()  # blocks until killed


def _pool_with(code: int | None) -> tuple[Pool, Handle]:
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=True)
    p = ctx.Process(target=_serve, args=(theirs, code), daemon=True)
    p.start()
    theirs.close()
    pool = Pool(LocalBackend(start_method="fork"), {}, now(), units=1)
    h = Handle("pool-0", p, ours, (0,), ("decode", "learner"), now())
    pool.handles[h.worker] = h
    pool.records[h.worker] = WorkerRecord(h.worker, h.kinds, 1.0, (0,), 0.0, pid=p.pid)
    return pool, h


def _await_eof(h: Handle) -> None:
    """What the driver sees of a death: its pipe reads EOF (an event, no timing)."""
    try:
        h.conn.recv()
    except EOFError:
        return
    raise AssertionError("the worker sent something")


def test_a_rank_that_left_on_a_broken_all_reduce_is_released_not_killed():
    pool, h = _pool_with(GROUP_BROKEN_EXIT)
    _await_eof(h)
    pool.dead(h)
    rec = pool.records[h.worker]
    assert rec.released_s is not None and not rec.killed and h.worker not in pool.handles


def test_a_sigkilled_worker_and_a_crash_are_killed():
    pool, h = _pool_with(None)
    os.kill(h.pid, signal.SIGKILL)
    _await_eof(h)
    pool.dead(h)
    assert pool.records[h.worker].killed
    pool, h = _pool_with(1)  # an uncaught exception's status
    _await_eof(h)
    pool.dead(h)
    assert pool.records[h.worker].killed
