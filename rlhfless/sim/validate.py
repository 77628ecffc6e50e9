"""Validation: simulate a run recorded on this machine and compare with what it measured, per stage and mode.

Purpose: `validate(run_dir, calibrate_from=None)` -> report with `step_time_error` and `cost_error` (the largest
relative error of the mean over modes) and per-stage rows. A run dir is one run (`config.yaml`, `metrics.jsonl`,
`traces/rollouts.jsonl[.gz]`), or a comparison with `serverless/` and `serverful/` sub-runs.
  * Calibration (this machine's measurements, never the steps being validated): the CPU performance model's
    decode constants (bytes/s and per-iteration overhead of `PerfModel.decode_iter_s` for the tiny model) are
    fitted to measured `timing_s/decode` by non-negative least squares on per-step features computed from the
    trace with the planner's time model (`fit_decode`); prefill, update and the remaining loop seconds are linear
    in the tokens they process (`fit_linear`). Fitted on `calibrate_from` (another run) when given, else on the
    first half of the steps and validated on the second half.
  * Simulation: each validated step's groups, as recorded, through the same time model (inline: one engine
    batch; runtime modes: the planner's actor count per step from metrics) plus the fitted stage models.
  * Cost: inline = units x wall (serverful-like; units = train.threads cores); runtime runs: `cost/device_seconds`
    and `function/<kind>/billed_s` from metrics (or `invocations.jsonl`), simulated with `plan.cost`'s billing and
    cold starts measured in `workers.jsonl`. Fields that are absent are reported as such (`missing`), not guessed.

Non-goals: no per-token replay; no simulation of process start-up outside the steps.

Deviations from the paper: none (the paper validates Vidur against its GPUs; this validates against our CPU runs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlhfless.errors import DataError
from rlhfless.plan import PlanJob, TimeModel, assign
from rlhfless.plan.cost import BillingRules, billed_seconds_array
from rlhfless.sim.calibrate import cpu_decode_model, fit_linear
from rlhfless.sim.hardware import tiny_model
from rlhfless.sim.workload import StepWork, replay_trace

STAGES = ("rollout", "decode", "prefill", "update", "step")


@dataclass(frozen=True)
class RunData:
    """One recorded run: its mode, config, per-step metrics (by step), trace steps, runtime logs if any."""

    path: Path
    mode: str
    config: dict
    metrics: dict[int, dict]
    work: list[StepWork]
    invocations: list[dict]
    workers: list[dict]


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                raise DataError(f"{path}:{i}: not a JSON object") from None
    return out


def load_run(path: str | Path) -> RunData:
    """Read a run dir; a missing config, metrics or trace is a DataError naming the file."""
    import yaml

    p = Path(path)
    cfg_path = p / "config.yaml"
    if not cfg_path.is_file():
        raise DataError(f"validate: {cfg_path} not found (expected a run dir written by `rlhfless train`)")
    config = yaml.safe_load(cfg_path.read_text()) or {}
    rows = _jsonl(p / "metrics.jsonl")
    metrics = {r["step"]: r for r in rows if "timing_s/step" in r}
    if not metrics:
        raise DataError(f"validate: {p / 'metrics.jsonl'} has no step with timing_s/step")
    trace = next((t for t in (p / "traces" / "rollouts.jsonl", p / "traces" / "rollouts.jsonl.gz") if t.is_file()),
                 None)
    if trace is None:
        raise DataError(f"validate: no trace at {p / 'traces' / 'rollouts.jsonl'}[.gz]")
    work = [s for s in replay_trace(trace) if s.step in metrics]
    mode = (config.get("runtime") or {}).get("mode", "inline")
    return RunData(p, mode, config, metrics, work, _jsonl(p / "invocations.jsonl"), _jsonl(p / "workers.jsonl"))


def load_runs(path: str | Path) -> dict[str, RunData]:
    """A comparison dir (serverless/ and serverful/ sub-runs) or a single run, keyed by mode."""
    p = Path(path)
    if not p.is_dir():
        raise DataError(f"validate: run dir not found: {p}")
    subs = [p / m for m in ("serverless", "serverful", "inline") if (p / m / "config.yaml").is_file()]
    runs = [load_run(s) for s in subs] if subs else [load_run(p)]
    return {r.mode if len(runs) == 1 else r.path.name: r for r in runs}


# ---- per-step features --------------------------------------------------------------------------------
def _context(work: list[StepWork]) -> float:
    plen = np.mean([g.prompt_len for s in work for g in s.groups])
    return float(plen + np.mean([x for s in work for g in s.groups for x in g.lengths]) / 2)


def _jobs(step: StepWork) -> list[PlanJob]:
    return [PlanJob(g.prompt_id, len(g.lengths), tuple(float(x) for x in g.lengths), 0) for g in step.groups]


def decode_features(work: list[StepWork], n_actors: list[int], capacity: int, ctx: float) -> np.ndarray:
    """(steps, 2): per step, decode iterations of the slowest actor and the bytes the roofline moves on it, from
    the planner's time model with unit costs (iteration = 1 s; bytes at 1 byte/s, no overhead)."""
    ones = TimeModel((1, capacity), (1.0, 1.0), 0.0, 0.0, source="unit")
    pm = cpu_decode_model(tiny_model(), 1e30, 1.0, 0.0)
    per_byte = pm.time_model(capacity, ctx)
    out = np.zeros((len(work), 2))
    for i, (s, n) in enumerate(zip(work, n_actors)):
        jobs = _jobs(s)
        a, _ = assign(jobs, n, capacity, per_byte, "round_robin")
        b, _ = assign(jobs, n, capacity, ones, "round_robin")
        out[i] = (b.makespan_s, a.makespan_s)
    return out


def fit_decode(feats: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(bytes_per_s, iter_overhead_s) >= 0 with measured ~ overhead x iterations + bytes / bytes_per_s."""
    from scipy.optimize import nnls

    scale = feats.max(axis=0)
    coef, _ = nnls(feats / scale, measured)
    ov, inv_bw = coef / scale
    return (1.0 / inv_bw if inv_bw > 0 else 1e30), float(ov)


def trained_tokens(step: StepWork, skip_zero_variance: bool) -> float:
    """Prompt + response tokens the update processes (GRPO drops groups whose rewards are all equal)."""
    keep = [g for g in step.groups if not skip_zero_variance or not g.rewards or len(set(g.rewards)) > 1]
    return float(sum(g.tokens for g in keep))


def unique_prompt_tokens(step: StepWork) -> float:
    return float(sum(g.prompt_len for g in step.groups))


# ---- calibration ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageModel:
    """This machine's calibrated stage times (seconds) for the tiny model (module header)."""

    bytes_per_s: float
    iter_overhead_s: float
    prefill: tuple[float, float]  # intercept, seconds per unique prompt token
    update: tuple[float, float]  # intercept, seconds per trained token
    rollout_other_s: float  # rollout seconds beyond prefill + decode (sampling set-up, scoring of the batch)
    step_other_s: float  # step seconds beyond rollout + update (plan, reward, reference, observe, logging)
    fit: dict

    def time_model(self, capacity: int, ctx: float) -> TimeModel:
        return cpu_decode_model(tiny_model(), 1e30, self.bytes_per_s, self.iter_overhead_s).time_model(capacity, ctx)


def _measured(run: RunData, steps: list[StepWork], key: str) -> np.ndarray:
    return np.array([run.metrics[s.step].get(key) or 0.0 for s in steps], dtype=float)


def _actors(run: RunData, steps: list[StepWork]) -> tuple[list[int], int]:
    """Decode actors per step and their capacity: one engine batch inline, the planner's choice otherwise."""
    if run.mode == "inline":
        return [1] * len(steps), max(s.n_seqs for s in steps)
    cap = int((run.config.get("plan") or {}).get("capacity", 256))
    cap = max(cap, max(len(g.lengths) for s in steps for g in s.groups))
    return [max(1, int(run.metrics[s.step].get("scaler/num_actors") or 1)) for s in steps], cap


def calibrate(run: RunData, steps: list[StepWork], ctx: float) -> StageModel:
    """Fit the stage models on `steps` of `run` (module header)."""
    n, cap = _actors(run, steps)
    feats = decode_features(steps, n, cap, ctx)
    dec = _measured(run, steps, "timing_s/decode")
    bw, ov = fit_decode(feats, dec)
    pre = _measured(run, steps, "timing_s/prefill")
    p0, p1, perr = fit_linear(np.array([unique_prompt_tokens(s) for s in steps]), pre)
    skip = bool((run.config.get("algo") or {}).get("skip_zero_variance_groups", False))
    upd = _measured(run, steps, "timing_s/update")
    u0, u1, uerr = fit_linear(np.array([trained_tokens(s, skip) for s in steps]), upd)
    roll, step = _measured(run, steps, "timing_s/rollout"), _measured(run, steps, "timing_s/step")
    pred_dec = feats @ np.array([ov, 1.0 / bw])
    return StageModel(bw, ov, (p0, p1), (u0, u1), float(np.mean(roll - pre - dec)), float(np.mean(step - roll - upd)),
                      {"decode_median_abs_rel_err": float(np.median(np.abs(pred_dec / np.maximum(dec, 1e-9) - 1))),
                       "prefill_median_abs_rel_err": perr, "update_median_abs_rel_err": uerr,
                       "steps": len(steps)})


# ---- simulation and comparison ---------------------------------------------------------------------
def simulate_steps(run: RunData, steps: list[StepWork], sm: StageModel, ctx: float) -> dict[str, np.ndarray]:
    """Per-step simulated seconds of every stage (STAGES) for the recorded steps."""
    n, cap = _actors(run, steps)
    tm = sm.time_model(cap, ctx)
    skip = bool((run.config.get("algo") or {}).get("skip_zero_variance_groups", False))
    decode = np.array([assign(_jobs(s), k, cap, tm, "round_robin")[0].makespan_s for s, k in zip(steps, n)])
    prefill = np.array([sm.prefill[0] + sm.prefill[1] * unique_prompt_tokens(s) for s in steps])
    update = np.array([sm.update[0] + sm.update[1] * trained_tokens(s, skip) for s in steps])
    rollout = prefill + decode + sm.rollout_other_s
    return {"decode": decode, "prefill": prefill, "update": update, "rollout": rollout,
            "step": rollout + update + sm.step_other_s}


def _units(run: RunData) -> float:
    rt = run.config.get("runtime") or {}
    return float(rt.get("units") or (run.config.get("train") or {}).get("threads") or 1)


def cost_rows(run: RunData, steps: list[StepWork], sim: dict[str, np.ndarray]) -> dict:
    """Simulated vs measured device-seconds per step (mean), and per function kind where the run billed any."""
    units, measured_step = _units(run), _measured(run, steps, "timing_s/step")
    if run.mode in ("inline", "serverful"):
        meas = [run.metrics[s.step].get("cost/device_seconds") for s in steps]
        m = float(np.mean(meas)) if all(v is not None for v in meas) else float(units * measured_step.mean())
        return {"cost_device_s": _row(units * sim["step"].mean(), m),
                "note": "units x wall" + ("" if run.mode == "serverful" else " (inline: serverful-like)")}
    return _serverless_cost(run, steps, sim, units)


def _serverless_cost(run: RunData, steps: list[StepWork], sim: dict[str, np.ndarray], units: float) -> dict:
    """Serverless: each stage billed as invocations of `units` cores under the run's billing rules; cold starts
    measured in workers.jsonl (absent: none)."""
    billing = BillingRules(**(run.config.get("plan") or {}).get("billing", {}))
    cold = float(np.mean([w["cold_start_s"] for w in run.workers if w.get("cold_start_s") is not None] or [0.0]))
    kinds = {"decode": sim["decode"], "prefill": sim["prefill"], "learner": sim["update"]}
    out, total_sim = {}, 0.0
    for kind, secs in kinds.items():
        billed = billed_seconds_array(secs + cold, np.ones(len(secs), bool), cold, billing)
        total_sim += float((billed * units).mean())
        meas = [run.metrics[s.step].get(f"function/{kind}/billed_s") for s in steps]
        if all(v is not None for v in meas):
            out[f"function/{kind}/billed_s"] = _row(float(billed.mean()), float(np.mean(meas)))
        else:
            out[f"function/{kind}/billed_s"] = {"simulated": float(billed.mean()), "missing": "not in metrics.jsonl"}
    meas = [run.metrics[s.step].get("cost/device_seconds") for s in steps]
    if all(v is not None for v in meas):
        out["cost_device_s"] = _row(total_sim, float(np.mean(meas)))
    else:
        out["cost_device_s"] = {"simulated": total_sim, "missing": "cost/device_seconds not in metrics.jsonl"}
    return out


def _row(sim: float, meas: float) -> dict:
    return {"simulated": sim, "measured": meas, "rel_error": abs(sim / meas - 1.0) if meas else float("nan")}


def validate_mode(run: RunData, calib: RunData | None) -> dict:
    """One mode: calibrate (other run, or first half), simulate the validated steps, compare stage means."""
    work = run.work
    if calib is not None:
        cal_steps, val = calib.work, work
    else:
        if len(work) < 4:
            raise DataError(f"validate: {run.path} has {len(work)} steps; need >= 4 to calibrate on half")
        cal_steps, val = work[:len(work) // 2], work[len(work) // 2:]
    ctx = _context(work)
    sm = calibrate(calib or run, cal_steps, ctx)
    sim = simulate_steps(run, val, sm, ctx)
    stages = {}
    for st in STAGES:
        meas = _measured(run, val, f"timing_s/{st}")
        stages[st] = _row(float(sim[st].mean()), float(meas.mean()))
    tpot = tpot_profile_decode(run, val, ctx)
    if tpot is not None:  # the engine benchmark's profile alone, without fitting to this run: for reference
        stages["decode_from_tpot_profile"] = _row(tpot, float(_measured(run, val, "timing_s/decode").mean()))
    return {"mode": run.mode, "path": str(run.path), "steps_validated": len(val),
            "calibrated_on": str((calib or run).path) + ("" if calib else f" steps {cal_steps[0].step}.."
                                                         f"{cal_steps[-1].step}"),
            "calibration": {"bytes_per_s": sm.bytes_per_s, "iter_overhead_s": sm.iter_overhead_s,
                            "prefill": sm.prefill, "update": sm.update, "rollout_other_s": sm.rollout_other_s,
                            "step_other_s": sm.step_other_s, **sm.fit},
            "stages": stages, "cost": cost_rows(run, val, sim)}


def tpot_profile_decode(run: RunData, steps: list[StepWork], ctx: float) -> float | None:
    """Mean decode seconds of `steps` from the CPU model fitted to the shipped TPOT profile (None without it)."""
    from rlhfless.sim.calibrate import fit_cpu_decode

    profile = Path(__file__).resolve().parents[2] / "data" / "profiles" / "tpot_tiny_cpu.json"
    if not profile.is_file():
        return None
    pm, _ = fit_cpu_decode(profile, tiny_model())
    n, cap = _actors(run, steps)
    tm = pm.time_model(cap, ctx)
    return float(np.mean([assign(_jobs(s), k, cap, tm, "round_robin")[0].makespan_s for s, k in zip(steps, n)]))


def validate(run_dir: str | Path, calibrate_from: str | Path | None = None) -> dict:
    """The `--validate` report: per mode, and the largest step-time and cost errors over modes."""
    runs = load_runs(run_dir)
    calib = load_runs(calibrate_from) if calibrate_from else {}
    modes = {m: validate_mode(r, calib.get(m) or (next(iter(calib.values())) if calib else None))
             for m, r in runs.items()}
    step_err = max(m["stages"]["step"]["rel_error"] for m in modes.values())  # the reference row is not a mode
    costs = [m["cost"]["cost_device_s"].get("rel_error") for m in modes.values()]
    cost_err = max((c for c in costs if c is not None), default=float("nan"))
    return {"run_dir": str(run_dir), "modes": modes, "step_time_error": step_err, "cost_error": cost_err}
