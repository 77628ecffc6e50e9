"""Actor scaling: hand-worked choices for every objective, warm pools, config validation, metrics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlhfless.core import metrics as M
from rlhfless.core.configbase import from_dict
from rlhfless.core.errors import ConfigError
from rlhfless.plan.config import PlanConfig
from rlhfless.plan.cost import BillingRules, price
from rlhfless.plan.overlap import LearnerCosts
from rlhfless.plan.records import PlanJob
from rlhfless.plan.scaler import CUT_REASONS, choose
from rlhfless.plan.timemodel import TimeModel

TM = TimeModel.per_token(0.01)
JOBS = [PlanJob(x, 1, 100.0) for x in "abcd"]  # 1 s of decode work each under TM
RULES = BillingRules(granularity_s=1.0, minimum_s=0.0, bill_cold_start=True, keep_alive_s=0.0)


def _cfg(**kw):
    base = dict(min_actors=1, max_actors=4, cold_start_s=3.0, weight_sync_s=0.2, billing=RULES, migrate=False)
    base.update(kw)
    return PlanConfig(**base)


def test_hand_worked_table_and_score_choice():
    # N=1: 3 + 0.2 + 4 = 7.2 s, billed 8; N=2: 5.2 s, 2 x 6 = 12; N=3 (chunks 1,2,1): 5.2 s, 5+6+5 = 16;
    # N=4: 4.2 s, 4 x 5 = 20 GPU-s.  lam=0.5: N=1 scores .5*7.2/4.2 + .5*8/8 = 1.357 (N=2: 1.369)
    d, m = choose(JOBS, _cfg(lam=0.5), TM)
    table = [(c.n_actors, round(c.step_s, 6), c.gpu_seconds) for c in d.candidates]
    assert table == [(1, 7.2, 8.0), (2, 5.2, 12.0), (3, 5.2, 16.0), (4, 4.2, 20.0)]
    assert d.n_actors == 1
    assert d.chosen.score == pytest.approx(0.5 * 7.2 / 4.2 + 0.5)
    assert m[M.SCALER_NUM_ACTORS] == 1.0
    assert m[M.SCALER_COST_USD] == pytest.approx(8.0 * price("cpu-core").serverless_usd_per_s)
    assert [r["n_actors"] for r in m[M.SCALER_CANDIDATES]] == [1, 2, 3, 4]
    # lam=0.9 favours time: N=4 scores .9*1 + .1*2.5 = 1.15 (N=2: 1.264)
    assert choose(JOBS, _cfg(lam=0.9), TM)[0].n_actors == 4
    assert choose(JOBS, _cfg(lam=1.0), TM)[0].n_actors == 4
    assert choose(JOBS, _cfg(lam=0.0), TM)[0].n_actors == 1


def test_constrained_objectives():
    d, m = choose(JOBS, _cfg(objective="min_cost_under_deadline", deadline_s=6.0), TM)
    assert d.n_actors == 2 and d.constraint_met and m[M.SCALER_CONSTRAINT_MET] == 1.0
    usd = price("cpu-core").serverless_usd_per_s
    d, _ = choose(JOBS, _cfg(objective="min_time_under_budget", budget_usd=13 * usd), TM)
    assert d.n_actors == 2
    d, _ = choose(JOBS, _cfg(objective="min_cost_under_deadline", deadline_s=1.0), TM)
    assert d.n_actors == 4 and not d.constraint_met  # nothing meets 1 s: the fastest is taken
    d, _ = choose(JOBS, _cfg(objective="min_time_under_budget", budget_usd=usd), TM)
    assert d.n_actors == 1 and not d.constraint_met


def test_warm_actors_skip_the_cold_start():
    d, _ = choose(JOBS, _cfg(lam=0.5), TM, n_warm=4)
    # warm: N=1 4.2 s / 5 GPU-s; N=4 1.2 s / 4 x 2 = 8 GPU-s -> scores 0.5*3.5+0.5 = 2.25 vs 0.5 + 0.8 = 1.3
    assert [(c.n_actors, round(c.step_s, 6), c.gpu_seconds) for c in d.candidates][::3] == [(1, 4.2, 5.0),
                                                                                           (4, 1.2, 8.0)]
    assert d.n_actors == 4


def test_scaling_off_uses_max_actors_and_migration_can_be_simulated():
    d, _ = choose(JOBS, _cfg(scale=False), TM)
    assert [c.n_actors for c in d.candidates] == [4]
    d, _ = choose(JOBS, _cfg(migrate=True, simulate_migration=True, tau=0.5), TM)
    assert len(d.candidates) == 4


@pytest.mark.parametrize("kw, field", [
    (dict(lam=1.5), "plan.lam"), (dict(lam=-0.1), "plan.lam"), (dict(min_actors=0), "plan.min_actors"),
    (dict(max_actors=0), "plan.max_actors"), (dict(policy="random"), "plan.policy"),
    (dict(gpu_kind="TPU"), "plan.gpu_kind"), (dict(tau=0.0), "plan.tau"), (dict(capacity=0), "plan.capacity"),
    (dict(objective="min_cost_under_deadline"), "plan.deadline_s"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        PlanConfig(**kw)


def test_config_from_dict_and_capacity_error():
    cfg = from_dict(PlanConfig, {"policy": "lpt", "billing": {"granularity_s": 0.1}}, prefix="plan")
    assert cfg.billing.granularity_s == 0.1
    with pytest.raises(ConfigError, match="capacity"):
        choose([PlanJob("g", 8, 10.0)], _cfg(capacity=4), TM)


TINY = TimeModel.default_tiny_cpu()
FINE = BillingRules(granularity_s=0.001, minimum_s=0.0, bill_cold_start=True, keep_alive_s=0.0)
# two actors: one of long groups, one of short groups plus a group with one straggler (300 tokens)
STRAGGLER = ([PlanJob(f"L{i}", 2, 400.0) for i in range(3)] + [PlanJob(f"S{i}", 4, 20.0) for i in range(3)]
             + [PlanJob("X", 4, (20.0, 20.0, 20.0, 300.0))])


def _two(**kw):
    return PlanConfig(min_actors=2, max_actors=2, scale=False, capacity=16, cold_start_s=0.0, billing=FINE, **kw)


def test_migrate_switch_changes_the_decision_only_when_cuts_help_the_objective():
    off, m_off = choose(STRAGGLER, _two(migrate=False, lam=0.0), TINY)
    assert off.migration is None and off.cut_option is None and M.BAL_MIGRATE_USED not in m_off
    assert m_off[M.BAL_MIGRATIONS] == 0
    # cost only (lam = 0): cutting the short actor at tau releases it (its straggler joins the long actor's
    # batch, where an iteration costs little more), so the plan includes the cuts
    on, m_on = choose(STRAGGLER, _two(migrate=True, lam=0.0), TINY)
    assert on.migration is not None and on.chosen.migrations == len(on.migration.moves) == 3
    assert m_on[M.BAL_MIGRATE_USED] == 1.0 and m_on[M.BAL_MIGRATIONS] == 3 and m_on[M.BAL_RELEASED_ACTORS] == 1
    assert on.chosen.gpu_seconds < off.chosen.gpu_seconds  # what it buys: billed device-seconds
    assert m_on[M.BAL_MAKESPAN_S] == pytest.approx(on.migration.makespan_s)
    assert on.migration.makespan_s > off.plan.makespan_s  # what it costs: time
    assert on.plan == off.plan  # the placement itself is the same
    # time only (lam = 1): a straggler cannot finish sooner elsewhere, so cuts are declined and the decision
    # is the one without them; the variant with cuts is still logged
    no, m_no = choose(STRAGGLER, _two(migrate=True, lam=1.0), TINY)
    off1, m_off1 = choose(STRAGGLER, _two(migrate=False, lam=1.0), TINY)
    assert no.migration is None and m_no[M.BAL_MIGRATE_USED] == 0.0
    assert no.candidates == off1.candidates and no.plan == off1.plan
    assert {k: v for k, v in m_no.items() if not k.startswith("balancer/migrate")} == {
        **m_off1, M.BAL_RELEASED_ACTORS: 0.0}
    assert m_no[M.BAL_MIGRATE_STEP_S] == pytest.approx(on.cut_option.step_s)


def test_the_scaler_records_why_it_kept_cuts_or_not():
    """The reason comes from where the cuts are weighed, per decision: kept (cost objective, the straggler's actor
    released), slower (time objective: the straggler cannot finish sooner elsewhere), nothing to move (balanced
    groups: no actor reaches tau with rows left), and none at all with plan.migrate off."""
    on, m_on = choose(STRAGGLER, _two(migrate=True, lam=0.0), TINY)
    no, m_no = choose(STRAGGLER, _two(migrate=True, lam=1.0), TINY)
    even, m_even = choose([PlanJob(f"E{i}", 4, 100.0) for i in range(4)], _two(migrate=True, lam=0.0), TINY)
    off, m_off = choose(STRAGGLER, _two(migrate=False, lam=0.0), TINY)
    assert (on.cut_reason, m_on[M.BAL_MIGRATE_REASON]) == ("kept", "kept")
    assert (no.cut_reason, m_no[M.BAL_MIGRATE_REASON]) == ("slower", "slower")
    assert even.migration is None and m_even[M.BAL_MIGRATE_REASON] == "nothing_to_move"
    assert off.cut_reason == "" and M.BAL_MIGRATE_REASON not in m_off
    assert {on.cut_reason, no.cut_reason, even.cut_reason} <= set(CUT_REASONS)


def _queued_jobs():
    # 16 one-sequence jobs of 100 tokens, 2 slots per actor, flat 0.01 s per iteration: N actors decode in
    # 8/N waves of 1 s; each actor starts cold (4 s, billed), so decode alone trades time against cold starts
    from rlhfless.plan import PlanJob, TimeModel

    tm = TimeModel(batch_sizes=(1, 2), s_per_iter=(0.01, 0.01), prefill_s_per_token=0.0, actor_fixed_s=0.0)
    return [PlanJob(f"j{i}", 1, 100.0) for i in range(16)], tm


@pytest.mark.parametrize("exact", [False, True])
def test_whole_step_scoring_with_a_large_trainer_bill_prefers_more_actors(exact):
    from dataclasses import replace

    from rlhfless.plan import PlanConfig, choose
    from rlhfless.plan.cost import BillingRules
    from rlhfless.plan.overlap import LearnerCosts

    jobs, tm = _queued_jobs()
    cfg = PlanConfig(policy="round_robin", capacity=2, migrate=False, lam=0.5, max_actors=8, cold_start_s=4.0,
                     weight_sync_s=0.0, exact_sweep=exact, billing=BillingRules(granularity_s=0.001, keep_alive_s=0.0))
    decode_only, _ = choose(jobs, cfg, tm)
    # decode alone: T = 4 + 8/N, C = 4N + 8 device-s: the score's minimum is N = 2
    assert decode_only.n_actors == 2
    # the trainer: 8 devices for a 100 s optimizer step after the rollout, the same bill for every N, so the
    # cost ratios flatten and the (whole-step) time ratios decide: more actors
    big = LearnerCosts(whole_step=True, overlap=False, devices=8.0, s_per_token=0.01, update_fixed_s=100.0,
                       cold_start_s=0.0)
    whole, m = choose(jobs, replace(cfg, learner=big), tm)
    assert whole.n_actors > decode_only.n_actors
    row = whole.chosen
    # T = decode + learner work (1600 tokens x 0.01 / 8 devices) + the optimizer step
    assert row.step_s == pytest.approx(4.0 + 8 / row.n_actors + 1600 * 0.01 / 8 + 100.0)
    assert m["plan/predicted_device_s"] == pytest.approx(whole.predicted_device_s) == pytest.approx(row.gpu_seconds)
    assert row.gpu_seconds == pytest.approx(4.0 * row.n_actors + 8.0 + 8 * (2.0 + 100.0))  # decode + trainer


def test_min_cost_at_deadline_is_relative_to_the_serverful_plan():
    from rlhfless.plan import PlanConfig, choose
    from rlhfless.plan.cost import BillingRules

    jobs, tm = _queued_jobs()
    base = dict(policy="round_robin", capacity=2, migrate=False, max_actors=8, cold_start_s=4.0, weight_sync_s=0.0,
                billing=BillingRules(granularity_s=0.001, keep_alive_s=0.0), objective="min_cost_at_deadline")
    # serverful: 8 warm actors, 1 s; x 20 leaves every N feasible -> the cheapest (one actor: 12 s, 12 device-s)
    loose, _ = choose(jobs, PlanConfig(**base, deadline_ratio=20.0), tm)
    assert loose.n_actors == 1 and loose.constraint_met
    # x 6 = 6 s: T = 4 + 8/N <= 6 needs N >= 4; the cheapest of those is 4
    tight, _ = choose(jobs, PlanConfig(**base, deadline_ratio=6.0), tm)
    assert tight.n_actors == 4 and tight.constraint_met
    with pytest.raises(ConfigError, match="plan.deadline_ratio"):
        PlanConfig(**base, deadline_ratio=0.0)


def test_whole_step_with_overlap_prefers_fewer_decode_actors_when_spare_devices_train_during_decode():
    """The overlap branch of the whole-step score: devices no decode actor holds train finished groups while the
    rest decode, so a learner-heavy step needs fewer decode actors than the sequential one."""
    from dataclasses import replace

    from rlhfless.plan import PlanConfig, choose
    from rlhfless.plan.cost import BillingRules
    from rlhfless.plan.overlap import LearnerCosts

    jobs, tm = _queued_jobs()
    cfg = PlanConfig(policy="round_robin", capacity=2, migrate=False, lam=0.5, max_actors=8, cold_start_s=4.0,
                     weight_sync_s=0.0, exact_sweep=True,
                     billing=BillingRules(granularity_s=0.001, keep_alive_s=0.0))
    # 16 jobs x 100 tokens x 0.02 device-s = 32 device-s of learner work on an 8-device budget
    lc = LearnerCosts(whole_step=True, overlap=False, devices=8.0, s_per_token=0.02, update_fixed_s=0.0,
                      cold_start_s=0.0)
    seq, _ = choose(jobs, replace(cfg, learner=lc), tm)
    ovl, _ = choose(jobs, replace(cfg, learner=replace(lc, overlap=True)), tm)
    by_n = {c.n_actors: c for c in ovl.candidates}
    # sequential, N=2: decode 4 + 8/2 = 8 s, then 32 device-s on all 8 devices = 4 s
    assert {c.n_actors: c for c in seq.candidates}[2].step_s == pytest.approx(12.0)
    # overlapped, N=2: 6 spare devices from the first finish (5 s); 8 device-s arrive at 5, 6, 7, 8 s; the backlog
    # is 14 device-s when both actors release at 8 s and all 8 devices drain it in 1.75 s
    assert by_n[2].step_s == pytest.approx(9.75)
    # N=1: 7 spare devices keep up with 4 device-s a second; the last 4 arrive at 12 s with 8 devices: 0.5 s
    assert by_n[1].step_s == pytest.approx(12.5)
    assert ovl.n_actors < seq.n_actors
    assert (ovl.n_actors, seq.n_actors) == (2, 4)


def test_wide_straggler_by_hand_and_only_where_the_rule_prefers_it():
    from rlhfless.plan.wide import WideActor

    jobs = [PlanJob("long", 1, 800.0), *[PlanJob(x, 1, 100.0) for x in "abc"]]
    cfg = _cfg(lam=0.5, max_actors=4, scale=False, policy="lpt")  # 4 actors; "long" alone: 8 s, the rest 1 s
    base, _ = choose(jobs, cfg, TM)
    assert base.wide_actor == -1 and base.wide_option is None and base.chosen.step_s == pytest.approx(3.2 + 8.0)
    # a wide engine twice as fast per token for twice the devices: 3 + 0.2 + 4 = 7.2 s on 2 devices (budget:
    # 3 narrow + 1 wide = 5 devices > 4 -> not offered); with a budget of 5 devices it is, and it pays
    fast = WideActor(TimeModel.per_token(0.005), 2.0, 256, 3.0, 0.2)
    d, m = choose(jobs, cfg, TM, wide=fast)
    assert d.wide_actor == -1 and d.wide_option is None and M.SCALER_WIDE_USED not in m
    roomy = replace(cfg, learner=LearnerCosts(devices=5.0))
    d, m = choose(jobs, roomy, TM, wide=fast)
    long_actor = next(a for a, js in enumerate(d.plan.actor_jobs) if js and js[0].group_id == "long")
    assert d.wide_actor == long_actor and m[M.SCALER_WIDE_USED] == 1.0
    # T: 7.2 s instead of 11.2; C: 3 x ceil(4.2) + 2 x ceil(7.2) = 15 + 16 = 31 device-s instead of 27
    assert d.chosen.step_s == pytest.approx(7.2) and d.chosen.gpu_seconds == pytest.approx(31.0)
    # asked for cost only, the same engine is declined (and weighed: wide_option is kept)
    d, m = choose(jobs, replace(roomy, lam=0.0), TM, wide=fast)
    assert d.wide_actor == -1 and d.wide_option is not None and m[M.SCALER_WIDE_USED] == 0.0


def test_whole_step_prices_a_migrated_group_at_the_rollouts_end_as_the_simulator_does():
    import numpy as np

    from rlhfless.plan.balancer import JobArrays
    from rlhfless.plan.scaler import _tail

    # actor 0 holds a 4 s group and a 1 s one but was cut at 2 s (its straggler moved): the 4 s group arrives when
    # the rollout ends (actor 1's release, 3 s after its 0.5 s head), not at its own uncut finish
    ja = JobArrays.from_jobs([PlanJob("a", 1, 400.0), PlanJob("b", 1, 100.0), PlanJob("c", 1, 300.0)])
    labels, rank = np.array([0, 0, 1]), np.arange(3)
    head = np.array([0.5, 0.5])
    lc = LearnerCosts(whole_step=True, overlap=True, devices=2.0, s_per_token=0.001, cold_start_s=0.0)
    cfg = _cfg(max_actors=2, learner=lc)
    dur = head + np.array([2.0, 3.0])
    end, invs = _tail(ja, labels, rank, 2, dur, head, cfg, TM)
    # work: a 0.4, b 0.1, c 0.3 device-s on the released actors' devices (1 each, at 2.5 and 3.5 s): b is done by
    # 2.6; a and c both arrive at 3.5 -> 0.7 on 2 devices -> 3.85 (a at its uncut finish, 4.5 s, would end 4.7)
    assert end == pytest.approx(3.5 + 0.7 / 2)


def test_draws_make_T_and_C_the_mean_over_outcomes_played_on_the_predicted_placement():
    from rlhfless.plan.balancer import evaluate_plan

    long_a = [PlanJob("a", 1, 1000.0), *JOBS[1:]]  # an outcome where job a runs ten times its prediction
    as_pred = list(JOBS)
    cfg = _cfg(lam=1.0)
    plain, _ = choose(JOBS, cfg, TM)
    d, _ = choose(JOBS, cfg, TM, draws=[long_a, as_pred])
    for c, p in zip(d.candidates, plain.candidates):
        if c.n_actors == d.n_actors:  # the chosen plan's own placement, played on each outcome
            t = [3.2 + evaluate_plan(d.plan, o, TM).makespan_s for o in (long_a, as_pred)]
            assert c.step_s == pytest.approx(sum(t) / 2)
        assert c.step_s > p.step_s  # the long outcome lengthens every candidate's expected step
        assert c.gpu_seconds > p.gpu_seconds


def test_pre_warmed_instances_a_candidate_leaves_unused_are_billed():
    # warm_bill_s = 2: a warm actor bills 2 s before the step; N=1 with 4 pre-warmed: 0.2 + 4 + 2 = 6.2 -> 7 s,
    # plus 3 unused instances x 2 s = 13 GPU-s. n_warm=None: a pool sized to each candidate, none unused: 7.
    cfg = _cfg(lam=0.5, warm_bill_s=2.0)
    d4, _ = choose(JOBS, cfg, TM, n_warm=4)
    assert d4.candidates[0].gpu_seconds == pytest.approx(13.0)
    assert d4.candidates[-1].gpu_seconds == pytest.approx(4 * 4.0)  # 0.2 + 1 + 2 = 3.2 -> 4 s each, none unused
    dn, _ = choose(JOBS, cfg, TM, n_warm=None)
    assert dn.candidates[0].gpu_seconds == pytest.approx(7.0)
    assert all(c.step_s == pytest.approx(0.2 + 4.0 / c.active_actors if c.n_actors != 3 else 2.2)
               for c in dn.candidates)  # every candidate warm: no cold start on the critical path
    exact, _ = choose(JOBS, replace(cfg, exact_sweep=True), TM, n_warm=4)
    assert [c.gpu_seconds for c in exact.candidates] == pytest.approx([c.gpu_seconds for c in d4.candidates])


def test_hybrid_warm_actors_reshard_in_place_and_bill_from_the_step_start():
    # a pool of 4 warm instances, 2 of them hybrid functions from the last step's learner (hybrid_sync_s 0.05 s,
    # billed from the step's start), 2 pre-warmed (weight_sync_s 0.2 s, billed warm_bill_s 2 s before the step).
    # N=4: 2 x ceil(0.05 + 1) + 2 x ceil(0.2 + 1 + 2) = 12 GPU-s, step 1.2 s (a pre-warmed one syncs longer).
    # N=1: the busiest actor is hybrid: 4.05 s, ceil -> 5, plus the 2 pre-warmed left unused x 2 s = 9 GPU-s
    # (the unused hybrid one stays a learner rank: no decode bill)
    cfg = _cfg(lam=0.5, warm_bill_s=2.0, hybrid_warm=2, hybrid_sync_s=0.05)
    for exact in (False, True):
        d, _ = choose(JOBS, replace(cfg, exact_sweep=exact), TM, n_warm=4)
        assert (d.candidates[-1].step_s, d.candidates[-1].gpu_seconds) == pytest.approx((1.2, 12.0))
        assert (d.candidates[0].step_s, d.candidates[0].gpu_seconds) == pytest.approx((4.05, 9.0))
    plain, _ = choose(JOBS, _cfg(lam=0.5, warm_bill_s=2.0), TM, n_warm=4)
    assert plain.candidates[0].gpu_seconds == pytest.approx(13.0)  # without hybrid functions, as before
    for kw, field in [(dict(hybrid_warm=-1), "plan.hybrid_warm"), (dict(hybrid_sync_s=-1.0), "plan.hybrid_sync_s")]:
        with pytest.raises(ConfigError, match=f"^{field}:"):
            _cfg(**kw)


def test_memoised_plays_are_keyed_by_placement_not_only_by_job_order():
    # two placements of the same jobs in the same order over 2 actors, a | bcd and abc | d: a play of one on a
    # draw must not be reused for the other (on an outcome where a runs 10 s: 10 s | 3 s against 12 s | 1 s)
    from rlhfless.plan.records import AssignmentPlan
    from rlhfless.plan.scaler import _row

    def placed(cut):
        parts = (tuple(JOBS[:cut]), tuple(JOBS[cut:]))
        busy = tuple(float(len(p)) for p in parts)
        return AssignmentPlan("round_robin", 2, 8, parts, busy, max(busy), max(busy) - min(busy))

    cfg, outcome = _cfg(lam=0.5), [[PlanJob("a", 1, 1000.0), *JOBS[1:]]]
    memo: dict = {}
    _row(placed(1), cfg, TM, 0, outcome, memo=memo)
    shared = _row(placed(3), cfg, TM, 0, outcome, memo=memo)
    alone = _row(placed(3), cfg, TM, 0, outcome)
    assert alone.step_s == pytest.approx(3.0 + 0.2 + 12.0)
    assert (shared.step_s, shared.gpu_seconds) == pytest.approx((alone.step_s, alone.gpu_seconds))


def test_a_warm_wide_straggler_is_a_pre_warmed_function_even_where_a_hybrid_one_would_stand():
    # a | bcd (busy 1 s | 3 s), both warm and hybrid functions. The straggler on the wide engine (2 devices, twice
    # as fast: 1.5 s) is a new function with weights over the network, not the learner's block: billed
    # warm_bill_s = 2 s before the step like any pre-warmed one: 2 + 0.2 + 1.5 = 3.7 -> 4 s x 2 devices = 8,
    # plus the hybrid narrow actor 0.05 + 1 -> 2 s: 10 GPU-s (a free pre-warm would make it 6)
    from rlhfless.plan.records import AssignmentPlan
    from rlhfless.plan.scaler import _row
    from rlhfless.plan.wide import WideActor

    parts = (tuple(JOBS[:1]), tuple(JOBS[1:]))
    plan = AssignmentPlan("round_robin", 2, 8, parts, (1.0, 3.0), 3.0, 2.0)
    cfg = _cfg(lam=0.5, warm_bill_s=2.0, hybrid_warm=2, hybrid_sync_s=0.05)
    wide = WideActor(TimeModel.per_token(0.005), 2.0, 8, 3.0, 0.2)
    row = _row(plan, cfg, TM, 2, (), wide=wide)
    assert (row.step_s, row.gpu_seconds) == pytest.approx((1.7, 10.0))


def test_sequential_whole_step_tail_reads_no_finish_so_the_scaler_simulates_none():
    """Without overlap every group's learner work waits for the rollout's end: `whole_step_tail` gives the same
    step and bill whatever the arrivals, which is why `_tail` skips simulating each job's finish there. Checked
    against the finishes simulated (`labels_finish_s`) and against arbitrary ones."""
    import numpy as np

    from rlhfless.plan.balancer import JobArrays, labels_finish_s
    from rlhfless.plan.overlap import job_learner_tokens, whole_step_tail
    from rlhfless.plan.scaler import _tail

    rng = np.random.default_rng(3)
    ja = JobArrays.from_jobs([PlanJob(f"g{i}", 2, tuple(rng.uniform(50, 900, 2).tolist()), 7) for i in range(9)])
    labels, rank = rng.integers(0, 3, 9), np.arange(9)
    head = np.array([0.4, 0.7, 0.2])
    lc = LearnerCosts(whole_step=True, overlap=False, devices=3.0, s_per_token=0.001, cold_start_s=0.5,
                      update_fixed_s=0.3, after_s_per_token=0.0005, prefill_s=0.2, prefill_devices=1.0)
    cfg = _cfg(max_actors=3, learner=lc)
    busy = np.bincount(labels, weights=ja.work, minlength=3) * 0.01
    dur = np.where(busy > 0, head + busy, 0.0)
    end, invs = _tail(ja, labels, rank, 3, dur, head, cfg, TM)
    tokens = job_learner_tokens(ja.sizes.astype(float), ja.prompt_len, ja.work, lc)
    fin = labels_finish_s(ja, labels, rank, 3, cfg.capacity, TM) + head[labels]
    for arrive in (fin, rng.uniform(0, 50, 9)):
        ref = whole_step_tail(dur[dur > 0], arrive, tokens * lc.s_per_token, cfg.gpus_per_actor, 3.0, lc,
                              cfg.gpus_per_actor, 0, float(tokens.sum()) * lc.after_s_per_token)
        assert (end, invs) == ref


def test_a_memo_shares_tails_between_equal_learner_costs_built_apart(monkeypatch):
    """`_memo_tail` keys the learner's costs by value (`_learner_key`): twins build equal `LearnerCosts` as objects
    of their own and share a step's memo, so the second costs no tail the first costed; a cost that differs
    (even 0.0 against -0.0) is costed on its own."""
    import numpy as np

    from rlhfless.plan import scaler
    from rlhfless.plan.balancer import JobArrays

    ja = JobArrays.from_jobs([PlanJob("a", 1, 400.0), PlanJob("b", 1, 100.0), PlanJob("c", 1, 300.0)])
    labels, rank, head = np.array([0, 0, 1]), np.arange(3), np.array([0.5, 0.5])
    dur = head + np.array([2.0, 3.0])
    calls, real = [], scaler._tail
    monkeypatch.setattr(scaler, "_tail", lambda *a, **k: calls.append(1) or real(*a, **k))
    memo = {}

    def cost(**lc):
        cfg = _cfg(max_actors=2, learner=LearnerCosts(whole_step=True, overlap=True, devices=2.0, s_per_token=0.001,
                                                      **lc))
        return scaler._memo_tail(ja, labels, rank, 2, dur, head, cfg, TM, None, None, 0, memo)

    first = cost(cold_start_s=0.0)
    assert cost(cold_start_s=0.0) == first and len(calls) == 1  # another object, the same value: shared
    cost(cold_start_s=-0.0 + 0.0, update_fixed_s=-0.0)
    assert len(calls) == 2  # -0.0 is not 0.0 by repr: costed anew


def test_a_memo_plays_a_plans_cuts_on_an_outcome_once(monkeypatch):
    """Twins that choose the same N weigh cuts on the same plan object and draws (`_memo_cuts`): the second
    `with_cuts` of a plan in one memo plays nothing again and gives the same row; another memo plays anew."""
    from rlhfless.plan import scaler
    from rlhfless.plan.balancer import assign

    plays, real = [], scaler.play_with_migration
    monkeypatch.setattr(scaler, "play_with_migration", lambda *a, **k: plays.append(1) or real(*a, **k))
    cfg = _cfg(max_actors=2, migrate=True)
    plan, _ = assign(STRAGGLER, 2, 4, TM, "contiguous")
    draws = [list(STRAGGLER), [PlanJob(j.group_id, j.n_seqs, tuple(2.0 * x for x in j.lengths())) for j in STRAGGLER]]
    memo = {}
    first, _ = scaler.with_cuts(plan, cfg, TM, 0, draws, memo)
    assert len(plays) == 3  # the predictions and each draw
    again, _ = scaler.with_cuts(plan, cfg, TM, 0, draws, memo)
    assert replace(again, score=0.0) == replace(first, score=0.0) and len(plays) == 3  # unscored: NaN
    scaler.with_cuts(plan, cfg, TM, 0, draws, {})
    assert len(plays) == 6


@pytest.mark.parametrize("seed", range(2))
def test_draw_mean_is_numpys_mean_bit_for_bit(seed):
    """`_mean` (a row's mean over its draws, in Python) equals `np.mean` for every count, signed zeros,
    cancelling magnitudes and infinities included (its order of additions is numpy's below 8 values)."""
    import numpy as np

    from rlhfless.plan.scaler import _mean

    rng = np.random.default_rng(seed)
    pool = [1e16, -1e16, 1.0, 0.1, -0.0, 0.0, 3.3e-5, 7.0, float("inf"), 2.0 ** -1074]
    for _ in range(8000):
        n = int(rng.integers(1, 11))
        xs = [float(x) * float(rng.uniform(0.5, 2.0)) ** int(rng.integers(0, 2)) for x in rng.choice(pool, n)]
        want, got = float(np.mean(xs)), _mean(xs)
        assert (want == got and np.signbit(want) == np.signbit(got)) or (np.isnan(want) and np.isnan(got)), xs


@pytest.mark.parametrize("policy", ["round_robin", "contiguous", "lpt", "karmarkar_karp"])
def test_a_memoised_plans_arrays_are_those_its_jobs_give(policy):
    """`_plan_jobs` gathers a plan `_memo_plan` built from the step's arrays in `build_plan`'s order; they must
    be `JobArrays.from_jobs` of the plan's jobs, bit for bit (per-sequence lengths and jobs of several sizes, so
    a gather in another order differs)."""
    import numpy as np

    from rlhfless.plan import scaler
    from rlhfless.plan.balancer import JobArrays

    rng = np.random.default_rng(7)
    jobs = [PlanJob(f"g{i}", int(k), tuple(float(x) for x in rng.integers(1, 300, int(k))), int(rng.integers(0, 50)))
            for i, k in enumerate(rng.integers(1, 5, 23))]
    cfg = _cfg(max_actors=5, policy=policy, capacity=8)
    ja, memo = JobArrays.from_jobs(jobs), {}
    res = scaler._memo_sweep(ja, cfg, TM, memo)
    for n in cfg.candidates():
        plan = scaler._memo_plan(ja, res, n, cfg, TM, memo)
        got = scaler._plan_jobs(plan, memo)
        want = JobArrays.from_jobs([j for js in plan.actor_jobs for j in js])
        assert got.jobs == want.jobs
        for f in ("sizes", "prompt_len", "work", "mean_len", "seq_len", "offsets"):
            a, b = getattr(got, f), getattr(want, f)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f
        assert scaler._plan_jobs(plan, memo) is got  # once per plan
