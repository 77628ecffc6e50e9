"""Held-out evaluation: accuracy of sampled (mean over G samples) and greedy responses, overall and per k.

Uses the rollout engine in chunks so memory stays flat on 1,000+ prompts. Sampled accuracy at the training
temperature averaged over G samples is the headline number: greedy accuracy on a tiny model moves in noisy jumps
(see shared/notes/task-calibration.md), while the sampled mean tracks what GRPO optimises.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from rlhfless.core.records import Prompt
from rlhfless.rollout.engine import SamplingParams, generate
from rlhfless.step.textenv import TextEnv


@dataclass
class EvalResult:
    accuracy: float
    """Fraction of correct responses over all prompts x samples."""
    mean_length: float
    num_prompts: int
    samples_per_prompt: int
    per_k: dict[int, float] = field(default_factory=dict)
    """Accuracy by number of terms (task meta 'k'), where prompts carry it."""


@torch.no_grad()
def evaluate(model, prompts: list[Prompt], samples: int, params: SamplingParams, env: TextEnv, *, seed: int = 0,
             chunk: int = 128, progress=None) -> EvalResult:
    """Accuracy of `samples` responses per prompt (temperature 0 -> greedy, use samples=1); `params` should come
    from `env.sampling` so that generation stops at the tokenizer's stop ids."""
    was_training = model.training
    model.eval()
    correct_by_k: dict[int, list[float]] = defaultdict(list)
    total_correct, total_len, n = 0.0, 0, 0
    for start in range(0, len(prompts), chunk):
        batch = prompts[start:start + chunk]
        ids = [env.encode(p) for p in batch]
        out = generate(model, ids, samples, params, seed=seed + start)
        for r, resp in enumerate(out.responses):
            p = batch[r // samples]
            _, s = env.score_ids(resp, p.answer, out.truncated[r])
            total_correct += s.reward
            total_len += len(resp)
            n += 1
            if "k" in p.meta:
                correct_by_k[int(p.meta["k"])].append(float(s.correct))
        if progress is not None:
            progress(len(batch))
    model.train(was_training)
    per_k = {k: sum(v) / len(v) for k, v in sorted(correct_by_k.items())}
    return EvalResult(total_correct / max(1, n), total_len / max(1, n), len(prompts), samples, per_k)
