"""The real runtime's planner is not coupled to the simulator's scaler settings (issue 19): with every shipped
run config it scores decode alone (learner.whole_step off), bills warm decode functions nothing before the step,
prices no hybrid functions and no drawn outcomes (`rlhfless.step.planner.Planner.plan_step` passes none); the
simulator sets these per step itself (`rlhfless.sim.policies.RLHFless.decide`)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from rlhfless.config import load_run_config
from rlhfless.step.planner import Planner
from rlhfless.run.preflight import plan_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "experiments" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_run_configs_keep_the_runtime_planner_decode_only_without_warm_bills_or_hybrids(path):
    plan = plan_config(load_run_config(path))
    assert not plan.learner.whole_step
    assert (plan.warm_bill_s, plan.hybrid_warm, plan.hybrid_sync_s) == (0.0, 0, 0.0)
    assert plan.learner.release_cold_s is None and plan.learner.prewarm_bill_s is None


def test_the_runtime_planner_prices_the_predictions_alone():
    # no way to hand it outcomes: a step's draws would need the runtime to seed and bill them (not done)
    assert "draws" not in inspect.signature(Planner.plan_step).parameters
