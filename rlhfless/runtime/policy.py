"""Policy: how a step's work is split over workers, which workers exist, and when they start and go.

Two policies share one interface, so the serverful control is a policy, not a second code path:
  * `ServerlessPolicy`: decode work = the planner's assignment (N active actors, each its own function); migration
    when the planner kept cuts at tau; a learner function group and a reference function started per step and
    released after `keep_alive_s` idle; pre-warming from the invocation history.
  * `ServerfulPolicy` (verl-like): W pool workers held for the whole run; each step's prompts split evenly by count
    in contiguous chunks (verl's data-parallel dispatch), no migration, learning on the same W workers.

Pre-warming rule: a stage's workers are started at
    expected start of the stage - measured cold start (mean of the last `HISTORY`) - buffer.
For the learner, the expected start (end of the rollout) comes from `runtime.prewarm_from`:
  * "plan" (default): the planner's predicted makespan for THIS step's placement times the recent ratio of
    measured rollout time to predicted makespan (the prediction alone runs early: a group's mean predicted
    length misses its longest sample, measured about 1.7x on the comparison run);
  * "history" (the paper's rule): the shortest of the last `HISTORY` rollout durations.
Deviation from the paper: batches differ from step to step, so the shortest recent rollout starts the learners
early on most steps, and the idle is billed (measured on the comparison run: learners idle about 0.6 s per step
with "history"); the calibrated per-step prediction is closer. The next step's decode functions are pre-warmed
from the learner's history (the shortest recent update plus the driver's gap); not before step 2.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rlhfless.plan.schedule import PREWARM_HISTORY as HISTORY  # shared with the simulator
from rlhfless.rollout.prefix import plan_prefill
from rlhfless.step.planner import StepPlan


@dataclass
class History:
    """Recent stage durations and measured cold starts (seconds), kept by the runtime."""

    rollout_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    learn_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    rollout_vs_plan: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Measured rollout seconds over the plan's predicted makespan, per recent step."""
    between_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    share_tail_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Serverless learner: from the first rank's share to the update's end (`plan.ranks.next_work_after_share`)."""
    """From the end of the learner to the start of the next rollout (driver work: logging, planning)."""
    cold_s: dict[str, deque] = field(default_factory=dict)

    def cold(self, kind: str, default: float) -> float:
        """The mean of the recent measured cold starts of `kind` (`default` before any)."""
        c = self.cold_s.get(kind)
        return sum(c) / len(c) if c else default

    def add_cold(self, kind: str, seconds: float) -> None:
        self.cold_s.setdefault(kind, deque(maxlen=HISTORY)).append(seconds)


def split_by_count(n_groups: int, workers: int) -> list[list[int]]:
    """verl's dispatch: contiguous chunks whose sizes differ by at most one (empty chunks for extra workers)."""
    return [list(map(int, c)) for c in np.array_split(np.arange(n_groups), workers)]


def plan_split(plan: StepPlan) -> list[list[int]]:
    """The planner's assignment as group indices per active decode actor (in the plan's admission order)."""
    index = {id(j): i for i, j in enumerate(plan.jobs)}
    return [[index[id(j)] for j in jobs] for jobs in plan.decision.plan.actor_jobs if jobs]


@dataclass(frozen=True)
class Prewarm:
    """Seconds after a stage's start at which to start the next stage's workers (None: do not pre-warm)."""

    after_s: float | None


def prewarm_learner(history: History, predicted_makespan_s: float, cold_default: float, buffer_s: float,
                    source: str = "plan") -> Prewarm:
    """When to start the learner group, in seconds after the rollout started (rule in the module header)."""
    if source == "plan" and history.rollout_vs_plan:
        expected = predicted_makespan_s * sum(history.rollout_vs_plan) / len(history.rollout_vs_plan)
    elif history.rollout_s:
        expected = min(history.rollout_s)
    else:
        expected = predicted_makespan_s
    return Prewarm(max(0.0, expected - history.cold("learner", cold_default) - buffer_s))


def prewarm_decode(history: History, cold_default: float, buffer_s: float) -> Prewarm:
    if not history.learn_s:
        return Prewarm(None)
    expected = min(history.learn_s) + (min(history.between_s) if history.between_s else 0.0)
    return Prewarm(max(0.0, expected - history.cold("decode", cold_default) - buffer_s))


def ship_saves_tokens(prompts: list[list[int]], split: list[list[int]], group_size: int, dedup: bool) -> int:
    """Prompt tokens a prefill function computing every prefix once saves over actors prefilling their own groups
    (each actor still computes each of its prompts once: only prefixes shared ACROSS actors are saved)."""
    local = sum(plan_prefill([prompts[g] for g in gs], group_size, dedup=dedup).tokens_computed
                for gs in split if gs)
    return local - plan_prefill(prompts, group_size, dedup=dedup).tokens_computed


def should_ship(mode: str, saved_tokens: int, prefill_s_per_token: float, cold_start_s: float) -> bool:
    """never / always / auto: ship when the recompute it saves outweighs starting a prefill function (its cold
    start sits on the critical path: the decode functions wait for its KV)."""
    if mode != "auto":
        return mode == "always"
    return saved_tokens * prefill_s_per_token > cold_start_s
