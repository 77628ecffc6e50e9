"""Learned predictor: gradient boosting (scikit-learn) on prompt-text and length-history features.

Features per prompt: hashed character 2-4-grams of the text (`learned_hash_features` of them), the prompt's
byte length, word count and count of numbers, and the history of its own past lengths (number of past steps,
last group mean, mean, EWMA with `alpha`, std of past sample lengths; -1 without history: a sentinel rather
than NaN because an all-NaN column, as in text-only data, breaks scikit-learn's binning). Training examples
are built causally: a step's features come only from earlier steps, exactly what the loop sees online. The
point model predicts the group mean (squared error); one quantile model per level predicts single-sample
quantiles (`loss="quantile"`). scikit-learn runs on `learned_n_threads` OpenMP threads (1 by default).

Saved models: ``predictor.json`` holds the config and the history as JSON; the fitted scikit-learn models need
pickle and go to ``model.pkl``, whose first line is a JSON header (rlhfless version, scikit-learn version,
predictor name). Loading refuses a file whose header does not match the running versions, with a message
saying to retrain. Unpickling runs code: load only model files you made or trust.

Deviation from the paper: the paper uses only the per-prompt EWMA; this predictor is an addition, and is
the one that can predict prompts never seen before. Non-goals: neural text encoders, per-token models.
"""

from __future__ import annotations

import json
import math
import pickle
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import rlhfless
from rlhfless.errors import DataError
from rlhfless.predictor.base import Prediction, check_inputs, write_model
from rlhfless.predictor.data import LengthRow, Observation, group_observations

PICKLE_FILE = "model.pkl"
PICKLE_FORMAT = "rlhfless-learned-predictor"
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_HIST = ("count", "last", "sum", "ewma", "n", "total", "total_sq")


def _sklearn_version() -> str:
    import sklearn

    return sklearn.__version__


def history_features(h: dict | None) -> list[float]:
    """[count, last, mean, ewma, std] of a prompt's past lengths (tokens); -1 where undefined."""
    if not h or h["count"] == 0:
        return [0.0] + [-1.0] * 4
    mean_sample = h["total"] / h["n"]
    var = max(0.0, h["total_sq"] / h["n"] - mean_sample**2)
    return [float(h["count"]), h["last"], h["sum"] / h["count"], h["ewma"], math.sqrt(var)]


def text_features(prompts: Sequence[str]) -> np.ndarray:
    """[bytes, words, numbers] per prompt, shape (n, 3)."""
    return np.array([[len(p.encode("utf-8")), len(p.split()), len(_NUMBER.findall(p))] for p in prompts], dtype=float)


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
        return np.hstack([text, text_features(prompts), np.asarray(hist, dtype=float).reshape(len(prompts), 5)])

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
        from sklearn.ensemble import HistGradientBoostingRegressor

        if not self.examples:
            raise DataError("learned predictor: no training rows")
        prompts = [e[0] for e in self.examples]
        X = self._matrix(prompts, [e[1] for e in self.examples])
        sizes = np.array([len(e[2]) for e in self.examples])
        means = np.array([np.mean(e[2]) for e in self.examples])
        self.global_mean = float(np.average(means, weights=sizes))
        kw = dict(max_iter=self.cfg.learned_max_iter, random_state=self.cfg.seed, early_stopping=False)
        point = HistGradientBoostingRegressor(loss="squared_error", **kw).fit(X, means, sample_weight=sizes)
        X_s = np.repeat(X, sizes, axis=0)
        y_s = np.concatenate([np.asarray(e[2], dtype=float) for e in self.examples])
        quant = {q: HistGradientBoostingRegressor(loss="quantile", quantile=q, **kw).fit(X_s, y_s)
                 for q in self.cfg.quantiles}
        self.models = {"point": point, "quantiles": quant}

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
        with self._threads():
            m = np.maximum(self.models["point"].predict(X), 1.0)
            qs = {q: tuple(np.maximum(model.predict(X), 1.0).tolist()) for q, model in self.models["quantiles"].items()}
        return Prediction(tuple(prompt_ids), tuple(m.tolist()), qs)

    # --- persistence -----------------------------------------------------------------------------------
    def header(self) -> dict:
        return {"format": PICKLE_FORMAT, "rlhfless_version": rlhfless.__version__,
                "sklearn_version": _sklearn_version(), "predictor": self.name}

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        payload = {"models": self.models, "examples": self.examples}
        with (d / PICKLE_FILE).open("wb") as fh:
            fh.write((json.dumps(self.header()) + "\n").encode())
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        state = {"history": self.history, "fitted_epoch": self.fitted_epoch, "global_mean": self.global_mean,
                 "model_file": PICKLE_FILE}
        write_model(d, self.name, self.cfg.to_dict(), state)

    def load_state(self, state: dict, directory: Path) -> None:
        payload = read_pickle(directory / state["model_file"], self.header())
        self.models, self.examples = payload["models"], payload["examples"]
        self.history = state["history"]
        self.fitted_epoch = int(state["fitted_epoch"])
        self.global_mean = state["global_mean"]


def read_pickle(path: Path, expected: dict) -> dict:
    """Check the JSON header line of a learned-model file against `expected`, then unpickle the rest."""
    if not path.is_file():
        raise DataError(f"learned predictor model file not found: {path}")
    with path.open("rb") as fh:
        first = fh.readline()
        try:
            header = json.loads(first.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise DataError(f"{path}: no rlhfless header line; not a learned-predictor file") from None
        if not isinstance(header, dict) or header.get("format") != PICKLE_FORMAT:
            raise DataError(f"{path}: not a rlhfless learned-predictor file (header {header!r})")
        for key in ("rlhfless_version", "sklearn_version", "predictor"):
            if header.get(key) != expected[key]:
                raise DataError(
                    f"{path}: saved with {key} {header.get(key)!r} but this is {expected[key]!r}; pickled "
                    f"scikit-learn models are only loaded by the same versions; retrain with "
                    f"`rlhfless predictor train --model learned`"
                )
        return pickle.load(fh)
