"""Does the planner's time profile have the right shape? Split a step's rows over 1 or 2 decode functions.

usage: python benchmarks/bench_profile_shape.py [--sets 6] [--runtime] [--json out.json]
The quickstart's policy and workload (data/checkpoints/sft, 16 arith prompts x 8 samples, up to 192 tokens,
temperature 1). In this process, pinned to one core with one torch thread (a runtime worker's shape):
  1. the profile the runtime measures (`rollout.tpot.measure_profile`, the same call a worker makes);
  2. for `sets` prompt sets: the 128 rows decoded as one batch vs as two batches of 64 (the same tokens, checked),
     the measured ratio of seconds, 2 x 64 / 1 x 128;
  3. that ratio as predicted by the measured profile and by the shipped one (`data/profiles/tpot_tiny_cpu.json`):
     a decode's seconds = sum over finishing order of (length step) x s_per_iter(rows still running), plus
     prefill seconds per prompt token.
With --runtime, two serverless runs (8 steps, plan.max_actors=1 and 2, scale off) into a temporary folder, and the
ratio of their billed decode busy seconds per step, which adds what one process cannot show: co-running
workers. Wall times are machine- and load-dependent: name the CPU and the load beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "profiles" / "tpot_tiny_cpu.json"
B, G, MAX_NEW = 16, 8, 192


def busy_s(tm, lengths: list[int], prompt_lens: list[int]) -> float:
    """Predicted decode + prefill seconds of one batch that never queues (plan.timemodel's closed form)."""
    L = np.sort(np.asarray(lengths, dtype=float))
    prev = np.concatenate([[0.0], L[:-1]])
    return float(np.sum((L - prev) * tm.iter_seconds(len(L) - np.arange(len(L))))) + tm.prefill_s_per_token * sum(
        prompt_lens)


def split_ratios(model, env, sets: int) -> tuple[list[float], list[tuple[list[int], list[int], list[int], list[int]]]]:
    """Measured 2 x 64 / 1 x 128 seconds per prompt set, and each set's (lengths, prompt lengths) per half."""
    from rlhfless.rollout.engine import decode, prefill

    params = env.sampling(MAX_NEW, 1.0, 1.0)
    train = env.task.splits()[0]
    ratios, shapes = [], []
    for k in range(sets):
        ps = [env.encode(p) for p in train[k * B:(k + 1) * B]]
        t0 = time.perf_counter()
        whole = decode(model, prefill(model, ps, G), params, seed=k, row_ids=torch.arange(B * G), n_total=B * G)
        t1 = time.perf_counter()
        halves = [decode(model, prefill(model, ps[h * B // 2:(h + 1) * B // 2], G), params, seed=k,
                         row_ids=torch.arange(h * B * G // 2, (h + 1) * B * G // 2), n_total=B * G) for h in (0, 1)]
        t2 = time.perf_counter()
        assert whole.responses == halves[0].responses + halves[1].responses, "a split changed the tokens"
        ratios.append((t2 - t1) / (t1 - t0))
        lens = [len(r) for r in whole.responses]
        plens = [len(p) for p in ps]
        shapes.append((lens[: B * G // 2], lens[B * G // 2:], plens[: B // 2], plens[B // 2:]))
    return ratios, shapes


def predicted(tm, shapes) -> list[float]:
    return [(busy_s(tm, a, pa) + busy_s(tm, b, pb)) / busy_s(tm, a + b, pa + pb) for a, b, pa, pb in shapes]


def runtime_ratios() -> list[float]:
    """Billed decode busy seconds per step, N=2 over N=1, from two real serverless runs (same samples)."""
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train

    per_step = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2):
            cfg = load_run_config(REPO / "experiments/configs/quickstart.yaml", [
                "runtime.mode=serverless", f"plan.max_actors={n}", "plan.scale=false", "train.steps=8",
                f"rollout.prompts_per_step={B}", "train.eval_prompts=0", "train.checkpoint_every=0",
                "tracking.mode=disabled", "runtime.gantt_every=0"])
            out = Path(tmp) / f"n{n}"
            train(cfg, out, progress=False)
            for line in (out / "invocations.jsonl").read_text().splitlines():
                i = json.loads(line)
                if i["kind"] == "decode" and i["ok"]:
                    per_step.setdefault(i["step"], {}).setdefault(n, 0.0)
                    per_step[i["step"]][n] += i["finished_s"] - i["started_s"]
    return [v[2] / v[1] for v in per_step.values() if 1 in v and 2 in v]


def spread(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=6, help="prompt sets of 16 x 8 rows (default 6)")
    ap.add_argument("--runtime", action="store_true", help="also two 8-step serverless runs (about a minute)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from rlhfless.config import load_run_config
    from rlhfless.model.factory import load_policy
    from rlhfless.plan.timemodel import TimeModel
    from rlhfless.rollout.tpot import PROFILE_GROUP, PROFILE_PROMPTS, measure_profile
    from rlhfless.runtime.devices.profile import cpu_name
    from rlhfless.step.textenv import make_env

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # a worker's shape: one pinned core, one thread
    torch.set_num_threads(1)
    cfg = load_run_config(REPO / "experiments/configs/quickstart.yaml", [])
    env, model = make_env(cfg), load_policy(cfg.policy.resolved()).eval()
    prompts = [env.encode(p) for p in env.task.splits()[0][:PROFILE_PROMPTS]]
    t0 = time.perf_counter()
    rows, prefill_s = measure_profile(model, prompts, PROFILE_GROUP, env.sampling(MAX_NEW, 1.0, 1.0))
    profile_s = time.perf_counter() - t0
    measured = TimeModel.from_rows(rows, prefill_s_per_token=prefill_s)
    shipped = TimeModel.from_json(SHIPPED)
    ratios, shapes = split_ratios(model, env, args.sets)
    result = {
        "cpu": cpu_name(), "load_average": os.getloadavg(), "profile_s": profile_s, "profile_rows": rows,
        "profile_slowdown_256_vs_1": rows[-1]["s_per_iter"] / rows[0]["s_per_iter"],
        "shipped_slowdown_256_vs_1": float(shipped.iter_seconds(256) / shipped.iter_seconds(1)),
        "split_measured": spread(ratios),
        "split_predicted_measured_profile": spread(predicted(measured, shapes)),
        "split_predicted_shipped_profile": spread(predicted(shipped, shapes)),
    }
    if args.runtime:
        os.sched_setaffinity(0, cores)  # the runtime's workers pin themselves; the driver may use every core
        result["split_runtime_billed"] = spread(runtime_ratios())
    print(json.dumps({k: v for k, v in result.items() if k != "profile_rows"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
