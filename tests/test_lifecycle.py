"""A serverless function's life (`plan.lifecycle`): the one model the runtime and the simulator call."""

from __future__ import annotations

import pytest

from rlhfless.plan import lifecycle as L
from rlhfless.plan.billing import BillingRules
from rlhfless.plan.cost import billed_seconds
from rlhfless.plan.records import Invocation

LIFE = BillingRules(1.0, 0.0, True, 5.0, "lifetime")
PER_INV = BillingRules(1.0, 0.0, True, 5.0, "invocations")


def test_each_state_is_billed_as_its_rule_set_says():
    assert L.billed_in(L.State.BUSY, PER_INV) and L.billed_in(L.State.BUSY, LIFE)
    assert L.billed_in(L.State.WARM_IDLE, LIFE) and not L.billed_in(L.State.WARM_IDLE, PER_INV)
    assert not L.billed_in(L.State.STARTING, BillingRules(1.0, 0.0, False, 5.0, "lifetime"))  # snapshot restore
    assert not L.billed_in(L.State.COLD, LIFE) and not L.billed_in(L.State.RELEASED, LIFE)


def test_keep_alive_buys_warmth_and_bills_the_gap_not_a_keep_alive_per_invocation():
    assert L.warm_after(3.0, 5.0) and not L.warm_after(6.0, 5.0) and not L.warm_after(0.0, 0.0)
    assert L.idle_billed_s(3.0, LIFE) == 3.0  # kept through a 3 s gap: billed 3 s
    assert L.idle_billed_s(6.0, LIFE) == 5.0  # lapsed: billed the keep-alive, then released
    assert L.idle_billed_s(None, LIFE) == 5.0 and L.idle_billed_s(3.0, PER_INV) == 0.0
    # one function invoked three times, 2 s apart, 10 s each: 30 busy + 2 + 2 idle + the last keep-alive 5 = 39;
    # billed per invocation (the old rule under lifetime billing) it was 3 x 15 = 45
    spans = [(0.0, 10.0), (12.0, 22.0), (24.0, 34.0)]
    assert L.life_billed_s(spans, 0.0, LIFE) == 39.0
    # a gap past the keep-alive ends the life: 10 + 5, then a new life 10 + 5
    assert L.life_billed_s([(0.0, 10.0), (30.0, 40.0)], 0.0, LIFE) == 30.0
    assert L.life_billed_s(spans, 0.0, PER_INV) == 30.0


def test_a_single_invocation_bills_as_the_cost_model_does():
    for rules in (LIFE, PER_INV, BillingRules(2.0, 3.0, False, 1.5, "lifetime")):
        inv = Invocation("decode", 0, 1.0, 8.3, True, 1.0, 2.0)
        assert L.life_billed_s([(1.0, 8.3)], 2.0, rules) == billed_seconds(inv, rules)


def test_release_now_only_when_the_next_work_is_past_the_keep_alive():
    assert L.release_now(10.0, 5.0) and not L.release_now(4.0, 5.0)
    assert not L.release_now(None, 5.0) and L.release_now(None, 0.0)
    with pytest.raises(ValueError, match="keep_alive_s"):
        L.release_now(1.0, -1.0)


def test_a_prewarm_is_timed_from_the_predicted_end_of_the_stage_before_and_floored_only_at_now():
    assert L.prewarm_start_s(30.0, 22.0, 0.5) == 7.5
    # the stage before (its start at 10) is shorter than the cold start: start at once, not at that stage's start
    assert L.prewarm_start_s(20.0, 22.0, 0.5, now_s=12.0) == 12.0
    assert L.prewarm_idle_s(30.0, 25.0) == 5.0 and L.prewarm_idle_s(30.0, 31.0) == 0.0
    assert L.prewarm_pays(5.0, 22.0, LIFE) and not L.prewarm_pays(30.0, 22.0, LIFE)
    assert L.prewarm_pays(30.0, 22.0, PER_INV)  # idle is not billed per invocation


def test_the_device_budget_counts_a_handed_over_unit_once():
    spans = [(0.0, 10.0, 8.0), (10.0, 20.0, 8.0), (5.0, 15.0, 8.0)]
    assert L.peak_devices(spans) == 16.0 and L.within_budget(spans, 16)
    assert not L.within_budget(spans + [(9.0, 11.0, 1.0)], 16)
