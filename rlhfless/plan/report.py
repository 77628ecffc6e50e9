"""Planner report on a recorded length trace, with TRUE lengths (hindsight: every decision sees them).

Purpose: `trace_report(trace_path, cfg, n_actors, steps)` answers the planner's two target questions on a real
trace: (1) at a fixed number of actors, how much predicted idle device time does each assignment policy leave
(round-robin vs contiguous vs LPT vs Karmarkar-Karp, with and without cut-and-migrate at tau), and (2) what
does the scaler choose and what are its T and C against every fixed N. Steps are the trace's (epoch, step)
pairs; the prompt groups of a step become jobs (one per prompt, n_seqs = its samples, true per-sample lengths).
The fixed-N baselines keep their N actors warm after the first step; the scaler's warm pool is its previous
choice (functions pre-warmed from invocation history). Everything is predicted by the time model.

Non-goals: no plotting (the notebooks plot from this JSON), no prediction error (`rlhfless.predictor.evaluate`
does that).

Deviations from the paper: none beyond the planner's own (see its modules).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.plan.balancer import POLICIES, JobArrays, assign
from rlhfless.plan.config import PlanConfig
from rlhfless.plan.migrate import simulate_with_migration
from rlhfless.plan.records import PlanJob
from rlhfless.plan.scaler import choose, evaluate_candidate
from rlhfless.plan.timemodel import TimeModel
from rlhfless.core.records import TraceRow
from rlhfless.core.traces import read_trace


def trace_steps(rows: list[TraceRow], steps: str = "last_epoch") -> dict[tuple[int, int], list[PlanJob]]:
    """Jobs of each (epoch, step) with true lengths; `steps` = "last_epoch" (default) or "all"."""
    if steps not in ("last_epoch", "all"):
        raise ConfigError(f"steps: must be 'last_epoch' or 'all' (got {steps!r})")
    if not rows:
        raise DataError("trace is empty: no rows to plan")
    last = max(r.epoch for r in rows)
    groups: dict[tuple[int, int], dict[str, list[TraceRow]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if steps == "all" or r.epoch == last:
            groups[(r.epoch, r.step)][r.prompt_id].append(r)
    out = {}
    for key in sorted(groups):
        out[key] = [
            PlanJob(pid, len(rs), tuple(float(r.response_len) for r in sorted(rs, key=lambda r: r.sample)),
                    max(r.prompt_len for r in rs))
            for pid, rs in sorted(groups[key].items())
        ]
    return out


def _policy_rows(ja: JobArrays, n: int, cfg: PlanConfig, tm: TimeModel) -> dict[str, dict[str, float]]:
    rows = {}
    for pol in POLICIES:
        plan, _ = assign(ja, n, cfg.capacity, tm, pol)
        row = {"makespan_s": plan.makespan_s, "idle_device_s": plan.idle_device_s, "imbalance": plan.imbalance,
               "busy_device_s": sum(plan.busy_s)}
        if cfg.migrate:
            res, _ = simulate_with_migration(plan, tm, cfg.tau)
            row.update({"migrate_makespan_s": res.makespan_s, "migrate_idle_device_s": res.idle_device_s,
                        "migrate_busy_device_s": sum(res.busy_s), "migrations": float(len(res.moves))})
        rows[pol] = row
    return rows


def trace_report(trace_path: str | Path, cfg: PlanConfig | None = None, n_actors: int | None = None,
                 steps: str = "last_epoch", time_model: TimeModel | None = None) -> dict:
    """Compare policies at n_actors (default cfg.max_actors) and the scaler vs every fixed N, per step and in
    total, on a TraceRow JSONL trace with true lengths. Returns a JSON-ready dict: seconds are summed over the
    steps, `mean_imbalance` is averaged; `idle_reduction_vs_round_robin[p]` = round-robin idle / p's idle."""
    cfg = cfg or PlanConfig()
    tm = time_model or cfg.time_model()
    n = n_actors or cfg.max_actors
    rows = list(read_trace(trace_path))
    if not rows:
        raise DataError(f"{trace_path}: trace is empty: no rows to plan")
    per_step = trace_steps(rows, steps)
    totals = {p: defaultdict(float) for p in POLICIES}
    fixed = {k: defaultdict(float) for k in cfg.candidates()}
    scaler = defaultdict(float)
    chosen, prev = [], 0
    for i, (key, jobs) in enumerate(per_step.items()):
        ja = JobArrays.from_jobs(jobs)
        for pol, row in _policy_rows(ja, n, cfg, tm).items():
            for k, v in row.items():
                totals[pol][k] += v
        for k in cfg.candidates():
            cand, _ = evaluate_candidate(ja, k, cfg, tm, n_warm=k if i else 0)
            fixed[k]["step_s"] += cand.step_s
            fixed[k]["cost_usd"] += cand.cost_usd
            fixed[k]["gpu_seconds"] += cand.gpu_seconds
        decision, _ = choose(ja, cfg, tm, n_warm=prev)
        prev = decision.n_actors
        c = decision.chosen
        chosen.append({"epoch": key[0], "step": key[1], "n_actors": c.n_actors, "step_s": c.step_s,
                       "cost_usd": c.cost_usd, "gpu_seconds": c.gpu_seconds})
        for k in ("step_s", "cost_usd", "gpu_seconds"):
            scaler[k] += getattr(c, k)
    rr_idle = totals["round_robin"]["idle_device_s"]
    return {
        "what": "seconds predicted by the planner's time model (profile: time_model) on the trace's true "
                "lengths, not measured seconds",
        "trace": str(trace_path), "steps": len(per_step), "selection": steps, "n_actors": n,
        "sequences": sum(j.n_seqs for js in per_step.values() for j in js),
        "time_model": tm.source, "policy": cfg.policy, "tau": cfg.tau if cfg.migrate else None,
        "lam": cfg.lam, "gpu_kind": cfg.gpu_kind,
        "policies": {p: {**{k: x for k, x in v.items() if k != "imbalance"},
                         "mean_imbalance": v["imbalance"] / max(len(per_step), 1)} for p, v in totals.items()},
        "idle_reduction_vs_round_robin": {
            p: (rr_idle / v["idle_device_s"] if v["idle_device_s"] > 0 else None) for p, v in totals.items()
        },
        "scaler": {"total": dict(scaler), "chosen": chosen},
        "fixed_n": [{"n_actors": k, **dict(v)} for k, v in fixed.items()],
    }
