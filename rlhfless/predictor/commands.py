"""The work behind `rlhfless predictor ...` and `rlhfless data ...`: plain functions tests and notebooks call.

`train_predictor` fits on the train part of the standard split (`evaluate.split_rows`) unless told to use all
rows, and records the split in ``training.json`` beside the model so `eval_predictor` scores exactly the
held-out part (a ``training.json`` that is not an object with integer test_epoch/seed and numeric test_frac
is refused). `convert_predictor` re-saves a model in the current format (how an old pickled learned model,
loaded once with ``trust_pickle``, becomes a safe one). `compare_predictors` fits every predictor on the same
split and reports them side by side, plus the sibling refinement at several numbers of revealed samples.
Non-goal: model selection by search. Deviation from the paper: none (the paper has no predictor tooling).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rlhfless.core.errors import DataError
from rlhfless.core.jsonl import json_safe, read_json_file, write_json  # noqa: F401  (json_safe is re-exported)
from rlhfless.predictor.base import LengthPredictor
from rlhfless.predictor.config import (
    PREDICTOR_NAMES,
    PredictorConfig,
    build_predictor,
    load_predictor,
)
from rlhfless.predictor.data import LengthRow, read_lengths
from rlhfless.predictor.evaluate import Split, evaluate, split_rows

TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class SplitSpec:
    """How rows are split. test_epoch: None = last epoch (traces); test_frac, seed: held-out prompts (text)."""

    test_epoch: int | None = None
    test_frac: float = 0.2
    seed: int = 0

    def apply(self, rows: list[LengthRow]) -> Split:
        return split_rows(rows, test_epoch=self.test_epoch, test_frac=self.test_frac, seed=self.seed)


def train_predictor(data: str | Path, cfg: PredictorConfig, out: str | Path, *, split: SplitSpec = SplitSpec(),
                    use_all: bool = False, progress: bool = False) -> LengthPredictor:
    """Fit `cfg`'s predictor on `data` (train split, or every row with `use_all`) and save it to `out`."""
    from rlhfless.core.progress import phases

    with phases(["read", "fit", "save"], "predictor train", progress) as step:
        step("read")
        rows = read_lengths(data)
        s = split.apply(rows)
        predictor = build_predictor(cfg)
        step("fit")
        predictor.fit(rows if use_all else s.train)
        step("save")
        predictor.save(out)
    meta = {"data": str(Path(data).resolve()), "rows": len(rows), "use_all": use_all, "split_kind": s.kind,
            "test_epoch": s.test_epoch, "test_frac": split.test_frac, "seed": split.seed}
    write_json(meta, Path(out) / TRAINING_FILE)
    return predictor


def read_training_meta(model_dir: str | Path) -> dict:
    """``training.json`` beside a model ({} when absent); a file that is not a JSON object raises `DataError`."""
    path = Path(model_dir) / TRAINING_FILE
    meta = read_json_file(path)
    if meta is None:
        return {}
    ok = isinstance(meta, dict) and all(
        not isinstance(meta.get(k), bool) and isinstance(meta.get(k, 0), kinds)
        for k, kinds in (("test_epoch", (int, type(None))), ("test_frac", (int, float)), ("seed", int)))
    if not ok:
        raise DataError(f"{path}: expected a JSON object with integer test_epoch (or null) and seed, numeric test_frac")
    return meta


def eval_predictor(model_dir: str | Path, data: str | Path, *, n_actors: int = 4, trust_pickle: bool = False,
                   progress: bool = False) -> dict:
    """Metrics of a saved predictor on the held-out part of `data` (the split recorded at training)."""
    from rlhfless.core.progress import phases

    with phases(["load", "evaluate"], "predictor eval", progress) as step:
        step("load")
        predictor = load_predictor(model_dir, trust_pickle=trust_pickle)
        meta = read_training_meta(model_dir)
        spec = SplitSpec(meta.get("test_epoch"), meta.get("test_frac", 0.2), meta.get("seed", 0))
        s = spec.apply(read_lengths(data))
        if meta.get("use_all") and meta.get("data") == str(Path(data).resolve()):
            print(f"warning: {model_dir} was trained on all rows of {data}; its test rows are not held out",
                  file=sys.stderr)
        step("evaluate")
        metrics = evaluate(predictor, s.test, n_actors=n_actors)
    return {"predictor": predictor.name, "split": s.kind, "test_epoch": s.test_epoch, **metrics}


def convert_predictor(model_dir: str | Path, out: str | Path, *, trust_pickle: bool = False) -> LengthPredictor:
    """Load a saved predictor (any readable format) and save it in the current one to `out`, with its
    ``training.json``: how a format-1 (pickled) learned model becomes a safe one, once, with `trust_pickle`."""
    predictor = load_predictor(model_dir, trust_pickle=trust_pickle)
    predictor.save(out)
    meta = read_training_meta(model_dir)
    if meta:
        write_json(meta, Path(out) / TRAINING_FILE)
    return predictor


@dataclass
class Comparison:
    """Side-by-side results: metrics per predictor, sibling refinement, and the per-group predictions.

    predictions: pandas DataFrame with columns predictor, prompt_id, predicted, actual (tokens).
    """

    metrics: dict[str, dict[str, float]]
    refinement: dict[int, dict[str, float]]
    predictions: object
    split: Split

    def best(self, key: str = "kendall_tau") -> str:
        scored = {n: m[key] for n, m in self.metrics.items() if m[key] == m[key]}
        return max(scored, key=scored.get) if scored else ""

    def to_json(self) -> dict:
        return {"split": self.split.kind, "test_epoch": self.split.test_epoch, "best_by_kendall_tau": self.best(),
                "predictors": self.metrics, "sibling_refinement": {str(k): v for k, v in self.refinement.items()}}


def compare_predictors(rows: list[LengthRow], *, names=PREDICTOR_NAMES, base: PredictorConfig = PredictorConfig(),
                       split: SplitSpec = SplitSpec(), n_actors: int = 4, progress: bool = False) -> Comparison:
    """Fit each named predictor (config `base` with that name) on the same split and evaluate it (a bar over the
    predictors when `progress`: the learned one takes seconds)."""
    import pandas as pd

    from rlhfless.core.progress import phases
    from rlhfless.predictor.sibling import evaluate_refinement

    s = split.apply(rows)
    obs = [o for batch in s.test for o in batch]
    metrics, frames, refinement = {}, [], {}
    with phases(list(names), "predictor compare", progress) as step:
        for name in names:
            step(name)
            predictor = build_predictor(replace(base, name=name))
            predictor.fit(s.train)
            metrics[name] = evaluate(predictor, s.test, n_actors=n_actors)
            pred = predictor.predict([o.prompt_id for o in obs], [o.prompt for o in obs])
            frames.append(pd.DataFrame({"predictor": name, "prompt_id": [o.prompt_id for o in obs],
                                        "predicted": pred.mean, "actual": [o.mean for o in obs]}))
            if name == "sibling":
                g = max(len(o.lengths) for o in obs)
                reveal = sorted({k for k in (g // 4, g // 2, 3 * g // 4) if 0 < k < g})
                refinement = evaluate_refinement(predictor, s.test, reveal)
    return Comparison(metrics, refinement, pd.concat(frames, ignore_index=True), s)


def plot_comparison(comp: Comparison, path: str | Path) -> Path:
    """Seaborn figure: predicted vs actual per predictor (left), Kendall tau and MAE per predictor (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    df = comp.predictions
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    sns.scatterplot(data=df, x="actual", y="predicted", hue="predictor", s=14, alpha=0.6, ax=axes[0])
    hi = float(max(df["actual"].max(), df["predicted"].max()))
    axes[0].plot([0, hi], [0, hi], color="grey", lw=1, ls="--")
    axes[0].set(title="predicted vs actual mean length (test groups)", xlabel="actual (tokens)",
                ylabel="predicted (tokens)")
    table = pd.DataFrame([{"predictor": n, **m} for n, m in comp.metrics.items()])
    sns.barplot(data=table, x="predictor", y="kendall_tau", ax=axes[1])
    axes[1].set(title="Kendall tau (higher is better)")
    sns.barplot(data=table, x="predictor", y="mae", ax=axes[2])
    axes[2].set(title="MAE, tokens (lower is better)")
    for ax in axes[1:]:
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def synthetic_trace_file(out: str | Path, *, seed: int = 0, fit_from: str | Path | None = None, **params) -> int:
    """Write a synthetic trace (JSONL of `TraceRow`) to `out`; parameters fitted to `fit_from` when given,
    then overridden by `params`. Returns the number of rows."""
    from dataclasses import fields

    from rlhfless.core.configbase import from_dict
    from rlhfless.predictor.synthetic import SyntheticParams, fit_params, generate_trace
    from rlhfless.core.traces import TraceWriter

    base = SyntheticParams()
    if fit_from is not None:
        rows = read_lengths(fit_from)
        if any(r.epoch is None for r in rows):
            raise DataError(f"{fit_from}: fitting needs a loop trace with epochs")
        base = fit_params(rows)
    merged = {**{f.name: getattr(base, f.name) for f in fields(SyntheticParams)}, **params}
    params_obj = from_dict(SyntheticParams, merged, prefix="synthetic")
    trace = generate_trace(params_obj, seed)
    Path(out).unlink(missing_ok=True)
    with TraceWriter(out) as w:
        w.write(trace)
    return len(trace)
