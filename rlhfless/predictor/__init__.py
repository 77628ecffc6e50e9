"""Response-length predictors: length data, the paper's per-prompt EWMA, sibling refinement, a learned
(scikit-learn) predictor, baselines, leakage-free evaluation, and synthetic length traces.

What the training loop uses::

    predictor = build_predictor(PredictorConfig(name="ewma"))
    pred = predictor.predict(prompt_ids, prompts)        # Prediction: .mean (+ .quantiles)
    ...                                                  # plan and run the step
    metrics = step_metrics(pred, [g_lengths, ...])       # predictor/mae, predictor/kendall_tau
    predictor.update([Observation(pid, text, lengths, epoch, step), ...])

Names are resolved lazily, so importing the package (as `rlhfless --help` does via the CLI module) costs nothing;
scikit-learn and matplotlib are only imported by the functions that need them.
"""

import importlib

_EXPORTS = {
    "LengthPredictor": "base", "Prediction": "base",
    "PREDICTOR_NAMES": "config", "PredictorConfig": "config", "build_predictor": "config", "load_predictor": "config",
    "LengthRow": "data", "Observation": "data", "read_lengths": "data",
    "makespan_ratio": "evaluate", "prediction_table": "evaluate", "step_metrics": "evaluate",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlhfless.predictor.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlhfless.predictor' has no attribute {name!r}")


__all__ = [
    "PREDICTOR_NAMES", "LengthPredictor", "LengthRow", "Observation", "Prediction", "PredictorConfig",
    "build_predictor", "load_predictor", "makespan_ratio", "prediction_table", "read_lengths", "step_metrics",
]
