"""A worker process: one device unit (a pinned CPU core, one torch thread), one model replica, a request loop.

It runs the function kinds it was started for (`decode` with its rows' `reward`, `reference`, `learner`; a
serverful pool worker all of them on one replica), answering JSON requests (`runtime.wire`) with tensors as
safetensors files; it knows nothing of modes, plans or billing. The rule it keeps (the decode contract): every row
samples from its own stream (seed, decode step, row id), so where a row runs never changes its tokens; every
`progress_every` iterations it reports and obeys `cut` (hand back unfinished rows) and `adopt` (re-prefill and
decode migrated rows as a second batch). With `rollout.engine=vllm` the contract holds for fresh rows only.
Details: docs/internals.md#runtimedevicesworkerpy.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

from rlhfless.runtime import wire
from rlhfless.runtime.devices import ops
from rlhfless.runtime.wire import GROUP_BROKEN_EXIT, LEFT
from rlhfless.runtime.records import now

VLLM_KV_GIB = 0.25
"""KV cache of a decode worker's vLLM engine (rollout.engine=vllm), GiB: a step's rows of the tiny policy need
a few MiB; vLLM reserves what it is given, once per worker."""


def bind_device(setup: dict) -> str:
    """Give this fresh worker its units, before anything touches CUDA; returns the torch device its models use.

    runtime.device=cpu: its units are cores, pinned (the Ray backend pins only on the driver's node: core ids are
    that node's). runtime.device=cuda (`setup["gpu_layout"]`): its units are GPU slots; only their GPUs are made
    visible, so its GPU is cuda:0 (`runtime.devices.gpus`); it runs on whatever cores the OS gives it."""
    layout = setup.get("gpu_layout")
    if layout is None:
        if setup.get("pin", True):
            os.sched_setaffinity(0, setup["cores"])
        return "cpu"
    from rlhfless.runtime.devices.gpus import GpuLayout, apply_worker_env

    setup["gpu_env"] = GpuLayout.from_json(layout).worker_env(setup["cores"])
    apply_worker_env(setup["gpu_env"])
    return "cuda:0"


class GroupNotFormed(RuntimeError):
    """The data-parallel group could not form as this worker started: a peer died in the rendezvous."""


def leave_broken_group(conn, step: int | None, exc: Exception, where: str = "the learner's all-reduce") -> None:
    """A peer died inside the all-reduce (runtime.devices.dist: survivors raise at once) or the rendezvous (`where`).
    The driver restarts the group from the same state, so this is expected under faults: one line on stderr, not
    a traceback; `LEFT` on the pipe, then exit with GROUP_BROKEN_EXIT. Never returns."""
    import sys

    print(f"rlhfless worker: {where} broke ({str(exc).splitlines()[0][:100]}); "
          "exiting for the driver to restart the group", file=sys.stderr, flush=True)
    if conn is not None:
        try:
            wire.send(conn, {"op": LEFT, "why": "group_broken", "step": step})
        except OSError:  # the driver is gone too: nobody is left to tell
            pass
    raise SystemExit(GROUP_BROKEN_EXIT) from None


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when the thread that forked it exits (Linux)."""


def die_with_parent(driver_pid: int) -> None:
    """A local worker dies with its parent, even one blocked where it reads no pipe (decoding, or a gloo
    rendezvous whose peer will never come: once 60-80 s): SIGKILL from the kernel (`PR_SET_PDEATHSIG`) when the
    process that forked it exits. That parent is the fork server, which exits as soon as the driver is gone (EOF
    on its pipe to the driver), or with start_method=spawn the driver's thread that started the worker (the main
    thread: the runtime starts workers nowhere else). A driver already gone before the signal was armed is caught
    by the check after it. Elsewhere than Linux the worker relies on the pipe's EOF."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if not _alive(driver_pid):
        os._exit(0)


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, its parent has not reaped it yet) counts as gone, since the signal
    above is armed too late for a parent that already exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # on Linux: reaped between the two calls; elsewhere no procfs, so trust the kill
        return not sys.platform.startswith("linux")
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def drop_forkserver_alive_fd() -> None:
    """Close this worker's copy of the fork server's "alive" pipe. CPython hands every child of the fork server
    the write end whose EOF tells the server its driver is gone; a worker holding it keeps the server alive after
    the driver's exit for as long as the worker lives, so the worker's parent-death signal (the server's exit)
    never comes: one blocked in a gloo rendezvous outlived its driver by 60+ s (issue 42). Closed, the driver
    holds the only copy: its exit ends the server, and the kernel then ends every worker."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return
    server._forkserver_alive_fd = None  # this worker starts no process through the driver's fork server
    try:
        os.close(fd)
    except OSError:
        pass


def local_main(conn, setup_json: str, driver_pid: int) -> None:
    """Entry point of a `LocalBackend` worker: `main`, ended by the kernel if its driver goes."""
    drop_forkserver_alive_fd()
    die_with_parent(driver_pid)
    main(conn, setup_json)


def main(conn, setup_json: str) -> None:
    """Process entry point: bind its units, load, say ready, serve until `shutdown` (or the pipe closes).

    Signals: SIGINT is ignored (a terminal's Ctrl-C reaches the whole process group; the driver decides, and
    stops its workers itself); SIGTERM keeps its default action, so the driver's stop (`backend.stop_all`) ends
    a worker at once without a traceback. A pipe that breaks under a request (the driver died mid-invocation)
    ends the worker quietly too: nobody is left to read a reply or a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve(conn, setup_json)
    except (ConnectionError, EOFError):
        return


def _serve(conn, setup_json: str) -> None:
    setup = json.loads(setup_json)
    if "emulated" in setup:  # runtime.device=emulated: the same loop, modelled compute, no torch
        from rlhfless.runtime.devices.emulated import serve

        return serve(conn, setup)
    setup["torch_device"] = bind_device(setup)
    import torch

    torch.set_num_threads(len(setup["cores"]))
    if "gpu_env" in setup:
        from rlhfless.runtime.devices.gpus import limit_memory

        limit_memory(setup["gpu_env"])
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per cold start would drown the driver's output
    try:
        worker = Worker(setup)
    except GroupNotFormed as exc:  # a peer died while the group formed: the peer's death is the one to count
        leave_broken_group(conn, None, exc.__cause__ or exc, where="the learner group's rendezvous")
    wire.serve(worker, conn)


class Worker:
    """The state one worker holds between invocations: config, policy replica, learner, reference model."""

    def __init__(self, setup: dict):
        from rlhfless.config import RunConfig
        from rlhfless.core.configbase import build_config

        self.setup = setup
        self.kinds = tuple(setup["kinds"])
        self.cfg = build_config(RunConfig, setup["config"], [])
        self.G = self.cfg.algo.group_size
        self.version = -1
        self.model = None
        self.learner = None
        self.reference = None
        self.shard = None
        self.vllm = None
        self.vllm_version = None  # the replica version the vLLM engine holds
        self.deferred: list[dict] = []
        """Requests read by a running decode's control loop that are not for it (learner groups, shutdown)."""
        self.update = None  # the learner's AccumulatedUpdate of the current step (learn_begin .. learn_end)
        self.update_info: dict = {}
        self.critic = None  # PPO's critic (algo.name=ppo): the critic image, or the serverful pool's critic worker
        self.critic_version = -1
        self.values_step: dict | None = None  # the value forward's chunks of the current step (`ppo_worker`)
        self.ppo_old: dict | None = None  # the old log-probs computed ahead for the current step (ppo_worker)
        if {"decode", "learner", "prefill"} & set(self.kinds):
            self._load_policy(setup.get("state_path"), setup.get("version", 0))
        if "decode" in self.kinds and self.cfg.rollout.engine == "vllm":
            self._start_vllm()
        # a learner rank runs the reference forward of the groups streamed to it (runtime.overlap, kl > 0)
        if "reference" in self.kinds or ("learner" in self.kinds and self.cfg.algo.kl_coef > 0):
            from rlhfless.model.factory import load_policy

            self.reference = self._placed(load_policy(setup["reference_checkpoint"])).eval().requires_grad_(False)
        if "critic" in self.kinds or setup.get("holds_critic"):
            from rlhfless.runtime.devices.ppo_worker import load_critic_model

            load_critic_model(self, setup)
        if setup.get("dist"):
            self._join(setup["dist"])

    def _join(self, d: dict, on_listening=None) -> None:
        """Join the learner's data-parallel group (blocks until every rank has joined); rank 0 calls
        `on_listening` once its rendezvous listens (the driver sends the other ranks their learn_end then)."""
        from rlhfless.learn.dataparallel import Shard
        from rlhfless.runtime.devices.dist import PortTaken, init_group

        try:
            group = init_group(d["rank"], d["world"], d["port"], timeout_s=d["timeout_s"], on_listening=on_listening)
        except PortTaken:  # rank 0's own failure: it dies, and its peers' rendezvous breaks with it
            raise
        except RuntimeError as exc:  # torch's DistNetworkError included: a peer gone mid-rendezvous
            raise GroupNotFormed(str(exc)) from exc
        self.shard = Shard(d["rank"], d["world"], group)

    @functools.cached_property
    def env(self):
        """The run's task and tokenizer (decode functions decode and score their rows here)."""
        from rlhfless.step.textenv import make_env

        return make_env(self.cfg)

    # -- weights ------------------------------------------------------------------------------------------------
    def _load_policy(self, state_path: str | None, version: int) -> None:
        from rlhfless.model.factory import load_policy

        if self.model is None:
            self.model = self._placed(load_policy(self.setup["checkpoint"]))
        if "learner" in self.kinds and self.learner is None:
            from rlhfless.learn.learner import Learner

            self.learner = Learner(self.model, self.cfg.optim, self.cfg.algo,
                                   reuse_prefix=self.cfg.rollout.reuse_prefix_forward)
        if state_path:
            self._sync(state_path, version)
        else:
            self.version = version

    def _placed(self, model):
        """`model` on this worker's device in train.dtype (the same object on cpu/float32)."""
        import torch

        from rlhfless.core.devices import place, resolve_dtype

        return place(model, torch.device(self.setup.get("torch_device", "cpu")), resolve_dtype(self.cfg.train.dtype))

    def _sync(self, state_path: str, version: int) -> float:
        """Bring the replica to `version` from the learner's state file; returns the seconds it took."""
        if version == self.version:
            return 0.0
        t0 = now()
        if self.learner is not None:
            from rlhfless.learn.learner import load_learner_state

            load_learner_state(self.learner, state_path)
        else:
            from rlhfless.learn.learner import load_policy_weights

            load_policy_weights(self.model, state_path)
        self.version = version
        return now() - t0

    def _start_vllm(self) -> None:
        """The decode engine for rollout.engine=vllm: in this process (weights pass by reference), as many
        threads as this worker has cores, a small KV cache (one worker per core shares the machine's memory)."""
        import torch

        from rlhfless.rollout.vllm_engine import VLLMEngine

        # eager: torch.compile would add ~12 s to every cold start for no measurable decode gain on the tiny policy
        self.vllm = VLLMEngine(self.setup["checkpoint"], threads=torch.get_num_threads(), kv_cache_gib=VLLM_KV_GIB,
                               enforce_eager=True)
        self._engine_sync()

    def _engine_sync(self) -> float:
        """Load the replica's weights into the vLLM engine when it holds another version (the learner of a
        serverful pool worker updates the replica in place, without a `_sync`); returns the seconds it took."""
        if self.vllm is None or self.vllm_version == self.version:
            return 0.0
        t0 = now()
        self.vllm.load_weights(self.model.state_dict())
        self.vllm_version = self.version
        return now() - t0

    # -- requests -----------------------------------------------------------------------------------------------
    handle = ops.dispatch  # the one op table (`devices.ops`): which request runs which method below

    def unsupported(self, op: str) -> Exception:
        return ValueError(f"worker: unknown request {op!r}")

    def op_decode(self, msg: dict, conn) -> dict:  # decode and adopt
        from rlhfless.runtime.devices.decoding import run_decode

        sync_s = self._sync(msg["state_path"], msg["version"]) if msg.get("state_path") else 0.0
        # vLLM's reload is part of this invocation's weight sync (timed into sync_s)
        return run_decode(self, msg, conn, sync_s + self._engine_sync())

    def op_prefill(self, msg: dict, conn) -> dict:
        from rlhfless.runtime.devices.decoding import run_prefill

        sync_s = self._sync(msg["state_path"], msg["version"]) if msg.get("state_path") else 0.0
        return run_prefill(self, msg, sync_s)

    def op_profile(self, msg: dict, conn) -> dict:  # the planner's decode-time profile with this worker's threads
        return self._profile(conn)

    def op_cut(self, msg: dict, conn) -> dict:
        return ops.late_cut(msg)

    def op_ppo(self, msg: dict, conn) -> dict | None:
        from rlhfless.runtime.devices import ppo_worker

        op = msg["op"]
        if op not in ("ppo_actor", "critic_learn"):
            return getattr(ppo_worker, op)(self, msg)
        try:
            return getattr(ppo_worker, op)(self, msg, conn)
        except ppo_worker.GroupBroken as exc:  # a peer rank died: the driver re-runs the role
            leave_broken_group(conn, msg["step"], exc.args[0], where=exc.args[1])

    def _profile(self, conn) -> dict:
        """Time rollouts of the run's own workload (its task's first train prompts, its sampling settings): the
        decode-time profile of this worker's shape (`rollout.tpot.measure_profile`)."""
        from rlhfless.rollout.tpot import PROFILE_GROUP, PROFILE_PROMPTS, measure_profile

        r = self.cfg.rollout
        prompts = [self.env.encode(p) for p in self.env.task.splits()[0][:PROFILE_PROMPTS]]
        rows, prefill_s = measure_profile(self.model, prompts, PROFILE_GROUP,
                                          self.env.sampling(r.max_new_tokens, r.temperature, r.top_p),
                                          on_slice=lambda done: wire.send(conn, {"op": "profiling", "done": done}))
        return {"op": "profiled", "rows": rows, "prefill_s_per_token": prefill_s}

    # -- the learner: one accumulated update per step, fed group by group (rlhfless.learn.accumulate) ----------------
    def op_learn_begin(self, msg: dict, conn=None) -> None:
        """Start the step's update: weights (and AdamW) at the step's version, the seed, this rank's chunks."""
        import torch

        from rlhfless.learn.accumulate import AccumulatedUpdate

        t0 = now()
        sync_s = self._sync(msg["state_path"], msg["version"]) if msg.get("state_path") else 0.0
        torch.manual_seed(msg["seed"])
        self.update = AccumulatedUpdate(self.learner, msg["chunks"], msg["with_ref"])
        # busy: the intervals it computed in (the meter's busy time: waiting for groups between them is idle);
        # group_busy: those of its groups alone (the share done before the rollout ended)
        self.update_info = {"t_start": now(), "sync_s": sync_s, "compute_s": 0.0, "group_busy": [],
                            "busy": [[t0, now()]] if sync_s > 0 else []}
        return None

    def op_learn_group(self, msg: dict, conn=None) -> None:
        """Forward/backward of a finished group's micro-batch (once all of its groups are in); no reply."""
        from rlhfless.learn.accumulate import GroupBatch

        t0 = now()
        prompts, responses, rewards, ref = wire.read_batch(Path(msg["batch"]))
        if self.update.with_ref and ref is None:  # streamed before any reference function could run
            ref = self.group_reference(prompts[0], responses)
        self.update.add(GroupBatch(msg["g"], prompts[0], responses, rewards, ref))
        self.update_info["compute_s"] += now() - t0
        self.update_info["group_busy"].append([t0, now()])
        self.update_info["busy"].append([t0, now()])
        return None

    def op_learn_end(self, msg: dict, conn=None) -> dict:
        """The optimiser step (all-reduce across ranks), the next state version written by rank 0."""
        import torch

        from rlhfless.learn.learner import save_learner_state

        t_end0 = now()
        if msg.get("share"):
            return self._learn_share(msg, t_end0)
        if msg.get("dist") and self.shard is None:
            announce = None
            if msg["dist"].get("announce") and conn is not None:
                def announce():
                    wire.send(conn, {"op": "rendezvous_open", "step": msg["step"]})
            self._join(msg["dist"], announce)
        try:
            metrics = self.update.finish(torch.tensor(msg["rewards"], dtype=torch.float32), msg["lengths"],
                                         self.shard)
        except RuntimeError as exc:
            if self.shard is None:
                raise
            leave_broken_group(conn, msg["step"], exc)
        self.version = msg["version"] + 1
        if msg.get("state_out"):
            save_learner_state(self.learner, msg["state_out"])
        if msg.get("leave"):  # a hybrid function: its next step may be a decode, or a rank of another group
            from rlhfless.runtime.devices.dist import destroy_group

            destroy_group()
            self.shard = None
        info, peak = self.update_info, self.update.buffered_peak
        self.update, self.update_info = None, {}
        t_end = now()
        return {"op": "learned", "step": msg["step"], "t_start": info["t_start"], "t_end": t_end,
                "sync_s": info["sync_s"], "compute_s": info["compute_s"], "buffered_peak": peak,
                "busy": info["busy"] + [[t_end0, t_end]], "group_busy": info["group_busy"],
                "metrics": {k: v for k, v in metrics.items() if v is not None}}

    def _learn_share(self, msg: dict, t_end0: float) -> dict:
        """The serverless learner's end (`runtime.streaming`): `share.out`: write this rank's share of the update
        (the buffer it would all-reduce) and skip the optimiser step: the replica stays at its version and the
        function is free at once; `share.shares`: reduce every rank's share in rank order, step, and write the
        next state version (a reducer holds no update of its own: its share is one of the files)."""
        import torch

        from rlhfless.learn.accumulate import AccumulatedUpdate
        from rlhfless.learn.dataparallel import Shard
        from rlhfless.learn.learner import save_learner_state
        from rlhfless.runtime.devices.dist import ShareWritten, share_all_reduce

        sh = msg["share"]
        if sh.get("out"):
            update, info = self.update, self.update_info
        else:  # the reducer: in sync with the step's version, an empty update whose all-reduce reads the shares
            sync_s = self._sync(msg["state_path"], msg["version"])
            update = AccumulatedUpdate(self.learner, [], msg["with_ref"])
            info = {"t_start": t_end0, "sync_s": sync_s, "compute_s": 0.0, "group_busy": [], "busy": []}
        shard = Shard(sh["rank"], sh["world"], share_all_reduce(sh.get("out"), sh.get("shares")))
        shared, metrics = None, {}
        try:
            metrics = update.finish(torch.tensor(msg["rewards"], dtype=torch.float32), msg["lengths"], shard)
        except ShareWritten:
            shared = sh["out"]
            for p in self.learner.model.parameters():
                p.grad = None  # views of the share: the replica stays as it was, at the step's version
        if shared is None:  # stepped (the reducer), or no group was kept: no share, the step is just counted
            self.version = msg["version"] + 1
            if msg.get("state_out"):
                save_learner_state(self.learner, msg["state_out"])
        peak = update.buffered_peak
        self.update, self.update_info = None, {}
        t_end = now()
        return {"op": "learned", "step": msg["step"], "t_start": info["t_start"], "t_end": t_end,
                "sync_s": info["sync_s"], "compute_s": info["compute_s"], "buffered_peak": peak, "shared": shared,
                "busy": info["busy"] + [[t_end0, t_end]], "group_busy": info["group_busy"],
                "metrics": {k: v for k, v in metrics.items() if v is not None}}

    def op_reference(self, msg: dict, conn=None) -> dict:
        import torch

        t0 = now()
        prompts, responses, _, _ = wire.read_batch(Path(msg["batch"]))
        G = self.G
        parts = [self.group_reference(p, responses[g * G:(g + 1) * G]) for g, p in enumerate(prompts)]
        width = max(x.shape[1] for x in parts)
        logp = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in parts])
        wire.write_tensors(msg["out"], {"ref_logp": logp})
        return {"op": "referenced", "t_start": t0, "t_end": now()}

    def group_reference(self, prompt: list[int], responses: list[list[int]]):
        """[G, T_g] reference log-probs of one group, computed alone. The reference function (all groups, one by
        one) and a learner rank streaming the group (runtime.overlap) both call this, so the KL term is the same
        number either way: a batched forward over the whole step could differ in the last bits with the batch's
        shape, and the overlapped update would no longer equal the sequential one bitwise."""
        import torch

        from rlhfless.rollout.forward import response_logprobs

        with torch.no_grad():
            return response_logprobs(self.reference, [prompt], responses, self.G,
                                     reuse_prefix=self.cfg.rollout.reuse_prefix_forward).logp

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()
        if self.shard is not None:
            from rlhfless.runtime.devices.dist import destroy_group

            destroy_group()
