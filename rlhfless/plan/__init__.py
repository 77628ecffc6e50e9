"""The planner: cost model + price catalog, length-aware assignment, cut-and-migrate, cost-aware actor scaling.

Pure and fast; the same code drives the real runtime and the simulator. Entry points:
`assign` (balancer), `plan_migrations` / `simulate_with_migration` (migrate), `choose` / `realized_plan` (scaler),
`cost_step` / `cost_serverful` (cost), `hindsight_assign` / `makespan_lower_bound` (references for
scoring a decision), `TimeModel` (continuous-batching time model), `PlanConfig`.

Names are resolved lazily (as in `rlhfless.predictor`), so importing a submodule such as `rlhfless.plan.cli` (as
`rlhfless --help` does) does not import numpy.
"""

import importlib

_EXPORTS = {
    "POLICIES": "balancer", "JobArrays": "balancer", "assign": "balancer", "evaluate_plan": "balancer",
    "hindsight_assign": "balancer", "with_lengths": "balancer",
    "makespan_lower_bound": "bounds",
    "PlanConfig": "config",
    "CATALOG": "cost", "BillingRules": "cost", "CostSummary": "cost", "cost_run": "cost",
    "cost_serverful": "cost", "cost_step": "cost", "price": "cost",
    "plan_migrations": "migrate", "simulate_with_migration": "migrate",
    "ActorProgress": "records", "AssignmentPlan": "records", "Invocation": "records", "Migration": "records",
    "MigrationPlan": "records", "MigrationResult": "records", "PlanJob": "records", "ScalingCandidate": "records",
    "ScalingDecision": "records", "SeqProgress": "records",
    "choose": "scaler", "realized_plan": "scaler",
    "TimeModel": "timemodel",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlhfless.plan.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlhfless.plan' has no attribute {name!r}")


__all__ = [
    "CATALOG",
    "POLICIES",
    "ActorProgress",
    "AssignmentPlan",
    "BillingRules",
    "CostSummary",
    "Invocation",
    "JobArrays",
    "Migration",
    "MigrationPlan",
    "MigrationResult",
    "PlanConfig",
    "PlanJob",
    "ScalingCandidate",
    "ScalingDecision",
    "SeqProgress",
    "TimeModel",
    "assign",
    "choose",
    "cost_run",
    "cost_serverful",
    "cost_step",
    "evaluate_plan",
    "hindsight_assign",
    "makespan_lower_bound",
    "plan_migrations",
    "price",
    "realized_plan",
    "simulate_with_migration",
    "with_lengths",
]
