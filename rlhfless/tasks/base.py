"""The task interface: what the step loop needs from a verifiable-reward task, and nothing about tokens.

A task gives disjoint train and held-out prompts (`splits`) and a rule-based reward for a decoded response
(`score`). The loop, the evaluation and the runtime's decode functions call only these two, through
`make_task(cfg.task)`; which tokenizer turns a prompt into ids is the policy checkpoint's business
(`rlhfless.model.tokenizer.load_tokenizer`). A new task is a module with a config dataclass and a class with these
two methods, registered in `TASKS` below.

`score` takes the prompt's reference answer as a string (not the Prompt) because the runtime ships rows to worker
processes as token ids plus that string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rlhfless.core.records import Prompt


@dataclass(frozen=True)
class Score:
    """A response's reward and the two facts behind it (logged as accuracy and format_ok)."""

    reward: float
    correct: bool
    well_formed: bool


class Task(Protocol):
    """A source of prompts with a verifiable reward."""

    name: str

    def splits(self) -> tuple[list[Prompt], list[Prompt]]:
        """(train, held-out): disjoint by construction, reproducible from the task's config."""
        ...

    def score(self, response: str, answer: str, finished: bool) -> Score:
        """Reward of a decoded `response` (stop token removed) against the reference `answer`; `finished` is False
        when generation hit max_new_tokens without a stop token."""
        ...
