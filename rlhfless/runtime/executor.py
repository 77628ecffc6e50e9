"""The runtime: a step's stages executed by worker processes, as the mode's policy decides, and metered.

`Runtime(cfg, mode, learner)` starts the platform and, for serverful, the pool; per step `begin_step`, `rollout`,
`reference`, `values` (PPO), `learn`, then `end_step` -> metrics; `clock.off_clock()` wraps driver work between
steps (billed to neither mode); `release()` / `cleanup()` end the run. It is thin: four collaborators own the run's
state: the worker set (`workerset`: placement, start / keep / release), the ledger (`ledger`: invocations, counts),
the weight store (`weights`: versioned state files) and the step clock (`clock`: windows, history, pre-warm times,
calibration). Decode is in `runtime.stages`, PPO's stages in `runtime.ppo_stages`. Each method and the weight
loads: docs/internals.md#runtimeexecutorpy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from rlhfless.config import RunConfig
from rlhfless.core import metrics as M
from rlhfless.core.rundir import RunDir
from rlhfless.plan.billing import BILLED, BillingRules
from rlhfless.plan.cost import price
from rlhfless.runtime import wire
from rlhfless.runtime.clock import StepClock
from rlhfless.runtime.context import StepContext
from rlhfless.runtime.devices import setup as device_setup
from rlhfless.runtime.ledger import Ledger
from rlhfless.runtime.meter import bill_run, bill_window, billing_rules, usage_metrics, usage_window
from rlhfless.runtime.modes.policy import policy_for
from rlhfless.runtime.platform.backend import LocalBackend, WorkerDied
from rlhfless.runtime.records import now, peak_units, role, zero_held
from rlhfless.runtime.weights import WeightStore
from rlhfless.runtime.workerset import WorkerSet

RUNTIME_HOOKS: list = []
"""Callables given each new Runtime once it is up (the fault bench attaches its chaos thread here)."""


class Runtime:
    def __init__(self, cfg: RunConfig, mode: str, learner, out: Path, reference_checkpoint: Path | None = None,
                 planner=None, env=None, progress: bool = False, critic=None):
        from rlhfless.step.textenv import make_env

        self.cfg, self.rt, self.mode, self.out = cfg, cfg.runtime, mode, out
        self.policy = policy_for(mode)  # every decision that differs by mode (runtime.modes.policy.ModePolicy)
        self.planner = planner
        self.env = env if env is not None else make_env(cfg)
        units = self.rt.resolved_units()
        backend = self._backend(units)
        self.platform_start_s = backend.boot()
        setup = {"config": json.loads(json.dumps(asdict(cfg), default=list)),
                 "checkpoint": str(cfg.policy.resolved()),
                 "reference_checkpoint": str(reference_checkpoint or cfg.policy.resolved())}
        scratch = wire.scratch_dir(base=self.rt.scratch_dir or None)
        model = device_setup.prepare(cfg, setup, scratch, out, backend,
                                     planner.base_time_model if planner is not None else None, progress)
        if planner is not None and model.time_model is not None:  # the device's time model (and KV slots) prices
            planner.use_profile(model.time_model)
            if model.capacity is not None:
                planner.cfg = replace(planner.cfg, capacity=model.capacity)
        self.time_profile, self.profile_measured_s = model.source, model.measured_s
        self.planner_time_model = planner.time_model if planner is not None else cfg.plan.time_model()
        self.ppo = cfg.algo.name == "ppo"
        self.weights = WeightStore(scratch, learner, critic if self.ppo else None)
        segment = RunDir(out).next_segment()  # resumed: names and times follow the earlier records
        t_open = now()
        self.rules = billing_rules(self.rt)
        self.price = price(cfg.plan.gpu_kind)
        self.clock = StepClock(cfg, self.policy, self.rt.idle_timeout_s(), t_open, segment.offset_s)
        self.workers = WorkerSet(cfg, self.policy, backend, setup, units, self.clock.t0, self.clock, self.weights,
                                 segment.prefix)
        self.ledger = Ledger(self.clock)
        if self.policy.traits.holds_pool:  # W workers for the whole run, started before step 1's clock
            self.workers.start_pool()
        for hook in RUNTIME_HOOKS:
            hook(self)

    def _backend(self, units: int):
        if self.rt.backend == "ray":
            from rlhfless.runtime.platform.raybackend import RayBackend

            return RayBackend(self.rt.ray_address, units, self.rt.start_method)
        return LocalBackend(device_setup.start_method(self.rt), wire.preload(self.cfg.rollout.engine, self.rt.device))

    # -- what a stage is given ------------------------------------------------------------------------------------
    def context(self, step: int) -> StepContext:
        """Step `step`'s view of the run for its stages (`runtime.context`)."""
        w = self.workers
        return StepContext(step, self.cfg, self.rt, self.policy, self.weights.scratch,
                           w.keep_alive_s, w.hybrid, self.planner, self.planner_time_model, self.env.tok,
                           self.overlaps(), w, self.ledger, self.weights, self.clock)

    def overlaps(self) -> bool:
        """Whether this mode streams finished groups into the learner during decode (`runtime.overlap`)."""
        if self.ppo and not self.cfg.critic.values_chunk:  # PPO streams only the value forward, in chunks
            return False
        if self.rt.overlap is None:  # auto
            return self.policy.traits.overlap_default
        return self.rt.overlap

    # -- steps --------------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.clock.begin_step()
        self.ledger.counters = {}
        self.workers.pool.expire()

    def rollout(self, groups, seed: int, plan, step: int):
        """Decode (+ reward) of the step: (the rollout, its scored samples, the step's learner stream), the stream
        handed back to `values` and `learn`."""
        from rlhfless.runtime.ppo_stages import PpoStream
        from rlhfless.runtime.stages import DecodeStage
        from rlhfless.runtime.streaming import LearnerStream

        self.clock.stage_t0 = now()
        self.workers.pool.expire()
        prompts = [g.token_ids for g in groups]
        ctx = self.context(step)
        stream = PpoStream(ctx, prompts) if self.ppo else LearnerStream(ctx, prompts, seed, self.overlaps())
        self.workers.stream = stream  # its ranks waiting for groups may give their units up (`WorkerSet.claim`)
        out, samples = DecodeStage(ctx, groups, seed, plan, stream).run()
        return out, samples, stream

    def reference(self, prompts, responses, step: int) -> torch.Tensor | None:
        """The reference function's log-probs of the step; None when overlapping: then each learner rank runs the
        reference forward of every group it receives, as it arrives (the same per-group forward, so the same
        numbers: `worker.Worker.group_reference`)."""
        from rlhfless.runtime.stages import run_reference

        if self.overlaps() and not self.ppo:  # PPO streams only its value forward: the reference function runs
            return None
        return run_reference(self.context(step), prompts, responses)

    def values(self, stream, responses) -> torch.Tensor:
        """PPO: the value function's V(s_t) of the step's rollout, before any update (`ppo_stages`)."""
        return stream.values(responses)

    def learn(self, stream, prompts, responses, rewards: torch.Tensor, ref_logp, step: int) -> dict[str, float]:
        """The optimiser step of the step's `stream` (its groups were fed during decode when overlapping); PPO: the
        actor and critic functions."""
        t0 = now()
        w = self.workers
        w.stream = None
        try:
            metrics = stream.finish(responses, rewards, ref_logp)
        finally:
            w.stream = None
        self.weights.advance()
        held = [h for h in getattr(stream, "held", []) if h.worker in w.pool.handles]  # GRPO's (`_shared`)
        for h in stream.handles() + held:
            w.no_work_now(h)
        if not self.policy.traits.holds_pool:  # a pool's ranks are its workers; functions are never kept as a group:
            w.forget_learners()  # one kept warm is reused one by one (`LearnerStream._start`), as an idle function
        self.clock.learned(t0)
        return metrics

    def end_step(self, step: int) -> dict[str, float]:
        clock, ledger = self.clock, self.ledger
        t1 = clock.step_t1 = now()
        # every invocation so far, not only this step's: a hybrid function idle at the step's start is billed to
        # the role of its previous step's work (`meter.role_split`); busy time is clipped to the window
        recs = list(self.workers.pool.records.values())
        a, b = clock.rel(clock.step_t0), clock.rel(t1)
        bill = bill_window(recs, ledger.invocations, a, b, b, self.price, self.policy.traits.bills_held_pool,
                           clock.paused, self.rules)
        m = bill.metrics()
        m.update(ledger.counters)
        m[M.RUNTIME_WINDOW_START_S], m[M.RUNTIME_WINDOW_S] = clock.rel(clock.step_t0), t1 - clock.step_t0
        m.update(usage_metrics(usage_window(recs, ledger.invocations, a, b, b, clock.paused)))
        rows = [r.to_json() for r in recs]
        m[M.RUNTIME_UNITS_PEAK] = peak_units(rows, a, b)
        released = ledger.release_counts(self.workers.pool, rows, a, b)
        m.update(released)
        ledger.add_totals({k: released[k] for k in (M.RUNTIME_RELEASED_EXPIRED, M.RUNTIME_RELEASED_MID_STEP,
                                                    M.RUNTIME_RANKS_RELEASED_EARLY)})
        ledger.add_totals(ledger.counters)
        clock.steps_done += 1
        ledger.write(RunDir(self.out).invocations)
        return m

    def calibration(self, step: int):
        """The step's measured numbers for the planner to price the next step with (`clock.Calibration`), or None
        when this mode plans no decode; the planner's owner hands them over (`loop_stages`)."""
        if self.planner is None or not self.policy.traits.plans_decode:
            return None
        return self.clock.calibration(step, self.ledger.invocations)

    # -- end ----------------------------------------------------------------------------------------------------
    def run_bill(self):
        t = now()
        return bill_run(list(self.workers.pool.records.values()), self.ledger.invocations, self.clock.rel(t),
                        self.price, self.policy.traits.bills_held_pool, self.rules, self.clock.paused)

    def summary(self) -> dict:
        """The run's bill and what explains it (call after close(): every lifetime has ended)."""
        bill = self.run_bill()
        recs = list(self.workers.pool.records.values())
        wall = (self.clock.step_t1 or self.clock.t_open) - self.clock.t_open - self.clock.paused_s()
        cold: dict[str, list[float]] = {}
        for r in recs:
            if r.ready_s is not None:
                cold.setdefault(role(tuple(r.kinds)), []).append(r.cold_start_s)
        return {
            "mode": self.mode, "units": self.workers.units,
            "start_method": getattr(self.workers.backend, "start_method", self.rt.start_method),
            "platform_start_s": self.platform_start_s, "steps": self.clock.steps_done,
            "time_profile": self.time_profile or (self.planner.time_model.source if self.planner else None),
            "time_profile_measured_s": self.profile_measured_s,
            "loop_wall_s": wall, "step_time_s": wall / max(1, self.clock.steps_done),
            "off_clock_s": self.clock.paused_s(),
            "cost_device_s": bill.device_s, "cost_usd": bill.usd, "billed_s_by_kind": bill.by_kind,
            "busy_device_s": bill.busy_s, "idle_fraction": bill.idle_fraction, "cold_starts": bill.cold_starts,
            "cold_start_s_mean": {k: sum(v) / len(v) for k, v in cold.items()},
            "workers_started": len(recs), "workers_killed": sum(r.killed for r in recs),
            "prewarmed": sum(r.prewarmed for r in recs),
            "migrated_seqs": self.ledger.totals.get(M.RUNTIME_MIGRATED_SEQS, 0.0),
            "retries": self.ledger.totals.get(M.RUNTIME_RETRIES, 0.0),
            "weight_sync_s": self.ledger.totals.get(M.RUNTIME_WEIGHT_SYNC_S, 0.0),
            "billing": {"rules": self.policy.billing_name(self.rt.billing), "billed": self.rules.billed,
                        "granularity_s": self.rules.granularity_s, "keep_alive_s": self.workers.keep_alive_s},
            **self._release_summary(recs, wall),
        }

    def bills_by_rules(self) -> dict[str, float]:
        """The run's billed device-seconds under each rule set, from the same records: what this run would cost
        billed per invocation (the paper's proxy) and per lifetime, at its own granularity (the serverful pool
        is a VM: lifetime either way)."""
        t, recs = now(), list(self.workers.pool.records.values())
        g = self.rt.billing_granularity_s
        return {name: bill_run(recs, self.ledger.invocations, self.clock.rel(t), self.price,
                               self.policy.traits.bills_held_pool,
                               BillingRules.metered(g, self.workers.keep_alive_s, name), self.clock.paused).device_s
                for name in BILLED}

    def _release_summary(self, recs: list, wall: float) -> dict:
        """What scaled to zero over the run: releases at a keep-alive's lapse (all, and mid-step), the intervals
        with nothing held (from the first worker's start to the end), and held device-seconds by role spent busy,
        held idle and cold-starting (`meter.usage_window`)."""
        rows = [r.to_json() for r in recs]
        end = self.clock.rel(self.clock.step_t1 or self.clock.t_open)
        first = min((r["spawned_s"] for r in rows), default=end)
        zeros = zero_held(rows, first, end)
        usage = usage_window(recs, self.ledger.invocations, float("-inf"), end, end, self.clock.paused)
        return {"released_expired": int(self.ledger.totals.get(M.RUNTIME_RELEASED_EXPIRED, 0)),
                "released_mid_step": int(self.ledger.totals.get(M.RUNTIME_RELEASED_MID_STEP, 0)),
                "ranks_released_early": int(self.ledger.totals.get(M.RUNTIME_RANKS_RELEASED_EARLY, 0)),
                "zero_held_intervals": len(zeros), "zero_held_s": sum(b - a for a, b in zeros),
                "device_s_by_role": usage, "cost_device_s_by_billing": self.bills_by_rules()}

    def release(self) -> None:
        """Release every worker (billing ends) and write the records; the scratch files stay for sync_learner."""
        self.workers.pool.release_all()
        self.ledger.write(RunDir(self.out).invocations)
        with RunDir(self.out).workers.open("a") as f:  # appended: a resumed run keeps every segment's workers
            for rec in self.workers.pool.records.values():
                f.write(json.dumps(rec.to_json()) + "\n")

    def interrupt(self) -> None:
        """The run was interrupted (SIGINT/SIGTERM): stop every worker at once, busy ones included (a graceful
        release waits for each busy one in turn), then write the records as `release` does."""
        self.workers.pool.stop_all()
        self.release()

    def cleanup(self) -> None:
        self.workers.pool.release_all()
        self.workers.backend.close()
        wire.remove_scratch(self.weights.scratch)


__all__ = ["Runtime", "WorkerDied"]
