"""`rlhfless` command-line entry point.

Each area registers its own subcommands (`register(sub, bench)`) so this file stays a thin dispatcher:
`train`, `pretrain`, `build-hf-model`, `predictor train|eval|convert|compare`,
`data gsm8k-lengths|synthetic-trace|trace-stats`, `simulate`, `repro`, and
`bench prefill|engine|loop|planner|plan-trace|faults`. Heavy imports (torch, transformers, scikit-learn) happen inside
the command functions, so `rlhfless --help` is instant.

User errors (`rlhfless.errors.UserError`) print one line and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rlhfless.errors import UserError

# Modules that contribute subcommands: each defines register(subparsers, bench_subparsers).
_MODULES = (
    "rlhfless.train_cli",
    "rlhfless.model.cli",
    "rlhfless.plan.cli",
    "rlhfless.rollout.cli",
    "rlhfless.predictor.cli",
    "rlhfless.runtime.cli",
    "rlhfless.sim.cli",
    "rlhfless.repro.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhfless",
        description=(
            "Serverless synchronous RL post-training (GRPO) with deduplicated prefill, response-length "
            "prediction, length-aware prompt assignment and cost-aware actor scaling. "
            "Run `rlhfless <command> --help` for the options of each command."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = sub.add_parser(
        "bench",
        help="performance benchmarks that measure side by side in one run and print ratios",
        description="Performance benchmarks. Each measures the alternatives side by side in one run.",
    )
    bench_sub = bench.add_subparsers(dest="bench_name", metavar="NAME", required=True)
    for name in _MODULES:
        importlib.import_module(name).register(sub, bench_sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except UserError as exc:
        print(f"rlhfless: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlhfless: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
