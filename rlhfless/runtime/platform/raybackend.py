"""Mechanism on a Ray cluster: every worker is a Ray actor, with the local backend's methods and message protocol.

`RayBackend` has `LocalBackend`'s interface (`boot`, `start`, `send`, `poll`, `release`, `kill`, `close`), so the
pool, the policy, the stages and the meter run unchanged: a worker is a `FunctionHost` actor requesting `num_cpus`
= its units, created by `start` and killed by `release`, that connects back to the driver's authkey-protected
listener and runs `rlhfless.runtime.devices.worker.main` there. The rule it keeps: the same JSON messages as the local
backend, so the same requests give the same tokens; a dead actor is reported as (handle, None), like a dead local
process. Cold starts (per-node fork servers), death, placement, CPU pinning and tensors:
docs/internals.md#runtimeplatformraybackendpy.
Non-goals: moving tensors through Ray's object store; GPU requests (a unit is one CPU); restarting a dead cluster.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Listener, wait

from rlhfless.core.errors import ConfigError
from rlhfless.runtime import wire
from rlhfless.runtime.platform.backend import WorkerDied, without_main, noted
from rlhfless.runtime.devices.worker import main, now
from rlhfless.runtime.wire import PRELOAD

POLL_SLICE_S = 0.2
"""How often `poll` looks at the actors' task refs while no message arrives (a dead node sends no EOF)."""
GUARD_S = 0.2
"""How often a forked worker checks that its actor lives, and the actor that its worker does."""


class NodeForkServer:
    """One per node and run (`num_cpus=0`): a multiprocessing fork server that imported the worker's modules
    once, so a worker's cold start on Ray is fork + model load, as with the local backend's fork server."""

    def __init__(self):
        import multiprocessing as mp

        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.children: list = []

    def boot(self) -> float:
        t0 = now()
        p = self.ctx.Process(target=os.getpid)
        with without_main():  # a Ray worker's __main__ must not be re-run in the fork server
            p.start()
        p.join()
        return now() - t0

    def fork(self, address: list, authkey_hex: str, hello: dict, setup_json: str, guardian: int) -> int:
        self.children = [p for p in self.children if p.is_alive()]
        p = self.ctx.Process(target=_forked_worker, args=(address, authkey_hex, hello, setup_json, guardian),
                             daemon=True, name=f"rlhfless-{hello['worker']}")
        with without_main():
            p.start()
        self.children.append(p)
        return p.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _forked_worker(address: list, authkey_hex: str, hello: dict, setup_json: str, guardian: int) -> None:
    """A worker forked on a node: it serves the driver and ends with the actor that holds its units."""
    conn = Client(tuple(address), authkey=bytes.fromhex(authkey_hex))
    wire.send(conn, {**hello, "pid": os.getpid()})

    def guard() -> None:  # ray.kill ends the actor, not this process: follow it within GUARD_S
        while _alive(guardian):
            time.sleep(GUARD_S)
        os._exit(1)
    threading.Thread(target=guard, daemon=True).start()
    main(conn, setup_json)


class FunctionHost:
    """The Ray actor: holds the worker's units and serves `worker.main` until shutdown or EOF, either in its
    own process (start_method=spawn: imports on every cold start) or in a process forked by its node's fork
    server (start_method=forkserver), which it then watches."""

    def serve(self, address: list, authkey_hex: str, worker: str, setup_json: str, home: str,
              forkservers: str | None) -> str:
        import ray

        import rlhfless

        node = ray.get_runtime_context().get_node_id()
        setup = json.loads(setup_json)
        setup["pin"] = node == home  # core ids are the driver's node's numbering
        hello = {"op": "hello", "worker": worker, "node": node, "ip": ray.util.get_node_ip_address(),
                 "pid": os.getpid(), "code": os.path.dirname(rlhfless.__file__)}
        server = _node_server(ray, forkservers, node)
        if server is None:
            conn = Client(tuple(address), authkey=bytes.fromhex(authkey_hex))
            wire.send(conn, hello)
            main(conn, json.dumps(setup))
            return worker
        pid = ray.get(server.fork.remote(address, authkey_hex, hello, json.dumps(setup), os.getpid()))
        while _alive(pid):
            time.sleep(GUARD_S)
        return worker


def _node_server(ray, prefix: str | None, node: str):
    """This node's fork server, or None (spawn, or a node that joined after the run started)."""
    if prefix is None:
        return None
    try:
        return ray.get_actor(f"{prefix}{node}")
    except ValueError:
        return None


@dataclass(eq=False)
class RayHandle:
    """A started actor: what pool and stages read of a local Handle, plus the actor and its serve task."""

    worker: str
    actor: object
    ref: object
    cores: tuple[int, ...]
    kinds: tuple[str, ...]
    spawned_s: float
    target: str
    """The node id it was placed on (a soft placement may land elsewhere: `node` says where it did)."""
    home: bool
    ready_s: float | None = None
    conn: object = None
    node: str | None = None
    pid: int = 0
    dead: bool = False
    error: str | None = None
    pending: list[dict] = field(default_factory=list)
    outbox: list[dict] = field(default_factory=list)
    """Requests sent before the actor connected (a pipe would have buffered them)."""
    left: bool = False
    """It said it is leaving because its learner group broke (`wire.LEFT`, read through `backend.noted`)."""

    @property
    def alive(self) -> bool:
        return not self.dead


class RayBackend:
    def __init__(self, address: str, units: int, start_method: str = "forkserver"):
        self.address, self.units, self.start_method = address, units, start_method
        self.platform_start_s = 0.0
        self.started_ray = False
        self.handles: dict[str, RayHandle] = {}
        self._arrivals: queue.Queue = queue.Queue()

    # -- platform -----------------------------------------------------------------------------------------------
    def boot(self) -> float:
        """Join or start the cluster and open the listener the actors connect back to; returns the seconds."""
        try:
            import ray
        except ImportError:
            raise ConfigError("runtime.backend: ray is not installed (pip install 'rlhfless[ray]')") from None
        self.ray = ray
        t0 = now()
        if not ray.is_initialized():
            self._init(ray)
        self.home = ray.get_runtime_context().get_node_id()
        ip = ray.util.get_node_ip_address()
        self.authkey = secrets.token_bytes(32)
        self.listener = Listener((ip, 0), authkey=self.authkey)
        self._wake_r, self._wake_w = os.pipe()
        threading.Thread(target=self._accept, daemon=True, name="rlhfless-ray-accept").start()
        self.host = ray.remote(FunctionHost)
        self.forkservers = self._boot_forkservers() if self.start_method == "forkserver" else None
        self.platform_start_s = now() - t0
        return self.platform_start_s

    def _boot_forkservers(self) -> str:
        """A fork server on every node with CPUs, booted in parallel (platform set-up: measured, not billed)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        prefix = f"rlhfless-forkserver-{secrets.token_hex(4)}-"
        self._servers = []
        for n in self._nodes():
            self._servers.append(self.ray.remote(NodeForkServer).options(
                name=prefix + n, num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote())
        self.ray.get([s.boot.remote() for s in self._servers])
        return prefix

    def _nodes(self) -> list[str]:
        return [n["NodeID"] for n in self.ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]

    def _init(self, ray) -> None:
        env = {"RAY_USAGE_STATS_ENABLED": "0"}
        os.environ.update({k: os.environ.get(k, v) for k, v in env.items()})
        if self.address:
            ray.init(address=self.address)
        else:
            # a local cluster of its own, on loopback. Logical CPUs are bookkeeping here (workers pin themselves
            # to the pool's cores, as locally, where nothing caps how many are alive): under keep-alive the warm
            # decode functions, the pre-warmed learner group, a prefill function and a re-run can all be alive at
            # once, and an actor Ray cannot place waits forever, so leave room for all of them
            # address="local": a new cluster of our own, never one ray.init would otherwise find through
            # RAY_ADDRESS or /tmp/ray's note of the newest cluster on the machine (another run's, or a stale one)
            ray.init(address="local", num_cpus=4 * self.units, include_dashboard=False, _node_ip_address="127.0.0.1")
        self.started_ray = True

    def _accept(self) -> None:
        """Background: take each actor's connection and its hello; the driver thread adopts them in `_adopt`."""
        while True:
            try:
                conn = self.listener.accept()
                hello = wire.recv(conn)
            except (OSError, EOFError):
                if self.listener is None:
                    return
                continue  # a failed handshake: that actor's serve task fails and poll reports it dead
            self._arrivals.put((hello, conn))
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # closed: the backend shut down
                return

    def close(self) -> None:
        listener, self.listener = getattr(self, "listener", None), None
        if listener is not None:
            listener.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
        for server in getattr(self, "_servers", []):
            self.ray.kill(server, no_restart=True)  # its forked workers follow their actors, already gone
        self._servers = []
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False

    # -- placement ----------------------------------------------------------------------------------------------
    def _place(self, kinds: tuple[str, ...], role: str | None = None) -> tuple[str, bool, bool]:
        """(node id, is it home, is the affinity soft) for a new worker of `kinds`; `role`: what a hybrid
        function (decode + learner) starts as: a learner rank is home (its group binds loopback), a decode is
        placed as one."""
        live = [h for h in self.handles.values() if not h.dead]
        first = role or kinds[0]
        if (len(kinds) > 1 and role is None) or first in ("learner", "prefill"):
            return self.home, True, first == "prefill"
        if first == "decode" and not any(h.home and "decode" in h.kinds for h in live):
            return self.home, True, True
        nodes = self._nodes()
        load = {n: 0 for n in nodes}
        for h in live:
            if h.target in load:
                load[h.target] += len(h.cores)
        best = min(nodes, key=lambda n: (load[n], n == self.home, n))
        return best, best == self.home, True

    # -- workers ------------------------------------------------------------------------------------------------
    def start(self, worker: str, kinds: tuple[str, ...], cores: tuple[int, ...], setup: dict) -> RayHandle:
        """Create the actor (returns at once; `poll` sees its `ready` once it connected and loaded)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node, home, soft = self._place(kinds, setup.get("role"))
        payload = json.dumps({**setup, "kinds": list(kinds), "cores": list(cores)})
        t = now()
        # no Ray restart: a restarted actor has lost its model and connection; the runtime's retry starts a new one
        actor = self.host.options(num_cpus=len(cores), max_restarts=0,
                                  scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=soft)).remote()
        ref = actor.serve.remote(list(self.listener.address), self.authkey.hex(), worker, payload, self.home,
                                 self.forkservers)
        h = RayHandle(worker, actor, ref, tuple(cores), tuple(kinds), t, node, home)
        self.handles[worker] = h
        return h

    def _adopt(self) -> None:
        """Attach arrived connections to their handles and send what was queued for them, in order."""
        while True:
            try:
                hello, conn = self._arrivals.get_nowait()
            except queue.Empty:
                return
            h = self.handles.get(hello["worker"])
            if h is None or h.dead:
                conn.close()
                continue
            here = os.path.dirname(sys.modules["rlhfless"].__file__)
            if hello["code"] != here:  # a node importing another copy of rlhfless would run other code
                h.error = f"actor imported rlhfless from {hello['code']}, the driver from {here}"
                print(f"rlhfless: worker {h.worker}: {h.error}", file=sys.stderr)
            h.conn, h.node, h.pid = conn, hello["ip"], hello["pid"]
            for msg in h.outbox:
                self._write(h, msg)
            h.outbox.clear()

    def _write(self, h: RayHandle, msg: dict) -> None:
        try:
            wire.send(h.conn, msg)
        except (BrokenPipeError, OSError):
            h.dead = True
            raise WorkerDied(h) from None

    def send(self, h: RayHandle, msg: dict) -> None:
        self._adopt()
        if h.dead:
            raise WorkerDied(h)
        if h.conn is None:
            h.outbox.append(msg)
        else:
            self._write(h, msg)

    def poll(self, handles: list[RayHandle], timeout: float | None) -> list[tuple[RayHandle, dict | None]]:
        """Messages from any of `handles` within `timeout` s; (handle, None) marks a worker that died."""
        out = [(h, h.pending.pop(0)) for h in handles if h.pending]
        if out:
            return out
        deadline = None if timeout is None else now() + timeout
        while True:
            self._adopt()
            conns = {id(h.conn): h for h in handles if h.conn is not None and not h.dead}
            left = POLL_SLICE_S if deadline is None else max(0.0, min(POLL_SLICE_S, deadline - now()))
            ready = wait([h.conn for h in conns.values()] + [self._wake_r], left)
            for r in ready:
                if r == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                out.extend(self._drain(conns[id(r)]))
            out.extend((h, None) for h in self._finished(handles) if all(x is not h for x, _ in out))
            if out or (deadline is not None and now() >= deadline):
                return out

    def _drain(self, h: RayHandle) -> list[tuple[RayHandle, dict | None]]:
        got = []
        try:
            while h.conn.poll():
                msg = noted(h, wire.recv(h.conn))
                if msg is not None:
                    got.append((h, msg))
        except (EOFError, OSError):
            h.dead = True
            got.append((h, None))
        return got

    def _finished(self, handles: list[RayHandle]) -> list[RayHandle]:
        """Handles whose serve task ended (the actor died or was killed) and that have nothing left to read."""
        refs = {h.ref: h for h in handles if not h.dead}
        if not refs:
            return [h for h in handles if h.dead]
        done, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        gone = []
        for ref in done:
            h = refs[ref]
            if h.conn is not None and h.conn.poll():
                continue  # read its last messages first; the next poll reports the death
            h.dead, h.error = True, h.error or self._reason(ref)
            gone.append(h)
        return gone + [h for h in handles if h.dead and h.ref not in refs]

    def _reason(self, ref) -> str | None:
        try:
            self.ray.get(ref, timeout=0)
            return None
        except Exception as exc:  # why the actor ended (killed, crashed, node lost): kept for the report
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

    def release(self, h: RayHandle, timeout: float = 5.0) -> None:
        """Ask the worker to stop, wait up to `timeout` for it, then end the actor (its CPUs go back to Ray)."""
        self._adopt()
        if h.conn is not None and not h.dead:
            try:
                wire.send(h.conn, {"op": "shutdown"})
                self.ray.wait([h.ref], timeout=timeout)
            except (BrokenPipeError, OSError):
                pass
        self.kill(h)

    def stop_all(self, handles: list[RayHandle]) -> None:
        """Stop these workers together on an interrupt: end their actors (`kill`; a forked worker follows its
        actor within GUARD_S), without the graceful `shutdown` a busy worker would read only after its work."""
        for h in handles:
            self.kill(h)

    def exit_status(self, h: RayHandle) -> int | None:
        """Unknown here (the worker's process lives inside its actor); what it sent last is read (dropped), so a
        rank that said `wire.LEFT` is known by `h.left`, and every other ended worker counts as a death."""
        if h.conn is not None and not h.dead:
            self._drain(h)
        return None

    def kill(self, h: RayHandle) -> None:
        h.dead = True
        try:
            self.ray.kill(h.actor, no_restart=True)
        except Exception:  # already gone (its node died, or Ray shut down): nothing left to end
            pass
        if h.conn is not None:
            h.conn.close()
        self.handles.pop(h.worker, None)
