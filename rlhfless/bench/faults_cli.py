"""`rlhfless bench faults`: the runtime's fault-recovery benchmark (see rlhfless.bench.faults) on whole runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhfless.core.cliargs import count

FAULTS_CONFIG = "experiments/configs/faults.yaml"
HEADLINE_CONFIG = "experiments/configs/serverless_vs_serverful.yaml"
# the headline comparison's shape (keep-alive 2 s, hybrid functions) at a bench's length: no evaluation, no charts
HEADLINE_OVERRIDES = ["train.steps=20", "train.eval_prompts=0", "runtime.gantt_every=0"]
SUMMARY = ("mode", "device", "keep_alive_s", "hybrid", "repeats", "kills", "kills_requested", "lost_steps",
           "runs_stopped", "samples_identical",
           "retries", "extra_cost_fraction", "extra_cost_resolved", "undisturbed_noise_fraction", "lost_device_s",
           "extra_time_fraction")


def register(sub, bench) -> None:
    p = bench.add_parser(
        "faults",
        help="kill random workers with SIGKILL during a short run, serverless and serverful; nothing may be lost",
        description=(
            "Per mode (--mode; both by default), run the config --repeats times undisturbed and --repeats times "
            "while a chaos "
            "thread kills random busy workers (kill -9), alternating. Reports kills, lost_steps, samples_identical "
            "(every step's responses equal the undisturbed run's), extra_cost_fraction (billed device-seconds of "
            "each faulty run over its undisturbed one, minus 1: mean, std, min, max, n), the undisturbed runs' own "
            "spread, and lost_device_s (device-seconds of the invocations the kills cut short). --headline benches the "
            "headline comparison's configuration (keep-alive 2 s, hybrid functions); a config with runtime.device=emulated "
            "(experiments/configs/emulated_testbed_*.yaml) benches emulated devices."
        ),
        epilog=("examples: rlhfless bench faults --kills 20 --repeats 3 --json runs/faults.json  (config: "
                f"{FAULTS_CONFIG});  rlhfless bench faults --headline --mode serverless --json runs/faults.json;  "
                "rlhfless bench faults --config experiments/configs/emulated_testbed_3b_grpo.yaml --json runs/faults.json"),
    )
    p.add_argument("--config", default=None, help=f"run config (default {FAULTS_CONFIG}; --headline: {HEADLINE_CONFIG})")
    p.add_argument("--headline", action="store_true",
                   help=f"the headline comparison's config ({HEADLINE_CONFIG}) with {' '.join(HEADLINE_OVERRIDES)} "
                        "(overrides after it win)")
    p.add_argument("--mode", choices=("serverless", "serverful", "both"), default="both",
                   help="which runtime mode to bench (default both, one after the other, each into OUT/<mode>)")
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
    from rlhfless.run.launch import train
    from rlhfless.bench.faults import MODES, run_fault_bench

    if args.kills < 1:
        raise ConfigError(f"--kills: must be >= 1 (got {args.kills})")
    config = args.config or (HEADLINE_CONFIG if args.headline else FAULTS_CONFIG)
    if not Path(config).exists() and (REPO_ROOT / config).exists():
        config = str(REPO_ROOT / config)
    pre = HEADLINE_OVERRIDES if args.headline else []
    cfg = load_run_config(config, pre + args.overrides + ["tracking.mode=disabled"])
    cfg.check_machine()
    modes = MODES if args.mode == "both" else (args.mode,)
    report = {"config": config, "overrides": pre + args.overrides, "modes": {}}
    for mode in modes:  # each mode's report is written as soon as it is in: a later failure keeps it
        report["modes"][mode] = run_fault_bench(cfg, Path(args.out) / mode, train, args.kills, args.seed,
                                                progress=not args.no_progress, repeats=args.repeats, mode=mode)
        write_json(report, Path(args.json))
    print(json.dumps({m: {k: r[k] for k in SUMMARY} for m, r in report["modes"].items()}, indent=1))
    return verdict(report["modes"])


def verdict(modes: dict[str, dict]) -> int:
    """The bench's exit status: 1, with a one-line summary on stderr naming each failed run's mode and run, when
    any faulty run stopped, lost a step or diverged from its undisturbed twin (a script reading the exit code must
    not see success); else 0."""
    import sys

    from rlhfless.bench.faults import failed_runs

    lines = failed_runs(modes)
    if lines:
        runs = sum(len(r["pairs"]) for r in modes.values())
        print(f"rlhfless: bench faults: {len(lines)} of {runs} faulty runs failed: {'; '.join(lines)}", file=sys.stderr)
    return 1 if lines else 0
