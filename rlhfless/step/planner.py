"""Per-step planning glue for the loop: predict lengths, choose N and the assignment, then score the decision.

    plan_step:    predictor.predict -> PlanJob per group -> plan.choose (scaler over N, assignment per N)
    observe_step: predictor metrics on the actual lengths; the chosen placement re-simulated with the true lengths
                  ("realized"), the same policy fed the true lengths ("hindsight") and a lower bound no plan
                  beats (plan.bounds); predictor.update

Inline (runtime.mode=inline) the rollout runs as ONE local engine batch and the plan is only logged and scored;
with runtime.mode=serverless the runtime executes it: N decode functions, each running exactly its assigned
groups, with live cut-and-migrate (rlhfless.runtime). Either way the decision is scored against the time model
with the true lengths. The runtime replaces the assumed cold start and weight-sync seconds with measured ones
(`calibrate`), and the configured time profile with one measured on this machine for its workers (`use_profile`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from rlhfless.core import metrics as M
from rlhfless.core.outpaths import REPO_ROOT
from rlhfless.plan import (
    PlanConfig,
    PlanJob,
    ScalingDecision,
    TimeModel,
    choose,
    hindsight_assign,
    makespan_lower_bound,
    realized_plan,
)
from rlhfless.predictor import (
    Observation,
    Prediction,
    build_predictor,
    prediction_table,
    step_metrics,
)
from rlhfless.predictor.config import PredictorConfig
from rlhfless.core.records import PromptGroup, Sample


@dataclass
class StepPlan:
    """The planner's decision for one step, before rollout."""

    prediction: Prediction
    jobs: list[PlanJob]
    decision: ScalingDecision


class Planner:
    """Holds the length predictor (stateful across steps) and the planner config/time model (pure)."""

    def __init__(self, predictor_cfg: PredictorConfig, plan_cfg: PlanConfig):
        self.predictor = build_predictor(predictor_cfg)
        profile = plan_cfg.time_profile
        if profile and not Path(profile).exists() and (REPO_ROOT / profile).exists():
            plan_cfg = replace(plan_cfg, time_profile=str(REPO_ROOT / profile))
        self.cfg = plan_cfg
        self.base_time_model: TimeModel = plan_cfg.time_model()
        self.time_model: TimeModel = self.base_time_model

    def use_profile(self, time_model: TimeModel) -> None:
        """Price with `time_model` from now on (the runtime's profile measured on this machine); the per-step scale
        calibration starts again on top of it."""
        self.base_time_model = self.time_model = time_model

    def calibrate(self, cold_start_s: float | None = None, weight_sync_s: float | None = None,
                  time_scale: float | None = None) -> None:
        """Replace the assumed cold start / weight-sync seconds with measured ones, and scale the time model's
        durations by measured / predicted decode busy time (the runtime does this every step)."""
        changes = {k: v for k, v in (("cold_start_s", cold_start_s), ("weight_sync_s", weight_sync_s)) if v is not None}
        if changes:
            self.cfg = replace(self.cfg, **changes)
        if time_scale is not None:
            self.time_model = self.base_time_model.scaled(time_scale)

    def plan_step(self, groups: list[PromptGroup], n_warm: int = 0) -> tuple[StepPlan, dict]:
        """n_warm: decode functions kept warm from the last step (they start without a cold start)."""
        pred = self.predictor.predict([g.prompt.prompt_id for g in groups], [g.prompt.text for g in groups])
        jobs = [PlanJob(g.prompt.prompt_id, g.group_size, max(1.0, float(m)), len(g.token_ids))
                for g, m in zip(groups, pred.mean)]
        decision, metrics = choose(jobs, self.cfg, self.time_model, n_warm=n_warm)
        return StepPlan(pred, jobs, decision), metrics

    def observe_step(self, sp: StepPlan, groups: list[PromptGroup], samples: list[Sample], epoch: int,
                     step: int) -> tuple[list, dict[str, float]]:
        """Score the decision with the true lengths and update the predictor; returns (table rows, metrics)."""
        G = groups[0].group_size
        actual = [[s.response_len for s in samples[g * G:(g + 1) * G]] for g in range(len(groups))]
        metrics = step_metrics(sp.prediction, actual)
        true_jobs = [PlanJob(j.group_id, j.n_seqs, tuple(float(x) for x in lens), j.prompt_len)
                     for j, lens in zip(sp.jobs, actual)]
        realized = realized_plan(sp.decision, true_jobs, self.time_model, self.cfg.tau)
        by_id = {j.group_id: j.predicted_len for j in true_jobs}
        n = sp.decision.n_actors
        hindsight, _ = hindsight_assign(sp.jobs, lambda j: by_id[j.group_id], n, self.cfg.capacity,
                                        self.time_model, self.cfg.policy)
        bound = makespan_lower_bound(true_jobs, n, self.cfg.capacity, self.time_model,
                                     split_jobs=sp.decision.migration is not None)
        metrics.update({
            M.PLAN_REALIZED_MAKESPAN_S: realized.makespan_s,
            M.PLAN_REALIZED_IMBALANCE: realized.imbalance,
            M.PLAN_HINDSIGHT_MAKESPAN_S: hindsight.makespan_s,
            M.PLAN_MAKESPAN_VS_HINDSIGHT: realized.makespan_s / max(hindsight.makespan_s, 1e-12),
            M.PLAN_MAKESPAN_LOWER_BOUND_S: bound,
            M.PLAN_MAKESPAN_VS_LOWER_BOUND: realized.makespan_s / max(bound, 1e-12),
        })
        self.predictor.update([Observation(g.prompt.prompt_id, g.prompt.text, tuple(a), epoch, step)
                               for g, a in zip(groups, actual)])
        return prediction_table(sp.prediction, actual), metrics


def cut_report(rows: list[dict]) -> dict:
    """What a run's planner did with cut-and-migrate, from its metrics rows (`metrics.jsonl`, every segment of a
    resumed run): in how many steps it weighed cuts at tau and kept them, the rows the runtime really moved, and
    the reason recorded where the scaler decided (`plan.scaler.cut_reason`) for the steps it kept none."""
    weighed = [r for r in rows if r.get(M.BAL_MIGRATE_REASON)]
    reasons = Counter(r[M.BAL_MIGRATE_REASON] for r in weighed)
    return {"steps_weighed": len(weighed), "steps_kept": reasons.pop("kept", 0),
            "rows_moved": int(sum(r.get(M.RUNTIME_MIGRATED_SEQS) or 0 for r in rows)),
            "why_not": dict(sorted(reasons.items()))}


def tau_per_step(rows: list[dict]) -> dict[str, float | None]:
    """`predictor/kendall_tau` of every step, keyed by the step as text (JSON's and W&B's summary keys); None where
    undefined: no history yet, every prompt predicted alike."""
    return {str(r["step"]): r.get(M.PRED_KENDALL) for r in rows if M.PRED_MAE in r}
