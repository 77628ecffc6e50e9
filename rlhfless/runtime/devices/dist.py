"""A data-parallel process group on this machine's loopback, for `Learner.update(..., shard=Shard(...))`.

`init_group` joins rank `rank` of `world` processes through a TCP rendezvous on 127.0.0.1:`port` and returns the
blocking in-place SUM all-reduce the learner needs; `destroy_group` leaves it; `free_port` picks a port. The rule it
keeps: everything binds to 127.0.0.1 only, and a failure (a dead peer, a peer that never reduces, a rank that never
arrives) raises within `timeout_s`, never hangs; the caller tears the group down and starts a new one on a new port.
Failure semantics as measured: docs/internals.md#runtimedevicesdistpy.
Non-goals: several groups per process, groups across machines, NCCL tuning (backend="nccl" is untested here).
Both modes reduce the learner's shares with one rank-order sum (`rank_order_sum`): over gloo in the pool, as
files for the serverless learner (`share_all_reduce`), so a rank that wrote its share can leave early.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta

import torch

HOST = "127.0.0.1"
_GROUP: dict = {}
"""The one live group of this process: {"pg": process group, "store": TCPStore, "backend": str}."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it). Another process may take it before rank 0
    binds it (an outgoing connection's ephemeral port included); `init_group` then fails with an error naming the
    port. A driver that spawns the ranks holds the port instead: `reserve_port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def reserve_port() -> tuple[int, socket.socket]:
    """(port, reservation): a port on 127.0.0.1 held by a bound, not listening, SO_REUSEPORT socket. No other
    socket can bind it, and the kernel gives a bound port to no outgoing connection, while rank 0 (which binds with
    SO_REUSEPORT too) listens on it; connections go to the listening socket only. Close the reservation once the
    group has formed. (free_port left a window in which gloo's own connections could take the port: a rank 0
    that died starting, seen in CI beside other jobs.)"""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((HOST, 0))
    return s.getsockname()[1], s


def init_group(rank: int, world: int, port: int, backend: str = "gloo", timeout_s: float = 60.0,
               on_listening: Callable[[], None] | None = None) -> Callable[[torch.Tensor], None]:
    """Join the group (blocks until all `world` ranks have joined, at most `timeout_s`); returns all_reduce.

    Args:
        rank: 0 .. world - 1; rank 0 hosts the rendezvous on 127.0.0.1:port.
        port: the same on every rank (`reserve_port()` in the parent that spawns the ranks, held until they joined).
        backend: "gloo" (CPU) or "nccl" (one CUDA device per rank).
        timeout_s: bound on the rendezvous and on every later collective.
        on_listening: rank 0 calls it once its rendezvous listens, before waiting for the others. A rank that
            connects before rank 0 listens is refused and retries after torch's backoff (0.3 s and growing:
            measured 0.53 s to join for a rank 0 0.3 s late), so a driver holds the other ranks back until then.
    Returns:
        all_reduce(t): sums the float tensor t in place across ranks (blocking), for `dataparallel.Shard`.
    Raises:
        RuntimeError if a group is already live in this process, the port is taken, or a peer does not arrive.
    """
    if _GROUP:
        raise RuntimeError("a process group is already live in this process; destroy_group() first")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # beside the driver's `reserve_port`
        try:
            listener.bind((HOST, port))
        except OSError as exc:
            listener.close()
            raise PortTaken(f"cannot bind the rendezvous to {HOST}:{port} ({exc}); pick another port") from exc
        listener.listen(max(world, 8))
        # our own socket bound to 127.0.0.1: a TCPStore that opened its own would listen on every interface
        store = dist.TCPStore(HOST, port, world, True, timeout, wait_for_workers=False,
                              master_listen_fd=listener.detach())
        if on_listening is not None:
            on_listening()
    else:
        store = dist.TCPStore(HOST, port, world, False, timeout)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        # gloo's data connections on loopback too (its default device follows the hostname's interface)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=HOST)]
        opts._timeout = timeout
        pg = dist.ProcessGroupGloo(store, rank, world, opts)

        def all_reduce(t: torch.Tensor) -> None:
            # gathered, then summed here in rank order: the serverless learner sums the same shares from files in
            # the same order (`share_all_reduce`), so both modes' updates are bitwise equal at any world size
            # (gloo's own SUM adds in a ring order of its choosing, equal to the rank order only for 2 ranks)
            parts = [torch.empty_like(t) for _ in range(world)]
            pg.allgather([parts], [t]).wait()
            t.copy_(rank_order_sum(parts))
    elif backend == "nccl":
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=timeout)
        pg = dist.group.WORLD
        device = torch.device("cuda", torch.cuda.current_device())

        def all_reduce(t: torch.Tensor) -> None:
            on_dev = t.to(device)
            parts = [torch.empty_like(on_dev) for _ in range(world)]
            dist.all_gather(parts, on_dev)  # then the same rank-order sum as gloo's (IEEE adds: same bits on GPU)
            t.copy_(rank_order_sum(parts).to(t.device))
    else:
        raise ValueError(f"backend must be 'gloo' or 'nccl' (got {backend!r})")
    _GROUP.update(pg=pg, store=store, backend=backend)
    return all_reduce


def destroy_group() -> None:
    """Leave the group (a no-op when none is live); frees the port once every rank has left."""
    if not _GROUP:
        return
    if _GROUP["backend"] == "nccl":
        import torch.distributed as dist

        dist.destroy_process_group()
    _GROUP.clear()  # gloo: dropping the last references closes its connections and the store


def rank_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """parts[0] + parts[1] + ... added left to right (a new tensor): the one reduction of the learner's shares in
    both modes (float addition is not associative, so the order is part of the result). parts: [world] x [n]."""
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


class PortTaken(RuntimeError):
    """Rank 0 could not bind the rendezvous port: its own failure, never a peer's (`devices.worker` counts it as
    this worker's death, where a rendezvous broken by a dead peer is the peer's)."""


class ShareWritten(Exception):
    """Raised by a share all-reduce (`share_all_reduce(..., out=...)`) once the rank's buffer is on disk: the
    rank's part of the update is done and it skips the optimiser step (the reducer takes it)."""


def share_all_reduce(out: str | None = None, shares: list[str] | None = None) -> Callable[[torch.Tensor], None]:
    """The serverless learner's reduction through files (the scratch tmpfs) instead of a process group, so a rank
    whose share is computed can leave at once and no rank waits for its peers inside a collective:
      * out: write the rank's buffer (gradients, has-gradient flags, metric row) there, then raise ShareWritten;
      * shares: the reducer: every rank's file in rank order; the buffer becomes their `rank_order_sum` (what
        the serverful pool's gathered all-reduce computes from the same buffers)."""
    from rlhfless.runtime import wire

    def all_reduce(t: torch.Tensor) -> None:
        if out is not None:
            wire.write_tensors(out, {"share": t})
            raise ShareWritten(out)
        t.copy_(rank_order_sum([wire.read_tensors(f)["share"] for f in shares or []]))
    return all_reduce
