"""`RuntimeStages`: the loop's stage callables backed by the runtime, so `loop.run_step` keeps its shape.

rollout -> decode functions (reward scored on the same workers; `score` returns what they scored);
reference_logprobs -> the reference function; values (PPO) -> the value function; learn -> the data-parallel
learner function (PPO: the actor and critic functions, `runtime.ppo_stages`). The driver's own `Learner` (and
PPO's `Critic`) is a mirror brought up to date only when the run needs the weights (evaluation, checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from rlhfless.core import metrics as M
from rlhfless.step.loop import Stages
from rlhfless.core.records import PromptGroup, Sample
from rlhfless.rollout.engine import RolloutOutput
from rlhfless.runtime.executor import Runtime


@dataclass
class RuntimeRollout(RolloutOutput):
    """The rollout as the loop sees it, carrying the step's state to the stages after it: the samples the decode
    functions scored (`score`) and the step's learner stream (`values`, `learn`), so no stage stashes them."""

    samples: list[Sample] = field(default_factory=list)
    stream: object = None


class RuntimeStages(Stages):
    def __init__(self, cfg, learner, planner, mode: str, out: Path, reference_checkpoint: Path | None = None,
                 env=None, progress: bool = False, critic=None):
        super().__init__(cfg, learner, None, planner, env, critic)
        self.runtime = Runtime(cfg, mode, learner, out, reference_checkpoint, planner, self.env, progress, critic)
        self.step = 0

    def begin_step(self, step: int) -> None:
        self.step = step
        self.runtime.begin_step(step)

    def warm_decoders(self) -> int:
        return self.runtime.workers.warm_decoders()

    def end_step(self, step: int) -> dict[str, float]:
        m = self.runtime.end_step(step)
        cal = self.runtime.calibration(step)
        if cal is not None:  # the measured numbers replace the planner's assumptions (the planner is the loop's)
            self.planner.calibrate(cal.cold_start_s, cal.weight_sync_s, cal.time_scale)
            m.update({M.RUNTIME_PLANNER_COLD_START_S: self.planner.cfg.cold_start_s,
                      M.RUNTIME_PLANNER_WEIGHT_SYNC_S: self.planner.cfg.weight_sync_s,
                      M.RUNTIME_TIME_MODEL_SCALE: cal.time_scale or 1.0})
        return m

    def rollout(self, groups: list[PromptGroup], seed: int, plan=None) -> RuntimeRollout:
        out, samples, stream = self.runtime.rollout(groups, seed, plan, self.step)
        return RuntimeRollout(**{f.name: getattr(out, f.name) for f in fields(out)}, samples=samples, stream=stream)

    def score(self, groups: list[PromptGroup], out: RuntimeRollout) -> list[Sample]:
        return out.samples

    def reference_logprobs(self, groups: list[PromptGroup], out: RolloutOutput) -> torch.Tensor | None:
        if self.cfg.algo.kl_coef <= 0:
            return None
        return self.runtime.reference([g.token_ids for g in groups], out.responses, self.step)

    def values(self, groups: list[PromptGroup], out: RolloutOutput) -> torch.Tensor | None:
        return self.runtime.values(out.stream, out.responses) if self.critic is not None else None

    def learn(self, groups, out, samples, ref_logp, values=None) -> dict[str, float]:
        """GRPO: the learner stream's optimiser step; PPO (`values` given): the actor and critic functions, which
        read the values from the value function's file, not from `values`."""
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        return self.runtime.learn(out.stream, [g.token_ids for g in groups], out.responses, rewards, ref_logp,
                                  self.step)

    def sync_learner(self) -> None:
        self.runtime.weights.sync_learner(self.learner)
        if self.critic is not None:
            self.runtime.weights.sync_critic(self.critic)

    def off_clock(self):
        return self.runtime.clock.off_clock()

    def interrupt(self) -> None:
        """Stop every worker now (each gets SIGTERM, then SIGKILL after a grace) and remove the scratch files; the
        driver's learner stays at its last sync (the run resumes from its checkpoint), so `close` has nothing
        left to do."""
        self.interrupted = True
        try:
            self.runtime.interrupt()
        finally:
            self.runtime.cleanup()

    def close(self) -> None:
        """Release every worker first (billing stops), then load the last state into the driver's learner."""
        if getattr(self, "interrupted", False):
            return
        try:
            self.runtime.release()
            self.sync_learner()
        finally:
            self.runtime.cleanup()

    def summary(self) -> dict:
        return self.runtime.summary()

    def step_invocations(self, step: int) -> list[dict]:
        return [i.to_json() for i in self.runtime.ledger.invocations if i.step == step]
