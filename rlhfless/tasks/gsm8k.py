"""GSM8K: a JSONL loader (`question`, `answer`) with a few-shot/system template, and the GSM8K task with its reward.

`load_prompts(GSM8KConfig)` is a realistic prefill workload (one system line and worked examples shared by every
prompt); `GSM8KTask(GSM8KTaskConfig)` is the verifiable-reward task (`task.name: gsm8k`): reward 1 when the
response's final answer (`tasks.answers.extract_final`) equals the reference numerically, else `format_reward`
when it is well formed (finished, with ``#### <number>``), else 0; a truncated response gets 0. The rule it
keeps: the first `n_shots` rows are the worked examples, never prompts, and the data file (shared/data/gsm8k,
MIT) is read in place, never copied. The reference answer's form: docs/internals.md#tasksgsm8kpy.

Deviation from the usual GSM8K evaluation (the official test split): only train.jsonl is available, so the
held-out split is carved out of it by a hash of the question (`tasks.hashsplit`, disjoint by construction).
Non-goals: tokenization, chat templates (the policy's tokenizer applies those).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import DataError, require
from rlhfless.core.jsonl import iter_jsonl
from rlhfless.core.records import Prompt
from rlhfless.tasks.answers import answers_match, extract_final, marked_final, normalize_number
from rlhfless.tasks.base import Score
from rlhfless.tasks.hashsplit import check_split_fields, hash_split, normalize_question

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


SOURCE = "github.com/openai/grade-school-math (grade_school_math/data/, MIT)"
"""Where the GSM8K file comes from (the dataset's own repository)."""


def missing_message(path: str | Path, key: str = "task.gsm8k.path") -> str | None:
    """None when the GSM8K file exists, else one line saying why it is missing, where to get it and which setting
    (`key`: the override or flag that names the file) points at it."""
    p = Path(path)
    if p.is_file():
        return None
    return (f"GSM8K file not found at {p.resolve()}: not shipped with the repository; get train.jsonl from {SOURCE}, "
            f"then pass {key}=FILE or put it in {SHARED_HOME}")


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


def few_shot_header(cfg: GSM8KConfig | GSM8KTaskConfig, shots: list[QA]) -> str:
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


def template_error(template: str) -> str | None:
    """Why `template` cannot format a question (None when it can): it must use {question} and no other field."""
    try:
        placed = template.format(question="\0").count("\0") > template.count("\0")
    except (KeyError, IndexError, ValueError) as exc:  # another {field}, a {0} or a lone brace
        return f"must have no replacement field but {{question}} (write a literal brace twice); {exc!r}"
    return None if placed else f"must contain {{question}} (got {template!r})"


@dataclass
class GSM8KTaskConfig:
    """The GSM8K task (`task.name: gsm8k`): where the file is, how prompts are built and split, and the reward."""

    path: str = DEFAULT_PATH
    """JSONL file with one {"question": str, "answer": "... #### <final>"} object per line (relative to the
    working dir; the default is the shared copy beside the repository)."""
    n_shots: int = 0
    """Worked examples (the file's first rows) placed before every question. 0 suits a chat-template model, whose
    user turn is then the question alone; > 0 gives a few-shot prompt for a base model."""
    system: str = DEFAULT_SYSTEM
    """Text placed first in every prompt (may be empty)."""
    template: str = DEFAULT_TEMPLATE
    """Format of one question; must contain {question} (and no other field)."""
    num_eval: int = 500
    """Rows in the held-out split (chosen by a hash of the question: the same whatever num_train is)."""
    num_train: int | None = None
    """Rows in the train split; None = every row that is neither held out nor a few-shot example."""
    split_seed: int = 0
    """Seed of the question hash that splits the file (a different seed gives a different held-out set)."""
    format_reward: float = 0.0
    """Reward for a well-formed ('#### <number>') but wrong response, in [0, 1]; a correct one gets 1.0 in all."""

    def __post_init__(self) -> None:
        require(self.n_shots >= 0, "task.gsm8k.n_shots", f"must be >= 0 (got {self.n_shots})")
        why = template_error(self.template)
        require(why is None, "task.gsm8k.template", str(why))
        check_split_fields("task.gsm8k", self.num_eval, self.num_train, self.format_reward)


def well_formed(response: str) -> bool:
    """The GSM8K answer format: a ``####`` followed by a number (on the first non-empty line after it)."""
    final = marked_final(response)
    return final is not None and normalize_number(final) is not None


def score(response: str, answer: str, finished: bool, format_reward: float = 0.0) -> Score:
    """The GSM8K reward (module docstring). `correct` may hold without `well_formed`: the last-number fallback
    reads "The answer is 18." too, so a chat model is not scored 0 for ignoring the ``####`` convention."""
    if not finished:  # a truncated response may not have reached its final answer: no credit at all
        return Score(reward=0.0, correct=False, well_formed=False)
    correct = answers_match(extract_final(response), answer)
    formed = well_formed(response)
    return Score(reward=1.0 if correct else (format_reward if formed else 0.0), correct=correct, well_formed=formed)


class GSM8KTask:
    """GSM8K behind the `Task` interface (`tasks.base`); the file is read once per instance."""

    name = "gsm8k"

    def __init__(self, cfg: GSM8KTaskConfig):
        self.cfg = cfg
        self._splits: tuple[list[Prompt], list[Prompt]] | None = None

    def splits(self) -> tuple[list[Prompt], list[Prompt]]:
        if self._splits is None:
            self._splits = self._make_splits()
        train, held = self._splits
        return list(train), list(held)

    def _make_splits(self) -> tuple[list[Prompt], list[Prompt]]:
        cfg = self.cfg
        why = missing_message(cfg.path)
        if why:
            raise DataError(why)
        rows = read_jsonl(cfg.path)
        shots = rows[: cfg.n_shots]
        # a later row repeating a worked example's question would leak its answer into the prompt: drop it too
        shown = {normalize_question(s.question) for s in shots}
        rest = [r for r in rows[cfg.n_shots:] if normalize_question(r.question) not in shown]
        train, held = hash_split(rest, lambda r: r.question, cfg.num_eval, cfg.num_train, cfg.split_seed,
                                 f"{cfg.path} (after {cfg.n_shots} few-shot rows)", "task.gsm8k")
        header = few_shot_header(cfg, shots)
        return [self._prompt(r, header) for r in train], [self._prompt(r, header) for r in held]

    def _prompt(self, row: QA, header: str) -> Prompt:
        return Prompt(f"gsm8k-{row.line:05d}", header + self.cfg.template.format(question=row.question), row.final,
                      meta={"line": row.line, "header_chars": len(header), "solution": row.answer})

    def score(self, response: str, answer: str, finished: bool) -> Score:
        return score(response, answer, finished, self.cfg.format_reward)


def corpus_texts(path: str | Path) -> list[str]:
    """The question and answer texts of a GSM8K-format JSONL, in file order (the tokenizer's training corpus)."""
    why = missing_message(path)
    if why:
        raise DataError(why)
    return [t for qa in read_jsonl(path) for t in (qa.question, qa.answer)]
