"""The runtime: a step's stages executed by worker processes, as the mode's policy decides, and metered.

`Runtime(cfg, mode, learner)` starts the platform and, for serverful, the pool; per step `begin_step`, `rollout`,
`reference`, `values` (PPO), `learn`, then `end_step` -> metrics; `off_clock()` wraps driver work between steps
(billed to neither mode); `release()` / `cleanup()` end the run. Decode is in `runtime.stages`, PPO's stages in
`runtime.ppo_stages`. The rule it keeps: weights move only as the learner's state file `learner-v<k>.safetensors`
(k = updates done), kept until the next version is written, so a killed learner is re-run from it exactly.
Each method and the weight loads: docs/internals.md#runtimeexecutorpy.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from rlhfless.config import RunConfig
from rlhfless.core import metrics as M
from rlhfless.core.rundir import RunDir
from rlhfless.plan.billing import BILLED, BillingRules
from rlhfless.plan.cost import price
from rlhfless.plan.ranks import hold_after_share, next_work_after_share
from rlhfless.runtime import wire
from rlhfless.runtime.platform.backend import LocalBackend, WorkerDied
from rlhfless.runtime.meter import bill_run, bill_window, billing_rules, usage_metrics, usage_window
from rlhfless.runtime.context import StepContext
from rlhfless.runtime.modes.policy import History, policy_for, prewarm_decode, prewarm_learner
from rlhfless.runtime.platform.pool import Pool
from rlhfless.runtime.records import (CRITIC_IMAGE, HYBRID, KINDS_ALL, InvocationRecord, fail, now, peak_units, role,
                                      zero_held)


RUNTIME_HOOKS: list = []
"""Callables given each new Runtime once it is up (the fault bench attaches its chaos thread here)."""



TIME_SCALE_ALPHA = 0.3
"""Weight of the newest step's measured / predicted decode busy time in the planner's time-model scale (EWMA):
recent enough to follow a machine whose load changes, smooth enough that one odd step does not swing the plan."""


def smoothed_scale(scale: float | None, ratio: float) -> float:
    """The time-model scale after one more step's measured / predicted ratio (the first step's ratio as is)."""
    return ratio if scale is None else (1 - TIME_SCALE_ALPHA) * scale + TIME_SCALE_ALPHA * ratio

class Runtime:
    def __init__(self, cfg: RunConfig, mode: str, learner, out: Path, reference_checkpoint: Path | None = None,
                 planner=None, env=None, progress: bool = False, critic=None):
        from rlhfless.learn.learner import save_learner_state
        from rlhfless.step.textenv import make_env
        from rlhfless.runtime.devices.dist import reserve_port

        self._reserve_port = reserve_port
        self.cfg, self.rt, self.mode, self.out = cfg, cfg.runtime, mode, out
        self.policy = policy_for(mode)  # every decision that differs by mode (runtime.modes.policy.ModePolicy)
        self.hybrid = self.policy.hybrid_image(self.rt.hybrid)
        self.planner = planner
        self.env = env if env is not None else make_env(cfg)
        self.units = self.rt.resolved_units()
        self.backend = self._backend()
        self.platform_start_s = self.backend.boot()
        setup = {"config": json.loads(json.dumps(asdict(cfg), default=list)),
                 "checkpoint": str(cfg.policy.resolved()),
                 "reference_checkpoint": str(reference_checkpoint or cfg.policy.resolved())}
        if self.rt.device == "cuda":  # units are GPU slots; each worker makes only its GPUs visible
            from rlhfless.runtime.devices.gpus import GpuLayout, visible_gpus

            setup["gpu_layout"] = GpuLayout(tuple(visible_gpus()), self.rt.functions_per_gpu).to_json()
        self.scratch = wire.scratch_dir(base=self.rt.scratch_dir or None)
        if self.rt.device == "emulated":  # units are emulated GPUs: the planner prices with their model
            self.time_profile, self.profile_measured_s = self._use_emulated(setup), 0.0
        else:
            self.time_profile, self.profile_measured_s = self._use_measured_profile(setup, progress)
        self.planner_time_model = planner.time_model if planner is not None else cfg.plan.time_model()
        self.version = learner.updates
        save_learner_state(learner, self.state_path(self.version))
        self.ppo = cfg.algo.name == "ppo"
        if self.ppo:  # the critic moves between its functions as a state file, like the policy
            from rlhfless.learn.critic import save_critic_state

            save_critic_state(critic, self.critic_path(self.version))
        self.t0 = now()
        self.rules = billing_rules(self.rt)
        self.keep_alive_s = self.rt.idle_timeout_s()
        """Idle seconds before a serverless function is released (runtime.keep_alive_s or the billing preset's)."""
        self.pool = Pool(self.backend, setup, self.t0, self.units, self.policy.keep_alive(self.keep_alive_s))
        self.stage_t0: float | None = None  # this step's rollout start: releases after it are mid-step
        self._expired_seen = 0  # releases at a lapse already counted in a step's metrics
        self._early_seen = 0  # learner ranks released at their share already counted
        self.invocations: list[InvocationRecord] = []
        self._written = 0
        self.history = History()
        self.price = price(cfg.plan.gpu_kind)
        self.step_t0 = self.t0
        self.step_t1: float | None = self.t0  # step 1's window opens when the runtime does (pool start included)
        self.totals: dict[str, float] = {}
        self.paused: list[tuple[float, float]] = []  # run-relative intervals off the clock (`off_clock`)
        self.time_scale: float | None = None  # measured / predicted decode busy time, smoothed
        self.steps_done = 0
        self.last_learn_end: float | None = None
        self.counters: dict[str, float] = {}
        self.decode_prewarm = 0
        self.learners: list = []
        self.stream = None  # this step's LearnerStream (runtime.streaming), from the rollout to the update
        self.reference_worker = None
        self._invoked: set[str] = set()
        if self.policy.holds_pool:  # W workers for the whole run, started before step 1's clock
            self._start_pool()
        for hook in RUNTIME_HOOKS:
            hook(self)

    def _use_emulated(self, setup: dict) -> str:
        """runtime.device=emulated: the length table into the scratch folder, the workers' `emulated` setup, and
        the planner's time model = the one the emulated workers sleep by (`runtime.devices.emulated`)."""
        from rlhfless.runtime.devices import emulated

        setup["emulated"] = emulated.setup_for(self.cfg, self.scratch, self.cfg.train.steps)
        table = emulated.LengthTable.load(setup["emulated"]["table"])
        self.out.mkdir(parents=True, exist_ok=True)
        table.save(RunDir(self.out).emulated_lengths)  # what `sim.modelled` validates the run with
        tm = emulated.time_model(table)
        if self.planner is not None:  # the emulated replica's time model and KV slots, as the simulator sizes them
            from dataclasses import replace

            self.planner.use_profile(tm)
            self.planner.cfg = replace(self.planner.cfg, capacity=table.capacity)
        return tm.source

    def _use_measured_profile(self, setup: dict, progress: bool) -> tuple[str | None, float]:
        """Hand the planner this machine's decode-time profile for one-unit workers, from the cache or measured
        now in a worker (platform set-up before the run's clock starts: not billed); (its path, seconds measuring).
        Off with runtime.measure_profile=false, without a planner, and for vLLM decode (rlhfless.runtime.devices.profile)."""
        if self.planner is None or not self.rt.measure_profile or self.cfg.rollout.engine != "own":
            return None, 0.0
        from rlhfless.runtime.devices import profile as P

        key = P.profile_key(self.cfg, threads=1)  # a worker holds one unit: one torch thread
        path = P.cache_path(P.cache_dir(self.rt.profile_cache), key)
        measured_s, found = 0.0, P.read_cached(path, key)
        if found is None:
            found, measured_s = P.measure_in_worker(self.backend, setup, (0,), progress, self.rt.invocation_timeout_s,
                                                    self.cfg.rollout.max_new_tokens)
            P.write_cached(path, key, found, measured_s)
        self.planner.use_profile(P.time_model(found, self.planner.base_time_model, str(path)))
        P.save_for_run(found, self.out)
        return str(path), measured_s

    def _backend(self):
        if self.rt.backend == "ray":
            from rlhfless.runtime.platform.raybackend import RayBackend

            return RayBackend(self.rt.ray_address, self.units, self.rt.start_method)
        # CUDA cannot be used in a process forked from one that initialised it (this driver may have: train.device),
        # so GPU workers start as fresh interpreters and pay the imports in their cold start
        method = "spawn" if self.rt.device == "cuda" else self.rt.start_method
        return LocalBackend(method, wire.preload(self.cfg.rollout.engine, self.rt.device))

    # -- what a stage is given, and the run state it reads and changes through methods --------------------------
    def context(self, step: int) -> StepContext:
        """Step `step`'s view of the run for its stages (`runtime.context`)."""
        return StepContext(step, self.cfg, self.rt, self.policy, self.pool, self.backend, self.scratch,
                           self.keep_alive_s, self.hybrid, self.planner, self.planner_time_model, self.env.tok, self)

    def set_decode_prewarm(self, n: int) -> None:
        """How many decode functions this step ran: the next step's decode pre-warm starts as many."""
        self.decode_prewarm = n

    def kept_reference(self):
        """The reference function kept warm from an earlier step, if it is still in the pool."""
        h = self.reference_worker
        return h if h and h.worker in self.pool.handles else None

    def keep_reference(self, h) -> None:
        """Remember h as the reference function to reuse (None: none is kept)."""
        self.reference_worker = h

    def active_stream(self):
        """This step's learner stream between the rollout and the update, else None."""
        return self.stream

    def pool_workers(self) -> list:
        """The held pool's workers in rank order (a policy that holds a pool)."""
        return self.pool_handles

    def has_learners(self) -> bool:
        return bool(self.learners)

    def kept_learners(self) -> list:
        """Learner functions of the last step still in the pool (their data-parallel group may be reused)."""
        return [h for h in self.learners if h.worker in self.pool.handles]

    def add_learner(self, h) -> None:
        self.learners.append(h)

    def drop_learner(self, h) -> None:
        self.learners = [x for x in self.learners if x is not h]

    def forget_learners(self) -> None:
        self.learners = []

    def cold_start(self, kind: str, default: float) -> float:
        """The recent measured cold start of `kind` (`default` before any)."""
        return self.history.cold(kind, default)

    def observe_rollout(self, seconds: float, makespan_s: float) -> None:
        """A rollout took `seconds` against the plan's predicted makespan (0: no plan): the pre-warm rules' input."""
        self.history.rollout_s.append(seconds)
        if makespan_s > 0:
            self.history.rollout_vs_plan.append(seconds / makespan_s)

    def learner_prewarm_after(self, predicted_makespan_s: float) -> float | None:
        """Seconds after the rollout's start at which to start the learner ranks (None: not pre-warmed, also when
        last step's learners are still warm)."""
        if not self.policy.prewarms(self.rt.prewarm) or self.learners:
            return None
        return prewarm_learner(self.history, predicted_makespan_s, self.cfg.plan.cold_start_s,
                               self.rt.prewarm_buffer_s, self.rt.prewarm_from).after_s

    def next_work_after_share(self) -> float | None:
        """Expected seconds from a rank's share to its function's next work (`plan.ranks`), from history."""
        return next_work_after_share(list(self.history.share_tail_s), list(self.history.between_s))

    def holds_after_share(self) -> bool:
        """Whether a rank whose share is in is held to the update's end (`plan.ranks.hold_after_share`), from
        the recent tails, driver gaps and measured decode cold starts. The longest recent tail: a function not held
        that lapses costs a cold start, one held that would have stayed warm costs at most its tail (the shortest,
        as `next_work_after_share` reads, let 14 of 16 lapse on the emulated 3B testbed: its tail ran past the
        keep-alive that step)."""
        tails, between = self.history.share_tail_s, self.history.between_s
        return hold_after_share(max(tails) if tails else None, min(between) if between else None,
                                self.keep_alive_s or 0.0, self.history.cold("decode", self.cfg.plan.cold_start_s))

    def observe_share_tail(self, seconds: float) -> None:
        self.history.share_tail_s.append(seconds)

    def updates_done(self) -> int:
        """The state version: optimiser steps done so far."""
        return self.version

    def next_state_path(self) -> Path:
        return self.state_path(self.version + 1)

    def next_critic_path(self) -> Path:
        return self.critic_path(self.version + 1)

    def decode_busy_s(self, step: int) -> float:
        """Busy seconds of the step's decode invocations that succeeded."""
        return sum(i.busy_s for i in self.invocations if i.step == step and i.kind == "decode" and i.ok)

    # -- helpers ------------------------------------------------------------------------------------------------
    def state_path(self, version: int) -> Path:
        return self.scratch / f"learner-v{version}.safetensors"

    def critic_path(self, version: int) -> Path:
        return self.scratch / f"critic-v{version}.safetensors"

    def rel(self, t: float) -> float:
        return t - self.t0

    def poll(self, handles: list, timeout: float | None):
        """`backend.poll`, its timeout capped at the next keep-alive lapse, then the lapsed idle workers released:
        keep-alive is an event inside every stage's wait, mid-step included (`Pool.expire`)."""
        lapse = self.pool.next_lapse()
        if lapse is not None:
            wait = max(0.0, lapse - now())
            timeout = wait if timeout is None else min(timeout, wait)
        out = self.backend.poll(handles, timeout)
        self.pool.expire()
        return out

    def count(self, key: str, n: float = 1.0) -> None:
        self.counters[key] = self.counters.get(key, 0.0) + n

    def record(self, step: int, kind: str, h, requested: float, started: float, finished: float, cold: bool,
               attempt: int = 1, ok: bool = True, groups: list[int] | None = None, engine: str = "",
               busy: list | None = None, **extra) -> None:
        """One invocation; `busy`: its compute intervals (monotonic clock) when it did not compute throughout."""
        started = max(started, requested)
        spans = [[self.rel(a), self.rel(b)] for a, b in busy or [] if b > a]
        self.invocations.append(InvocationRecord(step, kind, h.worker, float(len(h.cores)), self.rel(requested),
                                                 self.rel(started), self.rel(max(finished, started)), cold,
                                                 attempt, ok, {k: float(v) for k, v in extra.items()},
                                                 sorted(groups or []), engine, spans))

    def first_use(self, h) -> bool:
        """True the first time a worker is invoked (its invocation carries the cold start)."""
        if h.worker in self._invoked:
            return False
        self._invoked.add(h.worker)
        return True

    def state_setup(self) -> dict:
        return {"state_path": str(self.state_path(self.version)), "version": self.version}

    def critic_setup(self) -> dict:
        """PPO: where the critic of this step's version is (`runtime.devices.ppo_worker.sync_critic`)."""
        return {"critic_state": str(self.critic_path(self.version)), "critic_version": self.version}

    # -- workers ------------------------------------------------------------------------------------------------
    def _start_pool(self) -> None:
        """Serverful: W colocated workers, one core each, one data-parallel group, held until close(). The
        rendezvous port is reserved until the group has formed (`dist.reserve_port`); a worker that dies while
        starting anyway fails the attempt: the others are stopped and the group forms again on a new port."""
        W = self.rt.workers()
        for attempt in range(1, self.rt.max_attempts + 1):
            port, held = self._reserve_port()
            # W <= units (check_machine): one unit each; PPO's critic lives on the last worker (`ppo_stages`)
            hs = [self.pool.start(KINDS_ALL, (r,), {**self.state_setup(), "dist": self.dist_spec(r, W, port),
                                                    **(self._critic_holder() if self.ppo and r == W - 1 else {})})
                  for r in range(W)]
            try:
                self.pool.await_ready(hs)
            except WorkerDied as died:
                for h in hs:
                    self.pool.dead(h) if h is died.handle else self.pool.stop(h)
                continue
            finally:
                held.close()
            self.pool_handles = hs
            return
        raise fail("the serverful pool's start", self.rt.max_attempts)

    def _critic_holder(self) -> dict:
        return {"holds_critic": True, **self.critic_setup()}

    def dist_spec(self, rank: int, world: int, port: int) -> dict:
        return {"rank": rank, "world": world, "port": port, "timeout_s": min(60.0, self.rt.invocation_timeout_s)}

    def restart_pool(self, dead=None) -> None:
        """Serverful recovery: a pool worker (`dead`, if the caller has not reaped it yet) died, so the whole
        data-parallel pool restarts from the last state. The survivors are stopped at once, not asked to shut down:
        their work is redone anyway, and a busy one would read `shutdown` only after its decode (or, inside the
        broken all-reduce, only at gloo's timeout) while holding the unit its replacement needs. The caller
        counts the retry (one per death)."""
        for h in self.pool_handles:
            if h.worker in self.pool.handles:
                self.pool.dead(h) if h is dead or not h.alive else self.pool.stop(h)
        self._start_pool()

    def claim(self, must: bool) -> tuple[int, ...] | None:
        """A free unit for a new function. `must` (work is waiting for it): idle workers are evicted first, then a
        learner rank that only waits for groups (it restarts later from the same inputs); otherwise None."""
        cores = self.pool.claim(1)
        if cores is None and must:
            self.pool.make_room(1)
            cores = self.pool.claim(1)
            if cores is None and self.stream is not None and self.stream.preempt():
                cores = self.pool.claim(1)
            if cores is None:
                raise RuntimeError(f"runtime: all {self.units} units are busy and a function must start "
                                   "(a bug: the runtime never holds more functions than runtime.units)")
        return cores

    def image(self, kind: str) -> tuple[str, ...]:
        """The kinds a new decode or learner function can run: both with the hybrid image (runtime.hybrid)."""
        return HYBRID if self.hybrid else (kind,)

    def start_learner(self, prewarmed: bool):
        """One learner rank onto a free unit (not pre-warmed: work waits for it, so idle workers kept alive are
        released to make room), or None when every unit is busy (it waits for one)."""
        cores = self.claim(must=False)
        if cores is None and not prewarmed and self.pool.make_room(1):  # work waits: idle capacity yields to it
            cores = self.claim(must=False)
        if cores is None:
            return None
        return self.pool.start(self.image("learner"), cores, {**self.state_setup(), "role": "learner"}, prewarmed)

    def start_decoders(self, n: int, prewarmed: bool) -> list:
        """n decode functions; pre-warmed ones only into free units (as many as fit)."""
        out = []
        for _ in range(n):
            cores = self.claim(must=not prewarmed)
            if cores is None:
                break
            out.append(self.pool.start(self.image("decode"), cores, {**self.state_setup(), "role": "decode"},
                                       prewarmed))
        return out

    def start_critic(self, must: bool, prewarmed: bool = False):
        """PPO's critic image onto a free unit (must: evicting idle workers if none is free), or None."""
        cores = self.claim(must)
        return None if cores is None else self.pool.start(CRITIC_IMAGE, cores, self.critic_setup(), prewarmed)

    def start_single(self, kind: str):
        """A prefill or reference function onto a free unit (evicting idle workers when none is free)."""
        return self.pool.start((kind,), self.claim(must=True), {} if kind == "reference" else self.state_setup())

    def on_ready(self, h, msg: dict) -> None:
        self.pool.mark_ready(h, msg)
        cold = self.pool.records[h.worker].cold_start_s
        for kind in h.kinds if h.kinds == HYBRID else (role(h.kinds),):  # a hybrid start is either kind's
            self.history.add_cold(kind, cold)

    # -- steps --------------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Windows are contiguous: a step's window starts where the previous one ended (driver work between
        steps, such as logging, is billed to the next step, so per-step bills add up to the run's)."""
        self.step_t0 = self.step_t1 if self.step_t1 is not None else now()
        self.counters = {}
        self.stage_t0 = None
        self.pool.expire()
        if self.last_learn_end is not None:
            self.history.between_s.append(self.step_t0 - self.last_learn_end)

    def warm_decoders(self) -> int:
        """Serverless: ready workers that can decode and are idle (kept warm); the serverful pool is not planned."""
        if not self.policy.plans_decode():
            return 0
        return sum(1 for h in self.pool.warm(self.image("decode"))
                   if h.ready_s is not None and h.worker in self.pool.idle_since)

    @contextmanager
    def off_clock(self):
        """Driver work between steps that is not RL training (mid-run evaluation, checkpoints): cut out of every
        worker's bill and out of the loop's wall time, in both modes (`meter`, "Off the clock")."""
        t0 = now()
        try:
            yield
        finally:
            self.paused.append((self.rel(t0), self.rel(now())))

    def paused_s(self) -> float:
        return sum(b - a for a, b in self.paused)

    def overlaps(self) -> bool:
        """Whether this mode streams finished groups into the learner during decode (`runtime.overlap`)."""
        if self.ppo and not self.cfg.critic.values_chunk:  # PPO streams only the value forward, in chunks
            return False
        if self.rt.overlap is None:  # auto
            return self.policy.overlap_default()
        return self.rt.overlap

    def rollout(self, groups, seed: int, plan, step: int):
        from rlhfless.runtime.ppo_stages import PpoStream
        from rlhfless.runtime.stages import DecodeStage
        from rlhfless.runtime.streaming import LearnerStream

        self.stage_t0 = now()
        self.pool.expire()
        prompts = [g.token_ids for g in groups]
        ctx = self.context(step)
        self.stream = PpoStream(ctx, prompts) if self.ppo else LearnerStream(ctx, prompts, seed, self.overlaps())
        return DecodeStage(ctx, groups, seed, plan, self.stream).run()

    def reference(self, prompts, responses, step: int) -> torch.Tensor | None:
        """The reference function's log-probs of the step; None when overlapping: then each learner rank runs the
        reference forward of every group it receives, as it arrives (the same per-group forward, so the same
        numbers: `worker.Worker.group_reference`)."""
        from rlhfless.runtime.stages import run_reference

        if self.overlaps() and not self.ppo:  # PPO streams only its value forward: the reference function runs
            return None
        return run_reference(self.context(step), prompts, responses)

    def values(self, responses) -> torch.Tensor:
        """PPO: the value function's V(s_t) of the step's rollout, before any update (`ppo_stages`)."""
        return self.stream.values(responses)

    def learn(self, prompts, responses, rewards: torch.Tensor, ref_logp, step: int) -> dict[str, float]:
        """The optimiser step of the step's stream (its groups were fed during decode when overlapping); PPO: the
        actor and critic functions."""
        t0 = now()
        stream, self.stream = self.stream, None
        try:
            metrics = stream.finish(responses, rewards, ref_logp)
        finally:
            self.stream = None
        self.version += 1
        # keep the previous version: a worker started (pre-warmed) moments ago may still be loading it
        self.state_path(self.version - 2).unlink(missing_ok=True)
        self.critic_path(self.version - 2).unlink(missing_ok=True)
        held = [h for h in getattr(stream, "held", []) if h.worker in self.pool.handles]  # GRPO's (`_shared`)
        for h in stream.handles() + held:
            self.policy.no_work_now(self.pool, h, self.keep_alive_s)
        if not self.policy.keeps_learners(self.keep_alive_s, self.hybrid, self.ppo):
            self.learners = []
        self.last_learn_end = now()
        self.history.learn_s.append(self.last_learn_end - t0)
        return metrics

    def end_step(self, step: int) -> dict[str, float]:
        t1 = self.step_t1 = now()
        # every invocation so far, not only this step's: a hybrid function idle at the step's start is billed to
        # the role of its previous step's work (`meter.role_split`); busy time is clipped to the window
        recs = list(self.pool.records.values())
        a, b = self.rel(self.step_t0), self.rel(t1)
        bill = bill_window(recs, self.invocations, a, b, b, self.price, self.policy.bills_held_pool(), self.paused,
                           self.rules)
        m = bill.metrics()
        m.update(self.counters)
        m[M.RUNTIME_WINDOW_START_S], m[M.RUNTIME_WINDOW_S] = self.rel(self.step_t0), t1 - self.step_t0
        m.update(usage_metrics(usage_window(recs, self.invocations, a, b, b, self.paused)))
        rows = [r.to_json() for r in recs]
        m[M.RUNTIME_UNITS_PEAK] = peak_units(rows, a, b)
        released = self.release_counts(rows, a, b)
        m.update(released)
        for k in (M.RUNTIME_RELEASED_EXPIRED, M.RUNTIME_RELEASED_MID_STEP, M.RUNTIME_RANKS_RELEASED_EARLY):
            self.totals[k] = self.totals.get(k, 0.0) + released[k]
        m.update(self._calibrate(step))
        for k, v in self.counters.items():
            self.totals[k] = self.totals.get(k, 0.0) + v
        self.steps_done += 1
        self._write_invocations()
        return m

    def release_counts(self, rows: list[dict], a: float, b: float) -> dict[str, float]:
        """Functions released at their keep-alive's lapse since the last step's end (mid-step: the lapse after this
        step's rollout began and before its update ended; one noticed late is counted when noticed, at its lapse
        instant), and the intervals in [a, b) with nothing held at all (before the run's first worker started is
        not one)."""
        lapses = [t for t, _ in self.pool.expired[self._expired_seen:]]
        self._expired_seen = len(self.pool.expired)
        early = [t for t, _ in self.pool.released_early[self._early_seen:]]  # learner ranks whose share was done
        self._early_seen = len(self.pool.released_early)
        s0 = self.rel(self.stage_t0) if self.stage_t0 is not None else b
        s1 = self.rel(self.last_learn_end) if self.last_learn_end is not None and \
            self.rel(self.last_learn_end) >= s0 else b
        first = min((r["spawned_s"] for r in rows), default=b)
        zeros = zero_held(rows, max(a, first), b)
        return {M.RUNTIME_RELEASED_EXPIRED: float(len(lapses)),
                M.RUNTIME_RELEASED_MID_STEP: float(sum(s0 <= t <= s1 for t in lapses + early)),
                M.RUNTIME_RANKS_RELEASED_EARLY: float(len(early)),
                M.RUNTIME_ZERO_HELD: float(len(zeros)), M.RUNTIME_ZERO_HELD_S: sum(y - x for x, y in zeros)}

    def observe_time_scale(self, ratio: float) -> None:
        self.time_scale = smoothed_scale(self.time_scale, ratio)

    def _calibrate(self, step: int) -> dict[str, float]:
        """Hand the planner the measured decode cold start and weight-sync seconds in place of its assumptions."""
        if self.planner is None or not self.policy.plans_decode():
            return {}
        cold = self.history.cold_s.get("decode")
        # every decode invocation's weight load, zeros included: a cold one loaded inside its cold start, a warm
        # hybrid one holds the weights it computed; the planner adds weight_sync_s to each decode function, so
        # the mean is what it should add (only the loads of warm functions behind the version, it kept 0.2 s
        # assumed forever when every function was warm and at the version)
        syncs = [i.extra["sync_s"] for i in self.invocations
                 if i.step == step and i.kind == "decode" and "sync_s" in i.extra]
        self.planner.calibrate(sum(cold) / len(cold) if cold else None, sum(syncs) / len(syncs) if syncs else None,
                               self.time_scale)
        return {M.RUNTIME_PLANNER_COLD_START_S: self.planner.cfg.cold_start_s,
                M.RUNTIME_PLANNER_WEIGHT_SYNC_S: self.planner.cfg.weight_sync_s,
                M.RUNTIME_TIME_MODEL_SCALE: self.time_scale or 1.0}

    def next_decode_prewarm(self):
        """(seconds after the learner's start, how many) for the next step's decode workers, or None."""
        if not self.policy.prewarms(self.rt.prewarm) or not self.decode_prewarm:
            return None
        pw = prewarm_decode(self.history, self.cfg.plan.cold_start_s, self.rt.prewarm_buffer_s)
        return None if pw.after_s is None else (pw.after_s, self.decode_prewarm)

    # -- end ----------------------------------------------------------------------------------------------------
    def sync_learner(self, learner) -> None:
        """Bring the driver's learner (for eval and checkpoints) to the runtime's latest version."""
        from rlhfless.learn.learner import load_learner_state

        if learner.updates != self.version:
            load_learner_state(learner, self.state_path(self.version))

    def sync_critic(self, critic) -> None:
        """PPO: bring the driver's critic (for checkpoints) to the runtime's latest version."""
        from rlhfless.learn.critic import load_critic_state

        if critic.updates != self.version:
            load_critic_state(critic, self.critic_path(self.version))

    def run_bill(self):
        t = now()
        return bill_run(list(self.pool.records.values()), self.invocations, self.rel(t), self.price,
                        self.policy.bills_held_pool(), self.rules, self.paused)

    def summary(self) -> dict:
        """The run's bill and what explains it (call after close(): every lifetime has ended)."""
        bill = self.run_bill()
        recs = list(self.pool.records.values())
        wall = (self.step_t1 or self.t0) - self.t0 - self.paused_s()
        cold: dict[str, list[float]] = {}
        for r in recs:
            if r.ready_s is not None:
                cold.setdefault(role(tuple(r.kinds)), []).append(r.cold_start_s)
        return {
            "mode": self.mode, "units": self.units, "start_method": getattr(self.backend, "start_method", self.rt.start_method),
            "platform_start_s": self.platform_start_s, "steps": self.steps_done,
            "time_profile": self.time_profile or (self.planner.time_model.source if self.planner else None),
            "time_profile_measured_s": self.profile_measured_s,
            "loop_wall_s": wall, "step_time_s": wall / max(1, self.steps_done), "off_clock_s": self.paused_s(),
            "cost_device_s": bill.device_s, "cost_usd": bill.usd, "billed_s_by_kind": bill.by_kind,
            "busy_device_s": bill.busy_s, "idle_fraction": bill.idle_fraction, "cold_starts": bill.cold_starts,
            "cold_start_s_mean": {k: sum(v) / len(v) for k, v in cold.items()},
            "workers_started": len(recs), "workers_killed": sum(r.killed for r in recs),
            "prewarmed": sum(r.prewarmed for r in recs),
            "migrated_seqs": self.totals.get(M.RUNTIME_MIGRATED_SEQS, 0.0),
            "retries": self.totals.get(M.RUNTIME_RETRIES, 0.0),
            "weight_sync_s": self.totals.get(M.RUNTIME_WEIGHT_SYNC_S, 0.0),
            "billing": {"rules": self.policy.billing_name(self.rt.billing), "billed": self.rules.billed,
                        "granularity_s": self.rules.granularity_s, "keep_alive_s": self.keep_alive_s},
            **self._release_summary(recs, wall),
        }

    def bills_by_rules(self) -> dict[str, float]:
        """The run's billed device-seconds under each rule set, from the same records: what this run would cost
        billed per invocation (the paper's proxy) and per lifetime, at its own granularity (the serverful pool
        is a VM: lifetime either way)."""
        t, recs = now(), list(self.pool.records.values())
        g = self.rt.billing_granularity_s
        return {name: bill_run(recs, self.invocations, self.rel(t), self.price, self.policy.bills_held_pool(),
                               BillingRules.metered(g, self.keep_alive_s, name), self.paused).device_s
                for name in BILLED}

    def _release_summary(self, recs: list, wall: float) -> dict:
        """What scaled to zero over the run: releases at a keep-alive's lapse (all, and mid-step), the intervals
        with nothing held (from the first worker's start to the end), and held device-seconds by role spent busy,
        held idle and cold-starting (`meter.usage_window`)."""
        rows = [r.to_json() for r in recs]
        end = self.rel(self.step_t1 or self.t0)
        first = min((r["spawned_s"] for r in rows), default=end)
        zeros = zero_held(rows, first, end)
        usage = usage_window(recs, self.invocations, float("-inf"), end, end, self.paused)
        return {"released_expired": int(self.totals.get(M.RUNTIME_RELEASED_EXPIRED, 0)),
                "released_mid_step": int(self.totals.get(M.RUNTIME_RELEASED_MID_STEP, 0)),
                "ranks_released_early": int(self.totals.get(M.RUNTIME_RANKS_RELEASED_EARLY, 0)),
                "zero_held_intervals": len(zeros), "zero_held_s": sum(b - a for a, b in zeros),
                "device_s_by_role": usage, "cost_device_s_by_billing": self.bills_by_rules()}

    def _write_invocations(self) -> None:
        path = RunDir(self.out).invocations
        with path.open("a") as f:
            for inv in self.invocations[self._written:]:
                f.write(json.dumps(inv.to_json()) + "\n")
        self._written = len(self.invocations)

    def release(self) -> None:
        """Release every worker (billing ends) and write the records; the scratch files stay for sync_learner."""
        self.pool.release_all()
        self._write_invocations()
        with RunDir(self.out).workers.open("w") as f:
            for rec in self.pool.records.values():
                f.write(json.dumps(rec.to_json()) + "\n")

    def interrupt(self) -> None:
        """The run was interrupted (SIGINT/SIGTERM): stop every worker at once, busy ones included (a graceful
        release waits for each busy one in turn), then write the records as `release` does."""
        self.pool.stop_all()
        self.release()

    def cleanup(self) -> None:
        self.pool.release_all()
        self.backend.close()
        wire.remove_scratch(self.scratch)


__all__ = ["Runtime", "WorkerDied"]
