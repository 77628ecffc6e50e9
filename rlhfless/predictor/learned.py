"""Learned predictor: gradient boosting (scikit-learn) on prompt-text and length-history features.

Features per prompt: hashed character 2-4-grams of the text, its byte length, word and number counts, and the
history of its own past lengths. A point model predicts the group mean, one quantile model per level predicts
single-sample quantiles; each fitted model is exported to a `predictor.trees.Forest` (plain arrays) that
predicts exactly as the estimator did, in numpy. The rule it keeps: training examples are built causally (a
step's features come only from earlier steps, what the loop sees online), and saved files hold no code
(``model.npz`` loads with ``allow_pickle=False``). The features and the saved format, array by array:
docs/internals.md#predictorlearnedpy.

Deviation from the paper: 1. The paper uses only the per-prompt EWMA; this predictor is an addition, and the one
that can predict prompts never seen before. Non-goals: neural text encoders, per-token models.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError
from rlhfless.predictor.base import (
    Prediction,
    SavedState,
    check_inputs,
    number,
    whole,
    write_model,
)
from rlhfless.predictor.data import LengthRow, Observation, group_observations
from rlhfless.predictor.npzio import (
    ARRAY_DTYPES,
    HISTORY_FIELDS,
    N_HISTORY_FEATURES,
    check_dtypes,
    examples_from_arrays,
    examples_to_arrays,
    history_from_arrays,
    history_to_arrays,
    load_arrays,
)
from rlhfless.predictor.trees import FIELDS as FOREST_FIELDS
from rlhfless.predictor.trees import Forest, from_sklearn

NPZ_FILE = "model.npz"
N_HISTORY = N_HISTORY_FEATURES
N_TEXT = 3
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_HIST = HISTORY_FIELDS
_HIST_KEYS = set(_HIST)


def history_features(h: dict | None) -> list[float]:
    """[count, last, mean, ewma, std] of a prompt's past lengths (tokens); -1 where undefined."""
    if not h or h["count"] == 0:
        return [0.0] + [-1.0] * 4  # -1, not NaN: an all-NaN column breaks scikit-learn's binning
    mean_sample = h["total"] / h["n"]
    var = max(0.0, h["total_sq"] / h["n"] - mean_sample**2)
    return [float(h["count"]), h["last"], h["sum"] / h["count"], h["ewma"], math.sqrt(var)]


def text_features(prompts: Sequence[str]) -> np.ndarray:
    """[bytes, words, numbers] per prompt, shape (n, 3)."""
    return np.array([[len(p.encode("utf-8")), len(p.split()), len(_NUMBER.findall(p))] for p in prompts], dtype=float)


def fit_estimators(cfg, X: np.ndarray, groups: Sequence[Sequence[int]]) -> dict:
    """Fit the point model (group means, weighted by G) and one quantile model per level (single samples).

    X: (E, n_features) one row per example; groups: the E examples' observed lengths (tokens).
    Returns ``{"point": estimator, "quantiles": {level: estimator}}`` (scikit-learn HistGradientBoostingRegressor).
    """
    from sklearn.ensemble import HistGradientBoostingRegressor

    sizes = np.array([len(g) for g in groups])
    means = np.array([np.mean(g) for g in groups])
    kw = dict(max_iter=cfg.learned_max_iter, random_state=cfg.seed, early_stopping=False)
    point = HistGradientBoostingRegressor(loss="squared_error", **kw).fit(X, means, sample_weight=sizes)
    X_s = np.repeat(X, sizes, axis=0)
    y_s = np.concatenate([np.asarray(g, dtype=float) for g in groups])
    quant = {q: HistGradientBoostingRegressor(loss="quantile", quantile=q, **kw).fit(X_s, y_s) for q in cfg.quantiles}
    return {"point": point, "quantiles": quant}


class LearnedPredictor:
    """HistGradientBoosting point + quantile models over text and history features; see the module header."""

    name = "learned"

    def __init__(self, cfg):
        self.cfg = cfg
        self.history: dict[str, dict] = {}
        self.examples: list[tuple[str, list[float], tuple[int, ...]]] = []  # (prompt, history feats, lengths)
        self.models: dict | None = None
        self.fitted_epoch = -1
        self.global_mean: float | None = None

    # --- features --------------------------------------------------------------------------------------
    def _matrix(self, prompts: Sequence[str], hist: Sequence[list[float]]) -> np.ndarray:
        from sklearn.feature_extraction.text import HashingVectorizer

        vec = HashingVectorizer(analyzer="char_wb", ngram_range=(2, 4), n_features=self.cfg.learned_hash_features,
                                alternate_sign=False, norm="l2")
        text = vec.transform(list(prompts)).toarray()
        return np.hstack([text, text_features(prompts), np.asarray(hist, dtype=float).reshape(len(prompts), N_HISTORY)])

    def n_features(self) -> int:
        """Columns of the feature matrix: hashed n-grams, text counts, history."""
        return self.cfg.learned_hash_features + N_TEXT + N_HISTORY

    def _absorb(self, obs: Observation) -> None:
        h = self.history.setdefault(obs.prompt_id, dict.fromkeys(_HIST, 0.0))
        m = obs.mean
        h["ewma"] = m if h["count"] == 0 else self.cfg.alpha * m + (1 - self.cfg.alpha) * h["ewma"]
        h["count"] += 1
        h["last"] = m
        h["sum"] += m
        h["n"] += len(obs.lengths)
        h["total"] += float(sum(obs.lengths))
        h["total_sq"] += float(sum(x * x for x in obs.lengths))

    # --- protocol --------------------------------------------------------------------------------------
    def fit(self, rows: Sequence[LengthRow]) -> None:
        self.__init__(self.cfg)
        batches = group_observations(rows)
        for batch in batches:
            self._record(batch)
        self._train()
        self.fitted_epoch = batches[-1][0].epoch if batches else -1

    def _record(self, batch: Sequence[Observation]) -> None:
        for obs in batch:
            self.examples.append((obs.prompt, history_features(self.history.get(obs.prompt_id)), obs.lengths))
        for obs in batch:
            self._absorb(obs)

    def _threads(self):
        import sklearn.ensemble  # noqa: F401  (load libgomp first: limits only reach libraries already loaded)
        from threadpoolctl import threadpool_limits

        return threadpool_limits(self.cfg.learned_n_threads or None)

    def _train(self) -> None:
        with self._threads():
            self._train_models()

    def _train_models(self) -> None:
        if not self.examples:
            raise DataError("learned predictor: no training rows")
        X = self._matrix([e[0] for e in self.examples], [e[1] for e in self.examples])
        groups = [e[2] for e in self.examples]
        sizes = np.array([len(g) for g in groups])
        self.global_mean = float(np.average([np.mean(g) for g in groups], weights=sizes))
        est = fit_estimators(self.cfg, X, groups)
        self.models = {"point": from_sklearn(est["point"]),
                       "quantiles": {q: from_sklearn(e) for q, e in est["quantiles"].items()}}

    def update(self, observations: Sequence[Observation]) -> None:
        if not observations:
            return
        epoch = max(o.epoch for o in observations)
        refit = self.cfg.learned_refit_every_epochs
        if refit and epoch - self.fitted_epoch > refit and self.examples:
            self._train()  # on all examples before this batch: earlier epochs are complete
            self.fitted_epoch = epoch - 1
        self._record(observations)

    def predict(self, prompt_ids: Sequence[str], prompts: Sequence[str]) -> Prediction:
        check_inputs(prompt_ids, prompts)
        hist = [history_features(self.history.get(p)) for p in prompt_ids]
        if self.models is None:  # nothing fitted yet: the prompt's EWMA, else the prior
            m = [h[3] if h[0] > 0 else self.cfg.prior_length for h in hist]
            return Prediction(tuple(prompt_ids), tuple(m), {})
        X = self._matrix(prompts, hist)
        m = np.maximum(self.models["point"].predict(X), 1.0)
        qs = {q: tuple(np.maximum(model.predict(X), 1.0).tolist()) for q, model in self.models["quantiles"].items()}
        return Prediction(tuple(prompt_ids), tuple(m.tolist()), qs)

    # --- persistence -----------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(d / NPZ_FILE, **self.arrays())
        state = {"fitted_epoch": self.fitted_epoch, "global_mean": self.global_mean,
                 "fitted": self.models is not None, "model_file": NPZ_FILE}
        write_model(d, self.name, self.cfg.to_dict(), state)

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything ``model.npz`` holds (see the module header)."""
        out = {"quantiles": np.asarray(self.cfg.quantiles, dtype=np.float64), **examples_to_arrays(self.examples),
               **history_to_arrays(self.history)}
        if self.models is not None:
            out.update(self.models["point"].to_arrays("point"))
            for i, q in enumerate(self.cfg.quantiles):
                out.update(self.models["quantiles"][q].to_arrays(f"quantile{i}"))
        return out

    def load_state(self, saved: SavedState) -> None:
        state = saved.state
        self.fitted_epoch = whole(state["fitted_epoch"], "fitted_epoch")
        self.global_mean = None if state["global_mean"] is None else number(state["global_mean"], "global_mean")
        if saved.version == 1:
            self._load_legacy(saved)
            return
        if state["model_file"] != NPZ_FILE or not isinstance(state["fitted"], bool):
            raise ValueError(f"model_file must be {NPZ_FILE!r} and fitted true or false")
        self._read_npz(saved.directory / NPZ_FILE, state["fitted"])

    def _load_legacy(self, saved: SavedState) -> None:
        """Format 1: history in the JSON state, models and examples in a pickle (only with trust_pickle)."""
        from rlhfless.predictor.legacy import read_legacy

        history = history_from_state(saved.state["history"])
        self.models, examples = read_legacy(saved.directory, self.cfg.quantiles, trust_pickle=saved.trust_pickle)
        where = saved.directory / "model.pkl"
        self.examples = examples_from_arrays(examples_to_arrays(examples), where)  # the same checks as format 2
        self.history = history_from_arrays(history_to_arrays(history), where)

    def _read_npz(self, path: Path, fitted: bool) -> None:
        arrays = load_arrays(path)
        prefixes = ["point", *(f"quantile{i}" for i in range(len(self.cfg.quantiles)))] if fitted else []
        expected = {"quantiles", *ARRAY_DTYPES, *(f"{p}.{f}" for p in prefixes for f in FOREST_FIELDS)}
        if set(arrays) != expected:
            missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
            raise DataError(f"{path}: arrays do not match a {'fitted' if fitted else 'unfitted'} learned model "
                            f"(missing {missing}, unexpected {extra})")
        levels = arrays["quantiles"]
        if levels.dtype != np.float64 or levels.tolist() != list(self.cfg.quantiles):
            raise DataError(f"{path}: quantile levels {levels.tolist()} differ from the config's "
                            f"{list(self.cfg.quantiles)}")
        check_dtypes(arrays, path)
        self.examples = examples_from_arrays(arrays, path)
        self.history = history_from_arrays(arrays, path)
        forests = [Forest.from_arrays(arrays, p, self.n_features(), path) for p in prefixes]
        self.models = {"point": forests[0], "quantiles": dict(zip(self.cfg.quantiles, forests[1:]))} if fitted else None


def history_from_state(value: object) -> dict[str, dict[str, float]]:
    """Per-prompt history as format 1 saved it in ``predictor.json``; anything but objects of numbers raises
    ValueError."""
    if not isinstance(value, dict):
        raise ValueError(f"history must be an object (got {type(value).__name__})")
    out = {}
    for pid, h in value.items():  # 4k+ prompts: checked inline rather than by one call per number
        if not isinstance(h, dict) or h.keys() != _HIST_KEYS or not all(type(v) in (int, float) for v in h.values()):
            raise ValueError(f"history[{pid!r}] must be an object of numbers with keys {list(_HIST)}")
        out[pid] = {k: float(h[k]) for k in _HIST}
    return out
