"""The pre-warm rule (plan.schedule): one copy, read by the runtime's modes and the simulator's arm model."""

from rlhfless.plan.lifecycle import planned_start_s, prewarm_start_s
from rlhfless.runtime.modes.policy import History, prewarm_decode, prewarm_learner


def test_a_stage_starts_its_cold_start_and_buffer_before_its_expected_start_never_before_zero():
    assert prewarm_start_s(10.0, 3.0, 0.5) == 6.5
    assert prewarm_start_s(1.0, 3.0, 0.5) == 0.0


def test_the_planned_start_scales_the_makespan_by_the_mean_measured_ratio():
    assert planned_start_s(8.0, []) == 8.0
    assert planned_start_s(8.0, [1.0, 1.5]) == 10.0


def test_the_runtime_reads_the_shared_rule():
    """The modes' learner and decode pre-warm times are the shared rule's, from their history."""
    h = History()
    h.rollout_vs_plan.extend([1.2, 1.4])
    h.add_cold("learner", 2.0)
    assert prewarm_learner(h, 10.0, 9.0, 0.25).after_s == prewarm_start_s(planned_start_s(10.0, [1.2, 1.4]), 2.0, 0.25)
    h.learn_s.extend([5.0, 4.0])
    h.between_s.append(0.5)
    h.add_cold("decode", 1.0)
    assert prewarm_decode(h, 9.0, 0.25).after_s == prewarm_start_s(4.5, 1.0, 0.25)
