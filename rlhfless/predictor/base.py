"""The predictor Protocol, the `Prediction` record, and the on-disk model format shared by all predictors.

A predictor maps prompts to an expected response length (tokens, per sample) and, where the model can,
quantiles of a single sample's length. It is `fit` on length rows, `predict`s a step's prompts, and is
`update`d with the observed lengths after each step (the loop calls this; `fit` is a replay of updates for
the online predictors).

Model directories hold ``predictor.json``: a header (format, format version, rlhfless version, predictor name),
the config, and the state as plain JSON. No pickle for ewma, sibling and the baselines. The learned
predictor additionally stores a scikit-learn pickle; see `rlhfless.predictor.learned` for its versioned header.

Deviation from the paper: the paper predicts one number per prompt; we also expose per-sample quantiles so a
planner can reason about the tail. Non-goal: a predictor never sees a step's own lengths before `update`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import rlhfless
from rlhfless.errors import DataError
from rlhfless.predictor.data import LengthRow, Observation

MODEL_FILE = "predictor.json"
FORMAT = "rlhfless-length-predictor"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Prediction:
    """Predicted lengths for a batch of prompts.

    prompt_ids: the prompts, in request order.
    mean: expected response length of one sample of each prompt (tokens), same order.
    quantiles: level (0 < q < 1) -> per-prompt q-quantile of one sample's length; empty when the model has none.
    """

    prompt_ids: tuple[str, ...]
    mean: tuple[float, ...]
    quantiles: Mapping[float, tuple[float, ...]] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if len(self.prompt_ids) != len(self.mean):
            raise ValueError(f"Prediction: {len(self.prompt_ids)} prompt ids but {len(self.mean)} estimates")
        for q, vals in self.quantiles.items():
            if len(vals) != len(self.mean):
                raise ValueError(f"Prediction: quantile {q} has {len(vals)} values for {len(self.mean)} prompts")


@runtime_checkable
class LengthPredictor(Protocol):
    """What the loop, the planner and the evaluation need from a length predictor."""

    name: str

    def fit(self, rows: Sequence[LengthRow]) -> None:
        """Forget any state and learn from `rows` (causally: history features only from earlier steps)."""

    def predict(self, prompt_ids: Sequence[str], prompts: Sequence[str]) -> Prediction:
        """Expected per-sample length (and quantiles where available) for each prompt; no state change."""

    def update(self, observations: Sequence[Observation]) -> None:
        """Absorb the observed lengths of one step (all groups of that step)."""

    def save(self, directory: str | Path) -> None:
        """Write the model to `directory` (created if needed)."""


def check_inputs(prompt_ids: Sequence[str], prompts: Sequence[str]) -> None:
    """`predict` arguments must pair up one to one."""
    if len(prompt_ids) != len(prompts):
        raise ValueError(f"predict: {len(prompt_ids)} prompt ids but {len(prompts)} prompt texts")


def write_model(directory: str | Path, name: str, config: dict[str, Any], state: dict[str, Any]) -> Path:
    """Write ``predictor.json`` (header + config + JSON state) into `directory`; returns the file path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "rlhfless_version": rlhfless.__version__,
        "predictor": name,
        "config": config,
        "state": state,
    }
    path = d / MODEL_FILE
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path


def read_model(directory: str | Path) -> dict[str, Any]:
    """Read and check ``predictor.json``; a missing, foreign or newer-format file raises `DataError`."""
    path = Path(directory) / MODEL_FILE
    if not path.is_file():
        raise DataError(f"no saved predictor at {directory} (expected {path}; "
                        "make one with `rlhfless predictor train`)")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataError(f"{path}: not a rlhfless length-predictor file (format {doc.get('format')!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: predictor file format version {doc.get('format_version')!r} is not supported by this "
            f"rlhfless {rlhfless.__version__} (reads version {FORMAT_VERSION}); retrain with `rlhfless predictor train`"
        )
    return doc
