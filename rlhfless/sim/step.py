"""Mechanism of one synchronous RLHF step: a policy's decision played out on the event loop.

`play_step(loop, timeline, t0, plan)` schedules a `StepSchedule` (every duration already known from the performance
model and the planner's time model) as events and records spans: the prefill function, each decode actor (cold
start, weight sync, KV, decode, release), the learner (`LearnerPlan`, the model of `rlhfless.plan.overlap`) and one
optimizer step, whose end is the step's end. The rule it keeps: no decisions here; serverless bills every function
span on its own, serverful bills one `pool` span of all devices over the step. Schedule and billing in full:
docs/internals.md#simsteppy.

Deviations from the paper:
1. The paper's stages are strictly sequential; with `LearnerPlan.overlap` finished groups are scored and trained on
   freed devices during the decode tail (still on-policy: one optimizer step per step).
2. RLHFuse-like fusion is a smaller learner work decided by its policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlhfless.plan.overlap import (
    Blocks,
    learner_blocks,
    learner_drain,
    learner_invocations,
    prewarm_billed,
    sequential_blocks,
    share_invocations,
    size_blocks,
)
from rlhfless.sim.events import PRIO_OTHER, PRIO_RELEASE, PRIO_START, EventLoop, Span, Timeline


@dataclass(frozen=True)
class ActorRun:
    """One decode actor of a step (seconds): cold start, weight sync, KV wait, its own prefill, decode.

    kv_ready_s: seconds after t0 at which its prompts' KV has arrived from the prefill function (0 without one;
    the prefill function works through the actors in order, so each waits for its own groups only).
    """

    instance: int
    devices: float
    cold_s: float
    sync_s: float
    kv_ready_s: float
    prefill_s: float
    decode_s: float
    prewarm_s: float = 0.0  # seconds before t0 a pre-warmed actor started (billed, off the critical path)


@dataclass(frozen=True)
class FnRun:
    """A non-decode function of a step: kind, devices, cold-start seconds, working seconds."""

    kind: str
    devices: float
    cold_s: float
    work_s: float
    prewarm_s: float = 0.0


@dataclass(frozen=True)
class LearnerPlan:
    """Scoring + update of one step (model in `rlhfless.plan.overlap`).

    group_actor, group_done_s, group_work_ds: per group, the decode actor instance that ran it, the seconds after
    that actor's decode began at which its last sample finished, and its learner work in device-seconds.
    devices: the step's device budget; block_devices: devices per learner block (a replica's); cold_s: a
    learner block's cold start; prewarm: spare devices are ready when the first group arrives (and, without
    overlap, the whole learner when the rollout ends); update_fixed_s: the optimizer step.
    """

    overlap: bool
    group_actor: tuple[int, ...]
    group_done_s: tuple[float, ...]
    group_work_ds: tuple[float, ...]
    devices: float
    block_devices: float
    cold_s: float
    prewarm: bool
    update_fixed_s: float
    prewarm_bill_s: float | None = None
    """Billed seconds ahead of a pre-warmed block's ready time (the pre-warm rule: kept alive through an idle gap
    shorter than a cold start, else restarted a cold start ahead); None = the cold start."""
    size_slack: float | None = None
    """With overlap: start only the blocks the backlog needs (`rlhfless.plan.overlap.size_blocks`); None = all."""
    release_cold_s: float | None = None
    """Seconds a block needs on a released decode actor's devices; None = cold_s. A hybrid decode function goes
    on as the learner rank itself (`rlhfless.plan.overlap.LearnerCosts.release_cold_s`)."""
    warm_spare: int = 0
    """Spare blocks that are hybrid functions kept warm from the last step's learner beyond this step's decode
    need: learner blocks ready at the first arrival (`learner_blocks`)."""
    after_ds: float = 0.0
    """Learner device-seconds that can start only when the rollout has ended: verl's mini-batch updates under
    learner parity (mini-batch k trains on the policy mini-batch k-1 left; only the forwards stream)."""
    share_go: bool = False
    """Separate images: every rank (`block_devices` of a block) but the reducer is let go at its share, the end of
    the learner's work, and only the reducer holds its devices through the optimizer step, as the runtime's
    `LearnerStream._shared` does (the policy decides it with `plan.lifecycle.let_go`); False: every block holds
    its devices to the step's end."""


@dataclass(frozen=True)
class StepSchedule:
    """Everything a policy decided for one step (durations known up front)."""

    serverful: bool
    pool_devices: float
    actors: tuple[ActorRun, ...]
    prefill: FnRun | None
    learner: LearnerPlan
    metrics: dict = field(default_factory=dict)
    idle_warm: tuple[FnRun, ...] = ()
    """Pre-warmed decode instances the step left unused: billed from `prewarm_s` before t0 to t0."""


@dataclass
class StepResult:
    start_s: float
    end_s: float = 0.0
    rollout_end_s: float = 0.0
    score_end_s: float = 0.0
    learner_work_ds: float = 0.0
    blocks_joined: int = 0


def _span(tl: Timeline, plan: StepSchedule, step: int, kind: str, inst: int, start: float, end: float, devices: float,
          stage: str, cold_s: float) -> None:
    tl.add(Span(kind, inst, start, end, devices, stage, cold_s > 0, cold_s, step, billed=not plan.serverful))


def _decode_start(a: ActorRun) -> float:
    """Seconds after t0 at which actor a starts decoding (its cold start, sync and KV are in)."""
    return max(a.cold_s + a.sync_s, a.kv_ready_s) + a.prefill_s


def learner_schedule(plan: StepSchedule, prefill_end: float) -> tuple[float, Blocks, np.ndarray]:
    """(work end, learner blocks, joined) of a step, seconds after t0, from `rlhfless.plan.overlap`."""
    lp = plan.learner
    start = {a.instance: _decode_start(a) for a in plan.actors}
    release = np.array([start[a.instance] + a.decode_s for a in plan.actors])
    rollout_end = float(release.max()) if len(release) else prefill_end
    # each group's actor's decode start + its finish there (the same float additions, elementwise)
    arrive = np.array(list(map(start.__getitem__, lp.group_actor)), dtype=float) + \
        np.array(lp.group_done_s, dtype=float)
    if lp.after_ds > 0:
        arrive = np.append(arrive, rollout_end)
    work = np.array(list(lp.group_work_ds) + ([lp.after_ds] if lp.after_ds > 0 else []))
    if not lp.overlap:
        arrive = np.full(len(work), rollout_end)
        b = sequential_blocks(rollout_end + (0.0 if lp.prewarm else lp.cold_s), lp.devices, lp.cold_s)
    else:
        held = [a.devices for a in plan.actors]
        rel, dev = list(release), held
        if plan.prefill is not None:
            rel, dev = rel + [prefill_end], dev + [plan.prefill.devices]
        spare = max(lp.devices - sum(dev), 0.0)
        first = float(arrive.min()) if len(arrive) else rollout_end
        rcold = lp.cold_s if lp.release_cold_s is None else lp.release_cold_s
        rcolds = [rcold] * len(release) + ([lp.cold_s] if plan.prefill is not None else [])  # prefill: another image
        b = learner_blocks(np.array(rel), np.array(dev), spare, lp.block_devices, first, lp.cold_s, lp.prewarm,
                           np.array(rcolds), lp.warm_spare)
    # pre-warmed blocks (the spare ones, or the single one) bill the pre-warm rule's seconds, as the scaler does
    b = prewarm_billed(b, len(rel) if lp.overlap else 0, lp.prewarm, lp.prewarm_bill_s)
    if lp.overlap and lp.size_slack is not None:
        b = size_blocks(arrive, work, b, lp.size_slack)
    end, joined = learner_drain(arrive, work, b.ready_s, b.devices)
    return max(end, rollout_end), b, joined


def play_step(loop: EventLoop, tl: Timeline, t0: float, plan: StepSchedule, step: int) -> StepResult:
    """Schedule `plan` from t0 on `loop`; returns a StepResult filled in as the loop runs."""
    res = StepResult(t0)
    prefill_end = t0
    if plan.prefill is not None:
        p = plan.prefill
        prefill_end = t0 + p.cold_s + p.work_s
        loop.at(prefill_end, PRIO_RELEASE, lambda lp: _span(tl, plan, step, "prefill", 0, t0 - p.prewarm_s,
                                                            prefill_end, p.devices, "rollout", p.cold_s))
    pending = {"actors": len(plan.actors)}
    for k, f in enumerate(plan.idle_warm):  # released unused at the step's start
        _span(tl, plan, step, f.kind, len(plan.actors) + k, t0 - f.prewarm_s, t0, f.devices, "rollout", 0.0)

    def rollout_done(lp: EventLoop) -> None:
        res.rollout_end_s = lp.now
        tl.stage(step, "rollout", t0, lp.now)
        work_end, blocks, joined = learner_schedule(plan, prefill_end - t0)
        res.learner_work_ds = float(sum(plan.learner.group_work_ds)) + plan.learner.after_ds
        res.blocks_joined = int(joined.sum())
        lp.at(t0 + work_end, PRIO_START, lambda lp2: _update(lp2, blocks, joined))

    def release(a: ActorRun, end: float):
        def fn(lp: EventLoop) -> None:
            _span(tl, plan, step, "decode", a.instance, t0 - a.prewarm_s, end, a.devices, "rollout", a.cold_s)
            pending["actors"] -= 1
            if pending["actors"] == 0:
                lp.at(lp.now, PRIO_START, rollout_done)
        return fn

    def _update(lp: EventLoop, blocks: Blocks, joined: np.ndarray) -> None:
        res.score_end_s = lp.now
        tl.stage(step, "score", res.rollout_end_s, lp.now)
        lp.at(lp.now + plan.learner.update_fixed_s, PRIO_OTHER, lambda lp2: _finish(lp2, blocks, joined))

    def _finish(lp: EventLoop, blocks: Blocks, joined: np.ndarray) -> None:
        # every block that joined holds its devices (and its accumulated gradients) to the optimizer step's end;
        # separate images: every rank but the reducer only to its share
        lpl = plan.learner
        invs = share_invocations(blocks, joined, res.score_end_s - t0, lp.now - t0, lpl.block_devices, t0) \
            if lpl.share_go else learner_invocations(blocks, joined, lp.now - t0, t0)
        for inv in invs:
            tl.add(Span("learner", inv.actor_id, inv.start_s, inv.end_s, inv.gpus, "score+update", inv.cold,
                        inv.cold_start_s, step, billed=not plan.serverful))
        tl.stage(step, "update", res.score_end_s, lp.now)
        res.end_s = lp.now
        if plan.serverful:
            tl.add(Span("pool", 0, t0, lp.now, plan.pool_devices, "step", False, 0.0, step, billed=True))

    if not plan.actors:
        loop.at(prefill_end, PRIO_START, rollout_done)
    for a in plan.actors:
        done = t0 + _decode_start(a) + a.decode_s
        loop.at(done, PRIO_RELEASE, release(a, done))
    return res
