"""Simulator event core and step mechanism: exact timelines computed by hand."""

from __future__ import annotations

import pytest

from rlhfless.core.errors import DataError
from rlhfless.plan.cost import BillingRules, cost_step, price
from rlhfless.sim.events import PRIO_OTHER, PRIO_RELEASE, PRIO_START, EventLoop, Timeline
from rlhfless.sim.step import ActorRun, FnRun, LearnerPlan, StepSchedule, play_step


def test_events_run_by_time_then_priority_then_scheduling_order():
    loop, seen = EventLoop(), []
    for t, prio, tag in [(2.0, PRIO_OTHER, "c"), (1.0, PRIO_OTHER, "b1"), (1.0, PRIO_RELEASE, "a"),
                         (1.0, PRIO_OTHER, "b2"), (0.5, PRIO_START, "first")]:
        loop.at(t, prio, lambda lp, tag=tag: seen.append((lp.now, tag)))
    loop.at(1.0, PRIO_START, lambda lp: lp.after(0.25, PRIO_OTHER, lambda l2: seen.append((l2.now, "chained"))))
    assert loop.run() == 2.0
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "b1"), (1.0, "b2"), (1.25, "chained"), (2.0, "c")]
    assert loop.handled == 7


def test_events_refuse_the_past_and_stop_at_until():
    loop = EventLoop()
    loop.at(3.0, PRIO_OTHER, lambda lp: None)
    loop.at(1.0, PRIO_OTHER, lambda lp: None)
    assert loop.run(until=2.0) == 1.0
    with pytest.raises(DataError, match="past"):
        loop.at(0.5, PRIO_OTHER, lambda lp: None)


def _plan(serverful: bool, overlap: bool = True) -> StepSchedule:
    actors = (ActorRun(0, 2, 4.0, 1.0, 2.0, 0.5, 10.0), ActorRun(1, 2, 0.0, 1.0, 3.0, 0.0, 6.0, prewarm_s=4.0))
    # groups: two on actor 1 (done 2 s and 6 s into its decode, 4 device-s of learner work each), one on actor 0
    # (done 10 s in, 6 device-s); 8 devices in all, learner blocks of 2, 1 s learner cold start, 1 s optimizer
    learner = LearnerPlan(overlap, (1, 1, 0), (2.0, 6.0, 10.0), (4.0, 4.0, 6.0), 8.0, 2.0, 1.0, True, 1.0)
    return StepSchedule(serverful, 8, actors, FnRun("prefill", 2, 0.0, 3.0), learner)


def test_overlapped_step_timeline_by_hand_serverless():
    loop, tl = EventLoop(), Timeline()
    closed = []
    tl.on_span(closed.append)
    res = play_step(loop, tl, 100.0, _plan(serverful=False), step=7)
    loop.run()
    # decode 0 starts at max(4+1, 2)+0.5 = 5.5, releases at 15.5; decode 1 starts at 3, releases at 9.
    # Groups arrive at 5 (4 ds), 9 (4 ds), 15.5 (6 ds). Learner blocks: the prefill's 2 devices ready at 3+1 = 4,
    # the 2 spare devices (8 - 2 - 2 - 2) pre-warmed for the first arrival at 5, decode 1's at 9+1 = 10, decode
    # 0's at 16.5. Fluid drain: 5-6 on 4 devices (4 ds), 9-10 on 4 (4 ds), 15.5-16.5 on 6 (6 ds): work ends at
    # 16.5, before decode 0's block is ready (it never joins); the optimizer step ends at 17.5.
    assert (res.rollout_end_s, res.score_end_s, res.end_s) == (115.5, 116.5, 117.5)
    got = {(s.kind, s.instance): (s.start_s, s.end_s, s.devices, s.billed) for s in tl.spans}
    assert got[("prefill", 0)] == (100.0, 103.0, 2, True)
    assert got[("decode", 0)] == (100.0, 115.5, 2, True)
    assert got[("decode", 1)] == (96.0, 109.0, 2, True)  # billed from its pre-warm start
    # learner blocks (instances: decode 0's, decode 1's, the prefill's, the spare) held from start to the end
    assert ("learner", 0) not in got
    assert got[("learner", 1)] == (109.0, 117.5, 2.0, True)
    assert got[("learner", 2)] == (103.0, 117.5, 2.0, True)
    assert got[("learner", 3)] == (104.0, 117.5, 2.0, True)
    assert [s.kind for s in closed] == [s.kind for s in tl.spans]
    assert tl.stages == [(7, "rollout", 100.0, 115.5), (7, "score", 115.5, 116.5), (7, "update", 116.5, 117.5)]
    rules = BillingRules(granularity_s=1.0, keep_alive_s=0.0)
    cost, _ = cost_step(tl.invocations(7), price("L40S"), rules)
    # prefill 3 x 2 + decode ceil(15.5)=16 x 2 + 13 x 2 + learner ceil(8.5)=9 x 2 + ceil(14.5)=15 x 2 + 14 x 2
    assert cost.gpu_seconds == 3 * 2 + 16 * 2 + 13 * 2 + 9 * 2 + 15 * 2 + 14 * 2


def test_sequential_step_timeline_by_hand_serverless():
    loop, tl = EventLoop(), Timeline()
    res = play_step(loop, tl, 100.0, _plan(serverful=False, overlap=False), step=7)
    loop.run()
    # all 14 device-s arrive at the rollout's end (115.5) on all 8 devices: 1.75 s, then the optimizer step
    assert (res.rollout_end_s, res.score_end_s, res.end_s) == (115.5, 117.25, 118.25)
    learners = [(s.start_s, s.end_s, s.devices) for s in tl.spans if s.kind == "learner"]
    assert learners == [(114.5, 118.25, 8.0)]  # pre-warmed one cold start ahead of the rollout's end


def test_step_timeline_serverful_bills_the_pool_only():
    loop, tl = EventLoop(), Timeline()
    res = play_step(loop, tl, 0.0, _plan(serverful=True), step=0)
    loop.run()
    billed = [s for s in tl.spans if s.billed]
    assert [(s.kind, s.start_s, s.end_s, s.devices) for s in billed] == [("pool", 0.0, 17.5, 8)]
    assert res.end_s == 17.5


def test_step_without_actors_goes_straight_to_scoring():
    learner = LearnerPlan(True, (), (), (), 1.0, 1.0, 0.0, True, 1.0)
    plan = StepSchedule(False, 0, (), FnRun("prefill", 1, 1.0, 2.0), learner)
    loop, tl = EventLoop(), Timeline()
    res = play_step(loop, tl, 0.0, plan, 0)
    loop.run()
    assert (res.rollout_end_s, res.end_s) == (3.0, 4.0)


def test_event_order_is_sorted_by_time_priority_then_insertion():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=40))
    @hypothesis.settings(max_examples=30, deadline=None)
    def check(events):
        loop, seen = EventLoop(), []
        for i, (t, prio) in enumerate(events):
            loop.at(float(t), prio, lambda lp, i=i: seen.append(i))
        loop.run()
        assert seen == sorted(range(len(events)), key=lambda i: (events[i][0], events[i][1], i))

    check()
