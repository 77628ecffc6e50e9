"""Validation: simulate a run recorded on this machine and compare with what it measured, per stage and mode.

`validate(run_dir, calibrate_from=None)` -> report with `step_time_error`, `cost_error` and per-stage rows, for one
run or a comparison (`serverful/`, `serverful-overlap/`, `serverless/`); a comparison with the runtime's records is
also played by the arm model (`rlhfless.sim.armmodel`, `errors_from: arms`), else by the stage model
(`errors_from: modes`). The rule it keeps: the stage models are fitted on calibration steps (another run, or the
alternate steps) and never on the steps being validated; absent fields are reported `missing`, not guessed.
Calibration, simulation, cost and PPO's ratios in full: docs/internals.md#simvalidatepy.

Deviations from the paper: none (the paper validates Vidur against its GPUs; this validates against our CPU runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.core.rundir import RunDir
from rlhfless.plan import PlanJob, TimeModel, assign
from rlhfless.sim.calibrate import cpu_decode_model, fit_linear
from rlhfless.sim.hardware import tiny_model
from rlhfless.sim.workload import StepWork, replay_trace

STAGES = ("rollout", "decode", "prefill", "update", "step")
PPO_STAGES = ("rollout", "decode", "prefill", "values", "update", "step")
ALGOS = ("grpo", "ppo")


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
    algo: str = "grpo"


def load_run(path: str | Path) -> RunData:
    """Read a run dir; a missing config, metrics or trace is a DataError naming the file."""
    from rlhfless.core.configbase import load_yaml

    p = Path(path)
    cfg_path = RunDir(p).config
    if not cfg_path.is_file():
        raise DataError(f"validate: {cfg_path} not found (expected the --out folder of a `rlhfless train --out DIR` run)")
    config = load_yaml(cfg_path)  # bounded: a run folder from elsewhere is untrusted input
    run = RunDir(p)
    metrics = run.read_step_metrics()
    if not metrics:
        raise DataError(f"validate: {p / 'metrics.jsonl'} has no step with timing_s/step")
    trace = run.rollouts
    if trace is None:
        raise DataError(f"validate: no trace at {p / 'traces' / 'rollouts.jsonl'}[.gz]")
    work = [s for s in replay_trace(trace) if s.step in metrics]
    mode = (config.get("runtime") or {}).get("mode", "inline")
    algo = run_algo(config, cfg_path, mode)
    if algo == "ppo" and not any("timing_s/values" in r for r in metrics.values()):
        raise DataError(f"validate: {p / 'metrics.jsonl'}: algo.name is ppo but no step has timing_s/values (the "
                        "critic's forward, timed by rlhfless.step.loop)")
    return RunData(p, mode, config, metrics, work, run.read_invocations(), run.read_workers(), algo)


def run_algo(config: dict, cfg_path: Path, mode: str) -> str:
    """`algo.name` of a run's config.yaml (runs recorded before the key: grpo); a DataError naming the field for
    an algorithm the simulator does not model, PPO outside inline mode, or PPO's epochs / mini-batches not >= 1."""
    algo = config.get("algo") or {}
    if not isinstance(algo, dict):
        raise DataError(f"validate: {cfg_path}: algo must be a mapping (got {type(algo).__name__})")
    name = algo.get("name", "grpo")
    if name not in ALGOS:
        raise DataError(f"validate: {cfg_path}: algo.name {name!r} is not one the simulator models "
                        f"({', '.join(ALGOS)})")
    if name == "ppo":
        if mode != "inline":
            raise DataError(f"validate: {cfg_path}: algo.name ppo with runtime.mode {mode!r}: only inline PPO runs "
                            "are validated (the arm model has no value or critic functions, and there the actor and "
                            "the critic update side by side); validate an inline PPO run")
        for key in ("ppo_epochs", "ppo_mini_batches"):
            v = algo.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DataError(f"validate: {cfg_path}: algo.{key} must be an integer >= 1 for a PPO run (got {v!r})")
        kl = algo.get("kl_coef", 0.0)
        if isinstance(kl, bool) or not isinstance(kl, (int, float)) or not kl >= 0:
            raise DataError(f"validate: {cfg_path}: algo.kl_coef must be a number >= 0 (got {kl!r})")
    return name


def load_runs(path: str | Path) -> dict[str, RunData]:
    """A comparison dir (serverless/ and serverful/ sub-runs) or a single run, keyed by mode."""
    p = Path(path)
    if not p.is_dir():  # "not found" only of what does not exist
        raise DataError(f"validate: run dir not found: {p}" if not p.exists() else
                        f"validate: {p} is a file; give a run folder (the --out of `rlhfless train`)")
    subs = [p / m for m in ("serverless", "serverful", "serverful-overlap", "inline")
            if RunDir(p / m).config.is_file()]
    runs = [load_run(s) for s in subs] if subs else [load_run(p)]
    return {r.mode if len(runs) == 1 else r.path.name: r for r in runs}  # serverful-overlap: by its folder


# ---- per-step features --------------------------------------------------------------------------------
def _context(work: list[StepWork]) -> float:
    plen = np.mean([g.prompt_len for s in work for g in s.groups])
    return float(plen + np.mean([x for s in work for g in s.groups for x in g.lengths]) / 2)


def _jobs(step: StepWork) -> list[PlanJob]:
    return [PlanJob(g.prompt_id, len(g.lengths), tuple(float(x) for x in g.lengths), 0) for g in step.groups]


def decode_features(work: list[StepWork], n_actors: list[int], capacity: int, ctx: float,
                    policy: str = "round_robin") -> np.ndarray:
    """(steps, 2): per step, decode iterations of the slowest actor and the bytes the roofline moves on it, from
    the planner's time model with unit costs (iteration = 1 s; bytes at 1 byte/s, no overhead)."""
    ones = TimeModel((1, capacity), (1.0, 1.0), 0.0, 0.0, source="unit")
    pm = cpu_decode_model(tiny_model(), 1e30, 1.0, 0.0)
    per_byte = pm.time_model(capacity, ctx)
    out = np.zeros((len(work), 2))
    for i, (s, n) in enumerate(zip(work, n_actors)):
        jobs = _jobs(s)
        a, _ = assign(jobs, n, capacity, per_byte, policy)
        b, _ = assign(jobs, n, capacity, ones, policy)
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


def skips_groups(config: dict) -> bool:
    """Whether the run's update dropped zero-variance groups: GRPO's switch (PPO trains every sequence)."""
    algo = config.get("algo") or {}
    return algo.get("name", "grpo") == "grpo" and bool(algo.get("skip_zero_variance_groups", False))


def unique_prompt_tokens(step: StepWork) -> float:
    return float(sum(g.prompt_len for g in step.groups))


def ppo_update_features(steps: list[StepWork], config: dict) -> np.ndarray:
    """(steps, 2): per step, the tokens PPO's update passes over (prompt + response of every sequence x epochs)
    and its optimiser steps (epochs x mini-batches, each one actor and one critic step; `rlhfless.learn.ppo_update`).
    Tokens, not the padded batch: on four 20-step quickstart_ppo runs (docs/simulator.md, A-D) the padded count
    (rows x (longest prompt + longest response)) validated worse on three, for the update and for the values."""
    algo = config["algo"]
    ep, mb = int(algo["ppo_epochs"]), int(algo["ppo_mini_batches"])
    return np.array([(ep * trained_tokens(s, False), ep * min(mb, s.n_seqs)) for s in steps], dtype=float)


def fit_ppo_update(feats: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    """(seconds per token-pass, seconds per optimiser step, median |relative error|), both >= 0, of measured ~
    feats @ coef. With one run's fixed epochs and mini-batches the second term is the intercept."""
    from scipy.optimize import nnls

    scale = np.maximum(feats.max(axis=0), 1e-30)
    coef, _ = nnls(feats / scale, measured)
    coef = coef / scale
    pred = feats @ coef
    return float(coef[0]), float(coef[1]), float(np.median(np.abs(pred / np.maximum(measured, 1e-12) - 1)))


# ---- calibration ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageModel:
    """This machine's calibrated stage times (seconds) for the tiny model (docs/internals.md#simvalidatepy)."""

    bytes_per_s: float
    iter_overhead_s: float
    prefill: tuple[float, float]  # intercept, seconds per unique prompt token
    update: tuple[float, float]  # intercept, seconds per trained token
    rollout_other_s: float  # rollout seconds beyond prefill + decode (sampling set-up, scoring of the batch)
    step_other_s: float  # step seconds beyond rollout + update (plan, reward, reference, observe, logging)
    fit: dict
    values: tuple[float, float] | None = None  # PPO: intercept, seconds per token of the critic's forward
    ppo_update: tuple[float, float] | None = None  # PPO: s per token-pass, s per optimiser step

    def time_model(self, capacity: int, ctx: float) -> TimeModel:
        return cpu_decode_model(tiny_model(), 1e30, self.bytes_per_s, self.iter_overhead_s).time_model(capacity, ctx)


def _measured(run: RunData, steps: list[StepWork], key: str) -> np.ndarray:
    return np.array([run.metrics[s.step].get(key) or 0.0 for s in steps], dtype=float)


def _workers(run: RunData, step: int, kind: str) -> tuple[int, float]:
    """(workers, units per worker) that ran `kind` in `step`, from invocations.jsonl ((0, 1.0) when absent)."""
    rows = [i for i in run.invocations if i.get("step") == step and i.get("kind") == kind and i.get("ok", True)]
    units = {i.get("worker"): float(i.get("units") or 1.0) for i in rows}
    return len(units), (float(np.mean(list(units.values()))) if units else 1.0)


def _actors(run: RunData, steps: list[StepWork]) -> tuple[list[int], int]:
    """Decode actors per step and their capacity: one engine batch inline; otherwise the decode workers the run
    logged (invocations.jsonl, else `runtime/decode_actors`, else the planner's `scaler/num_actors`)."""
    if run.mode == "inline":
        return [1] * len(steps), max(s.n_seqs for s in steps)
    cap = int((run.config.get("plan") or {}).get("capacity", 256))
    cap = max(cap, max(len(g.lengths) for s in steps for g in s.groups))
    out = []
    for s in steps:
        m = run.metrics[s.step]
        n = _workers(run, s.step, "decode")[0] or m.get("runtime/decode_actors") or m.get("scaler/num_actors") or 1
        out.append(max(1, int(n)))
    return out, cap


def _policy(run: RunData) -> str:
    return "round_robin" if run.mode == "inline" else str((run.config.get("plan") or {}).get("policy", "contiguous"))


def calibrate(run: RunData, steps: list[StepWork], ctx: float) -> StageModel:
    """Fit the stage models on `steps` of `run` (docs/internals.md#simvalidatepy)."""
    n, cap = _actors(run, steps)
    feats = decode_features(steps, n, cap, ctx, _policy(run))
    dec = _measured(run, steps, "timing_s/decode")
    bw, ov = fit_decode(feats, dec)
    pred_dec = feats @ np.array([ov, 1.0 / bw])
    derr = float(np.median(np.abs(pred_dec / np.maximum(dec, 1e-9) - 1)))
    pre = _measured(run, steps, "timing_s/prefill")
    p0, p1, perr = fit_linear(np.array([unique_prompt_tokens(s) for s in steps]), pre)
    if run.algo == "ppo":
        return _calibrate_ppo(run, steps, (bw, ov, derr), (p0, p1, perr), dec, pre)
    skip = skips_groups(run.config)
    upd = _measured(run, steps, "timing_s/update")
    u0, u1, uerr = fit_linear(np.array([trained_tokens(s, skip) for s in steps]), upd)
    roll, step = _measured(run, steps, "timing_s/rollout"), _measured(run, steps, "timing_s/step")
    return StageModel(bw, ov, (p0, p1), (u0, u1), float(np.mean(roll - pre - dec)), float(np.mean(step - roll - upd)),
                      {"decode_median_abs_rel_err": derr, "prefill_median_abs_rel_err": perr,
                       "update_median_abs_rel_err": uerr, "steps": len(steps)})


def _calibrate_ppo(run: RunData, steps: list[StepWork], decode: tuple[float, float, float],
                   prefill: tuple[float, float, float], dec: np.ndarray, pre: np.ndarray) -> StageModel:
    """PPO's stage models: decode and prefill as GRPO's, the values stage linear in the trained tokens, the update
    on `ppo_update_features`; the step's remainder (plan, reward, reference, observe) a mean."""
    val = _measured(run, steps, "timing_s/values")
    v0, v1, verr = fit_linear(np.array([trained_tokens(s, False) for s in steps]), val)
    upd = _measured(run, steps, "timing_s/update")
    ut, uo, uerr = fit_ppo_update(ppo_update_features(steps, run.config), upd)
    roll, step = _measured(run, steps, "timing_s/rollout"), _measured(run, steps, "timing_s/step")
    bw, ov, derr = decode
    return StageModel(bw, ov, prefill[:2], (0.0, 0.0), float(np.mean(roll - pre - dec)),
                      float(np.mean(step - roll - val - upd)),
                      {"decode_median_abs_rel_err": derr, "prefill_median_abs_rel_err": prefill[2],
                       "values_median_abs_rel_err": verr, "update_median_abs_rel_err": uerr, "steps": len(steps)},
                      values=(v0, v1), ppo_update=(ut, uo))


# ---- simulation and comparison ---------------------------------------------------------------------
def simulate_steps(run: RunData, steps: list[StepWork], sm: StageModel, ctx: float) -> dict[str, np.ndarray]:
    """Per-step simulated seconds of every stage (STAGES) for the recorded steps, plus `decode_busy`: the decode
    actors' busy seconds summed (what serverless decode workers are billed for, before overheads)."""
    n, cap = _actors(run, steps)
    tm = sm.time_model(cap, ctx)
    skip = skips_groups(run.config)
    plans = [assign(_jobs(s), k, cap, tm, _policy(run))[0] for s, k in zip(steps, n)]
    decode = np.array([p.makespan_s for p in plans])
    prefill = np.array([sm.prefill[0] + sm.prefill[1] * unique_prompt_tokens(s) for s in steps])
    update = np.array([sm.update[0] + sm.update[1] * trained_tokens(s, skip) for s in steps])
    rollout = prefill + decode + sm.rollout_other_s
    out = {"decode": decode, "prefill": prefill, "update": update, "rollout": rollout,
           "step": rollout + update + sm.step_other_s, "decode_busy": np.array([sum(p.busy_s) for p in plans])}
    if run.algo == "ppo":
        if sm.values is None or sm.ppo_update is None:
            raise DataError(f"validate: {run.path} is a PPO run but its calibration run is not (no values stage)")
        out["values"] = np.array([sm.values[0] + sm.values[1] * trained_tokens(s, False) for s in steps])
        out["update"] = ppo_update_features(steps, run.config) @ np.array(sm.ppo_update)
        out["step"] = rollout + out["values"] + out["update"] + sm.step_other_s
    return out


def _units(run: RunData) -> float:
    rt = run.config.get("runtime") or {}
    return float(rt.get("units") or (run.config.get("train") or {}).get("threads") or 1)


def _measured_cost(run: RunData, steps: list[StepWork]) -> np.ndarray | None:
    vals = [run.metrics[s.step].get("cost/device_seconds") for s in steps]
    return np.array(vals, float) if all(v is not None for v in vals) else None


def cost_rows(run: RunData, cal_run: RunData, cal: list[StepWork], val: list[StepWork], sm: StageModel,
              ctx: float, sim: dict[str, np.ndarray]) -> dict:
    """Simulated vs measured device-seconds per step (mean) and, for serverless runs, per function kind; what is
    fitted is fitted on `cal` steps of `cal_run`, never on the validated steps."""
    if run.mode == "serverless":
        return _serverless_cost(run, cal_run, cal, val, sm, ctx, sim)
    meas = _measured_cost(run, val)
    if run.mode == "inline" or meas is None:
        units = _units(run)
        m = float(meas.mean()) if meas is not None else units * float(_measured(run, val, "timing_s/step").mean())
        return {"cost_device_s": _row(units * float(sim["step"].mean()), m),
                "note": f"{units:g} units x wall" + (" (inline: serverful-like)" if run.mode == "inline" else "")}
    pool = _pool_units(run, cal_run, cal)
    return {"cost_device_s": _row(pool * float(sim["step"].mean()), float(meas.mean())),
            "note": f"serverful pool of {pool:g} units x wall"}


def _pool_units(run: RunData, cal_run: RunData, cal: list[StepWork]) -> float:
    """Units the serverful pool holds: workers.jsonl (workers hosting several kinds), else the config, else the
    calibration steps' billed device-seconds per second of wall time."""
    pool = [w for w in run.workers if len(w.get("kinds") or ()) > 1]
    if pool:
        return float(sum(float(w.get("units") or 1.0) for w in pool))
    rt = run.config.get("runtime") or {}
    if rt.get("serverful_workers") or rt.get("units"):
        return float(rt.get("serverful_workers") or rt.get("units"))
    meas = _measured_cost(cal_run, cal)
    if meas is None:
        raise DataError(f"validate: {run.path}: serverful pool size unknown (no workers.jsonl, runtime.units 0 and no "
                        "cost/device_seconds)")
    return float(np.mean(meas / _measured(cal_run, cal, "timing_s/step")))


_BUSY = {"decode": "decode_busy", "prefill": "prefill", "learner": "update"}  # billed kind -> simulated busy


def _kind_busy(run: RunData, steps: list[StepWork], sim: dict[str, np.ndarray], kind: str) -> tuple[np.ndarray, ...]:
    """(busy device-seconds, workers) per step of `kind`: decode actors' summed busy x units; prefill and learner
    busy x their workers' units (a data-parallel learner keeps every rank busy for the update)."""
    wk = [_workers(run, s.step, kind) for s in steps]
    n = np.array([max(w[0], 1) for w in wk], float)
    units = np.array([w[1] for w in wk])
    busy = sim[_BUSY[kind]] * units * (1.0 if kind == "decode" else n)
    return busy, n


def _serverless_cost(run: RunData, cal_run: RunData, cal: list[StepWork], val: list[StepWork], sm: StageModel,
                     ctx: float, sim: dict[str, np.ndarray]) -> dict:
    """Serverless, the runtime's rule (a worker is billed request to release, x units): simulated busy
    device-seconds per kind plus a per-worker overhead (cold start, pre-warm, keep-alive, idle) fitted on the
    calibration steps from `function/<kind>/billed_s`; kinds the run did not bill are reported as missing."""
    sim_cal = simulate_steps(cal_run, cal, sm, ctx)
    out, total = {}, np.zeros(len(val))
    for kind in _BUSY:
        key = f"function/{kind}/billed_s"
        meas_cal = [cal_run.metrics[s.step].get(key) for s in cal]
        meas_val = [run.metrics[s.step].get(key) for s in val]
        if any(v is None for v in meas_cal + meas_val):
            out[key] = {"missing": f"{key} not in metrics.jsonl (the run has no worker of that kind)"}
            continue
        busy_c, n_c = _kind_busy(cal_run, cal, sim_cal, kind)
        overhead = max(0.0, float(np.mean((np.array(meas_cal) - busy_c) / n_c)))
        busy_v, n_v = _kind_busy(run, val, sim, kind)
        billed = busy_v + n_v * overhead
        total += billed
        out[key] = {**_row(float(billed.mean()), float(np.mean(meas_val))), "overhead_per_worker_s": overhead}
    meas = _measured_cost(run, val)
    out["cost_device_s"] = (_row(float(total.mean()), float(meas.mean())) if meas is not None else
                            {"simulated": float(total.mean()), "missing": "cost/device_seconds not in metrics.jsonl"})
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
            raise DataError(f"validate: {run.path} has {len(work)} steps; need >= 4 to calibrate on alternate steps")
        cal_steps, val = work[0::2], work[1::2]  # alternate steps: see armmodel.split_steps
    if calib is not None and calib.algo != run.algo:
        raise DataError(f"validate: {run.path} is a {run.algo} run (algo.name) but the calibration run {calib.path} "
                        f"is {calib.algo}: their learner stages differ")
    ctx = _context(work)
    sm = calibrate(calib or run, cal_steps, ctx)
    sim = simulate_steps(run, val, sm, ctx)
    stages = {}
    for st in (PPO_STAGES if run.algo == "ppo" else STAGES):
        meas = _measured(run, val, f"timing_s/{st}")
        stages[st] = _row(float(sim[st].mean()), float(meas.mean()))
    tpot = tpot_profile_decode(run, val, ctx)
    if tpot is not None:  # the engine benchmark's profile alone, without fitting to this run: for reference
        stages["decode_from_tpot_profile"] = _row(tpot, float(_measured(run, val, "timing_s/decode").mean()))
    out = {"mode": run.mode, "path": str(run.path), "steps_validated": len(val),
           "calibrated_on": str((calib or run).path) + ("" if calib else " alternate steps from "
                                                        f"{cal_steps[0].step}"),
           "calibration": {"bytes_per_s": sm.bytes_per_s, "iter_overhead_s": sm.iter_overhead_s,
                           "prefill": sm.prefill, "update": sm.update, "rollout_other_s": sm.rollout_other_s,
                           "step_other_s": sm.step_other_s, **sm.fit},
           "stages": stages, "cost": cost_rows(run, calib or run, cal_steps, val, sm, ctx, sim)}
    if run.algo == "ppo":
        out["algo"] = "ppo"
        out["calibration"]["update"] = {"s_per_token_pass": sm.ppo_update[0], "s_per_optimizer_step": sm.ppo_update[1]}
        out["calibration"]["values"] = sm.values
        out["ppo"] = ppo_structure(run)
    return out


def simulated_ppo_ratios(old_logprob: bool) -> dict[str, float]:
    """The simulator's PPO structure on this machine's model (`perf.FITTED["cpu-core"]`, the tiny model), per
    token from `PerfModel.learner_s_per_token` (its reference, value and old log-prob forwards at fwd_mfu, the
    actor's and the critic's training at train_mfu; `update_fixed_s` is 0 on this machine):
    value forward / reference forward, and PPO's update / the actor's part of it (with the old log-prob
    forward in both when the run recomputes it; `training_only`: without it, the bare PPO_MODELS)."""
    from rlhfless.sim.hardware import DEVICES
    from rlhfless.sim.perf import FITTED, PPO_MODELS, PerfModel

    pm = PerfModel(DEVICES["cpu-core"], tiny_model(), 1, FITTED["cpu-core"])
    fwd = pm.forward_s(1.0, 1.0)  # one scoring forward's seconds per token, the reference's or the value model's
    ppo, grpo = pm.learner_s_per_token("ppo", old_logprob), pm.learner_s_per_token("grpo", old_logprob)
    bare = pm.learner_s_per_token("ppo") - PPO_MODELS * fwd, pm.learner_s_per_token("grpo") - fwd
    # learner_s_per_token counts PPO_MODELS scoring forwards for PPO (reference + value), one for GRPO: minus those,
    # what is left is the update (the old log-prob forward, the actor's training, PPO: the critic's)
    return {"values_over_reference": float(PPO_MODELS - 1),
            "update_over_actor_update": (ppo - PPO_MODELS * fwd) / (grpo - fwd), "training_only": bare[0] / bare[1]}


def ppo_structure(run: RunData) -> dict:
    """The simulator's PPO structure (`simulated_ppo_ratios`) beside this run's measured ratios, over all its
    steps (ratios of the stages' mean seconds; docs/internals.md#simvalidatepy). A ratio the run cannot measure is
    `missing`, saying why."""
    from rlhfless.sim.perf import PPO_MODELS

    steps = run.work
    mean = {k: float(_measured(run, steps, f"timing_s/{k}").mean())
            for k in ("values", "reference", "update", "update_critic")}
    algo = run.config["algo"]
    kl = float(algo.get("kl_coef") or 0.0)
    ep, mb = int(algo["ppo_epochs"]), int(algo["ppo_mini_batches"])
    # rlhfless.learn.ppo_update recomputes the old log-probs when more than one optimiser step follows or the KL is a reward
    old = ep * min(mb, min(s.n_seqs for s in steps)) > 1 or (kl > 0 and algo.get("kl_in", "auto") in ("auto", "reward"))
    sim = simulated_ppo_ratios(old)
    out = {"steps": len(steps), "mean_s": mean, "ppo_epochs": ep, "ppo_mini_batches": mb,
           "old_logprob_recomputed": old, "simulator_models": PPO_MODELS}
    out["values_over_reference"] = (
        _row(sim["values_over_reference"], mean["values"] / mean["reference"]) if kl > 0 and mean["reference"] > 0
        else {"simulated": sim["values_over_reference"],
              "missing": f"algo.kl_coef is {kl:g}: the run has no reference forward to compare with"})
    actor = mean["update"] - mean["update_critic"]
    has_critic_t = all("timing_s/update_critic" in run.metrics[s.step] for s in steps)
    out["update_over_actor_update"] = (
        _row(sim["update_over_actor_update"], mean["update"] / actor) if has_critic_t and actor > 0 else
        {"simulated": sim["update_over_actor_update"],
         "missing": "timing_s/update_critic not in every step of metrics.jsonl (runs recorded before rlhfless.learn.ppo_update "
                    "timed the critic's steps)"})
    out["update_over_actor_update"]["simulated_training_only"] = sim["training_only"]
    out["note"] = ("simulated: perf.PPO_MODELS models of the policy's size on this machine's cpu-core model "
                   "(perf.learner_s_per_token); measured: this run's stage seconds; the actor's part of the update "
                   "(timing_s/update - timing_s/update_critic) includes the old log-prob forward when it is "
                   "recomputed, and so does the simulated ratio then")
    return out


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
    from rlhfless.sim.armmodel import arm_dirs, validate_arms
    from rlhfless.sim.modelled import emulated_dirs, validate_dir

    if Path(run_dir).is_dir() and emulated_dirs(run_dir):  # runtime.device=emulated: the perf model, not a fit
        if calibrate_from is not None:  # refused, not ignored: the flag would change nothing in the report
            raise ConfigError(f"--calibrate-from: {run_dir} holds emulated runs, validated against the "
                              "performance model they ran on (no fit to calibrate); drop --calibrate-from")
        return validate_dir(run_dir)
    runs = load_runs(run_dir)
    calib = load_runs(calibrate_from) if calibrate_from else {}
    modes = {}
    for m, r in runs.items():
        try:
            modes[m] = validate_mode(r, calib.get(m) or (next(iter(calib.values())) if calib else None))
        except DataError as exc:
            if len(runs) == 1:
                raise
            modes[m] = {"mode": m, "skipped": str(exc)}  # one unusable sub-run does not void the others
    staged = [m for m in modes.values() if "skipped" not in m]
    out = {"run_dir": str(run_dir), "modes": modes}
    arms = validate_arms(run_dir, calibrate_from) if arm_dirs(run_dir) else {}
    if arms:
        out["arms"] = arms
    played = [a for a in arms.values() if "skipped" not in a]
    if played:  # a comparison with runtime records: the arm model's per-step play decides the errors
        out["step_time_error"] = max(a["step_time_s"]["rel_error"] for a in played)
        out["cost_error"] = max(a["cost_device_s"]["rel_error"] for a in played)
        # the same with each step scaled by its own measured load (armmodel.at_measured_load): the model's error
        # once the neighbours' load on shared cores is taken out
        out["step_time_error_at_measured_load"] = max(a["at_measured_load"]["step_time_s"]["rel_error"] for a in played)
        out["cost_error_at_measured_load"] = max(a["at_measured_load"]["cost_device_s"]["rel_error"] for a in played)
        out["errors_from"] = "arms"
        return out
    if not staged:
        raise DataError(f"validate: {run_dir}: no sub-run could be validated ({modes})")
    out["step_time_error"] = max(m["stages"]["step"]["rel_error"] for m in staged)  # not the reference row
    costs = [m["cost"]["cost_device_s"].get("rel_error") for m in staged]
    out["cost_error"] = max((c for c in costs if c is not None), default=float("nan"))
    out["errors_from"] = "modes"
    return out
