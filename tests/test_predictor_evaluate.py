"""Evaluation: metric math vs brute-force references, the makespan helper, leakage-free splits."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core import metrics as M
from rlhfless.core.errors import DataError
from rlhfless.predictor.base import Prediction
from rlhfless.predictor.config import PredictorConfig, build_predictor
from rlhfless.predictor.data import LengthRow
from rlhfless.predictor.evaluate import (
    bucket_accuracy,
    chunk_assignment,
    evaluate,
    makespan_ratio,
    split_rows,
    step_metrics,
)


def _kendall_tau_b(x, y):
    """O(n^2) tau-b reference."""
    conc = disc = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif dx == dy:
            conc += 1
        else:
            disc += 1
    return (conc - disc) / math.sqrt((conc + disc + tx) * (conc + disc + ty))


def test_step_metrics_on_group_means():
    pred = Prediction(("a", "b", "c", "d"), (10.0, 20.0, 30.0, 25.0))
    actual = [[8, 12], [30, 30], [20, 40], [5, 15]]  # means 10, 30, 30, 10
    out = step_metrics(pred, actual)
    assert out[M.PRED_MAE] == pytest.approx((0 + 10 + 0 + 15) / 4)
    assert out[M.PRED_KENDALL] == pytest.approx(_kendall_tau_b([10, 20, 30, 25], [10, 30, 30, 10]))
    assert math.isnan(step_metrics([1.0, 2.0], [5.0, 5.0])[M.PRED_KENDALL])  # constant truth: undefined
    with pytest.raises(ValueError, match="3 predictions for 2 prompts"):
        step_metrics([1.0, 2.0, 3.0], [[1], [2]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1, 1000), min_size=1, max_size=40), st.integers(1, 8))
def test_chunk_assignment_is_contiguous_partition(keys, n):
    chunks = chunk_assignment(keys, keys, n)
    assert 1 <= len(chunks) <= n and all(chunks)
    flat = [i for c in chunks for i in c]
    assert sorted(flat) == list(range(len(keys)))
    order = np.argsort(-np.asarray(keys), kind="stable").tolist()
    assert flat == order  # contiguous chunks of the descending order


def test_chunk_assignment_balances_work():
    keys = [100.0] * 8
    assert [len(c) for c in chunk_assignment(keys, keys, 4)] == [2, 2, 2, 2]
    chunks = chunk_assignment([400, 100, 100, 100, 100], [400, 100, 100, 100, 100], 2)
    assert chunks == [[0], [1, 2, 3, 4]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 500), min_size=2, max_size=4), min_size=4, max_size=24), st.integers(1, 4))
def test_makespan_ratio_is_one_with_true_lengths(groups, n):
    true_means = [np.mean(g) for g in groups]
    assert makespan_ratio(true_means, groups, n) == pytest.approx(1.0)


def test_makespan_ratio_penalises_reversed_order():
    groups = [[400] * 4, [300] * 4, [20] * 4, [10] * 4, [10] * 4, [5] * 4]
    good = makespan_ratio([400, 300, 20, 10, 10, 5], groups, 2)
    bad = makespan_ratio([5, 10, 10, 20, 300, 400], groups, 2)
    assert good == pytest.approx(1.0) and bad > 1.2


def test_bucket_accuracy():
    true = np.array([1.0, 2, 3, 4, 5, 6, 7, 8])
    assert bucket_accuracy(true, true) == 1.0
    assert bucket_accuracy(true[::-1], true) == 0.0


def _trace(n_prompts=6, epochs=3, g=2):
    return [LengthRow(f"p{p}", f"prompt {p}", 10 * (p + 1) + e + s, e, e, s)
            for e in range(epochs) for p in range(n_prompts) for s in range(g)]


def test_epoch_split_has_no_leakage():
    s = split_rows(_trace(), test_epoch=2)
    assert s.kind == "epoch" and {r.epoch for r in s.train} == {0, 1}
    assert {o.epoch for b in s.test for o in b} == {2}
    with pytest.raises(DataError, match="test epoch 0"):
        split_rows(_trace(), test_epoch=0)


def test_prompt_split_is_disjoint_and_deterministic():
    rows = [LengthRow(f"q{i}", "t" * i, i + 1) for i in range(200)]
    a, b = split_rows(rows, test_frac=0.25, seed=1), split_rows(rows, test_frac=0.25, seed=1)
    test_ids = {o.prompt_id for batch in a.test for o in batch}
    assert a.kind == "prompt" and test_ids == {o.prompt_id for batch in b.test for o in batch}
    assert not test_ids & {r.prompt_id for r in a.train}
    assert 30 <= len(test_ids) <= 70


def test_evaluate_perfect_history_predictor():
    rows = _trace(epochs=3)
    s = split_rows(rows)
    p = build_predictor(PredictorConfig(name="ewma", alpha=1.0))
    p.fit(s.train)
    out = evaluate(p, s.test, n_actors=2)
    # alpha=1 predicts last epoch's mean (10(p+1)+1.5); epoch 2 is one token longer for every prompt
    assert out["mae"] == pytest.approx(1.0) and out["mape"] > 0
    assert out["kendall_tau"] == pytest.approx(1.0) and out["spearman"] == pytest.approx(1.0)
    assert out["makespan_ratio"] == pytest.approx(1.0) and out["n_groups"] == 6
    assert {"coverage_q0.1", "coverage_q0.5", "coverage_q0.9", "bucket_accuracy"} <= set(out)


def test_prediction_table_rows():
    from rlhfless.predictor.evaluate import PredictionRow, prediction_table

    rows = prediction_table(Prediction(("a", "b"), (10.0, 50.0)), [[8, 14], [40, 70]])
    assert rows == [PredictionRow("a", 10.0, 11.0, 14, 1.0), PredictionRow("b", 50.0, 55.0, 70, 5.0)]
