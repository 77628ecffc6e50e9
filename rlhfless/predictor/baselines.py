"""Baseline predictors: the global mean length, and a linear model on the prompt's length alone.

They set the bar the paper's EWMA and the learned predictor must clear. Both are online (exact running
sufficient statistics, so `update` is O(batch) and `fit` is a replay) and save as plain JSON.

Quantiles: moment-matched lognormal from the running variance of sample lengths (global), or of the linear
model's residuals (prompt_length). Prompt length is measured in UTF-8 bytes of the prompt text (the
project's byte tokenizer without BOS), so it needs no trace field. Non-goal: any feature beyond these.
Deviation from the paper: none (the paper has no baselines of its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# the standard normal quantile (scipy.stats.norm.ppf computes it with ndtri, value for value), without
# the 1.3 s CPU import of scipy.stats that every simulation paid at start-up
from scipy.special import ndtri

from rlhfless.predictor.base import Prediction, SavedState, check_inputs, number, record, whole, write_model
from rlhfless.predictor.data import LengthRow, Observation, group_observations


def prompt_tokens(text: str) -> int:
    """Prompt length in tokens of the byte tokenizer (UTF-8 bytes)."""
    return len(text.encode("utf-8"))


@lru_cache(maxsize=1024)
def _ndtri_level(q: float) -> float:
    """`ndtri` of one level, remembered: a predictor asks the same few quantile levels at every step."""
    return float(ndtri(q))


def lognormal_quantiles(mean: Sequence[float], std: Sequence[float], levels: Sequence[float]) -> dict[float, tuple]:
    """q-quantiles per prompt of the lognormal with mean `mean_i` and sd `std_i` (tokens; moment-matched).

    Lognormal rather than normal: lengths are positive and right-skewed, and a normal's low quantiles go
    negative for heavy-tailed length distributions. Floored at 1 token (a response is at least its EOS).
    """
    # each prompt's (log-mean, log-sd) once for every level: the same operations, in the same order, per value
    mu, sd = [], []
    for m, s in zip(mean, std):
        m = max(m, 1.0)
        sigma2 = math.log1p((s / m) ** 2)
        mu.append(math.log(m) - 0.5 * sigma2)
        sd.append(math.sqrt(sigma2))
    exp = math.exp
    out = {}
    for q in levels:
        z = _ndtri_level(q)
        out[q] = tuple([max(1.0, exp(a + z * b)) for a, b in zip(mu, sd)])
    return out


@dataclass
class RunningStats:
    """Count, sum and sum of squares of sample lengths (exact; JSON-serialisable)."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    def add(self, values: Sequence[float]) -> None:
        self.n += len(values)
        self.total += float(sum(values))
        self.total_sq += float(sum([v * v for v in values]))

    def mean(self, fallback: float) -> float:
        return self.total / self.n if self.n else fallback

    @classmethod
    def from_state(cls, state: object) -> RunningStats:
        """Rebuild from `vars(stats)` as saved; wrong keys or types raise ValueError."""
        d = record(state, ("n", "total", "total_sq"), "stats")
        return cls(whole(d["n"], "stats.n"), number(d["total"], "stats.total"), number(d["total_sq"], "stats.total_sq"))

    def std(self) -> float:
        if self.n < 2:
            return 0.0
        m = self.total / self.n
        return math.sqrt(max(0.0, self.total_sq / self.n - m * m))


class GlobalMeanPredictor:
    """Every prompt gets the mean of all lengths observed so far (`prior_length` before any)."""

    name = "global_mean"

    def __init__(self, cfg):
        self.cfg = cfg
        self.stats = RunningStats()

    def fit(self, rows: Sequence[LengthRow]) -> None:
        self.stats = RunningStats()
        for batch in group_observations(rows):
            self.update(batch)

    def update(self, observations: Sequence[Observation]) -> None:
        for obs in observations:
            self.stats.add(obs.lengths)

    def predict(self, prompt_ids: Sequence[str], prompts: Sequence[str]) -> Prediction:
        check_inputs(prompt_ids, prompts)
        m = [self.stats.mean(self.cfg.prior_length)] * len(prompt_ids)
        s = [self.stats.std()] * len(prompt_ids)
        return Prediction(tuple(prompt_ids), tuple(m), lognormal_quantiles(m, s, self.cfg.quantiles))

    def save(self, directory: str | Path) -> None:
        write_model(directory, self.name, self.cfg.to_dict(), vars(self.stats).copy())

    def load_state(self, saved: SavedState) -> None:
        self.stats = RunningStats.from_state(saved.state)


class PromptLengthPredictor:
    """Ordinary least squares `length ~ a + b * prompt_tokens`, from exact running sums.

    With fewer than two distinct prompt lengths the slope is 0 (the global mean).
    """

    name = "prompt_length"

    def __init__(self, cfg):
        self.cfg = cfg
        self.sums = {"n": 0.0, "x": 0.0, "y": 0.0, "xx": 0.0, "xy": 0.0, "yy": 0.0}

    def fit(self, rows: Sequence[LengthRow]) -> None:
        self.sums = dict.fromkeys(self.sums, 0.0)
        for batch in group_observations(rows):
            self.update(batch)

    def update(self, observations: Sequence[Observation]) -> None:
        s = self.sums
        for obs in observations:
            x = float(prompt_tokens(obs.prompt))
            for y in obs.lengths:
                s["n"] += 1
                s["x"] += x
                s["y"] += y
                s["xx"] += x * x
                s["xy"] += x * y
                s["yy"] += y * y

    def coefficients(self) -> tuple[float, float, float]:
        """(intercept, slope, residual std) of the current fit."""
        s = self.sums
        n = s["n"]
        if n == 0:
            return self.cfg.prior_length, 0.0, 0.0
        mx, my = s["x"] / n, s["y"] / n
        sxx = s["xx"] / n - mx * mx
        sxy = s["xy"] / n - mx * my
        syy = max(0.0, s["yy"] / n - my * my)
        slope = sxy / sxx if sxx > 1e-9 else 0.0
        resid_var = max(0.0, syy - slope * sxy)
        return my - slope * mx, slope, math.sqrt(resid_var)

    def predict(self, prompt_ids: Sequence[str], prompts: Sequence[str]) -> Prediction:
        check_inputs(prompt_ids, prompts)
        a, b, sd = self.coefficients()
        m = [max(1.0, a + b * prompt_tokens(p)) for p in prompts]
        return Prediction(tuple(prompt_ids), tuple(m), lognormal_quantiles(m, [sd] * len(m), self.cfg.quantiles))

    def save(self, directory: str | Path) -> None:
        write_model(directory, self.name, self.cfg.to_dict(), dict(self.sums))

    def load_state(self, saved: SavedState) -> None:
        state = record(saved.state, tuple(self.sums), "state")
        self.sums = {k: number(state[k], k) for k in self.sums}
