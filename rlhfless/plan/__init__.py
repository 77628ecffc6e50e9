"""The planner: cost model + price catalog, length-aware assignment, cut-and-migrate, cost-aware actor scaling.

Pure and fast; the same code drives the real runtime and the simulator. Entry points:
`assign` (balancer), `plan_migrations` / `simulate_with_migration` (migrate), `choose` / `realized_plan` (scaler),
`cost_step` / `cost_serverful` (cost), `hindsight_assign` / `makespan_lower_bound` (references for
scoring a decision), `TimeModel` (continuous-batching time model), `PlanConfig`.
"""

from rlhfless.plan.balancer import (
    POLICIES,
    JobArrays,
    assign,
    evaluate_plan,
    hindsight_assign,
    with_lengths,
)
from rlhfless.plan.bounds import makespan_lower_bound
from rlhfless.plan.config import PlanConfig
from rlhfless.plan.cost import (
    CATALOG,
    BillingRules,
    CostSummary,
    cost_run,
    cost_serverful,
    cost_step,
    price,
)
from rlhfless.plan.migrate import plan_migrations, simulate_with_migration
from rlhfless.plan.records import (
    ActorProgress,
    AssignmentPlan,
    Invocation,
    Migration,
    MigrationPlan,
    MigrationResult,
    PlanJob,
    ScalingCandidate,
    ScalingDecision,
    SeqProgress,
)
from rlhfless.plan.scaler import choose, realized_plan
from rlhfless.plan.timemodel import TimeModel

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
