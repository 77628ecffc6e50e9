"""How close the planner's predicted device-seconds come to the billed ones, on the comparison config's serverless arm.

Runs `experiments/configs/serverless_vs_serverful.yaml` as `runtime.mode=serverless` (shortened with --steps), then
prints `planner_accuracy` (`rlhfless.run.compare`: predicted and billed summed over the same steps past the
calibration) beside the planner's time-model scale at the end and how much of the machine other processes took
while it ran (`CpuWindow`). Billed seconds are measured: they follow this machine's speed and load, so this is a
measurement, never a test's assertion. Name the CPU beside the numbers.

usage: python benchmarks/bench_planner_accuracy.py [--steps 30] [--out runs/bench/planner_accuracy] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "configs" / "serverless_vs_serverful.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="runs/bench/planner_accuracy", help="run folder (replaced)")
    ap.add_argument("--json", help="also write the result to this JSON file")
    args = ap.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train
    from rlhfless.run.compare import run_planner_accuracy
    from rlhfless.run.contention import CpuWindow
    from rlhfless.runtime.devices.profile import cpu_name

    cfg = load_run_config(str(CONFIG), ["runtime.mode=serverless", f"train.steps={args.steps}",
                                        "train.eval_prompts=0", "train.checkpoint_every=0",
                                        "tracking.mode=disabled", "runtime.gantt_every=0"])
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    window = CpuWindow.open()
    train(cfg, out, progress=True)
    machine = window.close()
    acc = run_planner_accuracy(out, cfg.plan.learner.whole_step)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    result = {"cpu": cpu_name(), "steps": args.steps, "planner": acc,
              "time_model_scale_last": rows[-1].get("runtime/time_model_scale"), "machine": machine}
    print(f"planner: predicted {acc.get('predicted_device_s', float('nan')):.3f} vs billed "
          f"{acc.get('billed_device_s', float('nan')):.3f} device-s per step over {acc['steps']} steps "
          f"(first {acc['skipped_steps']} skipped): predicted / billed = {acc.get('predicted_over_billed')}")
    print(f"other processes took {machine['other_cpu_fraction']} of the machine while it ran "
          f"(time-model scale at the end: {result['time_model_scale_last']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
