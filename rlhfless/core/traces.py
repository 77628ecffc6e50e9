"""Length traces: one JSONL line per generated response (`rlhfless.core.records.TraceRow`).

Written by the training loop into the run directory and read by the predictors and the simulator. JSONL keeps
traces appendable (nothing is lost if a run stops) and readable with `pandas.read_json(lines=True)`.
`read_trace` refuses, with a one-line `DataError` naming the file and line: unreadable bytes (a truncated `.gz`),
a line that is not a JSON object, a missing field, and a field of the wrong type (prompt_id and prompt strings;
epoch, step, sample, prompt_len, response_len integers >= 0; truncated true/false; reward a number). Fields
beyond TraceRow's are ignored, so newer traces stay readable.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from rlhfless.core.errors import DataError
from rlhfless.core.jsonl import iter_jsonl, open_text
from rlhfless.core.records import TraceRow

TRACE_FIELDS = tuple(f.name for f in dataclasses.fields(TraceRow))


class TraceWriter:
    """Append-only JSONL writer (gzip for a `.gz` name); flushes after each batch so a crash loses one step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open_text(self.path, "a")

    def write(self, rows: Iterable[TraceRow]) -> None:
        if self._fh is None:
            raise RuntimeError("TraceWriter is closed")
        for row in rows:
            self._fh.write(json.dumps(dataclasses.asdict(row), separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_COUNTS = ("epoch", "step", "sample", "prompt_len", "response_len")


def read_trace(path: str | Path) -> Iterator[TraceRow]:
    """Yield rows of a trace file (`.jsonl` or `.jsonl.gz`); problems raise `DataError` naming the line."""
    for where, obj in iter_jsonl(path, "trace"):
        missing = [f for f in TRACE_FIELDS if f not in obj]
        if missing:
            raise DataError(f"{where}: missing trace field(s) {missing}")
        problem = _field_problem(obj)
        if problem:
            raise DataError(f"{where}: trace field {problem}")
        yield TraceRow(**{f: obj[f] for f in TRACE_FIELDS})


def _field_problem(obj: dict) -> str | None:
    """What is wrong with the types of a trace row's fields, or None."""
    def bad(name: str, kind: str) -> str:
        return f"'{name}' must be {kind} (got {json.dumps(obj[name])[:60]})"

    for name in ("prompt_id", "prompt"):
        if not isinstance(obj[name], str):
            return bad(name, "a string")
    for name in _COUNTS:
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return bad(name, "an integer >= 0")
    if not isinstance(obj["truncated"], bool):
        return bad("truncated", "true or false")
    if isinstance(obj["reward"], bool) or not isinstance(obj["reward"], (int, float)):
        return bad("reward", "a number")
    return None


def length_stats(rows: Iterable[TraceRow]) -> dict[str, float]:
    """How RLHF-like a trace's lengths are (all pure arithmetic on response_len):

    prompt_mean_spread: max/min over prompts of a prompt's mean length (prompt dependence);
    epoch_corr: Pearson and Spearman correlation of a prompt's mean length between consecutive epochs, averaged
        over epoch pairs (stability that makes history-based prediction work);
    within_group_cv_mean/median: coefficient of variation of the G lengths of one prompt in one step;
    top10_token_share: share of all tokens held by the longest 10% of responses (the long tail);
    max_over_p50: longest response over the median one.
    """
    import numpy as np
    import pandas as pd
    from scipy.stats import spearmanr

    df = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    if df.empty:
        raise DataError("length_stats: the trace has no rows")
    per_prompt = df.groupby("prompt_id")["response_len"].mean()
    groups = df.groupby(["step", "prompt_id"])["response_len"]
    cv = (groups.std(ddof=0) / groups.mean()).to_numpy()
    by_epoch = df.groupby(["epoch", "prompt_id"])["response_len"].mean().unstack("epoch")
    pearson, spearman = [], []
    for a, b in zip(by_epoch.columns[:-1], by_epoch.columns[1:]):
        both = by_epoch[[a, b]].dropna()
        if len(both) > 2:
            pearson.append(float(np.corrcoef(both[a], both[b])[0, 1]))
            spearman.append(float(spearmanr(both[a], both[b]).statistic))
    lens = np.sort(df["response_len"].to_numpy())[::-1]
    top = lens[: max(1, len(lens) // 10)]
    return {
        "rows": int(len(df)), "prompts": int(per_prompt.size), "epochs": int(df["epoch"].nunique()),
        "prompt_mean_spread": float(per_prompt.max() / per_prompt.min()),
        "epoch_corr_pearson": float(np.mean(pearson)) if pearson else float("nan"),
        "epoch_corr_spearman": float(np.mean(spearman)) if spearman else float("nan"),
        "within_group_cv_mean": float(np.mean(cv)), "within_group_cv_median": float(np.median(cv)),
        "within_group_identical_frac": float(np.mean(cv == 0)),
        "top10_token_share": float(top.sum() / lens.sum()),
        "max_over_p50": float(lens[0] / np.median(lens)),
        "truncated_frac": float(df["truncated"].mean()),
    }
