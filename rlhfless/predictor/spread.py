"""Outcomes of a step's lengths drawn from a prediction: what a planner averages its step time and cost over.

`draw_lengths(pred, sizes, k, rng, cap)` draws k outcomes of the step: each group's per-sample lengths from the
prompt's predicted distribution of ONE sample's length (a lognormal fitted to the prediction's quantile levels;
the means when it has fewer than two levels), floored at 1 token and capped at `cap`. Played on these draws, a
plan's rollout has the tail the prediction implies (with the means alone a group's samples end together and no
actor has a tail). The rule it keeps: each draw is a Latin hypercube over the step's S sequences, so every 1/S
stratum is used once and the longest sample always comes from the top one. What the means alone mispredicted,
and the model: docs/internals.md#predictorspreadpy.

Deviation from the paper: 1. Its planner uses the one predicted number for every sample; drawing outcomes from
the predicted distribution is ours. Non-goals: correlation between samples beyond the shared prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
# the standard normal quantile (scipy.stats.norm.ppf computes it with ndtri, value for value), without
# the 1.3 s CPU import of scipy.stats that every simulation paid at start-up
from scipy.special import ndtri

from rlhfless.predictor.base import Prediction


def lognormal_fit(pred: Prediction) -> tuple[np.ndarray, np.ndarray] | None:
    """(intercept, slope), (P,) each, of log-length = intercept + slope * z per prompt, least squares over the
    prediction's quantile levels (slope >= 0); None with fewer than two levels."""
    levels = sorted(pred.quantiles)
    if len(levels) < 2:
        return None
    z = ndtri(np.asarray(levels))  # (Q,)
    logq = np.log(np.maximum(np.array([pred.quantiles[q] for q in levels], float), 1.0))  # (Q, P)
    zc = z - z.mean()
    slope = np.maximum(zc @ (logq - logq.mean(axis=0)) / float(zc @ zc), 0.0)
    return logq.mean(axis=0) - slope * z.mean(), slope


def draw_lengths(pred: Prediction, sizes: Sequence[int], k: int, rng: np.random.Generator,
                 cap: float | None = None) -> list[list[tuple[float, ...]]]:
    """k outcomes (module header); each a list over `pred`'s prompts of sizes[p] per-sample lengths (tokens)."""
    if k < 1:
        raise ValueError(f"draw_lengths: k must be >= 1 (got {k})")
    if len(sizes) != len(pred.mean):
        raise ValueError(f"draw_lengths: {len(sizes)} group sizes for {len(pred.mean)} prompts")
    n = np.asarray(sizes, dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(n))).tolist()
    fit = lognormal_fit(pred)
    hi = np.inf if cap is None else float(cap)
    out = []
    for _ in range(k):
        if fit is None:
            seq = np.repeat(np.asarray(pred.mean, float), n)
        else:
            s = int(n.sum())
            # Latin hypercube: every 1/S stratum of levels once per draw, so the top one gives the longest sample
            u = (rng.permutation(s) + rng.random(s)) / s
            icpt, slope = np.repeat(fit[0], n), np.repeat(fit[1], n)
            seq = np.exp(icpt + slope * ndtri(np.clip(u, 1e-12, 1 - 1e-12)))
        seq = np.clip(seq, 1.0, hi).tolist()
        out.append([tuple(seq[bounds[p]:bounds[p + 1]]) for p in range(len(n))])
    return out
