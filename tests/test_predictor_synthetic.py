"""Synthetic length traces: structure, truncation, determinism, and the generate -> fit round trip."""

from __future__ import annotations

from collections import Counter

import pytest

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.predictor.data import rows_from_trace
from rlhfless.predictor.synthetic import SyntheticParams, fit_params, generate_trace


def test_structure_and_determinism():
    p = SyntheticParams(n_prompts=10, n_epochs=3, group_size=4, prompts_per_step=4)
    rows = generate_trace(p, seed=5)
    assert len(rows) == 10 * 3 * 4
    assert rows == generate_trace(p, seed=5) and rows != generate_trace(p, seed=6)
    per_epoch = Counter((r.prompt_id, r.epoch) for r in rows)
    assert set(per_epoch.values()) == {4}  # every prompt once per epoch with G samples
    assert len({r.step for r in rows}) == 3 * 3  # ceil(10 / 4) steps per epoch
    assert all(r.prompt_len == len(r.prompt.encode()) for r in rows)


def test_truncation_at_max_length():
    rows = generate_trace(SyntheticParams(n_prompts=30, log_base_mu=6.0, max_length=300), seed=0)
    assert max(r.response_len for r in rows) == 300
    assert all(r.truncated == (r.response_len == 300) for r in rows)
    assert any(r.truncated for r in rows)
    assert fit_params(rows).max_length == 300  # the cap is recovered from truncated rows


def test_round_trip_recovers_parameters():
    true = SyntheticParams(n_prompts=300, n_epochs=6, group_size=8, prompts_per_step=30, log_base_mu=5.2,
                           log_base_sigma=0.7, epoch_sigma=0.15, within_sigma=0.3, drift_per_epoch=-0.04,
                           max_length=4096)
    fit = fit_params(generate_trace(true, seed=11))
    assert (fit.n_prompts, fit.n_epochs, fit.group_size, fit.prompts_per_step) == (300, 6, 8, 30)
    assert fit.log_base_mu == pytest.approx(true.log_base_mu, abs=0.1)
    assert fit.log_base_sigma == pytest.approx(true.log_base_sigma, rel=0.12)  # sampling sd ~4% at 300 prompts
    assert fit.epoch_sigma == pytest.approx(true.epoch_sigma, rel=0.15)
    assert fit.within_sigma == pytest.approx(true.within_sigma, rel=0.05)
    assert fit.drift_per_epoch == pytest.approx(true.drift_per_epoch, abs=0.015)
    assert fit.prompt_log_mu == pytest.approx(true.prompt_log_mu, abs=0.1)
    # and it also reads length rows, not only TraceRows
    assert fit_params(rows_from_trace(generate_trace(true, seed=11))) == fit


def test_bad_params_and_inputs():
    with pytest.raises(ConfigError, match="synthetic.group_size: must be >= 1"):
        SyntheticParams(group_size=0)
    with pytest.raises(ConfigError, match="synthetic.within_sigma"):
        SyntheticParams(within_sigma=-0.1)
    with pytest.raises(DataError, match="non-empty trace"):
        fit_params([])


def test_synthetic_traces_carry_rewards():
    """Rewards vary within and across prompts (a GRPO group has variance to learn from), a truncated response
    scores 0, and the lengths do not depend on the reward draws. Replayed rewards of 0.0 on every row would switch
    the GRPO learner off (every advantage 0)."""
    p = SyntheticParams(n_prompts=40, n_epochs=2, group_size=8, prompts_per_step=10, log_base_mu=5.5, max_length=400)
    rows = generate_trace(p, seed=3)
    assert {r.reward for r in rows} == {0.0, 1.0}
    assert all(r.reward == 0.0 for r in rows if r.truncated) and any(r.truncated for r in rows)
    groups: dict[tuple[str, int], set[float]] = {}
    for r in rows:
        groups.setdefault((r.prompt_id, r.epoch), set()).add(r.reward)
    assert sum(len(v) > 1 for v in groups.values()) >= len(groups) // 4  # groups with reward variance
    easy = generate_trace(SyntheticParams(**{**p.__dict__, "solve_logit_mu": 4.0}), seed=3)
    assert [r.response_len for r in easy] == [r.response_len for r in rows]
    assert sum(r.reward for r in easy) > sum(r.reward for r in rows)
