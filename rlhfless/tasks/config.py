"""`task:` of a run config: which task the run trains on, and each task's own settings.

`task.name` picks one; only that task's section is used (the others keep their defaults and are validated like
every config section). `make_task(cfg)` is the one place that maps a name to a `Task` (`tasks.base`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlhfless.core.errors import require
from rlhfless.tasks.arith import ArithTask, ArithTaskConfig
from rlhfless.tasks.base import Task
from rlhfless.tasks.gsm8k import GSM8KTask, GSM8KTaskConfig, corpus_texts, missing_message
from rlhfless.tasks.jsonl_task import JSONLTask, JSONLTaskConfig

TASK_NAMES = ("arith", "gsm8k", "jsonl")


@dataclass
class TaskConfig:
    """The task a run trains and evaluates on."""

    name: Literal["arith", "gsm8k", "jsonl"] = "arith"
    """arith: the synthetic chained-addition task the shipped tiny checkpoint was trained for; gsm8k: grade-school
    math word problems (shared/data/gsm8k), numeric reward; jsonl: any question/answer JSONL file (task.jsonl.path)."""
    arith: ArithTaskConfig = field(default_factory=ArithTaskConfig)
    """Settings of the arith task."""
    gsm8k: GSM8KTaskConfig = field(default_factory=GSM8KTaskConfig)
    """Settings of the gsm8k task."""
    jsonl: JSONLTaskConfig = field(default_factory=JSONLTaskConfig)
    """Settings of the jsonl task."""

    def __post_init__(self) -> None:
        require(self.name in TASK_NAMES, "task.name", f"must be one of {', '.join(TASK_NAMES)} (got {self.name!r})")


def make_task(cfg: TaskConfig) -> Task:
    """The configured task."""
    if cfg.name == "arith":
        return ArithTask(cfg.arith)
    if cfg.name == "gsm8k":
        return GSM8KTask(cfg.gsm8k)
    if cfg.name == "jsonl":
        return JSONLTask(cfg.jsonl)
    raise AssertionError(cfg.name)  # unreachable: TaskConfig rejects unknown names


def tokenizer_corpus(cfg: TaskConfig) -> list[str]:
    """The texts a tokenizer for this task is trained on: GSM8K's questions and worked answers (the file's
    vocabulary), else each train prompt with its answer."""
    if cfg.name == "gsm8k":
        return corpus_texts(cfg.gsm8k.path)
    return [f"{p.text} {p.answer}" for p in make_task(cfg).splits()[0]]


def corpus_problem(cfg: TaskConfig) -> str | None:
    """Why the tokenizer corpus cannot be read (GSM8K's file missing, with where to get it), or None."""
    return missing_message(cfg.gsm8k.path) if cfg.name == "gsm8k" else None
