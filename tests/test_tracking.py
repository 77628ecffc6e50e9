"""Tracker: the metrics/tables mirror is standard JSON (NaN as null)."""

from __future__ import annotations

import json
import math

import numpy as np

from rlhfless.config import TrackingConfig
from rlhfless.tracking import Tracker


def _strict(line: str) -> dict:
    """Parse one line as standard JSON: a bare NaN/Infinity token is an error, not a float."""
    def reject(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(line, parse_constant=reject)


def test_metrics_and_tables_write_nan_and_inf_as_null(tmp_path):
    tracker = Tracker(TrackingConfig(mode="disabled"), tmp_path, config={})
    tracker.log({"a": 1.5, "b": float("nan"), "c": float("inf"), "d": np.float64("nan")}, step=3)
    tracker.table("scaler_candidates", ["n", "score"], [[1, float("nan")], [2, 0.25], [3, -math.inf]], step=3)
    tracker.finish()

    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert _strict(line) == {"step": 3, "a": 1.5, "b": None, "c": None, "d": None}
    rows = [_strict(x) for x in (tmp_path / "tables" / "scaler_candidates.jsonl").read_text().splitlines()]
    assert rows == [{"step": 3, "n": 1, "score": None}, {"step": 3, "n": 2, "score": 0.25},
                    {"step": 3, "n": 3, "score": None}]


def test_numpy_scalars_are_written_as_numbers(tmp_path):
    tracker = Tracker(TrackingConfig(mode="disabled"), tmp_path, config={})
    tracker.log({"n": np.int64(7), "x": np.float32(0.5), "y": np.float32("nan")}, step=1)
    tracker.finish()
    assert _strict((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "n": 7, "x": 0.5, "y": None}
