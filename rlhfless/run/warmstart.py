"""Supervised warm start of a policy on a task's worked solutions, through the run's `TextEnv`.

Why: a randomly initialised model (`policy.build=tiny-bpe`) never earns a reward on GSM8K, so every group's G
rewards are equal, every advantage is zero and GRPO has nothing to learn from. A few hundred steps on the train
split's worked solutions (`Prompt.meta["solution"]`, which the GSM8K task provides) teach it the answer format
(``#### <number>`` then the stop token), so the format reward and the occasional right answer give GRPO a signal.
Only train-split prompts are used: the held-out split stays unseen. The prompt is encoded exactly as the loop
encodes it (chat template included); the loss is next-token cross-entropy on the solution and the stop token only.
Non-goals: a good GSM8K solver (a 1M-parameter model is not one), packing, mixed precision.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from rlhfless.core.errors import DataError, require
from rlhfless.run.pretrain import lr_at, pad_batch, sft_step
from rlhfless.core.records import Prompt


@dataclass(frozen=True)
class WarmStartConfig:
    """The warm start's optimisation (AdamW, linear warmup then cosine decay to 10%)."""

    steps: int = 150
    """Optimiser steps (150 x 16 solutions: 3 of 64 sampled held-out responses end in '#### <number>', from none)."""
    batch_size: int = 16
    """Solutions per step."""
    lr: float = 3e-3
    """Peak learning rate."""
    warmup_steps: int = 20
    """Linear warmup steps (capped at steps // 5, so a short warm start still decays)."""
    seed: int = 0
    """Seeds the batch order."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "policy.build_sft_steps", f"must be >= 1 (got {self.steps})")
        require(self.batch_size >= 1, "warm_start.batch_size", f"must be >= 1 (got {self.batch_size})")
        require(self.lr > 0, "warm_start.lr", f"must be > 0 (got {self.lr})")
        require(self.warmup_steps >= 0, "warm_start.warmup_steps", f"must be >= 0 (got {self.warmup_steps})")
        object.__setattr__(self, "warmup_steps", min(self.warmup_steps, self.steps // 5))


def solution_pairs(env, prompts: list[Prompt], context: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, solution ids + the first stop id) of every prompt with a worked solution that fits `context`."""
    stop = env.tok.stop_ids[0]
    pairs = []
    for p in prompts:
        sol = p.meta.get("solution")
        if not sol:
            continue
        pair = (env.encode(p), env.tok.encode_text(sol) + [stop])
        if len(pair[0]) + len(pair[1]) <= context:
            pairs.append(pair)
    if not pairs:
        raise DataError(f"task {env.task.name}: no train prompt carries a worked solution (meta 'solution') that "
                        f"fits the context of {context} tokens; set policy.build_sft_steps=0 to skip the warm start")
    return pairs


def warm_start(model, pairs: list[tuple[list[int], list[int]]], cfg: WarmStartConfig, progress: bool = True) -> dict:
    """Train `model` in place on `pairs`; returns what it did (steps, examples, first/last loss, seconds)."""
    from tqdm.auto import tqdm

    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in tqdm(range(cfg.steps), desc="warm start (SFT)", disable=not progress):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        losses.append(sft_step(model, opt, *pad_batch(rng.sample(pairs, min(cfg.batch_size, len(pairs))))))
    model.eval()
    k = max(1, min(20, len(losses) // 5))
    return {"steps": cfg.steps, "examples": len(pairs), "loss_first": sum(losses[:k]) / k,
            "loss_last": sum(losses[-k:]) / k, "seconds": round(time.perf_counter() - t0, 1)}
