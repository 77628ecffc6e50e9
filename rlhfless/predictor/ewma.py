"""The paper's predictor: a per-prompt exponentially weighted moving average of past response lengths.

Prompts are revisited every epoch, so a prompt's next length is predicted from its own history:
``ewma <- alpha * mean(this step's G lengths) + (1 - alpha) * ewma``; the first observation sets it.
Unseen prompts get `default_length`, or the running mean of all observed lengths when that is None.

Deviations from the paper: (1) alpha and the unseen-prompt default are not given in our sources and are
configurable; (2) we also track an EWMA of each prompt's squared per-sample error, which gives moment-
matched lognormal quantiles of a single sample's length (the paper predicts one number). Non-goal: using
anything but the prompt's own history (that is the `learned` predictor).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlhfless.predictor.base import Prediction, SavedState, check_inputs, number_map, whole, write_model
from rlhfless.predictor.baselines import RunningStats, lognormal_quantiles
from rlhfless.predictor.data import LengthRow, Observation, group_observations


def ewma_step(previous: float | None, observed: float, alpha: float) -> float:
    """One EWMA update (tokens): `observed` when there is no `previous`, else the alpha-weighted blend."""
    return observed if previous is None else alpha * observed + (1.0 - alpha) * previous


class EWMAPredictor:
    """Per-prompt EWMA of group-mean lengths, with per-prompt error variance for quantiles."""

    name = "ewma"

    def __init__(self, cfg):
        self.cfg = cfg
        self.mean: dict[str, float] = {}
        self.var: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self.stats = RunningStats()

    def fit(self, rows: Sequence[LengthRow]) -> None:
        self.__init__(self.cfg)
        for batch in group_observations(rows):
            self.update(batch)

    def update(self, observations: Sequence[Observation]) -> None:
        a = self.cfg.alpha
        mean, var, count, add = self.mean, self.var, self.count, self.stats.add  # locals: once per group per step
        for obs in observations:
            pid, xs = obs.prompt_id, obs.lengths
            prev, observed = mean.get(pid), obs.mean
            # squared error of each sample against what we would have predicted: within-group spread plus drift
            centre = observed if prev is None else prev
            err2 = sum([(x - centre) ** 2 for x in xs]) / len(xs)
            var[pid] = ewma_step(var.get(pid), err2, a)
            mean[pid] = ewma_step(prev, observed, a)
            count[pid] = count.get(pid, 0) + 1
            add(xs)

    def unseen_length(self) -> float:
        """Prediction for a prompt with no history (tokens)."""
        if self.cfg.default_length is not None:
            return float(self.cfg.default_length)
        return self.stats.mean(self.cfg.prior_length)

    def predict(self, prompt_ids: Sequence[str], prompts: Sequence[str]) -> Prediction:
        check_inputs(prompt_ids, prompts)
        default, global_sd = self.unseen_length(), self.stats.std()
        m = [self.mean.get(p, default) for p in prompt_ids]
        s = [self.var[p] ** 0.5 if p in self.var else global_sd for p in prompt_ids]
        return Prediction(tuple(prompt_ids), tuple(m), lognormal_quantiles(m, s, self.cfg.quantiles))

    def state(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count, "stats": vars(self.stats).copy()}

    def save(self, directory: str | Path) -> None:
        write_model(directory, self.name, self.cfg.to_dict(), self.state())

    def load_state(self, saved: SavedState) -> None:
        state = saved.state
        self.mean = number_map(state["mean"], "mean")
        self.var = number_map(state["var"], "var")
        self.count = number_map(state["count"], "count", whole)
        self.stats = RunningStats.from_state(state["stats"])
