"""Sibling refinement: within a step, sharpen a group's estimate from the samples of that group already done.

When k of a prompt's G samples have finished, the other G-k are known to be longer than the decode position
`a`, and the finished lengths say something about the group's typical length (cf. Seer). Per group: one
sample's length is lognormal around the group mean m, the prior on m is lognormal around the base predictor's
estimate, and the evidence is Type-II censored (k exact lengths, G-k lengths > a); the estimate is
``E[X | X > a]`` averaged over m's posterior on a log grid. The rule it keeps: only what a running decode knows
is used (offline evaluation reveals the k shortest of G, `evaluate_refinement`). The model's formulas and where
its spreads are learned: docs/internals.md#predictorsiblingpy.

Deviation from the paper: 1. The paper has no within-step refinement; this is an addition for the balancer's
cut-and-migrate decision. Non-goals: token-level hazard models; it assumes equal decode speed within a group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import norm

from rlhfless.predictor.base import Prediction, SavedState, number, record, whole, write_model
from rlhfless.predictor.data import LengthRow, Observation, group_observations

_GRID = 401


@dataclass
class _MeanSq:
    """Running mean of squares (JSON-serialisable)."""

    n: int = 0
    total: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x * x

    @classmethod
    def from_state(cls, state: object, what: str) -> _MeanSq:
        d = record(state, ("n", "total"), what)
        return cls(whole(d["n"], f"{what}.n"), number(d["total"], f"{what}.total"))

    def rms(self, fallback: float) -> float:
        return math.sqrt(self.total / self.n) if self.n else fallback


def lognormal_tail_mean(m: np.ndarray, s: float, a: float) -> np.ndarray:
    """E[X | X > a] for log X ~ N(log m - s^2/2, s^2), elementwise over group means m (tokens)."""
    mu = np.log(m) - 0.5 * s * s
    if a <= 0:
        return m
    z = (math.log(a) - mu) / s
    tail = np.maximum(norm.sf(z), 1e-300)
    return m * norm.sf(z - s) / tail


def censored_posterior_mean(prior_mean: float, tau: float, s: float, finished: Sequence[float],
                            n_remaining: int, a: float) -> float:
    """Expected length (tokens) of each unfinished sample given k finished lengths and G-k still running past `a`.

    prior_mean: base estimate of the group mean m; tau: log-sd of the prior on m; s: within-group log-sd.
    """
    # centre the prior so that its mean (not its median) is the base estimate
    centre = math.log(max(prior_mean, 1.0)) - 0.5 * tau * tau
    spread = 5.0 * tau + 4.0 * s
    lo = min(centre - spread, math.log(max(min(finished, default=a), 1.0)) - 2 * s)
    hi = max(centre + spread, math.log(max(a, 1.0)) + 4 * s)
    log_m = np.linspace(lo, hi, _GRID)
    m = np.exp(log_m)
    logp = -0.5 * ((log_m - centre) / tau) ** 2  # constants drop out when normalising
    mu = log_m - 0.5 * s * s
    if len(finished):
        logx = np.log(np.maximum(np.asarray(finished, dtype=float), 1.0))
        logp = logp - 0.5 * (((logx[None, :] - mu[:, None]) / s) ** 2).sum(axis=1)
    if a > 0:
        logp = logp + n_remaining * norm.logsf((math.log(a) - mu) / s)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    return float(np.sum(w * lognormal_tail_mean(m, s, a)))


class SiblingPredictor:
    """A base predictor for step-start estimates plus `refine` from finished siblings during the step."""

    name = "sibling"

    def __init__(self, cfg, base):
        """base: the (fresh or loaded) predictor named by `cfg.sibling_base`; `predictor.build_predictor` makes it."""
        self.cfg = cfg
        self.base = base
        self.within = _MeanSq()
        self.err_seen = _MeanSq()
        self.err_unseen = _MeanSq()
        self.seen: set[str] = set()

    def fit(self, rows: Sequence[LengthRow]) -> None:
        self.__init__(self.cfg, type(self.base)(self.base.cfg))  # from scratch, base included (never a sibling)
        for batch in group_observations(rows):
            self.update(batch)

    def predict(self, prompt_ids: Sequence[str], prompts: Sequence[str]) -> Prediction:
        return self.base.predict(prompt_ids, prompts)

    def update(self, observations: Sequence[Observation]) -> None:
        pred = self.base.predict([o.prompt_id for o in observations], [o.prompt for o in observations])
        for obs, est in zip(observations, pred.mean):
            logs = np.log(np.maximum(np.asarray(obs.lengths, dtype=float), 1.0))
            for v in logs - logs.mean():
                self.within.add(float(v))
            tracker = self.err_seen if obs.prompt_id in self.seen else self.err_unseen
            tracker.add(math.log(max(obs.mean, 1.0)) - math.log(max(est, 1.0)))
            self.seen.add(obs.prompt_id)
        self.base.update(observations)

    def spreads(self) -> tuple[float, float, float]:
        """(within-group log-sd s, prior log-sd for seen prompts, for unseen prompts); floors keep them > 0."""
        s = max(self.within.rms(0.5), 0.02)
        unseen = max(self.err_unseen.rms(1.0), 0.02)
        return s, max(self.err_seen.rms(unseen), 0.02), unseen

    def refine(self, prompt_id: str, finished_lengths: Sequence[int], n_remaining: int, *, prompt: str = "",
               prior: float | None = None, position: float | None = None) -> float:
        """Expected length (tokens) of each of the `n_remaining` unfinished samples of a group.

        finished_lengths: lengths of the group's samples already done (the shortest ones).
        prior: the step-start estimate of the group mean; predicted with the base model when None.
        position: tokens decoded so far by the unfinished samples (>= max finished); default max finished.
        """
        if n_remaining < 1:
            raise ValueError(f"refine: n_remaining must be >= 1 (got {n_remaining})")
        if prior is None:
            prior = self.base.predict([prompt_id], [prompt]).mean[0]
        a = max([float(position or 0.0), *map(float, finished_lengths)])
        s, tau_seen, tau_unseen = self.spreads()
        tau = tau_seen if prompt_id in self.seen else tau_unseen
        return censored_posterior_mean(prior, tau, s, list(finished_lengths), n_remaining, a)

    def save(self, directory: str | Path) -> None:
        base_dir = Path(directory) / "base"
        self.base.save(base_dir)
        state = {"within": vars(self.within).copy(), "err_seen": vars(self.err_seen).copy(),
                 "err_unseen": vars(self.err_unseen).copy(), "seen": sorted(self.seen)}
        write_model(directory, self.name, self.cfg.to_dict(), state)

    def load_state(self, saved: SavedState) -> None:
        """The refinement's own state; `load_predictor` has already loaded the base from base/."""
        state = saved.state
        self.within = _MeanSq.from_state(state["within"], "within")
        self.err_seen = _MeanSq.from_state(state["err_seen"], "err_seen")
        self.err_unseen = _MeanSq.from_state(state["err_unseen"], "err_unseen")
        if not isinstance(state["seen"], list) or not all(isinstance(p, str) for p in state["seen"]):
            raise ValueError("seen must be a list of prompt ids")
        self.seen = set(state["seen"])
        if self.base.name != self.cfg.sibling_base:
            raise ValueError(f"base/ holds a {self.base.name} predictor but sibling_base is {self.cfg.sibling_base}")


def evaluate_refinement(predictor: SiblingPredictor, test_batches: Sequence[Sequence[Observation]],
                        reveal: Sequence[int]) -> dict[int, dict[str, float]]:
    """Offline check of `refine`: for each test group reveal its k shortest samples, estimate the rest.

    Returns ``{k: {"mae_base": ..., "mae_refined": ..., "n_groups": ...}}`` where the error is against the
    true mean length (tokens) of the G-k unrevealed samples; "base" is the step-start prediction. Groups with
    G <= k are skipped. The predictor is not updated.
    """
    out: dict[int, dict[str, float]] = {}
    for k in reveal:
        base_err, ref_err = [], []
        for batch in test_batches:
            pred = predictor.predict([o.prompt_id for o in batch], [o.prompt for o in batch])
            for obs, prior in zip(batch, pred.mean):
                xs = sorted(obs.lengths)
                if len(xs) <= k:
                    continue
                truth = float(np.mean(xs[k:]))
                est = predictor.refine(obs.prompt_id, xs[:k], len(xs) - k, prompt=obs.prompt, prior=prior)
                base_err.append(abs(prior - truth))
                ref_err.append(abs(est - truth))
        out[k] = {"mae_base": float(np.mean(base_err)) if base_err else float("nan"),
                  "mae_refined": float(np.mean(ref_err)) if ref_err else float("nan"),
                  "n_groups": len(ref_err)}
    return out
