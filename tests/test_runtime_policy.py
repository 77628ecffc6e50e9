"""The runtime's pure policy pieces: work splits, pre-warm timing, the ship-KV rule, the planner's calibration."""

import pytest

from rlhfless.plan import PlanConfig, TimeModel
from rlhfless.runtime.modes.policy import (
    History,
    prewarm_decode,
    prewarm_learner,
    ship_saves_tokens,
    should_ship,
    split_by_count,
)


def test_split_by_count_is_contiguous_and_differs_by_at_most_one():
    assert split_by_count(7, 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_by_count(2, 3) == [[0], [1], []]
    for n, w in ((32, 2), (33, 4), (5, 5)):
        chunks = split_by_count(n, w)
        assert sum(chunks, []) == list(range(n))
        assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_learner_prewarm_is_the_expected_rollout_minus_the_mean_cold_start_and_buffer():
    h = History()
    assert prewarm_learner(h, predicted_makespan_s=2.0, cold_default=0.5, buffer_s=0.1).after_s == pytest.approx(1.4)
    h.rollout_s.extend([3.0, 1.5, 2.5])
    h.add_cold("learner", 0.4)
    h.add_cold("learner", 0.6)
    # no measured/predicted ratio yet: the shortest recent rollout (the paper's rule)
    assert prewarm_learner(h, 2.0, 0.5, 0.1, "plan").after_s == pytest.approx(1.5 - 0.5 - 0.1)
    h.rollout_vs_plan.extend([1.6, 1.8])
    # "plan": this step's predicted makespan times the measured/predicted ratio; "history": shortest recent
    assert prewarm_learner(h, 1.0, 0.5, 0.1, "plan").after_s == pytest.approx(1.0 * 1.7 - 0.5 - 0.1)
    assert prewarm_learner(h, 9.9, 0.5, 0.1, "history").after_s == pytest.approx(1.5 - 0.5 - 0.1)
    assert prewarm_learner(h, 0.2, 0.5, 0.1).after_s == 0.0  # never before the stage starts


def test_decode_prewarm_waits_for_history_and_counts_the_driver_gap():
    h = History()
    assert prewarm_decode(h, 0.3, 0.05).after_s is None
    h.learn_s.extend([1.2, 1.0])
    h.between_s.append(0.2)
    h.add_cold("decode", 0.2)
    h.add_cold("decode", 0.4)
    assert prewarm_decode(h, 9.9, 0.05).after_s == pytest.approx(1.0 + 0.2 - 0.3 - 0.05)


def test_shipping_kv_saves_only_prefixes_shared_across_actors():
    template = list(range(3, 203))  # a long shared template (a system prompt)
    prompts = [template + [100 + i, 7, 8] for i in range(8)]
    saved = ship_saves_tokens(prompts, [[0, 1, 2, 3], [4, 5, 6, 7]], group_size=4, dedup=True)
    assert saved == 200  # the second actor's copy of the template
    assert ship_saves_tokens(prompts, [list(range(8))], group_size=4, dedup=True) == 0  # one actor: nothing shared
    assert should_ship("auto", saved, prefill_s_per_token=1.0, cold_start_s=0.5)
    assert not should_ship("auto", saved, prefill_s_per_token=1e-9, cold_start_s=0.5)
    assert should_ship("always", 0, 0.0, 9.0) and not should_ship("never", 10**6, 1.0, 0.0)


def test_the_planner_takes_measured_cold_start_and_a_time_scale():
    from rlhfless.step.planner import Planner
    from rlhfless.predictor.config import PredictorConfig

    p = Planner(PredictorConfig(), PlanConfig())
    base = p.time_model
    p.calibrate(cold_start_s=0.25, weight_sync_s=0.01, time_scale=2.0)
    assert p.cfg.cold_start_s == 0.25 and p.cfg.weight_sync_s == 0.01
    assert p.time_model.s_per_iter == tuple(2.0 * x for x in base.s_per_iter)
    assert p.time_model.prefill_s_per_token == pytest.approx(2.0 * base.prefill_s_per_token)
    p.calibrate(time_scale=0.5)  # always relative to the base profile, never compounded
    assert p.time_model.s_per_iter == tuple(0.5 * x for x in base.s_per_iter)


def test_time_model_scale_rejects_nonsense():
    from rlhfless.core.errors import ConfigError

    with pytest.raises(ConfigError, match="time_model.scale"):
        TimeModel.default_tiny_cpu().scaled(0.0)


def test_the_mode_is_a_policy_object_the_stages_ask():
    """runtime.modes.policy.ModePolicy: what the serverless runtime and the serverful pool decide differently."""
    from rlhfless.runtime.config import RuntimeConfig
    from rlhfless.runtime.modes.policy import ServerfulPolicy, ServerlessPolicy, policy_for

    sl, sf = policy_for("serverless"), policy_for("serverful")
    assert isinstance(sl, ServerlessPolicy) and isinstance(sf, ServerfulPolicy) and sf.traits.holds_pool
    assert sl.keep_alive(2.0) == 2.0 and sf.keep_alive(2.0) is None  # the pool is never idle-released
    assert sf.decode_split(5, None, 2) == [[0, 1, 2], [3, 4]]  # verl's contiguous split by count
    assert not sf.migrates("always", None) and sl.migrates("always", None)
    assert sl.billing_name("invocations") == "invocations" and sf.billing_name("invocations") == "lifetime"
    rt = RuntimeConfig(units=2, learner_units=2, serverful_workers=2)
    assert sl.learner_world(rt) == sf.learner_world(rt) == 2



def test_each_mode_returns_its_decisions_as_frozen_data():
    """`ModePolicy` decides and never acts: given plain values (the handles are any objects), each method returns a
    frozen record the worker set carries out (`WorkerSet.decoders`, `settle`, `decoder_done`, `seat_learners`,
    `reference_function`; the stages read `on_death`)."""
    from dataclasses import FrozenInstanceError

    from rlhfless.runtime.modes.policy import (HOLD, AfterDecode, DecodePick, Death, Keep, LearnerSeats, PpoSeat,
                                               ReferencePick, policy_for)

    sl, sf = policy_for("serverless"), policy_for("serverful")
    a, b, c = "fn-a", "fn-b", "fn-c"  # handles the mode only names, never calls
    # a function with no work now: its keep-alive runs; a keep-alive of 0 releases it at once. The pool holds.
    assert sl.no_work_now(2.0) == Keep(idle=True) and sl.no_work_now(0.0) == Keep(idle=True, release="lapse")
    assert sf.no_work_now(0.0) == HOLD and sf.no_rows() == HOLD and sl.no_rows() == Keep(idle=True)
    # decode: warm ones first, the rest cold; warm ones beyond the need are spare (their keep-alive runs)
    assert sl.decoders(2, [a, b, c], []) == DecodePick(warm=(a, b), spare=(c,), cold=0)
    assert sl.decoders(3, [a], []) == DecodePick(warm=(a,), cold=2)
    assert sf.decoders(2, [c], [a, b]) == DecodePick(held=(a, b))
    # a decode function done: hybrid, offered to a rank; separate images, let go when no next work is known and
    # there is no keep-alive (`plan.lifecycle.let_go`), kept otherwise; the pool's worker is a rank already
    assert sl.decoder_done(True, 2.0, None, 1.0) == AfterDecode(to_learner=True, keep=Keep(idle=True), pump=True)
    assert sl.decoder_done(False, 0.0, None, 1.0).release == "plan"
    assert sl.decoder_done(False, 2.0, None, 1.0).release is None
    assert sf.decoder_done(False, 2.0, None, 1.0) == AfterDecode()
    # learner ranks: the last step's functions when the whole group is there, else they go and a new group forms
    assert sl.learner_ranks(2, [a, b], []) == LearnerSeats(handles=(a, b), warm=True)
    assert sl.learner_ranks(2, [a], []) == LearnerSeats(release=(a,), forget=True)
    assert sf.learner_ranks(2, [], [a, b, c]) == LearnerSeats(handles=(a, b))
    # the reference: the kept function (None: start one) and keep it; the pool's worker 0, none kept
    assert sl.reference_function(a, []) == ReferencePick(a, keep=True) and sl.reference_function(None, []).keep
    assert sf.reference_function(c, [a, b]) == ReferencePick(a, keep=False)
    # the death path, one method: replace the dead function, or restart the pool (decode: the rollout over)
    assert {sl.on_death(r) for r in ("decode", "reference", "learner", "critic")} == {Death(whole=False)}
    assert sf.on_death("decode") == Death(whole=True, rollout_over=True)
    assert sf.on_death("learner") == sf.on_death("critic") == Death(whole=True, rollout_over=False)
    # PPO's ranks: a function of the role's own (serverless), or the pool worker that holds it all run
    assert {sl.ppo_rank(r, k) for r in ("learner", "critic") for k in (0, 3)} == {PpoSeat(held=False)}
    assert {sf.ppo_rank(r, k) for r in ("learner", "critic") for k in (0, 3)} == {PpoSeat(held=True)}
    with pytest.raises(FrozenInstanceError):
        sl.no_work_now(0.0).release = None
