"""Cost model: a hand-worked timeline, billing rules, monotonicity, serverful pool, catalog and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core import metrics as M
from rlhfless.core.errors import ConfigError, DataError
from rlhfless.plan.cost import (
    CATALOG,
    BillingRules,
    billed_seconds,
    billed_seconds_array,
    cost_run,
    cost_serverful,
    cost_step,
    price,
    step_cost,
)
from rlhfless.plan.records import Invocation

TIMELINE = [
    Invocation("decode", 0, 0.0, 2.5, cold=True, gpus=1, cold_start_s=1.0),
    Invocation("reward", 0, 2.5, 3.1),
    Invocation("learner", 0, 3.1, 5.0, gpus=2),
]


def test_known_timeline_cost():
    rules = BillingRules(granularity_s=1.0, minimum_s=0.0, bill_cold_start=True, keep_alive_s=2.0)
    summary, metrics = cost_step(TIMELINE, price("H100"), rules)
    # decode ceil(2.5 + 2) = 5; reward ceil(0.6 + 2) = 3; learner ceil(1.9 + 2) = 4 s x 2 GPUs = 8
    assert summary.gpu_seconds == pytest.approx(16.0)
    assert summary.usd == pytest.approx(16.0 * 0.00116)
    assert metrics[M.function_billed("decode")] == 5.0
    assert metrics[M.function_billed("learner")] == 4.0
    assert metrics[M.COST_GPU_S] == pytest.approx(16.0)
    unbilled_cold = BillingRules(1.0, 0.0, False, 2.0)
    assert cost_step(TIMELINE, price("H100"), unbilled_cold)[0].gpu_seconds == pytest.approx(15.0)
    minimum = BillingRules(1.0, 10.0, True, 0.0)
    assert cost_step(TIMELINE, price("H100"), minimum)[0].gpu_seconds == pytest.approx(40.0)
    run, m = cost_run([summary, summary])
    assert run.gpu_seconds == pytest.approx(32.0) and m[M.function_billed("reward")] == 6.0


def test_serverful_pool_and_prices():
    s, m = cost_serverful(8, 3600.0, price("L40S"))
    assert s.usd == pytest.approx(30.13) and s.gpu_seconds == 8 * 3600
    assert price("A100-80G").serverless_usd_per_s == 0.00076
    assert price("cpu-core").serverless_usd_per_s == pytest.approx(0.0000166667 * 2.0)
    for entry in CATALOG.values():
        assert "PAPER.md" in entry.source and entry.date == "late 2026 public list prices as recorded in PAPER.md"
    with pytest.raises(ConfigError, match="H200 has no on-demand price"):
        cost_serverful(1, 10.0, price("H200"))


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e4), st.floats(0, 1e4), st.floats(0.01, 60), st.floats(0, 120), st.floats(0, 10),
       st.booleans(), st.booleans(), st.sampled_from(sorted(CATALOG)))
def test_cost_never_negative_and_monotone_in_duration(d1, d2, gran, minimum, keep, bill_cold, cold, kind):
    rules = BillingRules(gran, minimum, bill_cold, keep)
    lo, hi = sorted((d1, d2))
    a = Invocation("decode", 0, 0.0, lo, cold=cold, cold_start_s=min(lo, 1.0) if cold else 0.0)
    b = Invocation("decode", 0, 0.0, hi, cold=cold, cold_start_s=min(lo, 1.0) if cold else 0.0)
    ca, cb = cost_step([a], price(kind), rules)[0], cost_step([b], price(kind), rules)[0]
    assert 0 <= ca.usd <= cb.usd and 0 <= ca.gpu_seconds <= cb.gpu_seconds
    assert billed_seconds(a, rules) >= minimum


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["decode", "learner"]), st.integers(0, 3), st.floats(0, 50),
                          st.floats(0, 50), st.booleans(), st.sampled_from([0.5, 1.0, 8.0]), st.floats(0, 1)),
                max_size=12),
       st.floats(0.01, 10), st.floats(0, 5), st.booleans(), st.floats(0, 10), st.sampled_from(["lifetime",
                                                                                             "invocations"]),
       st.dictionaries(st.tuples(st.sampled_from(["decode", "learner"]), st.integers(0, 3)), st.floats(-1, 20)))
def test_step_cost_is_billed_seconds_summed_in_order(rows, gran, minimum, bill_cold, keep, billed, gaps):
    """`step_cost` inlines `billed_seconds` (rule lookups once per step): the same floats as each invocation
    billed alone and summed in order, with and without gaps to the next invocation, under both billings."""
    rules = BillingRules(gran, minimum, bill_cold, keep, billed)
    invs = [Invocation(k, a, s, s + d, cold=c, gpus=g, cold_start_s=f * ((s + d) - s) if c else 0.0)
            for k, a, s, d, c, g, f in rows]
    dev = price("H100")
    for gap_map in (None, gaps):
        gpu_s, usd, kinds = 0.0, 0.0, {}
        for inv in invs:
            b = billed_seconds(inv, rules, gap_map.get((inv.kind, inv.actor_id)) if gap_map else None)
            gpu_s, usd = gpu_s + b * inv.gpus, usd + b * inv.gpus * dev.serverless_usd_per_s
            kinds[inv.kind] = kinds.get(inv.kind, 0.0) + b
        got = step_cost(invs, dev, rules, gap_map)
        assert (got.gpu_seconds, got.usd, got.billed_s_by_kind) == (gpu_s, usd, kinds)
        assert cost_step(invs, dev, rules, gap_map)[0] == got


def test_bad_input_is_a_clear_error():
    with pytest.raises(ConfigError, match="allowed: H100, A100-80G, H200, L40S, cpu-core"):
        price("TPU")
    with pytest.raises(ConfigError, match="granularity_s"):
        BillingRules(granularity_s=0)
    with pytest.raises(ConfigError, match="keep_alive_s"):
        BillingRules(keep_alive_s=-1)
    with pytest.raises(DataError, match="start_s <= end_s"):
        Invocation("decode", 0, 5.0, 1.0)
    with pytest.raises(ConfigError, match="wall_s"):
        cost_serverful(1, -1.0, price("H100"))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3), st.booleans(), st.floats(0, 1)), min_size=1, max_size=8),
       st.floats(0.01, 10), st.floats(0, 20), st.booleans(), st.floats(0, 5))
def test_vectorised_billing_equals_the_scalar_rule(rows, gran, minimum, bill_cold, keep):
    rules = BillingRules(gran, minimum, bill_cold, keep)
    invs = [Invocation("decode", i, 0.0, d, cold=c, cold_start_s=f * d if c else 0.0)
            for i, (d, c, f) in enumerate(rows)]
    got = billed_seconds_array(np.array([i.duration_s for i in invs]), np.array([i.cold for i in invs]),
                               np.array([i.cold_start_s for i in invs]), rules)
    assert got.tolist() == [billed_seconds(i, rules) for i in invs]
