"""Emulated devices (`runtime.device=emulated`): real worker processes whose compute is the simulator's modelled time.

The runtime runs unchanged (planner, processes, messages, cold starts, keep-alive, migration, billing, faults);
only what a worker computes is replaced: `worker.main` hands an emulated setup to `serve`, whose `EmulatedWorker`
answers `worker.Worker`'s requests with the same replies and sleeps the modelled time (`sim.scenario.build_cluster`'s
perf model for `runtime.emulated_model` on `runtime.emulated_tp` x `runtime.emulated_gpu`: a function of k units is
one TP-k replica; scaled by `runtime.time_scale`). The rule it keeps: sleeping is deadline based, so a worker's own
overhead is absorbed, not added. Each request's model:
docs/internals.md#runtimedevicesemulatedpy. Non-goals: the prefill function, vLLM.

Deviations:
1. The all-reduce is modelled, not run: each rank sleeps `PerfModel.grad_exchange_s` for its part of it (the
   pool's ranks in the optimiser step, a serverless rank before its share), but a GRPO rank that ends early returns
   without waiting for its peers (the driver waits for every rank, so the step's time is the same; the wait shows
   as held idle instead of busy). A PPO rank waits for its group's last rank to arrive before its work (a file
   barrier, `_group_barrier`), as its first real all-reduce would.
2. An emulated worker imports neither torch nor the model (a few tens of MB).
3. A serverful pool worker with `runtime.emulated_engine=paper` is one TP replica of verl as the paper ran it
   (`sim.devicemodel.engine_of`): it holds TP units, decodes with that engine's time model and KV slots, trains and
   scores its share on its TP devices, and after each optimiser step reshards the whole model and sleeps and wakes
   its KV cache. A tuned-engine function or pool worker at `runtime.emulated_tp` = k holds k units the same way
   (`sim.devicemodel.engine_of` at TP k: its decode, learner share, reference forward, cold start and weight
   loads; the learner's data-parallel ranks are units / k). A GRPO learner rank cold-started on a trained policy
   also reads its optimiser shard (`sim.devicemodel.cold_start_s`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlhfless.core.errors import ConfigError, require
from rlhfless.runtime import wire
from rlhfless.runtime.devices import ops
from rlhfless.runtime.records import now
from rlhfless.sim.devicemodel import (LengthTable, build_table, cold_start_s, engine_of, mix, ppo_split, ppo_update_s,
                                      time_model)

TOKEN_BASE, TOKEN_SPAN = 97, 26
"""Emulated token ids: 'a'..'z' in any byte or BPE vocabulary, so the driver's traces and tables decode them."""


def tokens(seed: int, row: int, start: int, stop: int) -> list[int]:
    """Token ids of `row` at positions start..stop-1: a pure function of (seed, row, position)."""
    off = mix(seed, row, 1)
    return [TOKEN_BASE + (off + 7 * t) % TOKEN_SPAN for t in range(start, stop)]


def setup_for(cfg, scratch: Path, steps: int) -> dict:
    """The driver's part: write the length table once into the scratch folder; the worker setup's `emulated`."""
    from rlhfless.tasks.config import make_task

    # replay is keyed by prompt: the train split's size places each draw in its epoch (`sim.devicemodel`)
    table = build_table(cfg, steps, n_train=len(make_task(cfg.task).splits()[0]))
    path = scratch / "emulated-lengths.json"
    table.save(path)
    a, rt = cfg.algo, cfg.runtime
    require(rt.emulated_engine == "tuned" or a.name == "grpo", "runtime.emulated_engine",
            "paper is built for GRPO only (verl's paper-settings engine for PPO is not modelled)")
    return {"table": str(path), "time_scale": rt.time_scale, "algo": a.name, "G": a.group_size,
            "engine": rt.emulated_engine, "learners": rt.learners(),
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "skip_zero_variance": bool(getattr(a, "skip_zero_variance_groups", False)),
            **({"ppo_epochs": a.ppo_epochs, "ppo_steps": ppo_steps(cfg)} if a.name == "ppo" else {})}


def ppo_steps(cfg) -> int:
    """PPO's optimiser steps per update (actor and critic alike): epochs x mini-batches (`ppo_update.ppo_schedule`)."""
    a = cfg.algo
    return a.ppo_epochs * min(a.ppo_mini_batches, cfg.rollout.prompts_per_step * a.group_size)


# ---- the worker ------------------------------------------------------------------------------------------
class Clock:
    """Sleeps modelled seconds, scaled, against a deadline: work done in between is absorbed, not added."""

    def __init__(self, scale: float, t0: float | None = None):
        self.scale, self.deadline = scale, now() if t0 is None else t0

    def start(self) -> None:
        self.deadline = max(self.deadline, now())

    def sleep(self, modelled_s: float) -> None:
        self.deadline += modelled_s * self.scale
        left = self.deadline - now()
        if left > 0:
            time.sleep(left)


class _Row:
    __slots__ = ("row", "target", "done", "answer", "pid")

    def __init__(self, row: int, target: int, done: int, pid: str | None = None):
        self.row, self.target, self.done, self.pid = row, target, done, pid


class _Job:
    """One emulated decode invocation's rows (the emulated `runtime.devices.decoding._Job`)."""

    def __init__(self, w: EmulatedWorker, step: int, seed: int):
        self.w, self.step, self.seed = w, step, seed
        self.rows: list[_Row] = []
        self.reported: set[int] = set()
        self.prefill = [0, 0, 0.0]  # prompt tokens computed, naive tokens, seconds (real)
        self.adopted = self.n_cut = self.iterations = 0

    def add(self, items: list[dict]) -> None:
        """Rows in: a fresh group's G rows share one prefill of its prompt; a migrated row re-prefills its prompt
        and partial response. Sleeps the prefill's modelled seconds."""
        w, tok, naive = self.w, 0, 0
        for it in items:
            plen, prefix = len(it["prompt"]), it.get("prefix")
            tok += plen if prefix is None else sum(plen + len(x) for x in prefix)
            for k, r in enumerate(it["rows"]):
                done = len(prefix[k]) if prefix is not None else 0
                naive += plen + done
                pid = it.get("pid")  # the lengths and reward of this prompt's visit (`sim.devicemodel`)
                self.rows.append(_Row(r, w.table.length(self.step, r, w.G, w.cap, pid), done, pid))
            self.adopted += len(it["rows"]) if prefix is not None else 0
        s = tok * w.tm.prefill_s_per_token
        self.prefill = [self.prefill[0] + tok, self.prefill[1] + naive, self.prefill[2] + s * w.clock.scale]
        w.clock.sleep(s)

    def live(self) -> list[_Row]:
        return [x for x in self.rows if x.done < x.target]

    def finished(self) -> list[list]:
        """Finished rows not reported yet, as the real decode's results: [row, tokens, truncated, reward, correct,
        well_formed]."""
        w, out = self.w, []
        for x in self.rows:
            if x.done >= x.target and x.row not in self.reported:
                self.reported.add(x.row)
                rw = w.table.reward(self.step, x.row, w.G, self.seed, x.pid)
                out.append([x.row, tokens(self.seed, x.row, 0, x.target), x.target >= w.cap, rw, rw > 0, True])
        return out

    def cut(self) -> list[list]:
        """Hand over every unfinished row with its tokens so far; the invocation then ends."""
        out = [[x.row, tokens(self.seed, x.row, 0, x.done)] for x in self.live()]
        self.rows = [x for x in self.rows if x.done >= x.target]
        self.n_cut = len(out)
        return out


class EmulatedWorker:
    """`worker.Worker`'s requests on an emulated device (docs/internals.md#runtimedevicesemulatedpy)."""

    def __init__(self, setup: dict):
        e = setup["emulated"]
        self.setup, self.kinds = setup, tuple(setup["kinds"])
        self.table = LengthTable.load(e["table"])
        self.pool_worker = bool(setup.get("dist"))  # the serverful pool: colocated, updates its replica in place
        eng = engine_of(self.table, paper=self.pool_worker and e.get("engine") == "paper")
        self.perf, self.tm, self.capacity, self.tp, self.kv_s = eng.pm, eng.tm, eng.capacity, eng.tp, eng.kv_s
        self.G, self.algo, self.cap = e["G"], e["algo"], e["max_new_tokens"]
        self.skip_zero = e["skip_zero_variance"]
        # the modelled cold start (container, engine, weights) runs from the request: the fork is part of it
        self.clock = Clock(e["time_scale"], setup.get("spawned_t"))
        self.version = setup.get("version", 0)
        self.deferred: list[dict] = []
        self.update: dict | None = None
        # PPO: the critic's version (the pool's holder starts at the runtime's), the value forward's chunks, the
        # old log-probs computed ahead, the optimiser steps per update (one per mini-batch)
        holds = "critic" in self.kinds or setup.get("holds_critic")  # loaded at its cold start, as the real one
        self.critic_version = setup.get("critic_version", -1) if holds else -1
        self.values_step: dict | None = None
        self.ppo_old: dict | None = None
        self.epochs, self.minibatches = e.get("ppo_epochs", 1), e.get("ppo_steps", 1)
        self.fwd_tok, self.train_tok = ppo_split(self.perf)
        # a GRPO learner rank resuming a trained policy reads its optimiser shard too (none exists before step 1)
        resumes = self.algo == "grpo" and setup.get("role") == "learner" and self.version > 0
        self.clock.sleep(cold_start_s(self.perf, self.kinds, e.get("learners", 1) if resumes else 0))

    def _sync(self, msg: dict) -> float:
        """A replica behind the step's version loads it over the network (serverless), or reshards it from the
        colocated actor (a serverful pool worker that did not run PPO's actor)."""
        if not msg.get("state_path") or msg["version"] == self.version:
            return 0.0
        t0 = now()
        self.clock.start()
        self.clock.sleep(self.perf.weight_sync_s(colocated=self.pool_worker))
        self.version = msg["version"]
        return now() - t0

    handle = ops.dispatch  # the one op table (`devices.ops`), as `worker.Worker`'s

    def unsupported(self, op: str) -> Exception:
        return ConfigError(f"runtime.device=emulated: request {op!r} is not emulated (prefill and profile "
                           "functions are not built yet)")

    def op_decode(self, msg: dict, conn) -> dict:  # decode and adopt
        return self._decode(msg, conn, self._sync(msg))

    def op_cut(self, msg: dict, conn) -> dict:
        return ops.late_cut(msg)

    def op_learn_begin(self, msg: dict, conn) -> None:
        t0 = now()
        sync_s = self._sync(msg)
        # busy / group_busy: the intervals it computed in, as the real rank reports them (`worker.op_learn_begin`)
        self.update = {"t_start": now(), "sync_s": sync_s, "compute_s": 0.0, "group_busy": [],
                       "busy": [[t0, now()]] if sync_s > 0 else []}
        return None

    def op_ppo(self, msg: dict, conn) -> dict | None:  # emulated with the simulator's split of PPO's learner time
        return getattr(self, "_" + msg["op"])(msg, conn)

    # -- decode ---------------------------------------------------------------------------------------------
    def _decode(self, msg: dict, conn, sync_s: float) -> dict:
        """The decode contract of `runtime.devices.decoding.run_decode`, on modelled time
        (docs/internals.md#runtimedevicesemulatedpy)."""
        t0 = now()
        self.clock.start()
        job = _Job(self, msg["step"], msg["seed"])
        job.add(msg["items"])
        step = msg["step"]
        while job.live():
            job.iterations += self._advance(job.rows, msg.get("progress_every", 8))
            if msg.get("stream", False):  # finished rows go out at once, as the real decode streams them
                out = job.finished()
                if out:
                    wire.send(conn, {"op": "rows", "step": step, "t": now(), "results": out})
            if msg.get("report", False):
                live = job.live()
                wire.send(conn, {"op": "progress", "step": step, "t": now(), "finished": len(job.rows) - len(live),
                                 "unfinished": [[x.row, x.done] for x in live]})
            while conn.poll():
                ctl = wire.recv(conn)
                if ctl["op"] == "cut":
                    wire.send(conn, {"op": "cut_rows", "step": step, "rows": job.cut(), "t": now()})
                elif ctl["op"] == "adopt":
                    job.add(ctl["items"])
                else:  # not for this decode (a learner's group, shutdown): served after it, in order
                    self.deferred.append(ctl)
        t_decode = now()
        return {"op": "done", "step": step, "t_start": t0, "t_decode_end": t_decode, "t_end": now(),
                "sync_s": sync_s, "reward_s": 0.0, "results": job.finished(), "prefill": job.prefill,
                "adopted": job.adopted, "cut": job.n_cut, "iterations": job.iterations, "engine": "emulated"}

    def _advance(self, rows: list[_Row], n: int) -> int:
        """Up to n iterations of continuous batching (the first `capacity` unfinished rows run, FIFO); sleeps
        their modelled seconds; returns the iterations run."""
        live = [x for x in rows if x.done < x.target]
        left = np.array([x.target - x.done for x in live], dtype=np.int64)
        cap = self.capacity
        k = 0
        total = 0.0
        while k < n and left.size and (left > 0).any():
            active = np.flatnonzero(left > 0)[:cap]
            total += float(self.tm.iter_seconds(len(active)))
            left[active] -= 1
            k += 1
        for x, rem in zip(live, left.tolist()):
            x.done = x.target - rem
        self.clock.sleep(total)
        return k

    # -- learner --------------------------------------------------------------------------------------------
    def _group_tokens(self, path: str) -> tuple[int, list[float]]:
        from safetensors.numpy import load_file

        t = load_file(path)
        resp_o, prom_o = t["resp_offsets"], t["prompt_offsets"]
        n_resp, plen = len(resp_o) - 1, int(prom_o[-1])
        return int(resp_o[-1]) + plen * n_resp, t["rewards"].tolist()

    def op_learn_group(self, msg: dict, conn=None) -> None:
        t0 = now()
        self.clock.start()
        tok, rewards = self._group_tokens(msg["batch"])
        if not (self.skip_zero and len(set(rewards)) <= 1):
            self.clock.sleep(self.perf.learner_s_per_token(self.algo) * tok / self.tp)  # on its TP devices
        self.update["compute_s"] += now() - t0
        self.update["group_busy"].append([t0, now()])
        self.update["busy"].append([t0, now()])
        return None

    def _world(self, msg: dict) -> int:
        """The learner's data-parallel ranks this update: the share's world (serverless), the group's (a
        rendezvous per update), or the pool's (formed when the workers started)."""
        for d in (msg.get("share"), msg.get("dist"), self.setup.get("dist")):
            if d:
                return int(d["world"])
        return 1

    def op_learn_end(self, msg: dict, conn=None, exchange: bool = True) -> dict:
        t_end0 = now()
        if msg.get("share"):
            return self._learn_share(msg, t_end0)
        dist = msg.get("dist")
        if dist and dist.get("announce") and dist["rank"] == 0 and conn is not None:
            wire.send(conn, {"op": "rendezvous_open", "step": msg["step"]})
        self.clock.start()
        opt = self.perf.update_fixed_s(self.algo)
        if exchange:  # every rank of the pool spends the gradient all-reduce (the reducer's was its share's)
            opt += self.perf.grad_exchange_s(self._world(msg))
        if self.pool_worker:  # verl's colocated resharding of the new weights into the rollout engine (and with
            opt += self.perf.weight_sync_s(colocated=True) + self.kv_s  # the paper engine, its KV's sleep and wake)
        self.clock.sleep(opt)
        self.version = msg["version"] + 1
        if msg.get("state_out"):  # weights never change: the next version is the same file
            out = Path(msg["state_out"])
            out.unlink(missing_ok=True)
            os.link(msg["state_path"], out)
        return self._learned(msg, t_end0)

    def _learned(self, msg: dict, t_end0: float, **extra) -> dict:
        """The `learned` reply of the update that ends now (its groups' compute, and `[t_end0, now]` busy)."""
        info = self.update or {"t_start": t_end0, "sync_s": 0.0, "compute_s": 0.0, "group_busy": [], "busy": []}
        self.update, t_end = None, now()
        return {"op": "learned", "step": msg["step"], "t_start": info["t_start"], "t_end": t_end,
                "sync_s": info["sync_s"], "compute_s": info["compute_s"], "buffered_peak": 0, "metrics": {},
                "busy": info["busy"] + [[t_end0, t_end]], "group_busy": info["group_busy"], **extra}

    def _learn_share(self, msg: dict, t_end0: float) -> dict:
        """The serverless learner's end, as `worker._learn_share`: `share.out`, a rank writes its share and is free
        at once (its replica stays at the step's version); `share.shares`, the last rank in syncs if behind and
        steps. A share costs the rank its part of the gradient exchange (`PerfModel.grad_exchange_s` over the
        share's world: the all-reduce a real data-parallel rank sits in, charged per rank); the optimiser step's
        `update_fixed_s` the reducer alone pays (as the reducer alone steps); the share file holds nothing (no
        weights or gradients exist)."""
        sh = msg["share"]
        if sh.get("out"):
            self.clock.start()
            self.clock.sleep(self.perf.grad_exchange_s(self._world(msg)))  # its part of the all-reduce
            Path(sh["out"]).write_bytes(b"")
            return self._learned(msg, t_end0, shared=sh["out"])
        sync_s = self._sync(msg)
        self.update = {"t_start": t_end0, "sync_s": sync_s, "compute_s": 0.0, "group_busy": [],
                       "busy": [[t_end0, now()]] if sync_s > 0 else []}
        reply = self.op_learn_end({k: v for k, v in msg.items() if k not in ("share", "dist")}, None,
                                  exchange=False)
        return {**reply, "shared": None}

    def op_reference(self, msg: dict, conn=None) -> dict:
        from safetensors.numpy import load_file, save_file

        t0 = now()
        self.clock.start()
        t = load_file(msg["batch"])
        resp_o, prom_o = t["resp_offsets"], t["prompt_offsets"]
        lens = np.diff(resp_o)
        tok = int(resp_o[-1]) + int(prom_o[-1]) * self.G
        self.clock.sleep(self.perf.forward_s(tok, self.tp))
        tmp = msg["out"] + ".tmp"
        save_file({"ref_logp": np.zeros((len(lens), int(lens.max(initial=1))), np.float32)}, tmp)
        os.replace(tmp, msg["out"])
        return {"op": "referenced", "t_start": t0, "t_end": now()}

    # -- PPO: the value function, the actor and the critic (`runtime.devices.ppo_worker`'s contract) -------------------
    def _batch_tokens(self, path: str) -> tuple[int, int]:
        """(prompt + response tokens of every row, rows) of a batch file, as `_reference` counts them."""
        from safetensors.numpy import load_file

        t = load_file(path)
        resp_o, prom_o = t["resp_offsets"], t["prompt_offsets"]
        rows = len(resp_o) - 1
        groups = len(prom_o) - 1
        return int(resp_o[-1]) + int(prom_o[-1]) * (rows // max(groups, 1)), rows

    def _sync_critic(self, msg: dict) -> float:
        """A critic behind the step's version loads it over the network (serverless; the pool's holder updated
        its own in place)."""
        if msg["critic_version"] == self.critic_version:
            return 0.0
        t0 = now()
        self.clock.start()
        self.clock.sleep(self.perf.weight_sync_s(colocated=False))
        self.critic_version = msg["critic_version"]
        return now() - t0

    def _link(self, src: str, dst: str) -> None:
        """Weights never change: the next version's state file is the same file."""
        out = Path(dst)
        out.unlink(missing_ok=True)
        os.link(src, out)

    def _values_chunk(self, msg: dict, conn) -> None:
        """The value forward of one chunk: `ppo_fwd_s` x its tokens (the critic's forward, as the reference's)."""
        t0 = now()
        st = self.values_step
        if st is None or st["step"] != msg["step"]:
            st = self.values_step = {"step": msg["step"], "parts": {}, "t_start": t0, "sync_s": 0.0,
                                     "compute_s": 0.0}
        st["sync_s"] += self._sync_critic(msg)
        t1 = now()
        self.clock.start()
        tok, rows = self._batch_tokens(msg["batch"])
        self.clock.sleep(self.fwd_tok * tok)
        st["parts"][msg["k"]] = rows
        st["compute_s"] += now() - t1
        return None

    def _values_end(self, msg: dict, conn) -> dict:
        from safetensors.numpy import save_file

        st = self.values_step
        rows = sum(st["parts"].values())
        tmp = msg["out"] + ".tmp"  # zeros: the values only feed the (emulated) actor and critic
        save_file({"values": np.zeros((rows, self.cap), np.float32)}, tmp)
        os.replace(tmp, msg["out"])
        self.values_step = None
        return {"op": "valued", "step": msg["step"], "t_start": st["t_start"], "t_end": now(),
                "sync_s": st["sync_s"], "compute_s": st["compute_s"]}

    def _ppo_old(self, msg: dict, conn) -> None:
        """The old log-probs ahead: one actor forward over the batch."""
        t0 = now()
        sync_s = self._sync(msg)
        self.clock.start()
        self.clock.sleep(self.fwd_tok * self._batch_tokens(msg["batch"])[0])
        self.ppo_old = {"step": msg["step"], "t_start": t0, "sync_s": sync_s}
        return None

    def _ppo_actor(self, msg: dict, conn) -> dict:
        """The actor: its forward (unless the old log-probs came ahead), the returns announced, then
        `ppo_train_s_per_token` x tokens and one optimiser step per mini-batch (+ the pool's resharding)."""
        pre, self.ppo_old = self.ppo_old, None
        pre = pre if pre is not None and pre["step"] == msg["step"] else None
        t0 = pre["t_start"] if pre else now()
        sync_s = (pre["sync_s"] if pre else 0.0) + self._sync(msg)
        tok, _ = self._batch_tokens(msg["batch"])
        world = msg.get("world", 1)
        self._group_barrier(msg)
        self.clock.start()
        if pre is None:  # several ranks split the forward (`ppo_update.shard_old_logprobs`)
            self.clock.sleep(self.fwd_tok * tok / world)
        if msg.get("rank", 0) == 0:
            Path(msg["returns_out"]).write_bytes(b"")  # the critic reads nothing from it
            wire.send(conn, {"op": "ppo_returns", "step": msg["step"], "returns": msg["returns_out"]})
        opt = self._rank_steps(tok, world)
        if self.pool_worker:  # verl's colocated resharding of the new weights into the rollout engine
            opt += self.perf.weight_sync_s(colocated=True)
        self.clock.sleep(opt)
        if msg.get("rank", 0) == 0:
            self._link(msg["state_path"], msg["state_out"])
        self.version = msg["version"] + 1
        return {"op": "ppo_learned", "step": msg["step"], "t_start": t0, "t_end": now(), "sync_s": sync_s,
                "old_ahead": pre is not None, "metrics": {}}

    def _group_barrier(self, msg: dict) -> None:
        """Several ranks: wait until every rank of this group has arrived (a file each in the scratch folder), as a
        real rank waits in its first collective for the last one to start (a cold one); the ranks then sleep the same
        modelled work and end together. The group is the update's (`dist`, serverless) or the pool's (its port:
        a restarted pool is a new group); a dead peer's role is stopped and re-run by the driver."""
        world = msg.get("world", 1)
        if world <= 1:
            return
        group = (msg.get("dist") or self.setup.get("dist") or {}).get("port")
        d = Path(msg["batch"]).parent / f"ppo-group-{msg['op']}-{msg['step']}-{group}"
        d.mkdir(exist_ok=True)
        (d / str(msg["rank"])).write_bytes(b"")
        while len(list(d.iterdir())) < world:
            time.sleep(0.002)

    def _rank_steps(self, tok: int, world: int) -> float:
        """One rank's optimiser steps of a PPO model over `world` data-parallel ranks (`devicemodel.ppo_update_s`:
        its share of the training tokens, each step's fixed cost and gradient exchange, charged per rank)."""
        return ppo_update_s(self.perf, tok, world, self.epochs, self.minibatches)

    def _critic_learn(self, msg: dict, conn) -> dict:
        """The critic: `ppo_train_s_per_token` x tokens and one optimiser step per mini-batch."""
        t0 = now()
        sync_s = self._sync_critic(msg)
        self._group_barrier(msg)
        self.clock.start()
        tok, _ = self._batch_tokens(msg["batch"])
        self.clock.sleep(self._rank_steps(tok, msg.get("world", 1)))
        if msg.get("rank", 0) == 0:
            self._link(msg["critic_state"], msg["critic_out"])
        self.critic_version = msg["critic_version"] + 1
        return {"op": "critic_learned", "step": msg["step"], "t_start": t0, "t_end": now(), "sync_s": sync_s,
                "metrics": {}}

    def close(self) -> None:
        pass


def serve(conn, setup: dict) -> None:
    """`worker.main` for an emulated device: no pinning, no torch; the same request loop."""
    wire.serve(EmulatedWorker(setup), conn)
