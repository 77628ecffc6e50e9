"""`PredictorConfig` and the factory that builds (or loads) a predictor by name.

Non-goals: hyper-parameter search. Deviation from the paper: the paper names only the EWMA; its alpha and
first-epoch default are not given in our sources, so both are configurable here (alpha 0.5 and the running
mean of observed lengths by default, chosen on synthetic traces, see notebooks/03_length_predictors.ipynb).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlhfless.core.errors import ConfigError, DataError, require
from rlhfless.predictor.base import MODEL_FILE, LengthPredictor, SavedState, read_model

PREDICTOR_NAMES = ("ewma", "sibling", "learned", "global_mean", "prompt_length")


@dataclass(frozen=True)
class PredictorConfig:
    """Which length predictor to use and its knobs.

    name: one of ewma, sibling, learned, global_mean, prompt_length.
    alpha: EWMA weight of the newest step's group mean, in (0, 1] (1 = last value only).
    default_length: prediction (tokens) for prompts never seen before; None = mean of all lengths seen so far.
    prior_length: prediction (tokens) before anything at all was observed, > 0 (used when default_length is None).
    quantiles: quantile levels to predict where the model can, each in (0, 1), increasing.
    sibling_base: predictor that the sibling refinement starts from (any name but sibling).
    learned_max_iter: boosting rounds of each gradient-boosting model of the learned predictor, >= 1.
    learned_hash_features: number of hashed character n-gram features of the prompt text, >= 1.
    learned_refit_every_epochs: refit the learned models when `update` enters a new epoch this many epochs
        after the last fit; 0 = never refit online (history features still update).
    learned_n_threads: OpenMP threads scikit-learn may use, >= 0 (0 = all cores). 1 by default: boosting
        threads fighting the training loop (or other jobs) for a few cores can be 10x slower than one thread.
    seed: random seed of the learned models.
    """

    name: str = "ewma"
    alpha: float = 0.5
    default_length: float | None = None
    prior_length: float = 256.0
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    sibling_base: str = "ewma"
    learned_max_iter: int = 100
    learned_hash_features: int = 64
    learned_refit_every_epochs: int = 1
    learned_n_threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.name in PREDICTOR_NAMES, "predictor.name",
                f"must be one of {list(PREDICTOR_NAMES)} (got {self.name!r})")
        require(0.0 < self.alpha <= 1.0, "predictor.alpha", f"must be in (0, 1] (got {self.alpha})")
        require(self.default_length is None or self.default_length > 0, "predictor.default_length",
                f"must be > 0 tokens or null for the running mean (got {self.default_length})")
        require(self.prior_length > 0, "predictor.prior_length", f"must be > 0 tokens (got {self.prior_length})")
        require(all(0.0 < q < 1.0 for q in self.quantiles), "predictor.quantiles",
                f"each level must be in (0, 1) (got {list(self.quantiles)})")
        require(list(self.quantiles) == sorted(set(self.quantiles)), "predictor.quantiles",
                f"levels must be strictly increasing (got {list(self.quantiles)})")
        require(self.sibling_base in PREDICTOR_NAMES and self.sibling_base != "sibling", "predictor.sibling_base",
                f"must be one of {[n for n in PREDICTOR_NAMES if n != 'sibling']} (got {self.sibling_base!r})")
        require(self.learned_max_iter >= 1, "predictor.learned_max_iter", f"must be >= 1 (got {self.learned_max_iter})")
        require(self.learned_hash_features >= 1, "predictor.learned_hash_features",
                f"must be >= 1 (got {self.learned_hash_features})")
        require(self.learned_n_threads >= 0, "predictor.learned_n_threads",
                f"must be >= 0 (got {self.learned_n_threads})")
        require(self.learned_refit_every_epochs >= 0, "predictor.learned_refit_every_epochs",
                f"must be >= 0 (got {self.learned_refit_every_epochs})")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["quantiles"] = list(self.quantiles)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> PredictorConfig:
        from rlhfless.core.configbase import from_dict

        return from_dict(cls, dict(data))


def build_predictor(cfg: PredictorConfig) -> LengthPredictor:
    """A fresh (unfitted) predictor for `cfg`; an unknown name raises `ConfigError` listing the allowed ones."""
    if cfg.name not in PREDICTOR_NAMES:  # configs built with object.__setattr__ or pickled from elsewhere
        raise ConfigError(f"predictor.name: must be one of {list(PREDICTOR_NAMES)} (got {cfg.name!r})")
    if cfg.name == "ewma":
        from rlhfless.predictor.ewma import EWMAPredictor

        return EWMAPredictor(cfg)
    if cfg.name == "sibling":
        from rlhfless.predictor.sibling import SiblingPredictor

        return SiblingPredictor(cfg, build_predictor(replace(cfg, name=cfg.sibling_base)))
    if cfg.name == "learned":
        from rlhfless.predictor.learned import LearnedPredictor

        return LearnedPredictor(cfg)
    from rlhfless.predictor.baselines import GlobalMeanPredictor, PromptLengthPredictor

    return GlobalMeanPredictor(cfg) if cfg.name == "global_mean" else PromptLengthPredictor(cfg)


def load_predictor(directory: str | Path, *, trust_pickle: bool = False) -> LengthPredictor:
    """Load a predictor saved with `save`, with its whole online state.

    Foreign, corrupt, unknown-version or wrongly typed files raise `DataError` naming the file; nothing from the
    file is executed. `trust_pickle` allows reading a format-1 learned model (``model.pkl``), which unpickles:
    only for files you made yourself; it warns (`UnsafeLoadWarning`). Re-save such a model to drop the pickle.
    """
    doc = read_model(directory)
    where = Path(directory) / MODEL_FILE
    try:
        cfg = PredictorConfig.from_dict(doc["config"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise DataError(f"{where}: bad saved config ({exc})") from None
    if doc["predictor"] != cfg.name:
        raise DataError(f"{where}: header says predictor {doc['predictor']!r} but config says {cfg.name!r}")
    predictor = build_predictor(cfg)
    if cfg.name == "sibling":  # its base is a saved predictor of its own (in base/), loaded first
        predictor.base = load_predictor(Path(directory) / "base", trust_pickle=trust_pickle)
    saved = SavedState(Path(directory), doc["format_version"], doc["state"], trust_pickle)
    try:
        predictor.load_state(saved)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{where}: saved {cfg.name} state is incomplete or corrupt ({exc!r}); retrain it") from None
    return predictor
