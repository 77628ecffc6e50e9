"""End to end from the shipped SFT checkpoint: GRPO must raise the reward and move the weights.

A small, hard slice of the task (16 prompts of 7-8 terms, where the checkpoint's samples are right about a third
of the time) revisited every step with a high learning rate: within 24 steps the policy gets clearly better on them.
Removing the update (lr ~ 0), the advantages, or the reward would fail this test.
"""

import json

import torch
from safetensors.torch import load_file

from rlhfless.config import load_run_config
from rlhfless.run.launch import train

OVERRIDES = [
    "task.arith.k_min=7", "task.arith.k_max=8", "task.arith.num_train=16", "task.arith.num_eval=16", "rollout.prompts_per_step=16",
    "algo.group_size=8", "rollout.max_new_tokens=160", "optim.lr=1e-3", "train.steps=24", "train.eval_prompts=0",
    "train.threads=1", "tracking.mode=disabled", "train.plan=false", "train.checkpoint_every=0",
]


def test_grpo_raises_reward_from_the_sft_checkpoint(sft_checkpoint, tmp_path):
    cfg = load_run_config(None, OVERRIDES + [f"policy.checkpoint={sft_checkpoint}"])
    summary = train(cfg, tmp_path / "run", progress=False)
    rewards = [json.loads(x)["reward/mean"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
               if "reward/mean" in x]
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.1, (first, last, rewards)
    before = load_file(sft_checkpoint / "model.safetensors")
    after = load_file(tmp_path / "run" / "checkpoints" / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert summary["steps"] == 24
