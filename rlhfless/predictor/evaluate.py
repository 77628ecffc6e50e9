"""Evaluation of length predictors without leakage, and the per-step metrics the loop logs.

Splits: traces (rows with epochs) train on epochs < e and test on epoch e (default: the last epoch), so every
prediction is a next-epoch prediction; text-only data is split at random by prompt (a seeded hash of the
prompt id, so `train` and `eval` agree on the split without sharing state). Metrics are computed per test
group (one prompt in one step) on the group's mean length, except quantile coverage, which is per sample.

The downstream metric is `makespan_ratio`: the TRUE makespan of a sort-and-chunk assignment of groups to N
actors made with predicted lengths, over the same assignment made with the true lengths. It is a small
self-contained model of the balancer (sum of true tokens per actor as the time proxy), not the planner's
policy; deviation from the paper: no cut-and-migrate, no decode-batch effects.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import kendalltau, spearmanr

from rlhfless.core import metrics as M
from rlhfless.core.errors import DataError
from rlhfless.predictor.base import LengthPredictor, Prediction
from rlhfless.predictor.data import (
    LengthRow,
    Observation,
    group_observations,
    has_epochs,
)


@dataclass(frozen=True)
class Split:
    """Train rows and test batches (per-step lists of observations) of one evaluation.

    kind: "epoch" (train on epochs < test_epoch) or "prompt" (random held-out prompts).
    """

    train: list[LengthRow]
    test: list[list[Observation]]
    kind: str
    test_epoch: int | None = None


def _held_out(prompt_id: str, test_frac: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < test_frac


def split_rows(rows: Sequence[LengthRow], *, test_epoch: int | None = None, test_frac: float = 0.2,
               seed: int = 0) -> Split:
    """The standard split: by epoch for traces (default: last epoch), by prompt for text-only data."""
    if not rows:
        raise DataError("no rows to split")
    if has_epochs(rows) and len({r.epoch for r in rows}) > 1:
        e = max(r.epoch for r in rows) if test_epoch is None else test_epoch
        train = [r for r in rows if r.epoch < e]
        test_rows = [r for r in rows if r.epoch == e]
        if not train or not test_rows:
            raise DataError(f"test epoch {e}: needs rows in epoch {e} and in earlier epochs")
        return Split(train, group_observations(test_rows), "epoch", e)
    train = [r for r in rows if not _held_out(r.prompt_id, test_frac, seed)]
    test_rows = [r for r in rows if _held_out(r.prompt_id, test_frac, seed)]
    if not train or not test_rows:
        raise DataError(f"prompt split with test fraction {test_frac}: too few prompts ({len(rows)} rows)")
    return Split(train, group_observations(test_rows), "prompt")


def _mean_lengths(actual: Sequence) -> np.ndarray:
    return np.array([float(np.mean(a)) if isinstance(a, (list, tuple, np.ndarray)) else float(a) for a in actual])


def _tau(pred: np.ndarray, true: np.ndarray) -> float:
    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(true) == 0:
        return math.nan
    return float(kendalltau(pred, true).statistic)


def _spearman(pred: np.ndarray, true: np.ndarray) -> float:
    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(true) == 0:
        return math.nan
    return float(spearmanr(pred, true).statistic)


def step_metrics(predicted: Prediction | Sequence[float], actual: Sequence) -> dict[str, float]:
    """`predictor/mae` (tokens) and `predictor/kendall_tau` for one step, on per-prompt mean lengths.

    predicted: a `Prediction` or per-prompt estimates, shape (P,). actual: per prompt, either the G observed
    lengths or their mean, in the same order. Kendall tau is NaN when either side is constant or P < 2.
    """
    pred = np.asarray(predicted.mean if isinstance(predicted, Prediction) else predicted, dtype=float)
    true = _mean_lengths(actual)
    if pred.shape != true.shape:
        raise ValueError(f"step_metrics: {pred.shape[0]} predictions for {true.shape[0]} prompts")
    mae = float(np.mean(np.abs(pred - true))) if len(true) else math.nan
    return {M.PRED_MAE: mae, M.PRED_KENDALL: _tau(pred, true)}


def bucket_accuracy(pred: np.ndarray, true: np.ndarray, n_buckets: int = 4) -> float:
    """Fraction of groups whose predicted length falls in the same bucket as the true one; bucket edges are
    the quantiles of the true lengths (quartiles for 4 buckets)."""
    edges = np.quantile(true, np.linspace(0, 1, n_buckets + 1)[1:-1])
    return float(np.mean(np.digitize(pred, edges) == np.digitize(true, edges)))


def chunk_assignment(order_keys: Sequence[float], work: Sequence[float], n_actors: int) -> list[list[int]]:
    """Sort groups by `order_keys` (descending) and cut the order into <= `n_actors` contiguous chunks of about
    equal total `work` (the same keys' notion of tokens). Returns the group indices per actor."""
    order = np.argsort(-np.asarray(order_keys, dtype=float), kind="stable")
    cum = np.cumsum(np.asarray(work, dtype=float)[order])
    bounds = [0]
    for k in range(1, n_actors):
        target = cum[-1] * k / n_actors
        i = int(np.searchsorted(cum, target))  # first position whose prefix reaches the target
        # cut after i items or after i+1, whichever prefix is closer to the target; chunks stay non-empty
        cands = [c for c in (i, i + 1) if bounds[-1] < c < len(order)]
        if cands:
            bounds.append(min(cands, key=lambda c: abs(cum[c - 1] - target)))
    bounds.append(len(order))
    return [order[a:b].tolist() for a, b in zip(bounds, bounds[1:])]


def makespan_ratio(predicted: Sequence[float], true_lengths: Sequence[Sequence[int]], n_actors: int) -> float:
    """True makespan with a predicted-length assignment over that with a true-length assignment (>= ~1).

    predicted: estimated per-sample length of each group (tokens), shape (P,). true_lengths: each group's G
    true lengths. Assignment: `chunk_assignment` by predicted (resp. true) group work = length x G; an
    actor's time is the sum of TRUE tokens of its groups (decode time proxy); makespan = max over actors.
    """
    sizes = np.array([len(t) for t in true_lengths], dtype=float)
    true_work = np.array([float(np.sum(t)) for t in true_lengths])
    pred_work = np.asarray(predicted, dtype=float) * sizes

    def span(keys: np.ndarray) -> float:
        return max(float(true_work[idx].sum()) for idx in chunk_assignment(keys, keys, n_actors))

    return span(pred_work) / span(true_work)


def evaluate(predictor: LengthPredictor, test: Sequence[Sequence[Observation]], *, n_actors: int = 4,
             makespan_batch: int = 64) -> dict[str, float]:
    """All metrics of a fitted `predictor` on test batches (no updates; every batch predicted from the same
    state, i.e. next-epoch prediction). The makespan is per test step, cut into chunks of at most
    `makespan_batch` groups (text-only data is one step). Keys: mae, mape, kendall_tau, spearman,
    bucket_accuracy, makespan_ratio, coverage_q<level>, n_groups."""
    obs = [o for batch in test for o in batch]
    pred = predictor.predict([o.prompt_id for o in obs], [o.prompt for o in obs])
    p = np.asarray(pred.mean, dtype=float)
    t = np.array([o.mean for o in obs])
    out = {
        "n_groups": float(len(obs)),
        "mae": float(np.mean(np.abs(p - t))),
        "mape": float(np.mean(np.abs(p - t) / np.maximum(t, 1.0))),
        "kendall_tau": _tau(p, t),
        "spearman": _spearman(p, t),
        "bucket_accuracy": bucket_accuracy(p, t),
    }
    for q, vals in pred.quantiles.items():
        hits = [x <= v for o, v in zip(obs, vals) for x in o.lengths]
        out[f"coverage_q{q:g}"] = float(np.mean(hits))
    out["makespan_ratio"] = _batched_makespan(test, p, n_actors, makespan_batch)
    return out


def _batched_makespan(test: Sequence[Sequence[Observation]], pred: np.ndarray, n_actors: int,
                      batch: int) -> float:
    """Mean makespan ratio over test steps, each cut into chunks of at most `batch` groups (one text-only
    "step" holds every test prompt); chunks with fewer than max(2, n_actors) groups are skipped."""
    ratios, offset = [], 0
    for step in test:
        for s in range(0, len(step), batch):
            chunk = step[s:s + batch]
            if len(chunk) >= max(2, n_actors):
                p = pred[offset + s:offset + s + len(chunk)]
                ratios.append(makespan_ratio(p, [o.lengths for o in chunk], n_actors))
        offset += len(step)
    return float(np.mean(ratios)) if ratios else math.nan


@dataclass(frozen=True)
class PredictionRow:
    """One line of the per-prompt predicted-vs-actual table the loop logs (tokens)."""

    prompt_id: str
    predicted: float
    actual_mean: float
    actual_max: int
    abs_error: float


def prediction_table(predicted: Prediction, actual: Sequence[Sequence[int]]) -> list[PredictionRow]:
    """Per-prompt rows of predicted vs actual length for one step; `actual` holds each prompt's G lengths."""
    if len(predicted.mean) != len(actual):
        raise ValueError(f"prediction_table: {len(predicted.mean)} predictions for {len(actual)} prompts")
    return [PredictionRow(pid, float(p), float(np.mean(a)), int(max(a)), abs(float(p) - float(np.mean(a))))
            for pid, p, a in zip(predicted.prompt_ids, predicted.mean, actual)]
