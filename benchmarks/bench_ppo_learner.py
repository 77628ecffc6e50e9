"""The learner's seconds on one quickstart-size batch: GRPO's update vs PPO's value forward and update.

usage: python benchmarks/bench_ppo_learner.py
Batch: 32 prompts x 8 responses of random tokens (prompt 12 tokens, responses 25-80: the quickstart's lengths),
0/1 rewards, GRPO without group skipping so both train every token; one torch thread. The arms run interleaved,
4 rounds, the first dropped, medians reported, so a contended machine slows them alike. The simulator assumes
PPO's learner costs 2x GRPO's per token plus a value forward at scoring cost (`rlhfless.sim.perf`); this
measures it. Name the CPU beside results.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch

from rlhfless.algo.config import GRPOConfig
from rlhfless.learn.config import CriticConfig, OptimConfig
from rlhfless.learn.critic import load_critic
from rlhfless.learn.learner import Learner
from rlhfless.model.factory import load_policy
from rlhfless.learn.ppo_update import ppo_update

CKPT = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "sft"
B, G, ROUNDS = 32, 8, 4


def batch(seed: int = 0) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    """B prompts of 12 random tokens, B * G responses of 25-80 random tokens, 0/1 rewards."""
    rng = random.Random(seed)
    prompts = [[rng.randint(3, 200) for _ in range(12)] for _ in range(B)]
    responses = [[rng.randint(3, 200) for _ in range(rng.randint(25, 80))] for _ in range(B * G)]
    return prompts, responses, torch.tensor([float(rng.random() < 0.6) for _ in range(B * G)])


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> int:
    torch.set_num_threads(1)
    prompts, responses, rewards = batch()
    grpo = Learner(load_policy(CKPT), OptimConfig(), GRPOConfig(skip_zero_variance_groups=False))
    ppo = {mb: (Learner(load_policy(CKPT), OptimConfig(), GRPOConfig(name="ppo", group_size=G, ppo_mini_batches=mb)),
                load_critic(CriticConfig(), CKPT)) for mb in (1, 2)}
    t: dict[str, list[float]] = {"grpo_update": [], "ppo_values": [], "ppo_update_mb1": [], "ppo_update_mb2": []}
    for _ in range(ROUNDS):  # interleaved, so a change in the machine's load hits every arm alike
        t["grpo_update"].append(timed(lambda: grpo.update(prompts, responses, rewards))[0])
        for mb, (learner, critic) in ppo.items():
            tv, values = timed(lambda: critic.values(prompts, responses, G))
            if mb == 1:
                t["ppo_values"].append(tv)
            t[f"ppo_update_mb{mb}"].append(
                timed(lambda: ppo_update(learner, critic, prompts, responses, rewards, values))[0])
    med = {k: statistics.median(v[1:]) for k, v in t.items()}  # round 1 is the warm-up
    tokens = sum(map(len, responses))
    for k, v in med.items():
        print(f"{k:16s} {v:6.2f} s  {1e6 * v / tokens:7.1f} us/response token  {v / med['grpo_update']:.2f}x "
              "GRPO's update")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
