"""Predictor files are untrusted input: the learned model saves as plain arrays that predict exactly as the fitted
scikit-learn models did, every malformed or hostile file is refused with one line naming it, and nothing in a
file ever runs (a pickle payload that would write a marker file is planted everywhere a loader reads)."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from rlhfless.core.errors import DataError
from rlhfless.predictor.config import PredictorConfig, build_predictor, load_predictor
from rlhfless.predictor.data import rows_from_trace
from rlhfless.predictor.learned import NPZ_FILE, fit_estimators
from rlhfless.predictor.legacy import PICKLE_FILE, PICKLE_FORMAT, UnsafeLoadWarning
from rlhfless.predictor.synthetic import SyntheticParams, generate_trace
from rlhfless.predictor.trees import from_sklearn

FAST = dict(learned_max_iter=15, learned_hash_features=16)


@pytest.fixture(scope="module")
def fitted():
    rows = rows_from_trace(generate_trace(SyntheticParams(n_prompts=30, n_epochs=3, prompts_per_step=10), seed=5))
    p = build_predictor(PredictorConfig(name="learned", **FAST))
    p.fit(rows)
    return p


def _features(p, n=200, seed=0):
    """Feature rows like the model's, with NaN (missing) and -1 (sentinel) entries and extreme values."""
    rng = np.random.default_rng(seed)
    ex = p.examples[:n]
    X = p._matrix([e[0] for e in ex], [e[1] for e in ex])
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.15] = -1.0
    X[:3] = np.inf
    X[3:6] = -np.inf
    return X


def test_forest_predicts_exactly_as_the_fitted_estimators(fitted):
    X_train = fitted._matrix([e[0] for e in fitted.examples], [e[1] for e in fitted.examples])
    est = fit_estimators(fitted.cfg, X_train, [e[2] for e in fitted.examples])
    X = _features(fitted)
    for name, e in [("point", est["point"]), *est["quantiles"].items()]:
        forest = from_sklearn(e)
        assert np.array_equal(forest.predict(X), e.predict(X)), name  # bit-identical, NaN/sentinel rows included
        assert np.array_equal(forest.predict(X_train), e.predict(X_train)), name


def test_forest_follows_learned_missing_value_directions():
    """Trained with NaNs, scikit-learn learns where missing values go; the forest must send them the same way."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 4))
    X[rng.random(X.shape) < 0.3] = np.nan
    y = np.where(np.isnan(X[:, 0]), 50.0, 10.0 * np.nan_to_num(X[:, 0])) + rng.normal(size=600)
    for kw in (dict(loss="squared_error"), dict(loss="quantile", quantile=0.9)):
        e = HistGradientBoostingRegressor(max_iter=30, random_state=0, early_stopping=False, **kw).fit(X, y)
        forest = from_sklearn(e)
        assert forest.missing_left.any() and not forest.missing_left.all()
        X_test = rng.normal(size=(300, 4))
        X_test[rng.random(X_test.shape) < 0.5] = np.nan
        assert np.array_equal(forest.predict(X_test), e.predict(X_test))


def test_saved_learned_model_is_plain_arrays_and_predicts_identically(tmp_path, fitted):
    fitted.save(tmp_path / "m")
    assert sorted(f.name for f in (tmp_path / "m").iterdir()) == [NPZ_FILE, "predictor.json"]
    with np.load(tmp_path / "m" / NPZ_FILE, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    q = load_predictor(tmp_path / "m")
    X = _features(fitted)
    for a, b in [(fitted.models["point"], q.models["point"]),
                 *((fitted.models["quantiles"][k], q.models["quantiles"][k]) for k in fitted.cfg.quantiles)]:
        assert np.array_equal(a.predict(X), b.predict(X))
    assert q.examples == fitted.examples and q.history == fitted.history


# --- malformed new-format files --------------------------------------------------------------------------------
def _rewrite_npz(path: Path, change) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    path.unlink()
    np.savez(path, **arrays)


def _set(key, value):
    return lambda a: a.__setitem__(key, value)


def _cycle(a):  # point the first split node's left child back at the root: a walk would never end
    inner = np.flatnonzero(~a["point.is_leaf"])[0]
    a["point.left"] = a["point.left"].copy()
    a["point.left"][inner] = 0


BAD_NPZ = [
    (lambda a: a.pop("point.value"), r"missing \['point.value'\]"),
    (_set("extra", np.zeros(3)), r"unexpected \['extra'\]"),
    (lambda a: a.__setitem__("point.value", a["point.value"].astype(np.float32)), "'point.value' has dtype float32"),
    (lambda a: a.__setitem__("point.threshold", a["point.threshold"][:-1]), "'threshold' has shape"),
    (lambda a: a.__setitem__("point.feature", a["point.feature"] + 1000), "feature index is outside"),
    (_cycle, "left child is not a later node of its own tree"),
    (lambda a: a.__setitem__("point.tree_start", a["point.tree_start"][::-1].copy()), "tree_start must rise"),
    (_set("quantiles", np.array([0.2, 0.5, 0.9])), "quantile levels .* differ from the config"),
    (lambda a: a.__setitem__("examples.prompt_index", a["examples.prompt_index"] + 10**6), "prompt index is out"),
    (_set("examples.prompts.bytes", np.array([0xFF, 0xFE] * 10, dtype=np.uint8)), "examples.prompts.start are not"),
    (lambda a: a.__setitem__("examples.history", a["examples.history"][:, :4].copy()), "examples.history must be"),
    (lambda a: a.__setitem__("examples.lengths", -a["examples.lengths"]), "a length is negative"),
    (lambda a: a.__setitem__("history.values", a["history.values"][:-1]), "history.values must be"),
    (lambda a: a.__setitem__("history.values", a["history.values"] * np.nan), "history.values must be"),
    (lambda a: a.__setitem__("history.ids.start", a["history.ids.start"].astype(np.int32)), "'history.ids.start' has"),
    (_set("history.values", np.array([1.0])), "'history.values' has dtype float64 and shape"),
]


@pytest.mark.parametrize("change, message", BAD_NPZ, ids=range(len(BAD_NPZ)))
def test_malformed_npz_is_refused_naming_the_file(tmp_path, fitted, change, message):
    fitted.save(tmp_path / "m")
    _rewrite_npz(tmp_path / "m" / NPZ_FILE, change)
    with pytest.raises(DataError, match=message) as err:
        load_predictor(tmp_path / "m")
    assert str(tmp_path / "m" / NPZ_FILE) in str(err.value) and "\n" not in str(err.value)


def test_non_utf8_prompt_text_and_missing_npz_are_refused(tmp_path, fitted):
    fitted.save(tmp_path / "m")
    npz = tmp_path / "m" / NPZ_FILE

    def garble(a):
        a["examples.prompts.bytes"] = a["examples.prompts.bytes"].copy()
        a["examples.prompts.bytes"][0] = 0xFF

    _rewrite_npz(npz, garble)
    with pytest.raises(DataError, match="not UTF-8 text"):
        load_predictor(tmp_path / "m")
    npz.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_predictor(tmp_path / "m")
    npz.unlink()
    with pytest.raises(DataError, match="model file not found"):
        load_predictor(tmp_path / "m")


# --- hostile files: nothing may run ------------------------------------------------------------------------------
class _Payload:
    """Unpickling this writes `marker`: proof that a loader executed code from a file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code from a predictor file ran')",)


def _format1_dir(directory: Path, predictor, payload: object) -> None:
    """A model folder as rlhfless 0.1 wrote it (predictor.json format 1 + model.pkl), holding `payload`."""
    import sklearn

    import rlhfless
    from rlhfless.predictor.base import FORMAT, MODEL_FILE

    directory.mkdir(parents=True, exist_ok=True)
    header = {"format": PICKLE_FORMAT, "rlhfless_version": rlhfless.__version__,
              "sklearn_version": sklearn.__version__, "predictor": "learned"}
    (directory / PICKLE_FILE).write_bytes(json.dumps(header).encode() + b"\n" + pickle.dumps(payload))
    state = {"history": predictor.history, "fitted_epoch": predictor.fitted_epoch,
             "global_mean": predictor.global_mean, "model_file": PICKLE_FILE}
    doc = {"format": FORMAT, "format_version": 1, "rlhfless_version": rlhfless.__version__, "predictor": "learned",
           "config": predictor.cfg.to_dict(), "state": state}
    (directory / MODEL_FILE).write_text(json.dumps(doc))


def test_malicious_predictor_files_are_refused_without_running_anything(tmp_path, fitted):
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(_Payload(tmp_path / "live")))
    assert (tmp_path / "live").exists()  # the payload is live: plain unpickling runs it

    old = tmp_path / "old"  # 1. where the old format reads its pickle, with and without --trust-pickle
    _format1_dir(old, fitted, {"models": _Payload(marker), "examples": []})
    with pytest.raises(DataError, match="format-1 learned predictor is a pickle.*refused"):
        load_predictor(old)
    with pytest.warns(UnsafeLoadWarning), pytest.raises(DataError, match="builtins.exec is not on the allow-list"):
        load_predictor(old, trust_pickle=True)

    fitted.save(tmp_path / "new")  # 2. the pickle disguised as the new format's model.npz
    (tmp_path / "new" / NPZ_FILE).write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(DataError, match="not a readable .npz"):
        load_predictor(tmp_path / "new", trust_pickle=True)

    fitted.save(tmp_path / "obj")  # 3. an object array (a pickle inside the .npz) in place of a numeric one
    _rewrite_npz(tmp_path / "obj" / NPZ_FILE, _set("point.value", np.array([_Payload(marker)], dtype=object)))
    with pytest.raises(DataError, match="not a readable .npz"):
        load_predictor(tmp_path / "obj", trust_pickle=True)

    fitted.save(tmp_path / "redirect")  # 4. a format-2 predictor.json pointing at the pickle
    (tmp_path / "redirect" / PICKLE_FILE).write_bytes((old / PICKLE_FILE).read_bytes())
    doc = json.loads((tmp_path / "redirect" / "predictor.json").read_text())
    doc["state"]["model_file"] = PICKLE_FILE
    (tmp_path / "redirect" / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="model_file must be 'model.npz'"):
        load_predictor(tmp_path / "redirect", trust_pickle=True)

    assert not marker.exists()


def test_honest_old_pickle_loads_only_with_trust_pickle_and_converts(tmp_path, fitted):
    X_train = fitted._matrix([e[0] for e in fitted.examples], [e[1] for e in fitted.examples])
    est = fit_estimators(fitted.cfg, X_train, [e[2] for e in fitted.examples])
    _format1_dir(tmp_path / "old", fitted, {"models": est, "examples": fitted.examples})
    with pytest.raises(DataError, match=r"model.pkl: a format-1 learned predictor is a pickle.*--trust-pickle"):
        load_predictor(tmp_path / "old")
    with pytest.warns(UnsafeLoadWarning, match="unpickling a format-1 learned predictor"):
        old = load_predictor(tmp_path / "old", trust_pickle=True)
    ids, texts = ["syn-1", "syn-2", "new"], ["synthetic prompt 1: lorem", "synthetic prompt 2: lorem", "x"]
    assert old.predict(ids, texts) == fitted.predict(ids, texts)
    assert old.predict(ids, texts).quantiles == fitted.predict(ids, texts).quantiles
    old.save(tmp_path / "converted")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the converted copy loads without trusting anything
        again = load_predictor(tmp_path / "converted")
    assert again.predict(ids, texts) == fitted.predict(ids, texts) and again.examples == fitted.examples


def test_cli_eval_refuses_old_pickle_until_trusted_and_convert_makes_it_safe(tmp_path, fitted, capsys):
    from rlhfless.cli import main
    from rlhfless.core.traces import TraceWriter

    trace = tmp_path / "t.jsonl"
    with TraceWriter(trace) as w:
        w.write(generate_trace(SyntheticParams(n_prompts=30, n_epochs=3, prompts_per_step=10), seed=5))
    X_train = fitted._matrix([e[0] for e in fitted.examples], [e[1] for e in fitted.examples])
    est = fit_estimators(fitted.cfg, X_train, [e[2] for e in fitted.examples])
    old, new = tmp_path / "old", tmp_path / "new"
    _format1_dir(old, fitted, {"models": est, "examples": fitted.examples})
    assert main(["predictor", "eval", "--model", str(old), "--data", str(trace)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(old / PICKLE_FILE) in err and "--trust-pickle" in err
    with pytest.warns(UnsafeLoadWarning):
        assert main(["predictor", "eval", "--model", str(old), "--data", str(trace), "--trust-pickle"]) == 0
        assert main(["predictor", "convert", "--model", str(old), "--out", str(new), "--trust-pickle"]) == 0
    assert (new / NPZ_FILE).is_file() and not (new / PICKLE_FILE).exists()
    assert main(["predictor", "eval", "--model", str(new), "--data", str(trace)]) == 0


def test_an_npz_that_would_expand_past_the_limit_is_refused_before_loading(tmp_path, monkeypatch):
    import rlhfless.predictor.npzio as npzio

    bomb = tmp_path / "model.npz"
    np.savez_compressed(bomb, zeros=np.zeros(20_000, dtype=np.uint8))  # 20 kB of zeros in well under 1 kB
    assert bomb.stat().st_size < 1_000
    monkeypatch.setattr(npzio, "MAX_NPZ_BYTES", 10_000)
    with pytest.raises(DataError, match="over the 10,000-byte limit"):
        npzio.load_arrays(bomb)
    monkeypatch.setattr(npzio, "MAX_NPZ_BYTES", 1 << 30)
    assert npzio.load_arrays(bomb)["zeros"].shape == (20_000,)
