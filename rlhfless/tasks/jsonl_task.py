"""Any question/answer JSONL file as a verifiable-reward task (`task.name: jsonl`), set up by field names and regexes.

Each line is a JSON object; `question_field` holds the question (a non-empty string), `answer_field` the reference
(a string or a number). `answer_regex`, when set, cuts the reference out of that field (its first group: e.g.
``####\\s*(.+)$`` for GSM8K's worked answers); otherwise the whole field, stripped, is the reference.
A prompt is `system` + `template` with the question; the file is split like GSM8K (`tasks.hashsplit`).

Reward: the prediction is the first group of the LAST match of `response_regex` in the response. It is correct
when it equals the reference: numerically (`tasks.answers.normalize_number`) when `numeric` is on and both sides
are single numbers, else as stripped strings (exact: case and punctuation count). A correct response scores 1.0,
a well-formed one (finished, `response_regex` matches) `format_reward`, anything else (a truncated response
included) 0. Unlike the GSM8K task there is no last-number fallback: a response the regex does not match is
neither correct nor well formed, because a generic answer need not be a number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import DataError, require
from rlhfless.core.jsonl import iter_jsonl
from rlhfless.core.records import Prompt
from rlhfless.tasks.answers import normalize_number
from rlhfless.tasks.base import Score
from rlhfless.tasks.gsm8k import template_error
from rlhfless.tasks.hashsplit import check_split_fields, hash_split


def _regex_error(pattern: str) -> str | None:
    """Why `pattern` cannot give an answer (None when it can): it must compile and have a capture group."""
    try:
        groups = re.compile(pattern).groups
    except re.error as exc:
        return f"not a valid regex ({exc}): {pattern!r}"
    return None if groups >= 1 else f"needs a capture group, e.g. '####\\s*(.+)' (got {pattern!r})"


@dataclass
class JSONLTaskConfig:
    """A question/answer JSONL file as a task (`task.name: jsonl`)."""

    path: str = ""
    """The JSONL file (relative to the working dir); required when task.name is jsonl."""
    question_field: str = "question"
    """Key of the question in each object."""
    answer_field: str = "answer"
    """Key of the reference answer in each object (a string or a number)."""
    answer_regex: str | None = None
    """Regex searched in the answer field; its first group is the reference. None: the whole field, stripped."""
    response_regex: str = r"####\s*(.+)"
    """Regex searched in a response; the first group of its last match is the prediction."""
    template: str = "{question}"
    """Format of one question; must contain {question} (and no other field)."""
    system: str = ""
    """Text placed first in every prompt (may be empty)."""
    num_eval: int = 500
    """Rows in the held-out split (chosen by a hash of the question: the same whatever num_train is)."""
    num_train: int | None = None
    """Rows in the train split; None = every row not held out."""
    split_seed: int = 0
    """Seed of the question hash that splits the file."""
    format_reward: float = 0.0
    """Reward for a well-formed (response_regex matches) but wrong response, in [0, 1]; a correct one gets 1.0."""
    numeric: bool = True
    """Compare as numbers when both sides are single numbers ('$1,200.00' = '1200'); else as stripped strings."""

    def __post_init__(self) -> None:
        # an empty path is checked by JSONLTask: this section is validated even when another task is selected
        for name in ("question_field", "answer_field"):
            require(bool(getattr(self, name)), f"task.jsonl.{name}", "must be a non-empty key")
        why = None if self.answer_regex is None else _regex_error(self.answer_regex)
        require(why is None, "task.jsonl.answer_regex", str(why))
        why = _regex_error(self.response_regex)
        require(why is None, "task.jsonl.response_regex", str(why))
        why = template_error(self.template)
        require(why is None, "task.jsonl.template", str(why))
        check_split_fields("task.jsonl", self.num_eval, self.num_train, self.format_reward)


@dataclass(frozen=True)
class Row:
    question: str
    answer: str
    """The reference answer (after answer_regex)."""
    line: int


def file_stem(path: str | Path) -> str:
    """The file's name without .gz/.jsonl/.json, the prefix of its prompt ids."""
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def parse_row(obj: dict, where: str, cfg: JSONLTaskConfig) -> Row:
    """One line as a Row; a missing field or an answer the regex does not match raises DataError naming `where`."""
    q, a = obj.get(cfg.question_field), obj.get(cfg.answer_field)
    if not isinstance(q, str) or not q.strip():
        raise DataError(f"{where}: needs a non-empty string {cfg.question_field!r} (task.jsonl.question_field)")
    if isinstance(a, bool) or not isinstance(a, (str, int, float)):
        raise DataError(f"{where}: needs a string or number {cfg.answer_field!r} (task.jsonl.answer_field)")
    gold = str(a).strip()
    if cfg.answer_regex is not None:
        m = re.search(cfg.answer_regex, str(a))
        if m is None or m.group(1) is None:
            raise DataError(f"{where}: task.jsonl.answer_regex {cfg.answer_regex!r} does not match the answer "
                            f"{str(a)[-80:]!r}")
        gold = m.group(1).strip()
    if not gold:
        raise DataError(f"{where}: the reference answer is empty (task.jsonl.answer_field, task.jsonl.answer_regex)")
    return Row(q.strip(), gold, int(where.rsplit(":", 1)[1]))


def read_rows(cfg: JSONLTaskConfig) -> list[Row]:
    rows = [parse_row(obj, where, cfg) for where, obj in iter_jsonl(cfg.path, "task.jsonl")]
    if not rows:
        raise DataError(f"{cfg.path}: no rows (expected JSONL with {cfg.question_field!r} and "
                        f"{cfg.answer_field!r} per line)")
    return rows


def same_answer(pred: str, gold: str, numeric: bool) -> bool:
    if numeric:
        a, b = normalize_number(pred), normalize_number(gold)
        if a is not None and b is not None:
            return a == b
    return pred.strip() == gold.strip()


class JSONLTask:
    """A JSONL file behind the `Task` interface (`tasks.base`); the file is read once per instance."""

    name = "jsonl"

    def __init__(self, cfg: JSONLTaskConfig):
        require(bool(cfg.path), "task.jsonl.path", "must be set to a JSONL file when task.name is jsonl")
        self.cfg = cfg
        self._response_re = re.compile(cfg.response_regex)
        self._splits: tuple[list[Prompt], list[Prompt]] | None = None

    def splits(self) -> tuple[list[Prompt], list[Prompt]]:
        if self._splits is None:
            cfg = self.cfg
            train, held = hash_split(read_rows(cfg), lambda r: r.question, cfg.num_eval, cfg.num_train,
                                     cfg.split_seed, cfg.path, "task.jsonl")
            self._splits = [self._prompt(r) for r in train], [self._prompt(r) for r in held]
        train, held = self._splits
        return list(train), list(held)

    def _prompt(self, row: Row) -> Prompt:
        return Prompt(f"{file_stem(self.cfg.path)}-{row.line:05d}",
                      self.cfg.system + self.cfg.template.format(question=row.question), row.answer,
                      meta={"line": row.line, "header_chars": len(self.cfg.system)})

    def score(self, response: str, answer: str, finished: bool) -> Score:
        matches = list(self._response_re.finditer(response))
        last = matches[-1] if matches else None
        if not finished or last is None:  # truncated: no credit, as in every task
            return Score(reward=0.0, correct=False, well_formed=False)
        pred = last.group(1)
        correct = pred is not None and same_answer(pred, answer, self.cfg.numeric)
        return Score(reward=1.0 if correct else self.cfg.format_reward, correct=correct, well_formed=True)
