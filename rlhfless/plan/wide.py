"""Per-actor tensor parallelism: one decode actor of the step on a wider engine (more devices, higher TP).

Purpose: the step's straggler actor (the busiest predicted: with contiguous assignment it holds the longest
groups) may run at a wider TP, so the tail that bounds the rollout decodes faster, while the narrow actors keep
the short work cheap. `WideActor` is the wide engine (its own `TimeModel`, devices, KV capacity, cold start and
weight sync); `on_wide(jobs, wide)` re-simulates one actor's jobs on it. The scaler (`plan.scaler.choose`, given a
`WideActor`) weighs the chosen N with and without the wide straggler by the same rule as its cuts and keeps it
only where that rule prefers it; the simulator plays the same choice.

Non-goals: one wide actor per step at most; not combined with cut-and-migrate (a plan that keeps its cuts stays
narrow); no re-packing of groups onto the wide actor (it takes the straggler's share as assigned).

Deviations from the paper: the paper runs every actor at one TP; per-actor TP is ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlhfless.core.errors import require
from rlhfless.plan.balancer import JobArrays, build_plan, labels_finish_s
from rlhfless.plan.records import AssignmentPlan, PlanJob
from rlhfless.plan.timemodel import TimeModel


@dataclass(frozen=True)
class WideActor:
    """The wide engine: time model per replica, devices it holds, KV capacity (sequences), cold start and weight
    sync seconds."""

    time_model: TimeModel
    gpus: float
    capacity: int
    cold_start_s: float
    weight_sync_s: float

    def __post_init__(self) -> None:
        require(self.gpus > 0, "wide.gpus", f"must be > 0 (got {self.gpus})")
        require(self.capacity >= 1, "wide.capacity", f"must be >= 1 (got {self.capacity})")
        require(self.cold_start_s >= 0 and self.weight_sync_s >= 0, "wide.cold_start_s",
                "cold start and weight sync must be >= 0 s")


def straggler(plan: AssignmentPlan, busy_s: Sequence[float]) -> int:
    """The busiest active actor (ties: the lower id); -1 when none is active."""
    active = [a for a, jobs in enumerate(plan.actor_jobs) if jobs]
    return min(active, key=lambda a: (-busy_s[a], a)) if active else -1


def on_wide(jobs: Sequence[PlanJob], wide: WideActor) -> tuple[float, np.ndarray]:
    """(busy seconds, (J,) finish seconds of each job from the actor's start) of one actor's jobs, in their
    admission order, on the wide engine (the same simulation `build_plan` and `labels_finish_s` run)."""
    ja = JobArrays.from_jobs(list(jobs))
    labels, rank = np.zeros(len(ja.jobs), dtype=np.int64), np.arange(len(ja.jobs))
    plan = build_plan(ja, labels, rank, 1, wide.capacity, wide.time_model, "wide")
    return float(plan.busy_s[0]), labels_finish_s(ja, labels, rank, 1, wide.capacity, wide.time_model)
