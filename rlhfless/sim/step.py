"""Mechanism of one synchronous RLHF step: a policy's decision played out on the event loop.

Purpose: `play_step(loop, timeline, t0, plan)` schedules a `StepPlan` (what a policy decided, with every duration
already known from the performance model and the planner's time model) as events and records spans:
    t0: prefill function starts (dedup prefill; cold start first when cold);
        every decode actor starts: cold start (if cold) and weight sync, meanwhile its prompts' KV arrives from
        the prefill function (`kv_ready_s`); then its own prefill (none with dedup) and decode; it releases
        itself when its last sequence ends;
    last decode release: scoring functions (reference, reward, value) start together;
    last scoring end: the learner starts; its end is the step's end.
Serverless: every function span is billed on its own (`billed=True`); the scoring functions and the learner
share one trainer worker (as verl hosts the reference beside the actor), billed once as a `trainer` span from its
start to the update's end (their own spans are drawn, not billed). Serverful: spans are drawn but not billed;
one `pool` span of all devices over [t0, end] is billed instead. A warm actor pre-warmed during the previous step bills
from `t0 - prewarm_s` (its cold start ran off the critical path).

Non-goals: no decisions here (the policies make them), no failures or retries.

Deviations from the paper: synchronous stages (scoring waits for the last decode actor, as in verl and the
paper's synchronous setting); RLHFuse-like fusion is a shorter scoring stage decided by its policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
class StepPlan:
    """Everything a policy decided for one step (durations known up front)."""

    serverful: bool
    pool_devices: float
    actors: tuple[ActorRun, ...]
    prefill: FnRun | None
    score: tuple[FnRun, ...]
    update: FnRun
    metrics: dict = field(default_factory=dict)


@dataclass
class StepResult:
    start_s: float
    end_s: float = 0.0
    rollout_end_s: float = 0.0
    score_end_s: float = 0.0


def _span(tl: Timeline, plan: StepPlan, step: int, kind: str, inst: int, start: float, end: float, devices: float,
          stage: str, cold_s: float) -> None:
    tl.add(Span(kind, inst, start, end, devices, stage, cold_s > 0, cold_s, step, billed=not plan.serverful))


def play_step(loop: EventLoop, tl: Timeline, t0: float, plan: StepPlan, step: int) -> StepResult:
    """Schedule `plan` from t0 on `loop`; returns a StepResult filled in as the loop runs."""
    res = StepResult(t0)
    prefill_end = t0
    if plan.prefill is not None:
        p = plan.prefill
        prefill_end = t0 + p.cold_s + p.work_s
        loop.at(prefill_end, PRIO_RELEASE, lambda lp: _span(tl, plan, step, "prefill", 0, t0 - p.prewarm_s,
                                                            prefill_end, p.devices, "rollout", p.cold_s))
    pending = {"actors": len(plan.actors)}

    def rollout_done(lp: EventLoop) -> None:
        res.rollout_end_s = lp.now
        tl.stage(step, "rollout", t0, lp.now)
        _score(lp)

    def release(a: ActorRun, end: float):
        def fn(lp: EventLoop) -> None:
            _span(tl, plan, step, "decode", a.instance, t0 - a.prewarm_s, end, a.devices, "rollout", a.cold_s)
            pending["actors"] -= 1
            if pending["actors"] == 0:
                lp.at(lp.now, PRIO_START, rollout_done)
        return fn

    def _score(lp: EventLoop) -> None:
        # scoring functions run one after another in the trainer worker (they share its devices)
        ts = t = lp.now
        for i, f in enumerate(plan.score):
            start, t = t, t + f.cold_s + f.work_s
            lp.at(t, PRIO_RELEASE, lambda _, f=f, i=i, s=start, e=t: tl.add(
                Span(f.kind, i, s, e, f.devices, "score", f.cold_s > 0, f.cold_s, step, billed=False)))
        lp.at(t, PRIO_START, lambda lp2: _update(lp2, ts))

    def _update(lp: EventLoop, score_start: float) -> None:
        ts = res.score_end_s = lp.now
        tl.stage(step, "score", res.rollout_end_s, ts)
        u = plan.update
        end = ts + u.cold_s + u.work_s
        lp.at(end, PRIO_OTHER, lambda lp2: _finish(lp2, score_start, u))

    def _finish(lp: EventLoop, score_start: float, u: FnRun) -> None:
        # the trainer worker is billed once, from its (pre-warmed) start through scoring to the update's end
        first = plan.score[0] if plan.score else u
        cold = first.cold_s + u.cold_s
        tl.add(Span(u.kind, 0, res.score_end_s, lp.now, u.devices, "update", u.cold_s > 0, u.cold_s, step,
                    billed=False))
        tl.add(Span("trainer", 0, score_start - first.prewarm_s, lp.now, u.devices, "score+update", cold > 0, cold,
                    step, billed=not plan.serverful))
        tl.stage(step, "update", res.score_end_s, lp.now)
        res.end_s = lp.now
        if plan.serverful:
            tl.add(Span("pool", 0, t0, lp.now, plan.pool_devices, "step", False, 0.0, step, billed=True))

    if not plan.actors:
        loop.at(prefill_end, PRIO_START, rollout_done)
    for a in plan.actors:
        ready = t0 + max(a.cold_s + a.sync_s, a.kv_ready_s)
        loop.at(ready + a.prefill_s + a.decode_s, PRIO_RELEASE, release(a, ready + a.prefill_s + a.decode_s))
    return res
