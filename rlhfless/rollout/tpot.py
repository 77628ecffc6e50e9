"""Time-per-output-token profile: seconds per decode iteration vs batch size, from the engine's IterationRecords.

Format (what `rlhfless.plan.timemodel.TimeModel.from_rows` reads): a JSON list of rows
``{"batch_size": int, "context": int, "s_per_iter": float, "n": int}``, one per batch-size bucket (powers of
two: 1, 2-3, 4-7, ...): batch_size is the median batch size in the bucket, context the mean number of keys
attended, s_per_iter the median seconds of one iteration, n the iterations aggregated.
`load_profile` refuses, with one line naming the file: a missing file, invalid JSON, and any row that
`rlhfless.plan.timemodel.check_profile_rows` refuses (missing keys, wrong types, times that are not > 0).
Non-goals: fitting a model to the rows (the planner does that).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

from rlhfless.errors import DataError


def profile_rows(iterations: Iterable) -> list[dict]:
    """Aggregate `IterationRecord`s (batch_size, context, seconds) into one row per power-of-two batch bucket."""
    buckets: dict[int, list] = {}
    for it in iterations:
        buckets.setdefault(max(1, it.batch_size).bit_length(), []).append(it)
    rows = []
    for key in sorted(buckets):
        its = buckets[key]
        rows.append({
            "batch_size": int(statistics.median_low([i.batch_size for i in its])),
            "context": int(round(statistics.fmean(i.context for i in its))),
            "s_per_iter": float(statistics.median(i.seconds for i in its)),
            "n": len(its),
        })
    return rows


def save_profile(rows: list[dict], path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return out


def load_profile(path: str | Path) -> list[dict]:
    """The checked rows of a TPOT profile written by `save_profile`."""
    from rlhfless.plan.timemodel import check_profile_rows

    p = Path(path)
    if not p.is_file():
        raise DataError(f"TPOT profile not found: {p} (make one with `rlhfless bench engine --json OUT`)")
    try:
        rows = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a huge integer, deep nesting
        raise DataError(f"{p}: not valid JSON") from None
    return check_profile_rows(rows, str(p))
