"""The predictor Protocol, the `Prediction` record, and the on-disk model format shared by all predictors.

A predictor maps prompts to an expected response length (tokens, per sample) and, where it can, quantiles of one
sample's length; it is `fit` on length rows, `predict`s a step's prompts and is `update`d with the observed
lengths after each step. Model folders hold ``predictor.json`` (header, config, online state as JSON), plus
``model.npz`` for the learned predictor and ``base/`` for the sibling one; `save` then `load_predictor` resumes
exactly. The rule it keeps: nothing is unpickled unless the caller passes ``trust_pickle=True`` (format-1
learned models only), and a bad file is one `DataError` naming it.
Format versions and refusals: docs/internals.md#predictorbasepy.

Deviation from the paper: 1. The paper predicts one number per prompt; we also expose per-sample quantiles so a
planner can reason about the tail. Non-goal: a predictor never sees a step's own lengths before `update`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import rlhfless
from rlhfless.core.errors import DataError
from rlhfless.predictor.data import LengthRow, Observation

MODEL_FILE = "predictor.json"
TRAIN_EXAMPLE = "`rlhfless predictor train --data TRACE --model ewma --out DIR`"
FORMAT = "rlhfless-length-predictor"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class SavedState:
    """A checked ``predictor.json``: what a predictor's `load_state` gets.

    directory: the model folder (side files such as ``model.npz`` and ``base/`` live there).
    version: its format version (one of READABLE_VERSIONS).
    state: the predictor's JSON state (a dict; its contents are checked by `load_state`).
    trust_pickle: whether a version-1 pickle may be unpickled (runs code from the file: trusted files only).
    """

    directory: Path
    version: int
    state: dict[str, Any]
    trust_pickle: bool = False


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
        """Write the model and its whole online state to `directory` (created if needed)."""

    def load_state(self, saved: SavedState) -> None:
        """Restore what `save` wrote; missing or wrongly typed state raises KeyError, TypeError or ValueError."""


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
        raise DataError(f"no saved predictor at {directory} (expected {path}; make one with {TRAIN_EXAMPLE})")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError):  # not UTF-8, an integer of thousands of digits, nesting thousands deep
        raise DataError(f"{path}: not readable JSON (not UTF-8, a number too long or nesting too deep)") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not valid JSON (not UTF-8 text)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise DataError(f"{path}: not a rlhfless length-predictor file (format {found!r})")
    version = doc.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise DataError(
            f"{path}: predictor file format version {version!r} is not supported by this rlhfless "
            f"{rlhfless.__version__} (reads versions {list(READABLE_VERSIONS)}); retrain with {TRAIN_EXAMPLE}"
        )
    for key, kind in (("predictor", str), ("config", dict), ("state", dict)):
        if not isinstance(doc.get(key), kind):
            raise DataError(f"{path}: field '{key}' must be a JSON {'object' if kind is dict else 'string'}")
    return doc


# --- checks for load_state: raise ValueError/TypeError, which `load_predictor` reports naming the file ------------
def number(value: Any, what: str) -> float:
    """`value` as a float; a bool, string or null raises ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number (got {value!r})")
    return float(value)


def whole(value: Any, what: str) -> int:
    """`value` as an int; anything but a JSON integer raises ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer (got {value!r})")
    return value


def record(value: Any, keys: Sequence[str], what: str) -> dict[str, Any]:
    """`value` must be a JSON object with exactly `keys`."""
    if not isinstance(value, dict) or set(value) != set(keys):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise ValueError(f"{what} must be an object with keys {sorted(keys)} (got {got})")
    return value


def number_map(value: Any, what: str, convert: Callable[[Any, str], Any] = number) -> dict[str, Any]:
    """A JSON object of numbers (prompt id -> value), each checked and converted by `convert`."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object (got {type(value).__name__})")
    return {str(k): convert(v, f"{what}[{k!r}]") for k, v in value.items()}
