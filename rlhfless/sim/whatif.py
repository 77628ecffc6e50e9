"""What-if for users: given a model, devices and prices, which mode, how many actors, and what a step costs.

`what_if(...)` simulates one workload on the user's devices under the tuned serverful verl and under RLHFless at
several lambdas, and recommends the best point under the user's constraint (`deadline_ratio` R: cheapest at most R x
the serverful step; `budget_usd` B: fastest at most B per step; neither: R = 1), each point with a 10th-90th
percentile band. The rule it keeps: the numbers are the simulator's (sources: docs/overheads.md); prices are the
catalog's unless a file replaces entries. Details: docs/internals.md#simwhatifpy.

Deviations from the paper: the paper has no such tool.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np

from rlhfless.core.errors import ConfigError, DataError, require

LAMS = (0.0, 0.5, 1.0)
"""Lambdas tried (the scaler's time-vs-cost weight)."""


def parse_devices(text: str) -> tuple[str, int]:
    """KIND:COUNT -> (kind, count); a bad value raises ConfigError naming --devices."""
    from rlhfless.sim import hardware as hw

    kind, sep, count = text.partition(":")
    require(bool(sep) and count.isdigit() and len(count) <= 6 and int(count) >= 1, "--devices",
            f"must be KIND:COUNT with COUNT a positive integer, e.g. H100:160 (got {text[:40]!r})")
    if kind not in hw.DEVICES or kind == "A40":
        raise ConfigError(f"--devices: unknown device kind {kind!r}; allowed: "
                          f"{', '.join(k for k in hw.DEVICES if k != 'A40')}")
    return kind, int(count)


def load_prices(path: str | None) -> dict:
    """A prices file (YAML or JSON): {KIND: {serverless_usd_per_s: X, ondemand_usd_per_h: Y}}, either key
    optional; a bad file raises DataError / ConfigError naming --prices."""
    if not path:
        return {}
    from rlhfless.core.configbase import load_yaml
    from rlhfless.plan.cost import CATALOG

    if not Path(path).is_file():
        raise DataError(f"--prices: file not found: {path}")
    try:
        data = load_yaml(path)
    except ConfigError as exc:
        raise ConfigError(f"--prices: {exc}") from None
    require(bool(data), "--prices", f"{path} must map device kinds to prices")
    out = {}
    for kind, entry in data.items():
        require(kind in CATALOG, "--prices", f"unknown device kind {kind!r} in {path}; allowed: {', '.join(CATALOG)}")
        require(isinstance(entry, dict) and set(entry) <= {"serverless_usd_per_s", "ondemand_usd_per_h"},
                "--prices", f"{kind} in {path} takes serverless_usd_per_s and/or ondemand_usd_per_h")
        for k, v in entry.items():
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0
            require(ok, "--prices", f"{kind}.{k} in {path} must be a positive number (got {v!r})")
        out[kind] = entry
    return out


@contextlib.contextmanager
def prices_in_effect(prices: dict):
    """The catalog with `prices` replacing its entries for the duration (restored after, whatever happens)."""
    from dataclasses import replace

    from rlhfless.plan.cost import CATALOG

    saved = {k: CATALOG[k] for k in prices}
    try:
        for kind, entry in prices.items():
            CATALOG[kind] = replace(CATALOG[kind], **entry, source=f"{CATALOG[kind].source}; replaced by --prices")
        yield
    finally:
        CATALOG.update(saved)


def hw_price_kind(kind: str) -> str:
    from rlhfless.sim import hardware as hw

    return hw.device(kind).price_kind


def _require_ondemand(kind: str, table: dict) -> None:
    """The serverful side needs an on-demand price: from the catalog or the prices file."""
    from rlhfless.plan.cost import CATALOG

    if CATALOG[kind].ondemand_usd_per_h is None and "ondemand_usd_per_h" not in table.get(kind, {}):
        raise ConfigError(f"--prices: {kind} has no on-demand price in the catalog; give one in a prices file, "
                          f"e.g. {kind}: {{ondemand_usd_per_h: 8.0}}")


def _point(mode: str, rows: list[dict], **how) -> dict:
    """Mean, 10th and 90th percentile of seconds and $ per step, and the range of decode actors."""
    t = np.array([r["step_time_s"] for r in rows])
    usd = np.array([r["cost_usd"] for r in rows])
    n = [r["n_actors"] for r in rows]
    return {"mode": mode, **how, "step_s": float(t.mean()), "step_s_band": [float(np.percentile(t, 10)),
                                                                             float(np.percentile(t, 90))],
            "usd": float(usd.mean()), "usd_band": [float(np.percentile(usd, 10)), float(np.percentile(usd, 90))],
            "device_s": float(np.mean([r["cost_device_s"] for r in rows])), "n_range": [int(min(n)), int(max(n))]}


def best_point(points: list[dict], serverful_step_s: float, deadline_ratio: float | None,
               budget_usd: float | None) -> tuple[dict, bool]:
    """The recommended point and whether it meets the constraint (docs/internals.md#simwhatifpy); if none does, the
    closest: the fastest under a deadline, the cheapest under a budget."""
    if budget_usd is not None:
        ok = [p for p in points if p["usd"] <= budget_usd]
        if ok:
            return min(ok, key=lambda p: (p["step_s"], p["usd"])), True
        return min(points, key=lambda p: (p["usd"], p["step_s"])), False
    limit = (deadline_ratio or 1.0) * serverful_step_s
    ok = [p for p in points if p["step_s"] <= limit * (1 + 1e-9)]
    if ok:
        return min(ok, key=lambda p: (p["usd"], p["step_s"])), True
    return min(points, key=lambda p: (p["step_s"], p["usd"])), False


def what_if(model: str, devices: str, prices: str | None = None, deadline_ratio: float | None = None,
            budget_usd: float | None = None, trace: str | None = None, steps: int = 6,
            prompts_per_step: int = 512, group_size: int = 8, seed: int = 0,
            overrides: list[str] | None = None) -> dict:
    """Serverful and serverless on the user's devices, and the recommendation (docs/internals.md#simwhatifpy).
    overrides: `SimConfig` key=value (design, each mechanism, learner, the baseline's settings, ...), as `simulate`
    takes."""
    from rlhfless.core.configbase import apply_overrides, from_dict
    from rlhfless.sim.policies import RLHFless, Verl
    from rlhfless.sim.scenario import SimConfig, clusters, simulate_policy, workload

    t0 = time.perf_counter()
    require(deadline_ratio is None or budget_usd is None, "--deadline-ratio",
            "give --deadline-ratio or --budget-usd, not both")
    require(deadline_ratio is None or (np.isfinite(deadline_ratio) and deadline_ratio > 0), "--deadline-ratio",
            f"must be a positive number (got {deadline_ratio})")
    require(budget_usd is None or (np.isfinite(budget_usd) and budget_usd > 0), "--budget-usd",
            f"must be a positive number of dollars per step (got {budget_usd})")
    kind, count = parse_devices(devices)
    table = load_prices(prices)
    _require_ondemand(hw_price_kind(kind), table)
    data = dict(name=f"{model}@{kind}x{count}", device=kind, n_devices=count, model=model, steps=steps,
                prompts_per_step=prompts_per_step, n_prompts=prompts_per_step * max(steps, 1),
                group_size=group_size, seed=seed)
    if trace:
        if not Path(trace).is_file():
            raise DataError(f"--trace: file not found: {trace}")
        data.update(workload="trace", trace=str(trace))
    cfg = from_dict(SimConfig, apply_overrides(data, overrides or [], example="design=extended"))
    with prices_in_effect(table):
        work, note = workload(cfg)
        cb, cs, _ = clusters(cfg, work)
        _, _, rows = simulate_policy(Verl(cb), work, cb)
        serverful = _point("serverful", rows, tp=cb.perf.tp)
        sw = cfg.switches()
        runs = [(dict(objective="score", lam=lam), RLHFless(cs, sw, lam, cfg.tau, cfg.prefill_actors))
                for lam in LAMS]
        if deadline_ratio is not None:
            runs.append((dict(objective="min_cost_at_deadline", deadline_ratio=deadline_ratio, lam=cfg.lam),
                         RLHFless(cs, sw, cfg.lam, cfg.tau, cfg.prefill_actors,
                                  objective="min_cost_at_deadline", deadline_ratio=deadline_ratio)))
        serverless = [_point("serverless", simulate_policy(pol, work, cs)[2], tau=cfg.tau, tp=cs.perf.tp, **how)
                      for how, pol in runs]
    rec, met = best_point([serverful, *serverless], serverful["step_s"], deadline_ratio, budget_usd)
    best_sl, _ = best_point(serverless, serverful["step_s"], deadline_ratio, budget_usd)
    constraint = (f"at most {budget_usd} $ per step" if budget_usd is not None else
                  f"step at most {deadline_ratio or 1.0} x serverful")
    return {"case": cfg.name, "workload": note, "steps": len(work), "constraint": constraint,
            "constraint_met": met, "recommended": rec, "serverful": serverful, "serverless": best_sl,
            "points": [serverful, *serverless], "wall_s": time.perf_counter() - t0}


def render(report: dict) -> str:
    """Serverful and the best serverless point side by side, then the recommendation."""
    def row(p):
        how = (f"tp {p['tp']}, all devices" if p["mode"] == "serverful" else
               f"{p['objective']}, lambda {p['lam']}, tau {p['tau']}, N {p['n_range'][0]}-{p['n_range'][1]}")
        return (f"  {p['mode']:10s} {p['step_s']:8.2f} s [{p['step_s_band'][0]:.2f}, {p['step_s_band'][1]:.2f}]  "
                f"${p['usd']:.4f} [{p['usd_band'][0]:.4f}, {p['usd_band'][1]:.4f}] per step  ({how})")
    rec = report["recommended"]
    lines = [f"{report['case']}: {report['steps']} simulated steps ({report['workload']}); constraint: "
             f"{report['constraint']}", "  mode       mean step [p10, p90]      mean $ [p10, p90]",
             row(report["serverful"]), row(report["serverless"]),
             f"recommended: {rec['mode']}" + ("" if rec["mode"] == "serverful" else
                                               f" ({rec['objective']}, lambda {rec['lam']}, tau {rec['tau']}, "
                                               f"N {rec['n_range'][0]}-{rec['n_range'][1]})")
             + ("" if report["constraint_met"] else "; no point meets the constraint, the closest is shown")]
    return "\n".join(lines)
