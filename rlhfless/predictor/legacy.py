"""Format-1 learned predictors (``model.pkl``): read only when the caller trusts the file, then never written again.

Format 1 stored the fitted scikit-learn models and the training examples as a pickle behind one JSON header line
(``{"format": "rlhfless-learned-predictor", "rlhfless_version", "sklearn_version", "predictor": "learned"}``).
Unpickling runs whatever code the file holds, so without ``trust_pickle`` the file is refused unopened. With it,
the header must name this format, the learned predictor and the running scikit-learn version; the pickle may
only name the classes a fitted HistGradientBoostingRegressor needs (an allow-list: scikit-learn's gradient
boosting and loss classes, numpy arrays and random generators), so even a trusted file cannot call `os.system`;
an `UnsafeLoadWarning` is issued; the models are converted to `Forest`s at once. Re-saving writes format 2.
This is the only module of rlhfless that imports `pickle`.
Non-goals: writing format 1; loading pickles of any other kind. Deviation from the paper: none.
"""

from __future__ import annotations

import importlib
import json
import pickle
import warnings
from pathlib import Path

from rlhfless.core.errors import DataError
from rlhfless.predictor.trees import Forest, from_sklearn

PICKLE_FILE = "model.pkl"
PICKLE_FORMAT = "rlhfless-learned-predictor"
CONVERT_EXAMPLE = "`rlhfless predictor convert --model OLD --out NEW --trust-pickle`"
_FUNCTIONS = {  # (module, name) of the functions a pickled fitted model calls to rebuild numpy objects
    ("numpy", "dtype"), ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy", "ndarray"), ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"), ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
}
_CLASS_MODULES = ("sklearn.ensemble._hist_gradient_boosting.", "sklearn._loss.", "numpy.random.")


class UnsafeLoadWarning(UserWarning):
    """A file was loaded in a way that can run code it holds, because the caller said to trust it."""


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _FUNCTIONS:
            return super().find_class(module, name)
        if module.startswith(_CLASS_MODULES):
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type):
                return obj
        raise pickle.UnpicklingError(f"global {module}.{name} is not on the allow-list of a fitted model")


def read_legacy(directory: Path, quantiles, *, trust_pickle: bool) -> tuple[dict, list]:
    """(models as `Forest`s, training examples) of a format-1 learned predictor in `directory`.

    Without `trust_pickle`, raises `DataError` without opening the file. `quantiles` are the config's levels.
    """
    path = Path(directory) / PICKLE_FILE
    if not trust_pickle:
        raise DataError(f"{path}: a format-1 learned predictor is a pickle, which runs code when loaded; refused. "
                        f"If you made it yourself, convert it once with {CONVERT_EXAMPLE}")
    if not path.is_file():
        raise DataError(f"learned predictor model file not found: {path}")
    warnings.warn(f"{path}: unpickling a format-1 learned predictor because trust_pickle was given; this can run "
                  f"code the file holds. Convert it with {CONVERT_EXAMPLE}", UnsafeLoadWarning, stacklevel=3)
    with path.open("rb") as fh:
        _check_header(path, fh.readline())
        try:
            payload = _AllowListUnpickler(fh).load()
        except Exception as exc:  # noqa: BLE001  (any failure of a foreign pickle is a bad file, one line)
            raise DataError(f"{path}: cannot unpickle ({type(exc).__name__}: {exc})") from None
    return _convert(path, payload, quantiles)


def _check_header(path: Path, first: bytes) -> None:
    import sklearn

    try:
        header = json.loads(first.decode("utf-8"))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a huge integer, deep nesting
        raise DataError(f"{path}: no rlhfless header line; not a learned-predictor file") from None
    if not isinstance(header, dict) or header.get("format") != PICKLE_FORMAT or header.get("predictor") != "learned":
        raise DataError(f"{path}: not a rlhfless learned-predictor file (header {header!r})")
    if header.get("sklearn_version") != sklearn.__version__:
        raise DataError(f"{path}: pickled with scikit-learn {header.get('sklearn_version')!r} but this is "
                        f"{sklearn.__version__!r}; load it where it was made and convert it there")


def _convert(path: Path, payload: object, quantiles) -> tuple[dict | None, list]:
    """Check the unpickled payload's shape and turn its estimators into `Forest`s."""
    models = payload.get("models") if isinstance(payload, dict) else None
    examples = payload.get("examples") if isinstance(payload, dict) else None
    ests = _estimators(models, quantiles) if models is not None else []
    if ests is None or not isinstance(examples, list) or not all(_is_example(e) for e in examples):
        raise DataError(f"{path}: the pickle does not hold a learned predictor's models and examples")
    if models is None:
        return None, examples
    try:
        forests: list[Forest] = [from_sklearn(e) for e in ests]
    except (ValueError, AttributeError, KeyError, IndexError) as exc:
        raise DataError(f"{path}: cannot convert the pickled models ({exc})") from None
    return {"point": forests[0], "quantiles": dict(zip(quantiles, forests[1:]))}, examples


def _estimators(models: object, quantiles) -> list | None:
    """[point, one per quantile level] when `models` is the format-1 dict of fitted estimators, else None."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    if not isinstance(models, dict) or not isinstance(models.get("quantiles"), dict):
        return None
    ests = [models.get("point"), *(models["quantiles"].get(q) for q in quantiles)]
    return ests if all(isinstance(e, HistGradientBoostingRegressor) for e in ests) else None


def _is_example(e: object) -> bool:
    """(prompt text, 5 history features, lengths) as format 1 stored them."""
    return (isinstance(e, tuple) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], list)
            and len(e[1]) == 5 and all(isinstance(x, float) for x in e[1]) and isinstance(e[2], tuple)
            and len(e[2]) >= 1 and all(isinstance(x, int) and not isinstance(x, bool) for x in e[2]))
