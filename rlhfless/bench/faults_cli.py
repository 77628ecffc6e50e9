"""`rlhfless bench faults`: the runtime's fault-recovery benchmark (see rlhfless.runtime.faults) on whole runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhfless.core.cliargs import count

FAULTS_CONFIG = "experiments/configs/faults.yaml"


def register(sub, bench) -> None:
    p = bench.add_parser(
        "faults",
        help="kill random serverless workers with SIGKILL during a short run and check that nothing is lost",
        description=(
            "Run the config in serverless mode --repeats times undisturbed and --repeats times while a chaos "
            "thread kills random busy workers (kill -9), alternating. Reports kills, lost_steps, samples_identical "
            "(every step's responses equal the undisturbed run's), extra_cost_fraction (billed device-seconds of "
            "each faulty run over its undisturbed one, minus 1: mean, std, min, max, n), the undisturbed runs' own "
            "spread, and lost_device_s (device-seconds of the invocations the kills cut short)."
        ),
        epilog=f"example: rlhfless bench faults --kills 20 --repeats 3 --json runs/faults.json  (config: {FAULTS_CONFIG})",
    )
    p.add_argument("--config", default=FAULTS_CONFIG, help=f"run config (default {FAULTS_CONFIG})")
    p.add_argument("--kills", type=count(0, 100_000), default=20, help="workers to kill over the run (default 20)")
    p.add_argument("--repeats", type=count(1, 100), default=3,
                   help="undisturbed and faulty runs each (default 3): the extra cost is reported with its spread")
    p.add_argument("--seed", type=int, default=0, help="seed of the chaos thread's choices (repeat i: seed + i - 1)")
    p.add_argument("--out", default="runs/bench_faults", help="folder for the runs (default runs/bench_faults)")
    p.add_argument("--json", required=True, help="write the report here")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. train.steps=10")
    p.set_defaults(func=_faults)


def _faults(args: argparse.Namespace) -> int:
    from rlhfless.config import REPO_ROOT, load_run_config
    from rlhfless.core.errors import ConfigError
    from rlhfless.core.jsonl import write_json
    from rlhfless.run.runner import train
    from rlhfless.runtime.faults import run_fault_bench

    if args.kills < 1:
        raise ConfigError(f"--kills: must be >= 1 (got {args.kills})")
    config = args.config
    if not Path(config).exists() and (REPO_ROOT / config).exists():
        config = str(REPO_ROOT / config)
    cfg = load_run_config(config, args.overrides + ["tracking.mode=disabled"])
    cfg.check_machine()
    report = run_fault_bench(cfg, Path(args.out), train, args.kills, args.seed, progress=not args.no_progress,
                             repeats=args.repeats)
    write_json(report, Path(args.json))
    print(json.dumps({k: report[k] for k in ("repeats", "kills", "lost_steps", "samples_identical", "retries",
                                             "extra_cost_fraction", "extra_cost_resolved",
                                             "undisturbed_noise_fraction", "lost_device_s",
                                             "extra_time_fraction")}, indent=1))
    return 0
