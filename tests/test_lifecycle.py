"""A serverless function's life (`plan.lifecycle`): the one model the runtime and the simulator call."""

from __future__ import annotations

import numpy as np
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


# ---- the separate-image learner's share, as the runtime plays it -----------------------------------------------
def _paper_sim_play(steps: int, *over: str):
    """design=paper on paper-sim (separate images, one learner of every device): (timeline, rows, cluster)."""
    from rlhfless.sim.scenario import case_configs, clusters, policies, simulate_policy, workload

    cfg = case_configs("paper-sim", steps, ["ablation=false", *over])[0]
    work, _ = workload(cfg)
    cb, cs, cp = clusters(cfg, work)
    pol = next(p for p in policies(cfg, cb, cs, cp) if p.name == "rlhfless")
    _, tl, rows = simulate_policy(pol, work, cs)
    return tl, rows, cs


def _step_bounds(rows) -> list[tuple[float, float, float]]:
    """(t0, share, end) of each step: the share is the learner's work end (`score_s` after the rollout)."""
    out, t = [], 0.0
    for r in rows:
        out.append((t, t + r["rollout_s"] + r["score_s"], t + r["step_time_s"]))
        t += r["step_time_s"]
    return out


def test_the_separate_learners_ranks_go_at_their_share_and_the_next_decode_prewarms_into_them():
    """paper-sim design=paper: every learner rank (8 devices) but the reducer ends at its share (the runtime's
    `LearnerStream._shared`: `lifecycle.let_go`, `ranks.reducer`); the reducer holds its 8 devices through the
    optimizer step (4 s: verl's 4 mini-batch steps under learner parity); the next step's decode and prefill
    functions start at the share, into the 152 devices freed, so 4 s of their 23.1 s cold start are off the path
    and 19.1 s stay on it. Never more than 160 devices held. (Before: every rank held to the step's end and nothing
    was pre-warmed: pre-warming was worth x1.000.)"""
    tl, rows, c = _paper_sim_play(3)
    pm, bounds = c.perf, _step_bounds(rows)
    cold, update = pm.cold_start_s(), pm.update_fixed_s(c.algo, c.minibatches)
    assert update == pytest.approx(4.0) and cold == pytest.approx(23.1, abs=0.05)
    for k, (t0, share, end) in enumerate(bounds):
        ranks = [x for x in tl.spans if x.kind == "learner" and x.step == k]
        assert len(ranks) == c.n_devices // pm.tp and all(x.devices == pm.tp for x in ranks)
        held = [x for x in ranks if x.end_s > share + 1e-6]
        assert len(held) == 1 and held[0].end_s == pytest.approx(end)  # the reducer, to the step's end
        assert all(x.end_s == pytest.approx(share) for x in ranks if x is not held[0])
        fns = [x for x in tl.spans if x.step == k and x.kind in ("decode", "prefill")]
        if k == 0:  # nothing before it freed a device
            assert all(x.start_s == pytest.approx(t0) and x.cold_s == pytest.approx(cold) for x in fns)
            continue
        assert rows[k]["sim/prewarmed"] > 0
        warm = [x for x in fns if x.start_s < t0 - 1e-6]
        assert len(warm) >= rows[k]["sim/prewarmed"]
        # started at the share before (the lifecycle's time, t0 - cold, is earlier: floored at the share)
        assert all(x.start_s == pytest.approx(bounds[k - 1][1]) and x.cold_s == pytest.approx(cold - update)
                   for x in warm)
    spans = [(x.start_s, x.end_s, x.devices) for x in tl.spans if x.billed]
    assert L.peak_devices(spans) == pytest.approx(c.n_devices) and L.within_budget(spans, c.n_devices)


def test_keep_alive_at_least_the_gap_leaves_the_paper_designs_cold_starts_the_budget_does_not_free():
    """The target "keep-alive >= the gap between steps leaves no cold start after step 1" on paper-sim
    design=paper, and what forbids it. At keep-alive 300 s (longer than every gap):
      * a decode function held from its rollout's end through the learner (gap 34-38 s) would hold 8 devices
        while the learner, one block of every device without overlap, holds all 160: the device budget forbids
        it (and the gap bills more than its 23.1 s cold start: `lifecycle.hold_pays` would let it go anyway);
      * the only devices free before t0 are those the learner's ranks free at their share, for the 4 s optimizer
        step: a pre-warm there hides 4 s of the 23.1 s cold start, and 19.1 s stay on the path every step;
      * the learner (every device) starts only when the last decode function has freed its devices: its 5.9 s
        join is on the path every step, and holding it through the ~55 s rollout would double the devices.
    Where the window covers the cold start (container 0.5 s, engine init 0.5 s, storage 100 GB/s: 1.17 s), no
    decode or prefill function starts cold after step 1."""
    tl, rows, c = _paper_sim_play(4, "billing.keep_alive_s=300")
    pm, bounds = c.perf, _step_bounds(rows)
    gaps = [r["score_s"] + r["update_s"] for r in rows]
    assert all(34.0 < g < 300.0 for g in gaps) and pm.cold_start_s() < min(gaps)  # hold_pays: False
    for k in range(1, len(rows)):
        # the functions that work (a pre-warmed one the scaler does not use ends at t0)
        fns = [x for x in tl.spans if x.step == k and x.kind in ("decode", "prefill") and x.end_s > bounds[k][0]]
        assert fns and all(x.cold_s >= pm.cold_start_s() - 4.0 - 1e-6 for x in fns)
        ranks = [x for x in tl.spans if x.step == k and x.kind == "learner"]
        assert all(x.cold and x.cold_s == pytest.approx(pm.learner_join_s()) for x in ranks)
    tl, rows, c = _paper_sim_play(4, "billing.keep_alive_s=300", "container_start_s=0.5", "engine_init_s=0.5",
                                  "storage_gbps=100")
    assert c.perf.cold_start_s() < 4.0
    for k in range(1, len(rows)):
        fns = [x for x in tl.spans if x.step == k and x.kind in ("decode", "prefill")]
        assert fns and all(x.cold_s == 0.0 and not x.cold for x in fns)


def test_the_simulators_share_release_is_the_shared_rule(monkeypatch):
    """The simulator's share release calls `lifecycle.let_go` as the runtime's `LearnerStream._shared` does: with
    the rule changed to "hold" (and no pre-warm waiting for the devices) every rank holds to the step's end;
    the runtime side of the same change is `test_lifecycle_runtime.py::test_the_runtime_holds_its_ranks_when_the_
    shared_rule_says_hold`."""
    tl, rows, c = _paper_sim_play(2, "prewarm=false")
    bounds = _step_bounds(rows)
    assert any(x.end_s < bounds[x.step][2] - 1e-6 for x in tl.spans if x.kind == "learner")
    monkeypatch.setattr(L, "let_go", lambda *a, **k: False)
    tl, rows, c = _paper_sim_play(2, "prewarm=false")
    bounds = _step_bounds(rows)
    assert all(x.end_s == pytest.approx(bounds[x.step][2]) for x in tl.spans if x.kind == "learner")


def test_separate_images_with_overlap_and_the_wide_actor_stay_within_the_device_budget():
    """The testbed's extended design on separate images (overlap, the sized learner and the wide actor on, hybrid
    off): learner blocks cut into ranks at their share, decode functions pre-warmed into the freed devices, never
    more than the 16 devices held."""
    from rlhfless.sim.scenario import case_configs, clusters, policies, simulate_policy, workload

    cfg = case_configs("paper-testbed", 4, ["ablation=false", "design=extended", "hybrid=false"])[0]
    work, _ = workload(cfg)
    cb, cs, cp = clusters(cfg, work)
    pol = next(p for p in policies(cfg, cb, cs, cp) if p.name == "rlhfless")
    _, tl, rows = simulate_policy(pol, work, cs)
    spans = [(x.start_s, x.end_s, x.devices) for x in tl.spans if x.billed]
    assert any(r["sim/prewarmed"] > 0 for r in rows[1:])
    assert L.peak_devices(spans) == pytest.approx(cfg.n_devices) and L.within_budget(spans, cfg.n_devices)


# ---- the scaler prices the separate learner's share release as the simulator charges it -------------------------
def _by_hand_step(overlap: bool, share_go: bool):
    """test_sim_events' by-hand step (8 devices; decode 0 releases at 15.5 s, decode 1 at 9 s, the prefill function
    at 3 s; groups of 4, 4 and 6 learner device-s arrive at 5, 9 and 15.5 s; learner blocks and ranks of 2
    devices, 1 s cold start, pre-warmed, 1 s optimizer step) as the simulator plays it and as the scaler prices
    it: (the simulator's learner device-seconds, the scaler's)."""
    from rlhfless.plan.overlap import LearnerCosts, whole_step_tail
    from rlhfless.sim.events import EventLoop, Timeline
    from rlhfless.sim.step import ActorRun, FnRun, LearnerPlan, StepSchedule, play_step

    actors = (ActorRun(0, 2, 4.0, 1.0, 2.0, 0.5, 10.0), ActorRun(1, 2, 0.0, 1.0, 3.0, 0.0, 6.0, prewarm_s=4.0))
    learner = LearnerPlan(overlap, (1, 1, 0), (2.0, 6.0, 10.0), (4.0, 4.0, 6.0), 8.0, 2.0, 1.0, True, 1.0,
                          share_go=share_go)
    loop, tl = EventLoop(), Timeline()
    play_step(loop, tl, 100.0, StepSchedule(False, 8, actors, FnRun("prefill", 2, 0.0, 3.0), learner), 0)
    loop.run()
    charged = sum(s.devices * (s.end_s - s.start_s) for s in tl.spans if s.kind == "learner")
    lc = LearnerCosts(whole_step=True, overlap=overlap, devices=8.0, s_per_token=1.0, update_fixed_s=1.0,
                      cold_start_s=1.0, prewarm=True, prefill_s=3.0, prefill_devices=2.0, rank_devices=2.0,
                      share_go=share_go)
    _, invs = whole_step_tail(np.array([15.5, 9.0]), np.array([5.0, 9.0, 15.5]), np.array([4.0, 4.0, 6.0]), 2.0,
                              8.0, lc, 2.0)
    priced = sum(i.gpus * i.duration_s for i in invs if i.kind == "learner")
    return charged, priced


def test_the_scaler_prices_the_separate_learners_share_release_as_the_simulator_charges_it():
    """The learner's held device-seconds the scaler prices (`plan.overlap.whole_step_tail`, its sequential form
    too) equal those the simulator charges (`sim.step.play_step`), ranks let go at their share or held to the
    step's end. By hand, overlap: blocks of decode 1 (starts 9 s), the prefill's (3 s) and a spare (4 s), one rank
    each; the work ends at 16.5 s, the optimizer step at 17.5 s; let go, the spare's rank is the reducer (the last
    share in): 2 x (7.5 + 13.5 + 13.5) = 69; held: 2 x (8.5 + 14.5 + 13.5) = 73. Sequential: one block of 8
    devices from 14.5 s, 4 ranks, share 17.25 s, end 18.25 s: 3 x 2 x 2.75 + 2 x 3.75 = 24; held 8 x 3.75 = 30.
    Before the fix the scaler priced 73 and 30 whatever the simulator charged."""
    for overlap, go, want in [(True, True, 69.0), (True, False, 73.0), (False, True, 24.0), (False, False, 30.0)]:
        charged, priced = _by_hand_step(overlap, go)
        assert charged == pytest.approx(want) and priced == pytest.approx(want), (overlap, go)


def test_the_scaler_and_the_simulator_decide_the_share_release_on_the_same_terms(monkeypatch):
    """The policy hands the scaler its share release's terms (`LearnerCosts.rank_devices`, `share_go`,
    `share_wait`) and decides the simulator's release on the same ones, both with `plan.lifecycle.share_release`:
    on paper-sim design=paper (no overlap: the learner holds every device, a pre-warm waits) the scaler prices a
    candidate's learner cut into 20 ranks of 8 devices, the reducer alone to the end, and every step's charged
    learner is cut so too; with the shared rule changed to "hold", both hold (one block of every device to the
    step's end)."""
    from rlhfless.plan.overlap import LearnerCosts, sequential_tails

    def price():
        lc = LearnerCosts(whole_step=True, overlap=False, devices=160.0, update_fixed_s=4.0, rank_devices=8.0,
                          share_wait=True)
        return sequential_tails([50.0], np.full(4, 100.0), 160.0, lc)[0][1]

    def charged():
        tl, _, _ = _paper_sim_play(2)
        return [len([x for x in tl.spans if x.kind == "learner" and x.step == k]) for k in range(2)]

    from rlhfless.sim.scenario import case_configs, clusters, policies, workload

    cfg = case_configs("paper-sim", 2, ["ablation=false"])[0]
    work, _ = workload(cfg)
    pol = next(p for p in policies(cfg, *clusters(cfg, work)) if p.name == "rlhfless")
    lc = pol._learner_costs(work[0], None)  # what the policy hands the scaler: the terms it then decides on
    assert (lc.rank_devices, lc.share_go, lc.share_wait) == (8.0, False, True)  # keep-alive 5 s, history unknown
    cut = price()
    assert len(cut) == 20 and sum(i.end_s > cut[0].end_s for i in cut) == 1 and charged() == [20, 20]
    monkeypatch.setattr(L, "share_release", lambda *a: False)
    held = price()
    assert len(held) == 1 and held[0].gpus == 160.0 and charged() == [1, 1]
