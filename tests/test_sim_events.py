"""Simulator event core and step mechanism: exact timelines computed by hand."""

from __future__ import annotations

import pytest

from rlhfless.errors import DataError
from rlhfless.plan.cost import BillingRules, cost_step, price
from rlhfless.sim.events import PRIO_OTHER, PRIO_RELEASE, PRIO_START, EventLoop, Timeline
from rlhfless.sim.step import ActorRun, FnRun, StepPlan, play_step


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


def _plan(serverful: bool) -> StepPlan:
    # two decode actors: A cold (4 s) + sync 1 s, KV ready at 2 s, prefill 0.5 s, decode 10 s -> ends 15.5;
    # B warm (pre-warmed 4 s ahead), sync 1 s, KV ready at 3 s (later than its sync), decode 6 s -> ends 9
    actors = (ActorRun(0, 2, 4.0, 1.0, 2.0, 0.5, 10.0), ActorRun(1, 2, 0.0, 1.0, 3.0, 0.0, 6.0, prewarm_s=4.0))
    score = (FnRun("reference", 4, 0.0, 2.0, prewarm_s=1.5), FnRun("value", 4, 0.0, 1.0))
    return StepPlan(serverful, 4, actors, FnRun("prefill", 2, 0.0, 3.0), score, FnRun("learner", 4, 0.0, 5.0))


def test_step_timeline_by_hand_serverless():
    loop, tl = EventLoop(), Timeline()
    closed = []
    tl.on_span(closed.append)
    res = play_step(loop, tl, 100.0, _plan(serverful=False), step=7)
    loop.run()
    # rollout ends at 115.5; reference 115.5-117.5, value -118.5, learner 118.5-123.5
    assert (res.rollout_end_s, res.score_end_s, res.end_s) == (115.5, 118.5, 123.5)
    got = {(s.kind, s.instance): (s.start_s, s.end_s, s.billed) for s in tl.spans}
    assert got[("prefill", 0)] == (100.0, 103.0, True)
    assert got[("decode", 0)] == (100.0, 115.5, True)
    assert got[("decode", 1)] == (96.0, 109.0, True)  # billed from its pre-warm start
    assert got[("reference", 0)] == (115.5, 117.5, False)  # drawn; billed inside the trainer span
    assert got[("value", 1)] == (117.5, 118.5, False)
    assert got[("trainer", 0)] == (114.0, 123.5, True)  # pre-warmed 1.5 s before scoring
    assert [s.kind for s in closed] == [s.kind for s in tl.spans]
    assert tl.stages == [(7, "rollout", 100.0, 115.5), (7, "score", 115.5, 118.5), (7, "update", 118.5, 123.5)]
    rules = BillingRules(granularity_s=1.0, keep_alive_s=0.0)
    cost, _ = cost_step(tl.invocations(7), price("L40S"), rules)
    # prefill 3 s x 2 + decode ceil(15.5)=16 x 2 + 13 x 2 + trainer ceil(9.5)=10 x 4
    assert cost.gpu_seconds == 3 * 2 + 16 * 2 + 13 * 2 + 10 * 4


def test_step_timeline_serverful_bills_the_pool_only():
    loop, tl = EventLoop(), Timeline()
    res = play_step(loop, tl, 0.0, _plan(serverful=True), step=0)
    loop.run()
    billed = [s for s in tl.spans if s.billed]
    assert [(s.kind, s.start_s, s.end_s, s.devices) for s in billed] == [("pool", 0.0, 23.5, 4)]
    assert res.end_s == 23.5


def test_step_without_actors_goes_straight_to_scoring():
    plan = StepPlan(False, 0, (), FnRun("prefill", 1, 1.0, 2.0), (), FnRun("learner", 1, 0.0, 1.0))
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
