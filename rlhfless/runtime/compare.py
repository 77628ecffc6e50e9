"""`runtime.mode=compare`: the serverful control and the serverless runtime on the same seed and prompts.

Runs serverful into OUT/serverful, then serverless into OUT/serverless (each a whole run with its own evals,
traces and W&B files), then writes OUT/comparison.json and side-by-side Gantt charts (OUT/gantt/step-<k>.png).

comparison.json: step_time_ratio (serverless / serverful mean step wall time), cost_ratio (billed device-seconds,
serverless / serverful), samples_identical (every step's responses hash equal in both runs), and per mode
step_time_s, cost_device_s, cost_usd, eval_accuracy_final, plus what explains the numbers (cold starts, idle
fraction, billed seconds per function kind, decode actors, migrations).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rlhfless.jsonl import write_json
from rlhfless.runtime.gantt import plot_steps

MODES = ("serverful", "serverless")


def read_digests(run_dir: Path) -> dict[int, str]:
    p = run_dir / "traces" / "samples_digest.jsonl"
    if not p.is_file():
        return {}
    return {r["step"]: r["sha256"] for r in (json.loads(x) for x in p.read_text().splitlines() if x.strip())}


def samples_match(a: Path, b: Path) -> tuple[bool, int | None, int]:
    """(identical, first step that differs or None, steps compared) of two runs' per-step sample digests."""
    da, db = read_digests(a), read_digests(b)
    steps = sorted(set(da) | set(db))
    diff = [s for s in steps if da.get(s) != db.get(s)]
    return (not diff and bool(steps)), (diff[0] if diff else None), len(steps)


def gantt_steps(steps: int, every: int) -> list[int]:
    return sorted({1, *(range(every, steps + 1, every) if every else ())} & set(range(1, steps + 1)))


def compare(cfg, out: Path, progress: bool = True) -> dict:
    from rlhfless.runner import train

    out.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for mode in MODES:
        sub = replace(cfg, runtime=replace(cfg.runtime, mode=mode))
        summaries[mode] = train(sub, out / mode, progress=progress)
    identical, first_diff, n = samples_match(out / "serverful", out / "serverless")
    rs = {m: summaries[m]["runtime"] for m in MODES}
    result = {
        "step_time_ratio": rs["serverless"]["step_time_s"] / rs["serverful"]["step_time_s"],
        "cost_ratio": rs["serverless"]["cost_device_s"] / rs["serverful"]["cost_device_s"],
        "usd_ratio": rs["serverless"]["cost_usd"] / rs["serverful"]["cost_usd"],
        "samples_identical": identical,
        "first_divergent_step": first_diff,
        "steps_compared": n,
        "seed": cfg.train.seed,
        "steps": cfg.train.steps,
        **{m: {**rs[m], "eval_accuracy_final": summaries[m]["eval_accuracy_final"],
               "eval_greedy_accuracy_final": summaries[m]["eval_greedy_accuracy_final"],
               "wall_s": summaries[m]["wall_s"]} for m in MODES},
    }
    charts = []
    for k in gantt_steps(cfg.train.steps, cfg.runtime.gantt_every):
        p = plot_steps({m: out / m for m in MODES}, k, out / "gantt" / f"step-{k}.png")
        if p is not None:
            charts.append(str(p))
    result["gantt"] = charts
    write_json(result, out / "comparison.json")
    return result
