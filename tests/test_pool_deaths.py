"""How the pool records a worker's end: a death of its own (SIGKILL, a crash) is `killed`; a learner rank that
left because a peer died inside the all-reduce (GROUP_BROKEN_EXIT) is not, whichever of the two the driver
notices first (the race that made the serverful SIGKILL test count 4 deaths for 3 kills on a loaded machine)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

import pytest

from rlhfless.runtime.platform.backend import Handle, LocalBackend
from rlhfless.runtime.platform.pool import Pool
from rlhfless.runtime.records import WorkerRecord, now
from rlhfless.runtime import wire
from rlhfless.runtime.devices.worker import leave_broken_group
from rlhfless.runtime.wire import GROUP_BROKEN_EXIT, LEFT


def _serve(conn, code: int | None) -> None:
    if code is not None:
        os._exit(code)
    conn.recv()  # blocks until killed


def _leave_and_linger(conn) -> None:
    """A rank whose all-reduce broke, on a loaded machine: it says `LEFT`, its pipe closes, and its process is
    still finishing (interpreter and gloo teardown) when the driver looks at it."""
    wire.send(conn, {"op": LEFT, "why": "group_broken", "step": 3})
    conn.close()
    threading.Event().wait()  # never set: it exits only when killed


def _pool_with(code: int | None, target=None) -> tuple[Pool, Handle]:
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=True)
    p = ctx.Process(target=target or _serve, args=(theirs,) if target else (theirs, code), daemon=True)
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
    assert rec.release_reason == "left"  # workers.jsonl says why, beside the flag


def test_a_rank_that_said_it_left_is_released_while_its_process_still_exits():
    """CI's 4-deaths-for-3-kills: the survivor's pipe closed before its process had exited, the driver's bounded
    wait for the exit status expired, and the rank was counted as a death of its own. Its `LEFT` message, read
    in order before the EOF, decides, with no wait for the process."""
    pool, h = _pool_with(None, _leave_and_linger)
    got = []
    while not got:  # LEFT is consumed by the backend (a poll may return nothing but it); then the EOF
        got = pool.backend.poll([h], None)
    assert got == [(h, None)]
    assert h.left and h.process.is_alive()
    t0 = now()
    pool.dead(h)
    assert not pool.records[h.worker].killed and not h.process.is_alive()
    assert now() - t0 < 4.5, "the driver waited (5 s) for the exit status of a rank that had said why it left"


def test_a_left_message_still_unread_when_the_driver_declares_the_rank_dead_is_read_then():
    """The restart reaps a survivor the driver had not polled: `exit_status` reads what it sent last."""
    pool, h = _pool_with(None, _leave_and_linger)
    _ = h.conn.poll(None)  # its LEFT has arrived (an event), unread
    pool.dead(h)
    assert h.left and not pool.records[h.worker].killed


def test_a_sigkilled_worker_and_a_crash_are_killed():
    pool, h = _pool_with(None)
    os.kill(h.pid, signal.SIGKILL)
    _await_eof(h)
    pool.dead(h)
    assert pool.records[h.worker].killed and pool.records[h.worker].release_reason == "killed"
    pool, h = _pool_with(1)  # an uncaught exception's status
    _await_eof(h)
    pool.dead(h)
    assert pool.records[h.worker].killed


def test_a_hung_worker_declared_dead_is_killed_at_once_not_after_waiting_for_its_exit():
    """An invocation over time (`DecodeStage._check_timeouts`) declares a worker that is alive and silent dead:
    its pipe is open, so it is not exiting, and waiting for its exit status only stalls the driver (5 s)."""
    pool, h = _pool_with(None)  # alive, blocked on its pipe: hung as far as the driver can tell
    t0 = now()
    pool.dead(h)
    assert not h.process.is_alive() and pool.records[h.worker].killed
    assert now() - t0 < 4.5, "the driver waited (5 s) for a hung worker to exit on its own"


def test_a_serverful_pool_whose_rendezvous_port_was_taken_starts_again_on_another(tmp_path, monkeypatch):
    """A rank 0 that cannot bind its rendezvous port dies starting (the port is reserved now, `reserve_port`, but
    a bug or a foreign SO_REUSEPORT socket could still take it): the pool forms again on a new port instead of
    failing the run."""
    import socket

    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train
    from rlhfless.runtime.devices import dist
    from rlhfless.runtime.config import available_cores

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    ports = [(taken.getsockname()[1], socket.socket())]
    real = dist.reserve_port
    monkeypatch.setattr(dist, "reserve_port", lambda: ports.pop() if ports else real())
    cfg = load_run_config("experiments/configs/quickstart.yaml",
                          ["runtime.mode=serverful", "train.steps=1", "rollout.prompts_per_step=4", "algo.group_size=2",
                           "rollout.max_new_tokens=16", "train.eval_prompts=0", "train.checkpoint_every=0",
                           "tracking.mode=disabled", "runtime.gantt_every=0", "runtime.measure_profile=false"])
    try:
        rt = train(cfg, tmp_path / "run", progress=False)["runtime"]
    finally:
        taken.close()
    W = available_cores()
    assert not ports and rt["steps"] == 1
    assert rt["workers_started"] == 2 * W and rt["workers_killed"] == 1  # rank 0 of the first try; the rest stopped


def test_a_reserved_port_is_refused_to_others_and_taken_by_rank_0():
    """reserve_port: while the driver holds the port no other socket binds it, and rank 0's rendezvous (SO_REUSEPORT)
    listens on it and forms the group (a world of one here)."""
    import socket

    from rlhfless.runtime.devices.dist import destroy_group, init_group, reserve_port

    port, held = reserve_port()
    try:
        other = socket.socket()
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        other.close()
        all_reduce = init_group(0, 1, port, timeout_s=10.0)
        import torch

        t = torch.ones(3)
        all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        destroy_group()
        held.close()


def test_rank_0_announces_its_rendezvous_before_the_others_join():
    """init_group's on_listening: rank 0 calls it once its store listens and before it waits for the others,
    so a driver can send the other ranks their learn_end then (early, they are refused and back off 0.3 s+)."""
    ctx = mp.get_context("fork")
    from rlhfless.runtime.devices.dist import reserve_port

    port, held = reserve_port()
    ours, theirs = ctx.Pipe()

    def rank(r: int) -> None:
        from rlhfless.runtime.devices.dist import destroy_group, init_group

        import torch

        all_reduce = init_group(r, 2, port, timeout_s=20.0,
                                on_listening=(lambda: theirs.send("open")) if r == 0 else None)
        t = torch.ones(1)
        all_reduce(t)  # as the learner does before it leaves: a rank that left at once could cut the other's join
        destroy_group()
        if t.item() != 2.0:
            raise SystemExit(3)

    r0 = ctx.Process(target=rank, args=(0,))
    r0.start()
    try:
        assert ours.poll(20.0) and ours.recv() == "open"  # rank 0 listens, alone: the call came before the join
        r1 = ctx.Process(target=rank, args=(1,))
        r1.start()
        r1.join(30.0)
        r0.join(30.0)
        assert r0.exitcode == 0 and r1.exitcode == 0
    finally:
        held.close()
        for p in (r0,):
            if p.is_alive():
                p.kill()


def _rank_whose_all_reduce_broke(conn) -> None:
    leave_broken_group(conn, 3, RuntimeError("Connection closed by peer [127.0.0.1]:1234"))


def test_a_worker_whose_all_reduce_broke_says_left_then_exits_with_its_status():
    """What the worker does in `op_learn_end` when gloo raises: LEFT on the pipe, then GROUP_BROKEN_EXIT, so the
    pool above records it as released however late its exit status arrives."""
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=True)
    p = ctx.Process(target=_rank_whose_all_reduce_broke, args=(theirs,), daemon=True)
    p.start()
    theirs.close()
    assert wire.recv(ours) == {"op": LEFT, "why": "group_broken", "step": 3}
    p.join()
    assert p.exitcode == GROUP_BROKEN_EXIT
