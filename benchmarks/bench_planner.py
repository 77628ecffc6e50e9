"""Planner benchmark: the full planning decision for 8,192 sequences over 64 candidate actor counts.

Same numbers as `rlhfless bench planner --json PATH` (both call `rlhfless.plan.bench.run_planner_bench`).
Usage: python benchmarks/bench_planner.py [--json PATH] [--n-actors 16] [--candidates 64] [--policy contiguous]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlhfless.plan.bench import run_planner_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write results to this JSON file")
    ap.add_argument("--n-actors", type=int, default=16)
    ap.add_argument("--candidates", type=int, default=64)
    ap.add_argument("--policy", default="contiguous")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args(argv)
    res = run_planner_bench(n_actors=args.n_actors, n_candidates=args.candidates, policy=args.policy,
                            repeats=args.repeats)
    print(f"{res['what']}\nCPU: {res['cpu']}")
    print(f"plan_ms p50 {res['plan_ms_p50']:.2f}  p90 {res['plan_ms_p90']:.2f}  cpu p50 {res['plan_cpu_ms_p50']:.2f}"
          f"   (target <= 10 ms p50); scaler chose N={res['scaler_choice']}")
    print(f"plan_migrate_ms p50 {res['plan_migrate_ms_p50']:.2f} (plan.migrate=true: the chosen plan also simulated "
          f"with cuts at tau; kept: {res['migrate_used']})")
    print(f"assign_ms p50 {res['assign_ms_p50']:.2f}  p90 {res['assign_ms_p90']:.2f}")
    base = res["policy_ms_p50"]["round_robin"]
    for pol, ms in res["policy_ms_p50"].items():
        print(f"  {pol:15s} {ms:7.2f} ms  ({ms / base:.2f}x round_robin)")
    print(f"exact sweep {res['exact_sweep_ms']:.0f} ms ({res['exact_sweep_ms'] / res['plan_ms_p50']:.0f}x the decision)"
          f"; vs exact: {res['sweep_vs_exact']}")
    print(f"migrate_sim_ms {res['migrate_sim_ms']:.1f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
