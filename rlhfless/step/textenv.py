"""The RL environment of a run: the task's prompts and reward, seen through the policy checkpoint's tokenizer.

Everything in a training run that turns text into ids or ids into a reward goes through a `TextEnv`: the step loop,
the held-out evaluation, the runtime's decode functions (inside worker processes) and `bench loop` (the engine and
prefill benchmarks build their own byte-token workloads). So the tiny byte-level
model on the arith task and a user's Hugging Face checkpoint on GSM8K run the same code; only `make_env`'s inputs
differ (`policy.checkpoint`, `policy.chat_template`, `task.*`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlhfless.model.tokenizer import TextTokenizer, load_tokenizer
from rlhfless.core.records import Prompt
from rlhfless.tasks.base import Score, Task

if TYPE_CHECKING:  # the engine imports torch; `train --dry-run` encodes prompts without it
    from rlhfless.rollout.engine import SamplingParams


@dataclass
class TextEnv:
    """A task and the tokenizer its prompts and responses pass through."""

    task: Task
    tok: TextTokenizer

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt ids as the model sees them (BOS or the chat template included)."""
        return self.tok.encode_prompt(prompt.text)

    def score_ids(self, response: Sequence[int], answer: str, truncated: bool) -> tuple[str, Score]:
        """(decoded text, reward) of one generated response."""
        text = self.tok.decode(response)
        return text, self.task.score(text, answer, finished=not truncated)

    def sampling(self, max_new_tokens: int, temperature: float, top_p: float = 1.0) -> SamplingParams:
        """Sampling parameters that stop at this tokenizer's stop ids."""
        from rlhfless.rollout.engine import SamplingParams

        return SamplingParams(max_new_tokens, temperature, top_p, stop_ids=tuple(self.tok.stop_ids))


def make_env(cfg, checkpoint: str | Path | None = None) -> TextEnv:
    """The environment of a `RunConfig`: its task, and the tokenizer of `checkpoint` (default: the policy's)."""
    from rlhfless.tasks.config import make_task

    path = checkpoint if checkpoint is not None else cfg.policy.resolved()
    return TextEnv(make_task(cfg.task), load_tokenizer(path, cfg.policy.chat_template))
