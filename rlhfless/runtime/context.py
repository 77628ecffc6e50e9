"""`StepContext`: what a stage of one step is given, instead of the whole `Runtime`.

A stage (decode, the learner stream, PPO's stream and update, the reference) reads the run's fixed parts here
(the configs, the mode's policy, the scratch folder, the step) and changes the run's state only through the four
collaborators that own it: the worker set (the pool and the backend; start / keep / release), the ledger
(invocations, counts), the weight store (versions) and the step clock (history, pre-warm times).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlhfless.runtime.config import RuntimeConfig
from rlhfless.runtime.modes.policy import ModePolicy

if TYPE_CHECKING:  # annotations only: the collaborators import nothing of the stages
    from rlhfless.config import RunConfig
    from rlhfless.runtime.clock import StepClock
    from rlhfless.runtime.ledger import Ledger
    from rlhfless.runtime.weights import WeightStore
    from rlhfless.runtime.workerset import WorkerSet


@dataclass(frozen=True)
class StepContext:
    """One step's view of the run."""

    step: int
    cfg: RunConfig  # the algorithm, plan, rollout, critic and train sections
    config: RuntimeConfig  # runtime.*
    policy: ModePolicy  # every decision that differs by mode
    scratch: Path  # tmpfs folder of the weight, batch and share files
    keep_alive_s: float
    hybrid: bool  # decode and learner functions share one image (a function can go on in the other role)
    planner: object  # the step planner (None for the serverful control's runs without one)
    time_model: object  # the planner's decode/prefill time model (the config's when there is no planner)
    tok: object  # the tokenizer that turns a sample's tokens into its text
    overlap: bool  # finished groups stream into the learner during decode (`Runtime.overlaps`)
    workers: WorkerSet  # placement and start / keep / release of functions
    ledger: Ledger  # invocations and the step's counts
    weights: WeightStore  # the versioned state files
    clock: StepClock  # history, pre-warm times, the run's clock
