"""Predictors: exact math vs simple references, persistence round trips, config and model-file errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.predictor.base import LengthPredictor
from rlhfless.predictor.config import (
    PREDICTOR_NAMES,
    PredictorConfig,
    build_predictor,
    load_predictor,
)
from rlhfless.predictor.data import (
    LengthRow,
    Observation,
    group_observations,
    rows_from_trace,
)
from rlhfless.predictor.evaluate import evaluate, split_rows
from rlhfless.predictor.sibling import censored_posterior_mean, evaluate_refinement
from rlhfless.predictor.synthetic import SyntheticParams, generate_trace

FAST_LEARNED = dict(learned_max_iter=20, learned_hash_features=16)


@pytest.fixture(scope="module")
def trace_rows():
    return rows_from_trace(generate_trace(SyntheticParams(n_prompts=40, n_epochs=4, prompts_per_step=10), seed=3))


def test_ewma_matches_loop_reference():
    cfg = PredictorConfig(name="ewma", alpha=0.3, default_length=77.0)
    p = build_predictor(cfg)
    history = [[10, 20], [40, 40], [5, 7]]
    for e, lengths in enumerate(history):
        p.update([Observation("a", "A", tuple(lengths), e, e)])
    ref = None
    for lengths in history:
        m = sum(lengths) / len(lengths)
        ref = m if ref is None else 0.3 * m + 0.7 * ref
    pred = p.predict(["a", "new"], ["A", "N"])
    assert pred.mean == pytest.approx((ref, 77.0))
    assert set(pred.quantiles) == {0.1, 0.5, 0.9}
    assert pred.quantiles[0.1][0] <= pred.quantiles[0.5][0] <= pred.quantiles[0.9][0]


def test_ewma_unseen_default_is_running_mean_then_prior():
    p = build_predictor(PredictorConfig(name="ewma", prior_length=99.0))
    assert p.predict(["x"], ["X"]).mean == (99.0,)
    p.update([Observation("a", "A", (10, 30)), Observation("b", "B", (50, 70))])
    assert p.predict(["x"], ["X"]).mean == (40.0,)


def test_global_mean_and_prompt_length_match_numpy():
    rows = [LengthRow(f"p{i}", "x" * n, y) for i, (n, y) in enumerate([(5, 20), (10, 41), (20, 79), (7, 30)])]
    g = build_predictor(PredictorConfig(name="global_mean"))
    g.fit(rows)
    assert g.predict(["z"], ["zz"]).mean == pytest.approx((np.mean([20, 41, 79, 30]),))
    lin = build_predictor(PredictorConfig(name="prompt_length"))
    lin.fit(rows)
    slope, icpt = np.polyfit([5, 10, 20, 7], [20, 41, 79, 30], 1)
    assert lin.predict(["q"], ["y" * 12]).mean[0] == pytest.approx(icpt + slope * 12)


def test_censored_posterior_respects_censoring_and_prior():
    # nothing finished, nothing decoded: the prior mean comes back
    assert censored_posterior_mean(200.0, 0.3, 0.25, [], 8, 0.0) == pytest.approx(200.0, rel=0.02)
    # 4 of 8 finished at ~400 tokens though the prior said 200: the rest are longer than 400, and more than prior
    est = censored_posterior_mean(200.0, 0.3, 0.25, [380, 390, 395, 400], 4, 400.0)
    assert est > 400.0
    # a tighter within-group spread pulls the estimate closer to the censoring point
    assert censored_posterior_mean(200.0, 0.3, 0.05, [380, 390, 395, 400], 4, 400.0) < est


def test_sibling_refinement_beats_step_start_estimate(trace_rows):
    split = split_rows(trace_rows)
    sib = build_predictor(PredictorConfig(name="sibling"))
    sib.fit(split.train)
    res = evaluate_refinement(sib, split.test, [2, 4, 6])
    for k, r in res.items():
        assert r["n_groups"] == 40
        assert r["mae_refined"] < 0.8 * r["mae_base"], (k, r)
    with pytest.raises(ValueError, match="n_remaining"):
        sib.refine("syn-0", [10, 12], 0)


def test_history_predictors_rank_next_epoch_well(trace_rows):
    split = split_rows(trace_rows)
    taus = {}
    for name in ("ewma", "learned", "prompt_length"):
        p = build_predictor(PredictorConfig(name=name, **FAST_LEARNED))
        p.fit(split.train)
        taus[name] = evaluate(p, split.test)["kendall_tau"]
    assert taus["ewma"] > 0.6 and taus["learned"] > 0.6
    assert taus["prompt_length"] < 0.4  # synthetic prompt text carries no length signal


def test_learned_refits_only_when_an_epoch_completes(trace_rows):
    p = build_predictor(PredictorConfig(name="learned", **FAST_LEARNED))
    p.fit([r for r in trace_rows if r.epoch < 2])
    assert p.fitted_epoch == 1
    batches = group_observations([r for r in trace_rows if r.epoch >= 2])
    first_model = p.models["point"]
    p.update(batches[0])  # epoch 2: examples of epochs 0-1 are what the model already has
    assert p.models["point"] is first_model
    for b in batches[1:]:
        p.update(b)  # epoch 3 begins: epoch 2 is complete, so refit
    assert p.models["point"] is not first_model and p.fitted_epoch == 2


IDS = ["syn-1", "syn-2", "syn-7", "never-seen"]
TEXTS = ["synthetic prompt 1: lorem", "synthetic prompt 2: lorem", "synthetic prompt 7: lorem", "other"]


def _same_predictions(p, q):
    a, b = p.predict(IDS, TEXTS), q.predict(IDS, TEXTS)
    assert a == b and a.quantiles == b.quantiles  # exact: the whole state came back bit for bit


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_save_load_resumes_the_whole_online_state(tmp_path, trace_rows, name):
    """After save + load, predictions are identical, and stay identical under the same further updates
    (the learned one refits on its restored examples when epoch 3 begins)."""
    p = build_predictor(PredictorConfig(name=name, alpha=0.4, **FAST_LEARNED))
    assert isinstance(p, LengthPredictor)
    p.fit([r for r in trace_rows if r.epoch < 2])
    p.save(tmp_path / name)
    q = load_predictor(tmp_path / name)
    _same_predictions(p, q)
    for batch in group_observations([r for r in trace_rows if r.epoch >= 2]):
        p.update(batch)
        q.update(batch)
        _same_predictions(p, q)
    if name == "sibling":
        assert q.refine("syn-1", [40, 50], 3, prompt=TEXTS[0]) == p.refine("syn-1", [40, 50], 3, prompt=TEXTS[0])
    if name == "learned":
        assert p.fitted_epoch == q.fitted_epoch == 2
    assert not list((tmp_path / name).rglob("*.pkl"))  # no pickle, for any predictor


@pytest.mark.parametrize("cfg", [dict(name="learned"), dict(name="sibling", sibling_base="learned")])
def test_learned_state_round_trips_before_any_fit(tmp_path, trace_rows, cfg):
    """The loop's learned predictor starts unfitted and is only updated: a resume at that point must work too."""
    p = build_predictor(PredictorConfig(**cfg, **FAST_LEARNED))
    batches = group_observations(trace_rows)
    p.update(batches[0])
    p.save(tmp_path / "m")
    q = load_predictor(tmp_path / "m")
    _same_predictions(p, q)
    for batch in batches[1:]:
        p.update(batch)
        q.update(batch)
    _same_predictions(p, q)
    learned = (p, q) if cfg["name"] == "learned" else (p.base, q.base)
    assert learned[0].models is not None and learned[0].examples == learned[1].examples


def test_unknown_name_and_bad_fields():
    with pytest.raises(ConfigError, match=r"predictor.name: must be one of \['ewma', 'sibling', 'learned'"):
        PredictorConfig(name="magic")
    with pytest.raises(ConfigError, match="predictor.alpha"):
        PredictorConfig(alpha=0.0)
    with pytest.raises(ConfigError, match="predictor.quantiles"):
        PredictorConfig(quantiles=(0.9, 0.1))
    with pytest.raises(ConfigError, match="predictor.sibling_base"):
        PredictorConfig(name="sibling", sibling_base="sibling")
    with pytest.raises(ConfigError, match="unknown config key 'bogus'"):
        PredictorConfig.from_dict({"name": "ewma", "bogus": 1})


def test_model_file_errors(tmp_path, trace_rows):
    with pytest.raises(DataError, match="no saved predictor"):
        load_predictor(tmp_path / "missing")
    p = build_predictor(PredictorConfig(name="ewma"))
    p.fit(trace_rows)
    p.save(tmp_path / "m")
    path = tmp_path / "m" / "predictor.json"
    doc = json.loads(path.read_text())
    cases = [
        ({**doc, "format_version": 99}, "format version 99 is not supported"),
        ({**doc, "format": "pytorch"}, "not a rlhfless length-predictor file"),
        ({**doc, "predictor": "magic", "config": {**doc["config"], "name": "magic"}}, "bad saved config"),
        ({**doc, "predictor": "learned"}, "header says predictor 'learned' but config says 'ewma'"),
        ({**doc, "state": []}, "field 'state' must be a JSON object"),
        ({**doc, "state": {}}, "incomplete or corrupt"),
        ({**doc, "state": {**doc["state"], "mean": {"syn-1": "12"}}}, r"mean\['syn-1'\] must be a number"),
        ({**doc, "state": {**doc["state"], "count": {"syn-1": 1.5}}}, "must be an integer"),
        ({**doc, "state": {**doc["state"], "stats": {"n": 1}}}, "stats must be an object with keys"),
        ([1, 2], "not a rlhfless length-predictor file"),
    ]
    for bad, message in cases:
        path.write_text(json.dumps(bad))
        with pytest.raises(DataError, match=message) as err:
            load_predictor(tmp_path / "m")
        assert str(path) in str(err.value) and "\n" not in str(err.value)
    path.write_text("{not json")
    with pytest.raises(DataError, match="predictor.json: not valid JSON"):
        load_predictor(tmp_path / "m")


def test_prediction_shape_checks():
    p = build_predictor(PredictorConfig(name="ewma"))
    with pytest.raises(ValueError, match="2 prompt ids but 1 prompt texts"):
        p.predict(["a", "b"], ["A"])
    assert math.isfinite(p.predict(["a"], ["A"]).mean[0])
    assert replace(PredictorConfig(), name="learned").name == "learned"
