"""The step clock: the run's time origin, each step's billing window, time off the clock, and what was measured.

It keeps the recent stage durations and cold starts (`History`) the pre-warm rules read (`plan.schedule`, through
the mode's `prewarm_learner` / `prewarm_decode`), the keep-or-release rule of a learner rank after its share
(`plan.ranks`), and the planner's calibration, which it returns as data (`Calibration`) for the planner's owner to
hand over: the clock never writes into the planner.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from rlhfless.plan.ranks import hold_after_share, next_work_after_share
from rlhfless.runtime.modes.policy import History, prewarm_decode, prewarm_learner
from rlhfless.runtime.records import now

TIME_SCALE_ALPHA = 0.3
"""Weight of the newest step's measured / predicted decode busy time in the planner's time-model scale (EWMA):
recent enough to follow a machine whose load changes, smooth enough that one odd step does not swing the plan."""


def smoothed_scale(scale: float | None, ratio: float) -> float:
    """The time-model scale after one more step's measured / predicted ratio (the first step's ratio as is)."""
    return ratio if scale is None else (1 - TIME_SCALE_ALPHA) * scale + TIME_SCALE_ALPHA * ratio


@dataclass(frozen=True)
class Calibration:
    """What the planner should price the next step with, measured: the decode cold start and weight load (None:
    nothing measured yet) and the smoothed measured / predicted decode time (None before the first ratio)."""

    cold_start_s: float | None
    weight_sync_s: float | None
    time_scale: float | None


class StepClock:
    """Times on the run's clock (`rel`: seconds since the runtime started), step windows, pauses, and history."""

    def __init__(self, cfg, policy, keep_alive_s: float | None, t_open: float, offset_s: float = 0.0):
        self.cfg, self.rt, self.policy, self.keep_alive_s = cfg, cfg.runtime, policy, keep_alive_s
        self.t_open = t_open  # when this run segment's runtime opened
        self.t0 = t_open - offset_s  # the origin of every run-relative time (a resumed segment follows the earlier)
        self.step_t0 = t_open
        self.step_t1: float | None = t_open  # step 1's window opens when the runtime does (pool start included)
        self.stage_t0: float | None = None  # this step's rollout start: releases after it are mid-step
        self.last_learn_end: float | None = None
        self.paused: list[tuple[float, float]] = []  # run-relative intervals off the clock (`off_clock`)
        self.history = History()
        self.time_scale: float | None = None  # measured / predicted decode busy time, smoothed
        self.decode_prewarm = 0
        self.steps_done = 0

    def rel(self, t: float) -> float:
        return t - self.t0

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

    def begin_step(self) -> None:
        """Windows are contiguous: a step's window starts where the previous one ended (driver work between
        steps, such as logging, is billed to the next step, so per-step bills add up to the run's)."""
        self.step_t0 = self.step_t1 if self.step_t1 is not None else now()
        self.stage_t0 = None
        if self.last_learn_end is not None:
            self.history.between_s.append(self.step_t0 - self.last_learn_end)

    def learned(self, t0: float) -> None:
        """The update that began at t0 has ended."""
        self.last_learn_end = now()
        self.history.learn_s.append(self.last_learn_end - t0)

    # -- what was measured, and the pre-warm times it gives -------------------------------------------------------
    def cold_start(self, kind: str, default: float) -> float:
        """The recent measured cold start of `kind` (`default` before any)."""
        return self.history.cold(kind, default)

    def observe_rollout(self, seconds: float, makespan_s: float) -> None:
        """A rollout took `seconds` against the plan's predicted makespan (0: no plan): the pre-warm rules' input."""
        self.history.rollout_s.append(seconds)
        if makespan_s > 0:
            self.history.rollout_vs_plan.append(seconds / makespan_s)

    def observe_share_tail(self, seconds: float) -> None:
        self.history.share_tail_s.append(seconds)

    def observe_time_scale(self, ratio: float) -> None:
        self.time_scale = smoothed_scale(self.time_scale, ratio)

    def learner_prewarm_after(self, predicted_makespan_s: float, learners_warm: bool) -> float | None:
        """Seconds after the rollout's start at which to start the learner ranks (None: not pre-warmed, also when
        last step's learners are still warm)."""
        if not self.policy.prewarms(self.rt.prewarm) or learners_warm:
            return None
        return prewarm_learner(self.history, predicted_makespan_s, self.cfg.plan.cold_start_s,
                               self.rt.prewarm_buffer_s, self.rt.prewarm_from).after_s

    def set_decode_prewarm(self, n: int) -> None:
        """How many decode functions this step ran: the next step's decode pre-warm starts as many."""
        self.decode_prewarm = n

    def next_decode_prewarm(self):
        """(seconds after the learner's start, how many) for the next step's decode workers, or None."""
        if not self.policy.prewarms(self.rt.prewarm) or not self.decode_prewarm:
            return None
        pw = prewarm_decode(self.history, self.cfg.plan.cold_start_s, self.rt.prewarm_buffer_s)
        return None if pw.after_s is None else (pw.after_s, self.decode_prewarm)

    def next_decode_work_after_done(self) -> float | None:
        """Separate images: predicted seconds from a decode function's end to its image's next work (the next step's
        rollout, after at least the shortest recent update and driver gap); None before any update is measured."""
        h = self.history
        if not h.learn_s:
            return None
        return min(h.learn_s) + (min(h.between_s) if h.between_s else 0.0)

    def next_learner_work_after_share(self) -> float | None:
        """Separate images: predicted seconds from a rank's share to its image's next work (the next step's update,
        after the update's tail, the driver gap and the shortest recent rollout); None before any is measured."""
        h = self.history
        if not h.share_tail_s or not h.rollout_s:
            return None
        return min(h.share_tail_s) + (min(h.between_s) if h.between_s else 0.0) + min(h.rollout_s)

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

    def calibration(self, step: int, invocations: list) -> Calibration:
        """The measured decode cold start and weight-sync seconds, and the time scale, for the planner to price
        with in place of its assumptions."""
        cold = self.history.cold_s.get("decode")
        # every decode invocation's weight load, zeros included: a cold one loaded inside its cold start, a warm
        # hybrid one holds the weights it computed; the planner adds weight_sync_s to each decode function, so
        # the mean is what it should add (only the loads of warm functions behind the version, it kept 0.2 s
        # assumed forever when every function was warm and at the version)
        syncs = [i.extra["sync_s"] for i in invocations
                 if i.step == step and i.kind == "decode" and "sync_s" in i.extra]
        return Calibration(sum(cold) / len(cold) if cold else None, sum(syncs) / len(syncs) if syncs else None,
                           self.time_scale)
