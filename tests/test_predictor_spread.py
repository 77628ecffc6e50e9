"""Outcomes drawn from a prediction (`rlhfless.predictor.spread`): the lognormal fit, the Latin hypercube, the cap,
the fallback to the means, and that a seeded generator draws the same outcomes twice (the simulator relies on it)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from rlhfless.predictor.base import Prediction
from rlhfless.predictor.spread import draw_lengths, lognormal_fit

LEVELS = (0.1, 0.5, 0.9)


def _pred(medians, sigmas):
    """A prediction whose quantiles are exactly lognormal: median m, log-sd s per prompt."""
    q = {lv: tuple(float(m * np.exp(s * norm.ppf(lv))) for m, s in zip(medians, sigmas)) for lv in LEVELS}
    return Prediction(tuple(f"p{i}" for i in range(len(medians))), tuple(float(m) for m in medians), q)


def test_the_fit_recovers_a_lognormal_prediction():
    icpt, slope = lognormal_fit(_pred([100.0, 400.0], [0.5, 0.0]))
    assert np.exp(icpt) == pytest.approx([100.0, 400.0])
    assert slope == pytest.approx([0.5, 0.0], abs=1e-12)
    assert lognormal_fit(Prediction(("p",), (5.0,), {0.5: (5.0,)})) is None


def test_each_draw_uses_every_stratum_once_over_the_step():
    pred, sizes = _pred([100.0, 300.0], [0.7, 0.3]), [5, 3]
    icpt, slope = lognormal_fit(pred)
    for outcome in draw_lengths(pred, sizes, 4, np.random.default_rng(0)):
        assert [len(g) for g in outcome] == sizes
        u = np.concatenate([norm.cdf((np.log(g) - icpt[p]) / slope[p]) for p, g in enumerate(outcome)])
        assert sorted(np.floor(u * 8).astype(int).tolist()) == list(range(8))


def test_a_seeded_generator_draws_the_same_outcomes_and_another_seed_others():
    pred = _pred([100.0, 300.0, 50.0], [0.7, 0.3, 1.0])
    a = draw_lengths(pred, [4, 4, 4], 2, np.random.default_rng([0, 3]))
    assert a == draw_lengths(pred, [4, 4, 4], 2, np.random.default_rng([0, 3]))
    assert a != draw_lengths(pred, [4, 4, 4], 2, np.random.default_rng([0, 4]))


def test_lengths_are_capped_and_floored_and_without_quantiles_are_the_means():
    outcome = draw_lengths(_pred([1000.0, 0.5], [2.0, 0.0]), [50, 2], 1, np.random.default_rng(1), cap=1500.0)[0]
    assert max(outcome[0]) == 1500.0 and min(outcome[1]) == 1.0
    flat = draw_lengths(Prediction(("p", "q"), (7.0, 9.0)), [2, 1], 2, np.random.default_rng(1))
    assert flat == [[(7.0, 7.0), (9.0,)]] * 2


def test_bad_arguments_name_the_problem():
    pred = _pred([100.0], [0.5])
    with pytest.raises(ValueError, match="k must be >= 1"):
        draw_lengths(pred, [2], 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="2 group sizes for 1 prompts"):
        draw_lengths(pred, [2, 2], 1, np.random.default_rng(0))


def test_the_quantile_function_is_scipys_normal_ppf_value_for_value():
    """The predictor takes the standard normal quantile from scipy.special.ndtri (importing scipy.stats cost
    every simulation 1.3 s of start-up): the same floats as scipy.stats.norm.ppf, bounds and bad inputs too."""
    from scipy.special import ndtri

    u = np.concatenate((np.random.default_rng(0).random(20000), [0.0, 1.0, 0.5, 1e-12, 1 - 1e-12, -0.1, 1.1,
                                                                   np.nan]))
    assert np.array_equal(norm.ppf(u), ndtri(u), equal_nan=True)
    assert all(float(norm.ppf(q)) == float(ndtri(q)) for q in (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95))
