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



def test_a_function_is_held_through_a_gap_only_inside_its_keep_alive_and_when_that_bills_less_than_a_cold_start():
    assert L.hold_pays(10.0, 22.0, 30.0)
    assert not L.hold_pays(25.0, 22.0, 30.0)  # the gap bills more than the cold start it saves
    assert not L.hold_pays(10.0, 22.0, 5.0)  # it lapses first


def test_the_device_budget_counts_a_handed_over_unit_once():
    spans = [(0.0, 10.0, 8.0), (10.0, 20.0, 8.0), (5.0, 15.0, 8.0)]
    assert L.peak_devices(spans) == 16.0 and L.within_budget(spans, 16)
    assert not L.within_budget(spans + [(9.0, 11.0, 1.0)], 16)


# ---- the simulator on the same model ---------------------------------------------------------------------------
def _paper_sim(keep_alive_s: float, *over: str):
    from rlhfless.sim.scenario import case_configs, clusters, policies, simulate_policy, workload

    cfg = case_configs("paper-sim", 4, [f"billing.keep_alive_s={keep_alive_s}", "ablation=false", *over])[0]
    work, _ = workload(cfg)
    cb, cs, cp = clusters(cfg, work)
    pol = next(p for p in policies(cfg, cb, cs, cp) if p.name == "rlhfless")
    summary, _, rows = simulate_policy(pol, work, cs)
    return summary, rows


def test_paper_sim_cost_is_monotone_and_bounded_in_the_keep_alive():
    """design=paper on paper-sim (4 steps): a longer keep-alive never costs more (a function is held through a gap
    only when that bills less than its cold start, else let go at once: `lifecycle.hold_pays`); billed a fresh
    keep-alive per invocation, 300 s cost 8.7x the keep-alive-0 bill."""
    costs = [_paper_sim(k)[0]["cost_device_s"] for k in (0, 5, 60, 300)]
    assert all(b <= a + 1e-6 for a, b in zip(costs, costs[1:])), costs
    assert costs[-1] >= 0.9 * costs[0]


def test_the_simulator_never_holds_more_devices_than_exist():
    """paper-sim's design=paper (separate functions; its learner holds all 160 devices to the step's end): no
    decode or prefill function is pre-warmed or kept into a learner that holds every device, and the learner is not
    pre-warmed into a rollout still running (before: 216 devices held at once with the default cold start)."""
    from rlhfless.sim.scenario import case_configs, clusters, policies, simulate_policy, workload

    for over in ([], ["container_start_s=60"]):
        cfg = case_configs("paper-sim", 3, ["ablation=false", "billing.keep_alive_s=300", *over])[0]
        work, _ = workload(cfg)
        cb, cs, cp = clusters(cfg, work)
        pol = next(p for p in policies(cfg, cb, cs, cp) if p.name == "rlhfless")
        _, tl, _ = simulate_policy(pol, work, cs)
        spans = [(x.start_s, x.end_s, x.devices) for x in tl.spans if x.billed]
        assert L.peak_devices(spans) > 100 and L.within_budget(spans, cfg.n_devices), over


def test_the_runtime_and_the_simulator_call_the_shared_lifecycle(monkeypatch):
    """Change the shared rule and both sides change with it: the runtime's pre-warm times and the simulator's
    hold-or-release and bill come from `plan.lifecycle`, not from copies."""
    from rlhfless.runtime.modes.policy import History, prewarm_decode, prewarm_learner

    monkeypatch.setattr(L, "prewarm_start_s", lambda *a, **k: 123.0)
    h = History()
    h.learn_s.append(5.0)
    assert prewarm_decode(h, 1.0, 0.1).after_s == 123.0 and prewarm_learner(h, 9.0, 1.0, 0.1).after_s == 123.0
    base = _paper_sim(300)[0]["cost_device_s"]
    monkeypatch.setattr(L, "hold_pays", lambda *a, **k: False)
    monkeypatch.setattr(L, "idle_billed_s", lambda gap, rules: 0.0)
    assert _paper_sim(300)[0]["cost_device_s"] != base


def test_let_go_is_release_at_the_lapse_or_a_hold_that_does_not_pay():
    # the runtime's one hold-or-release rule: the platform's keep-alive rule, else hold only when it pays
    for nxt in (None, 0.0, 2.0, 4.0, 6.0, 30.0):
        for cold in (1.0, 5.0, 50.0):
            for ka in (0.0, 5.0, 60.0):
                want = L.release_now(nxt, ka) or (nxt is not None and not L.hold_pays(nxt, cold, ka))
                assert L.let_go(nxt, cold, ka) == want, (nxt, cold, ka)
    assert L.let_go(4.0, 3.0, 5.0) and not L.let_go(4.0, 50.0, 5.0)  # kept warm only when the gap bills less
    with pytest.raises(ValueError, match="keep_alive_s"):
        L.let_go(1.0, 1.0, -1.0)
