"""GSM8K-format prompts: a JSONL loader (`question`, `answer`) with a few-shot/system template.

Used as a realistic prefill workload: every prompt starts with the same system line and worked examples, which
is the cross-prompt prefix that deduplicated prefill computes once. The reference answer is the text after the
last ``####`` of `answer` (stripped). The first `n_shots` rows of the file are the worked examples and are not
prompts themselves. The data file (shared/data/gsm8k/train.jsonl, MIT) is read in place, never copied.
Non-goals: a GSM8K reward (the tiny byte-level model cannot solve it; the RL task is `tasks.arith`), tokenization.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfless.errors import DataError, require
from rlhfless.jsonl import iter_jsonl
from rlhfless.records import Prompt

DEFAULT_PATH = "../shared/data/gsm8k/train.jsonl"
SHARED_HOME = "../shared/data/gsm8k/"  # beside the repository; never copied into it (MIT, see its LICENSE there)
DEFAULT_SYSTEM = "Solve the math word problem. Think step by step, then give the final answer after '####'.\n\n"
DEFAULT_TEMPLATE = "Question: {question}\nAnswer:"


@dataclass(frozen=True)
class GSM8KConfig:
    """Where the GSM8K-format file is and how prompts are built from it."""

    path: str = DEFAULT_PATH
    """JSONL file with one {"question": str, "answer": str} object per line (relative to the working dir)."""
    n_shots: int = 2
    """Worked examples (the file's first rows, question + full answer) placed before every question (>= 0)."""
    system: str = DEFAULT_SYSTEM
    """Text placed first in every prompt (may be empty)."""
    template: str = DEFAULT_TEMPLATE
    """Format of one question; must contain {question}. A shot is this plus ' ' + its answer + a blank line."""
    limit: int | None = None
    """Keep at most this many prompts (None = all)."""

    def __post_init__(self) -> None:
        require(self.n_shots >= 0, "gsm8k.n_shots", f"must be >= 0 (got {self.n_shots})")
        require("{question}" in self.template, "gsm8k.template", f"must contain {{question}} (got {self.template!r})")
        require(self.limit is None or self.limit >= 1, "gsm8k.limit", f"must be >= 1 or None (got {self.limit})")


@dataclass(frozen=True)
class QA:
    question: str
    answer: str
    """The full worked answer, ending in ``#### <final>``."""
    line: int

    @property
    def final(self) -> str:
        return self.answer.rpartition("####")[2].strip()


def missing_message(path: str | Path) -> str | None:
    """None when the GSM8K file exists, else one line saying exactly why it is missing and where it lives."""
    p = Path(path)
    if p.is_file():
        return None
    return (f"GSM8K file not found at {p.resolve()}: it is not part of the repository but lives in {SHARED_HOME} "
            f"beside it (a plain clone has no ../shared; CI provides it)")


def read_jsonl(path: str | Path) -> list[QA]:
    """Parse the file; a malformed row raises DataError naming its line."""
    rows = []
    for where, obj in iter_jsonl(path, "GSM8K"):
        q, a = obj.get("question"), obj.get("answer")
        if not isinstance(q, str) or not q.strip() or not isinstance(a, str):
            raise DataError(f"{where}: needs a non-empty string 'question' and a string 'answer'")
        if "####" not in a or not a.rpartition("####")[2].strip():
            raise DataError(f"{where}: 'answer' must end with '#### <final answer>'")
        rows.append(QA(q.strip(), a.strip(), int(where.rsplit(":", 1)[1])))
    if not rows:
        raise DataError(f"{path}: no rows (expected JSONL with 'question' and 'answer' per line)")
    return rows


def few_shot_header(cfg: GSM8KConfig, shots: list[QA]) -> str:
    """The shared prefix of every prompt: the system text and the worked examples."""
    return cfg.system + "".join(cfg.template.format(question=s.question) + " " + s.answer + "\n\n" for s in shots)


def load_prompts(cfg: GSM8KConfig) -> list[Prompt]:
    """Prompts with the template applied; prompt_id is ``gsm8k-<line>``."""
    rows = read_jsonl(cfg.path)
    if len(rows) <= cfg.n_shots:
        raise DataError(f"{cfg.path}: {len(rows)} rows, but n_shots={cfg.n_shots} leaves no prompts")
    header = few_shot_header(cfg, rows[: cfg.n_shots])
    body = rows[cfg.n_shots:][: cfg.limit]
    return [Prompt(f"gsm8k-{r.line:05d}", header + cfg.template.format(question=r.question), r.final,
                   meta={"line": r.line, "header_chars": len(header)}) for r in body]
