"""`rlhfless` command-line entry point. Each area registers its own subcommands, so this file stays a thin dispatcher:
`train`, `pretrain`, `config show|reference`, `build-hf-model`, `predictor train|eval|convert|compare`,
`data gsm8k-lengths|synthetic-trace|trace-stats`, `simulate`, `plan what-if`, `repro`, `profile`, and
`bench prefill|engine|loop|planner|plan-trace|faults`. Heavy imports happen inside the command functions, so
`rlhfless --help` is instant.

The rule it keeps: a user error, an OS error or a usage error prints one line (at most `errors.MESSAGE_LIMIT`
characters) and exits 2 without a traceback; SIGINT and SIGTERM stop the command cleanly (its workers first) and
exit 130 and 143. `KEY=VALUE` overrides may stand anywhere among the options, and output paths (`--json`,
`--out`) are checked here before any work (`rlhfless.core.outpaths`). Details: docs/internals.md#clipy.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from contextlib import contextmanager

from rlhfless.core.errors import Interrupted, UserError, interrupt, os_error_message, short_message

# Modules that contribute subcommands: each defines register(subparsers, bench_subparsers).
_MODULES = (
    "rlhfless.run.train_cli",
    "rlhfless.run.config_cli",
    "rlhfless.run.model_cli",
    "rlhfless.plan.cli",
    "rlhfless.bench.engine_cli",
    "rlhfless.bench.loop_bench",
    "rlhfless.bench.profile_cli",
    "rlhfless.predictor.cli",
    "rlhfless.bench.faults_cli",
    "rlhfless.sim.cli",
    "rlhfless.repro.cli",
)


# Commands whose --out is one file, and commands that check their own --out (a run, a checkpoint).
_FILE_OUT = {("data", "gsm8k-lengths"), ("data", "synthetic-trace"), ("profile", None)}
_OWN_OUT = {"train", "pretrain"}


class _Version(argparse.Action):
    """`--version`: the installed package's version, read from its metadata only when asked (it costs a file
    lookup, and every other command line would pay it at parser build)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the installed version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("rlhfless")
        except PackageNotFoundError:
            parser.exit(2, "rlhfless: error: the package is not installed, so it has no version (pip install -e .)\n")
        print(f"rlhfless {found}")  # stdout, as argparse's own version action does
        parser.exit(0)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the command and its --help (argparse prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {short_message(message, 240)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rlhfless",
        description=(
            "Serverless synchronous RL post-training (GRPO) with deduplicated prefill, response-length "
            "prediction, length-aware prompt assignment and cost-aware actor scaling. "
            "Run `rlhfless <command> --help` for the options of each command."
        ),
    )
    parser.add_argument("--version", action=_Version)
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


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse `argv`; `KEY=VALUE` words argparse could not place (after an option) join the overrides."""
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = list(args.overrides or []) + extra
    return args


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse an output path that cannot be written or must not be touched, before the command starts."""
    from rlhfless.core.outpaths import check_output_dir, check_output_file

    for flag in ("json", "figure"):
        value = getattr(args, flag, None)
        if isinstance(value, str):
            check_output_file(value, f"--{flag}")
    out = getattr(args, "out", None)
    if out is None or args.command in _OWN_OUT:
        return
    if (args.command, getattr(args, "data_command", None)) in _FILE_OUT:
        check_output_file(str(out), "--out")
    else:
        check_output_dir(str(out), "--out")


@contextmanager
def signals_interrupt():
    """While the command runs, SIGINT and SIGTERM raise `Interrupted` in this process (SIGTERM would otherwise end
    it at once, leaving its workers to find a closed pipe), so the command's `finally` blocks stop what it started.
    A second signal during that shutdown is ignored: it is bounded (a few seconds). A process forked from this one
    (a simulator pool's) keeps the default: it dies quietly when its parent stops it."""
    pid, fired = os.getpid(), []

    def handler(signum, frame):
        if os.getpid() != pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if not fired:
            fired.append(signum)
            interrupt(signum)

    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # main() called off the main thread: signals stay as they are
        old = {}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    try:
        with signals_interrupt():
            check_outputs(args)
            result = args.func(args)
    except UserError as exc:
        print(short_message(f"rlhfless: error: {exc}"), file=sys.stderr)
        return 2
    except OSError as exc:  # the disk, not the program: a full disk, a read-only mount, a symlink loop
        if exc.errno is None:  # raised by code, not reported by the OS (a bare TimeoutError): a program error
            raise
        train = getattr(args, "command", None) == "train"  # only train's hint names --resume
        print(short_message(f"rlhfless: error: {os_error_message(exc, train)}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        why = "SIGTERM" if stop.signum == signal.SIGTERM else "Ctrl-C (SIGINT)"
        print(short_message(f"rlhfless: interrupted by {why}" + (f": {stop.where}" if stop.where else "")),
              file=sys.stderr)
        return stop.exit_status
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
