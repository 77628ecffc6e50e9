"""Length data: one JSONL schema for response lengths, readers for it and for loop traces, GSM8K conversion.

Schema (one JSON object per line): ``prompt_id`` (str), ``prompt`` (str, the text), ``response_length`` (int,
tokens, EOS included), optional ``epoch``, ``step``, ``sample`` (ints). Loop traces (`rlhfless.core.records.TraceRow`,
which name the length ``response_len``) are read by the same reader, so a run's trace is training data as is.
Rows without ``epoch``/``step`` are "text-only" data (one pass, no history); they are evaluated by a split on
prompts, never on epochs.

Non-goals: tokenizing for a particular model. GSM8K lengths use the project's stated tokenizer
(`rlhfless.model.tokenizer.ByteTokenizer.response_length`: UTF-8 bytes + EOS); users with another tokenizer
write their own rows in this schema.

Deviation from the paper: none (the paper keeps a per-prompt history; this is its storage format).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import DataError
from rlhfless.core.jsonl import iter_jsonl


@dataclass(frozen=True)
class LengthRow:
    """One observed response length.

    prompt_id: stable id of the prompt (history is keyed on it).
    prompt: prompt text (features for text-based predictors).
    response_length: generated tokens, EOS included.
    epoch, step, sample: position in a training run; None for text-only data.
    truncated: True when the response hit the generation cap (its length is a lower bound).
    """

    prompt_id: str
    prompt: str
    response_length: int
    epoch: int | None = None
    step: int | None = None
    sample: int | None = None
    truncated: bool = False


@dataclass(frozen=True)
class Observation:
    """All G observed lengths of one prompt in one step: what `LengthPredictor.update` consumes.

    lengths: the G response lengths (tokens), in sample order.
    """

    prompt_id: str
    prompt: str
    lengths: tuple[int, ...]
    epoch: int = 0
    step: int = 0

    @property
    def mean(self) -> float:
        return sum(self.lengths) / len(self.lengths)


def _int_field(obj: dict, key: str, where: str, required: bool) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise DataError(f"{where}: missing field '{key}'")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{where}: field '{key}' must be an integer (got {value!r})")
    return value


def parse_row(obj: object, where: str) -> LengthRow:
    """Validate one decoded JSON object into a `LengthRow`; `where` (``path:line``) prefixes every error."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object (got {type(obj).__name__})")
    key = "response_length" if "response_length" in obj else "response_len"
    if key not in obj:
        raise DataError(f"{where}: missing field 'response_length' (or a trace's 'response_len')")
    for name in ("prompt_id", "prompt"):
        if not isinstance(obj.get(name), str):
            raise DataError(f"{where}: field '{name}' must be a string (got {obj.get(name)!r})")
    if not isinstance(obj.get("truncated", False), bool):
        raise DataError(f"{where}: field 'truncated' must be true or false (got {obj['truncated']!r})")
    length = _int_field(obj, key, where, required=True)
    if length < 0:
        raise DataError(f"{where}: field '{key}' must be >= 0 (got {length})")
    return LengthRow(
        prompt_id=obj["prompt_id"],
        prompt=obj["prompt"],
        response_length=length,
        epoch=_int_field(obj, "epoch", where, required=False),
        step=_int_field(obj, "step", where, required=False),
        sample=_int_field(obj, "sample", where, required=False),
        truncated=obj.get("truncated", False),
    )


def read_lengths(path: str | Path) -> list[LengthRow]:
    """Read length data or a loop trace (JSONL). Missing/empty files and bad lines raise `DataError`
    naming the file and line."""
    rows = [parse_row(obj, where) for where, obj in iter_jsonl(path, "length data")]
    if not rows:
        raise DataError(f"{path}: no rows (expected JSONL with prompt_id, prompt, response_length)")
    return rows


def write_lengths(rows: Iterable[LengthRow], path: str | Path) -> int:
    """Write rows as JSONL (None fields omitted); returns the number of rows written."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with p.open("w", encoding="utf-8") as fh:
        for row in rows:
            obj = {k: v for k, v in dataclasses.asdict(row).items() if v is not None}
            if not obj.get("truncated"):
                obj.pop("truncated", None)
            fh.write(json.dumps(obj, separators=(",", ":")) + "\n")
            n += 1
    return n


def rows_from_trace(trace_rows: Iterable) -> list[LengthRow]:
    """Convert `rlhfless.core.records.TraceRow`s (in memory) to `LengthRow`s."""
    return [
        LengthRow(r.prompt_id, r.prompt, r.response_len, r.epoch, r.step, r.sample, r.truncated)
        for r in trace_rows
    ]


def has_epochs(rows: Sequence[LengthRow]) -> bool:
    """True when every row carries an epoch (a loop trace), so epoch splits apply."""
    return all(r.epoch is not None for r in rows)


def group_observations(rows: Sequence[LengthRow]) -> list[list[Observation]]:
    """Group rows into per-step batches of `Observation`s, in (epoch, step) order.

    Rows without epoch/step count as epoch 0, step 0 (one batch). Within a step, groups keep first-seen
    order and samples are ordered by `sample` when present.
    """
    groups: dict[tuple[int, int, str], list[LengthRow]] = defaultdict(list)
    for r in rows:
        groups[(r.epoch or 0, r.step or 0, r.prompt_id)].append(r)
    steps: dict[tuple[int, int], list[Observation]] = defaultdict(list)
    for (epoch, step, pid), members in groups.items():
        members.sort(key=lambda r: -1 if r.sample is None else r.sample)
        lengths = tuple(r.response_length for r in members)
        steps[(epoch, step)].append(Observation(pid, members[0].prompt, lengths, epoch, step))
    return [steps[k] for k in sorted(steps)]


def gsm8k_lengths(in_path: str | Path, out_path: str | Path) -> int:
    """Convert GSM8K JSONL (``question``, ``answer``) to length data; returns rows written.

    The length is the reference answer's length under the stated tokenizer (`ByteTokenizer`: UTF-8 bytes
    + EOS); the prompt is the question text; ids are ``gsm8k-<line number>`` (stable for a given file).
    """
    from rlhfless.model.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    rows = []
    for where, obj in iter_jsonl(in_path, "GSM8K"):
        if not all(isinstance(obj.get(k), str) for k in ("question", "answer")):
            raise DataError(f"{where}: expected an object with string fields 'question' and 'answer'")
        rows.append(LengthRow(f"gsm8k-{where.rsplit(':', 1)[1]}", obj["question"], tok.response_length(obj["answer"])))
    if not rows:
        raise DataError(f"{in_path}: no rows (expected GSM8K JSONL with question and answer)")
    return write_lengths(rows, out_path)
