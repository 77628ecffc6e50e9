"""`StepContext`: what a stage of one step is given, instead of the whole `Runtime`.

A stage (decode, the learner stream, PPO's stream and update, the reference) reads the run's fixed parts here:
the configs, the mode's policy, the pool and the backend, the scratch folder, the step. Everything that changes
while the run goes (the weight version, the invocation records, counters, history, the warm learners) is owned
by the `Runtime` (`run`) and reached through its methods only: a stage never assigns to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfless.runtime.config import RuntimeConfig
from rlhfless.runtime.modes.policy import ModePolicy
from rlhfless.runtime.platform.pool import Pool


@dataclass(frozen=True)
class StepContext:
    """One step's view of the run. `cfg` is the run's `RunConfig` and `run` the `Runtime` (annotations only:
    importing them here would tie this module to the run config and to the executor, which imports it)."""

    step: int
    cfg: "RunConfig"  # noqa: F821  the algorithm, plan, rollout, critic and train sections
    config: RuntimeConfig  # runtime.*
    policy: ModePolicy  # every decision that differs by mode
    pool: Pool  # the workers and their lifecycles
    backend: object  # LocalBackend or RayBackend: send, poll, kill
    scratch: Path  # tmpfs folder of the weight, batch and share files
    keep_alive_s: float
    hybrid: bool  # decode and learner functions share one image (a function can go on in the other role)
    planner: object  # the step planner (None for the serverful control's runs without one)
    time_model: object  # the planner's decode/prefill time model (the config's when there is no planner)
    tok: object  # the tokenizer that turns a sample's tokens into its text
    run: "Runtime"  # noqa: F821  owner of the run's mutable state, through its methods
