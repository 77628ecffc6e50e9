"""One synchronous GRPO or PPO step, as a sequence of stage callables with timed boundaries.

    prompts -> plan (predict lengths, choose N, assign) -> rollout (prefill + decode) -> score (rule-based
    reward) -> reference -> values (PPO's critic forward) -> learn -> observe (predictor update, plan scored
    with true lengths) -> report

Each stage is a method of `Stages` taking and returning typed records, timed as `timing_s/<stage>`, so a later
runtime can run any stage as a serverless function (and insert plan/predict stages) without touching the others.
No math lives here: advantages and losses are in `rlhfless.algo`, the update in `rlhfless.learn.learner`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from rlhfless.core import metrics as M
from rlhfless.config import RunConfig
from rlhfless.learn.learner import Learner
from rlhfless.step.planner import Planner, StepPlan
from rlhfless.learn.ppo_update import ppo_update
from rlhfless.core.records import PromptGroup, Sample, TraceRow
from rlhfless.rollout.engine import RolloutOutput, generate
from rlhfless.rollout.forward import response_logprobs
from rlhfless.step.textenv import TextEnv, make_env


@dataclass
class StepReport:
    """What one step produced: the samples (for traces and tables) and every metric."""

    step: int
    epoch: int
    groups: list[PromptGroup]
    samples: list[Sample]
    rollout: RolloutOutput
    metrics: dict[str, float] = field(default_factory=dict)
    plan: StepPlan | None = None
    prediction_rows: list = field(default_factory=list)
    invocations: list[dict] = field(default_factory=list)
    """The runtime's invocation records of this step (empty inline)."""

    def trace_rows(self) -> list[TraceRow]:
        rows = []
        for s in self.samples:
            g = self.groups[s.group_index]
            rows.append(TraceRow(prompt_id=g.prompt.prompt_id, prompt=g.prompt.text, epoch=self.epoch,
                                 step=self.step, sample=s.sample_index, prompt_len=len(g.token_ids),
                                 response_len=s.response_len, truncated=s.truncated, reward=s.reward))
        return rows


@contextmanager
def timed(metrics: dict[str, float], stage: str):
    t0 = time.perf_counter()
    yield
    metrics[M.timing(stage)] = time.perf_counter() - t0


class Stages:
    """The stage callables of one step, sharing the policy, the optional reference model, the config and the
    environment (the task's reward through the policy's tokenizer; `make_env(cfg)` when not given)."""

    def __init__(self, cfg: RunConfig, learner: Learner, reference=None, planner: Planner | None = None,
                 env: TextEnv | None = None, critic=None):
        self.cfg = cfg
        self.learner = learner
        self.critic = critic
        """PPO's `rlhfless.learn.critic.Critic` (None for GRPO)."""
        self.reference = reference
        self.planner = planner
        self.env = env if env is not None else make_env(cfg)
        r = cfg.rollout
        self.sampling = self.env.sampling(r.max_new_tokens, r.temperature, r.top_p)
        self.vllm = None  # rollout.engine=vllm: started on the first rollout

    def begin_step(self, step: int) -> None:
        """Called first in every step (the runtime opens its billing window here)."""

    def end_step(self, step: int) -> dict[str, float]:
        """Called last in every step; returns the step's runtime metrics (none inline)."""
        return {}

    def warm_decoders(self) -> int:
        """Decode functions that would start warm now (the planner prices no cold start for them); none inline."""
        return 0

    def sync_learner(self) -> None:
        """Make `learner` hold the newest weights and optimizer state (inline: it always does)."""

    @contextmanager
    def off_clock(self):
        """Driver work between steps that is not RL training (mid-run evaluation, checkpoints): the runtime bills
        it to neither mode (inline bills nothing)."""
        yield

    def interrupt(self) -> None:
        """SIGINT or SIGTERM cut the step short: stop what runs elsewhere at once (inline: nothing does; `close`
        follows either way)."""

    def close(self) -> None:
        """Release whatever the stages hold (inline: the vLLM engine when one was started)."""
        if self.vllm is not None:
            self.vllm.close()
            self.vllm = None

    def summary(self) -> dict:
        """What the run's stages cost and did (inline: nothing to report)."""
        return {}

    def step_invocations(self, step: int) -> list[dict]:
        """The function invocations of `step` as plain rows (inline: none)."""
        return []

    def rollout(self, groups: list[PromptGroup], seed: int, plan: StepPlan | None = None) -> RolloutOutput:
        """Generate G responses per group (inline: one engine batch; the plan is only logged)."""
        self.learner.model.eval()
        prompts = [g.token_ids for g in groups]
        if self.cfg.rollout.engine == "vllm":
            return self._vllm().generate(prompts, self.cfg.algo.group_size, self.sampling, seed=seed)
        return generate(self.learner.model, prompts, self.cfg.algo.group_size, self.sampling, seed=seed,
                        dedup=self.cfg.rollout.dedup_prefill)

    def _vllm(self):
        """The vLLM engine, holding the learner's current weights (swapped in place every step: a resumed run's
        learner differs from the checkpoint the engine loads, and the tiny policy's copy costs milliseconds)."""
        if self.vllm is None:
            from rlhfless.rollout.vllm_engine import VLLMEngine

            self.vllm = VLLMEngine(self.cfg.policy.resolved(), threads=self.cfg.train.threads)
        self.vllm.load_weights(self.learner.model.state_dict())
        return self.vllm

    def score(self, groups: list[PromptGroup], out: RolloutOutput) -> list[Sample]:
        G = self.cfg.algo.group_size
        samples = []
        for r, resp in enumerate(out.responses):
            g, s = divmod(r, G)
            text, sc = self.env.score_ids(resp, groups[g].prompt.answer, out.truncated[r])
            samples.append(Sample(g, s, tuple(resp), text, out.truncated[r], sc.reward, sc.correct, sc.well_formed))
        return samples

    @torch.no_grad()
    def reference_logprobs(self, groups: list[PromptGroup], out: RolloutOutput) -> torch.Tensor | None:
        if self.reference is None:
            return None
        return response_logprobs(self.reference, [g.token_ids for g in groups], out.responses,
                                 self.cfg.algo.group_size, reuse_prefix=self.cfg.rollout.reuse_prefix_forward).logp

    def values(self, groups: list[PromptGroup], out: RolloutOutput) -> torch.Tensor | None:
        """PPO: [B*G, T] the critic's values of the rollout, before any update (None for GRPO)."""
        if self.critic is None:
            return None
        return self.critic.values([g.token_ids for g in groups], out.responses, self.cfg.algo.group_size)

    def learn(self, groups: list[PromptGroup], out: RolloutOutput, samples: list[Sample],
              ref_logp: torch.Tensor | None, values: torch.Tensor | None = None) -> dict[str, float]:
        self.learner.model.train()
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        prompts = [g.token_ids for g in groups]
        if values is None:
            return self.learner.update(prompts, out.responses, rewards, ref_logp)
        return ppo_update(self.learner, self.critic, prompts, out.responses, rewards, values, ref_logp,
                          seed=self.cfg.train.seed)


def run_step(stages: Stages, groups: list[PromptGroup], step: int, epoch: int, seed: int) -> StepReport:
    """One synchronous step; reads like the diagram in docs/architecture.md."""
    m: dict[str, float] = {}
    t0 = time.perf_counter()
    stages.begin_step(step)
    plan = None
    if stages.planner is not None:
        with timed(m, "plan"):
            plan, plan_metrics = stages.planner.plan_step(groups, n_warm=stages.warm_decoders())
        m.update(plan_metrics)
    with timed(m, "rollout"):
        out = stages.rollout(groups, seed, plan)
    with timed(m, "reward"):
        samples = stages.score(groups, out)
    with timed(m, "reference"):
        ref_logp = stages.reference_logprobs(groups, out)
    values = None
    if stages.cfg.algo.name == "ppo":
        with timed(m, "values"):
            values = stages.values(groups, out)
    with timed(m, "update"):
        m.update(stages.learn(groups, out, samples, ref_logp, values))
    rows = []
    if plan is not None:
        with timed(m, "observe"):
            rows, observed = stages.planner.observe_step(plan, groups, samples, epoch, step)
        m.update(observed)
    m.update(stages.end_step(step))
    m[M.timing("step")] = time.perf_counter() - t0
    m.update(rollout_metrics(out, samples))
    return StepReport(step, epoch, groups, samples, out, m, plan, rows, stages.step_invocations(step))


def rollout_metrics(out: RolloutOutput, samples: list[Sample]) -> dict[str, float]:
    """Reward, length, prefill and throughput metrics of one rollout (pure)."""
    lens = torch.tensor([s.response_len for s in samples], dtype=torch.float32)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    decode_s = max(out.decode_seconds, 1e-9)
    return {
        M.REWARD_MEAN: rewards.mean().item(),
        M.REWARD_STD: rewards.std().item() if len(rewards) > 1 else 0.0,
        M.ACCURACY: sum(s.correct for s in samples) / len(samples),
        M.FORMAT_OK: sum(s.well_formed for s in samples) / len(samples),
        M.RESP_LEN_MEAN: lens.mean().item(),
        M.RESP_LEN_MAX: lens.max().item(),
        M.RESP_LEN_MIN: lens.min().item(),
        M.RESP_LEN_CLIP: sum(s.truncated for s in samples) / len(samples),
        M.PREFILL_DEDUP_RATIO: out.prefill.dedup_ratio,
        M.PREFILL_SAVED_TOKENS: float(out.prefill.tokens_naive - out.prefill.tokens_computed),
        M.timing("prefill"): out.prefill.seconds,
        M.timing("decode"): out.decode_seconds,
        M.THROUGHPUT: out.generated_tokens / (decode_s + out.prefill.seconds),
        M.TOKENS: float(out.generated_tokens),
    }
