"""CLI wiring of `rlhfless repro`: run the chosen studies into one folder, then write the report.

    rlhfless repro [STUDY ...] --out DIR [--quick] [--seed N] [--tracking offline|online|disabled] [--list]

Studies run in registry order whatever order they are named in; a study that fails is reported (its
traceback in DIR/<study>/error.txt) and the others still run; the command then exits 1. Unknown names print
one line listing the valid ones and exit 2. Deviations from the paper: see each study's module header.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
import traceback
from pathlib import Path

from rlhfless.core.errors import ConfigError


def _description() -> str:
    """`repro --help`'s text: what it writes, and every study (which imports each study's module)."""
    from rlhfless.repro.studies import STUDIES

    names = "\n".join(f"  {s.name:12s} [{s.source}] {s.about}" for s in STUDIES.values())
    return textwrap.fill(
        "Regenerate the paper's figures from real runs on this machine and from the simulator, and write "
        "DIR/report.md (each figure, the command and config hash behind it, and a table: the paper's number, "
        "ours, and why they differ) and DIR/results.json. Each study is also an offline W&B run (group = "
        "study, job_type = repro) under DIR/<study>/wandb.", 100) \
        + "\n\nStudies ([real] = measured here, [sim] = simulated):\n" + names


class _Help(argparse.Action):
    """`repro --help` with the study list, made only when asked: every command line builds this parser, and the
    list's imports cost each of them 40 ms of start-up (`rlhfless simulate` included)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show this help message and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        parser.description = _description()
        parser.print_help()
        parser.exit()


def register(sub, bench) -> None:
    p = sub.add_parser(
        "repro", help="regenerate the paper's figures (real runs here + the simulator) and a report beside it",
        formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    p.add_argument("-h", "--help", action=_Help)
    p.add_argument("studies", nargs="*", metavar="STUDY", help="studies to run (default: all)")
    p.add_argument("--out", type=Path, default=None, help="output folder (required unless --list)")
    p.add_argument("--quick", action="store_true",
                   help="CI size: short sims and a 6-step real run (minutes); the default is the full size")
    p.add_argument("--seed", type=int, default=0, help="seed of the real runs and synthetic prompts (default 0)")
    p.add_argument("--tracking", default="offline", choices=("offline", "online", "disabled"),
                   help="W&B mode of the runs the repro makes (default offline: files under DIR, `wandb sync` "
                        "later)")
    p.add_argument("--set", dest="sim", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting of every simulated case (as `simulate` takes), e.g. --set "
                        "design=extended --set learner=single_step; repeatable")
    p.add_argument("--list", action="store_true", help="list the studies and exit")
    p.set_defaults(func=cmd_repro)


def chosen(names: list[str]) -> list[str]:
    """The studies to run, in registry order; ConfigError naming the unknown ones."""
    from rlhfless.repro.studies import STUDIES

    bad = [n for n in names if n not in STUDIES]
    if bad:
        raise ConfigError(f"studies: unknown {', '.join(bad)}; choose from {', '.join(STUDIES)}")
    return [n for n in STUDIES if not names or n in names]


def cmd_repro(args: argparse.Namespace) -> int:
    from rlhfless.repro.studies import STUDIES

    if args.list:
        for s in STUDIES.values():
            print(f"{s.name:12s} [{s.source}] {s.about}")
        return 0
    if args.out is None:
        raise ConfigError("out: give --out DIR (the folder for figures, report.md and results.json)")
    names = chosen(args.studies)
    if args.sim:  # a bad key stops here, in one line, before any study runs
        from rlhfless.sim.scenario import case_configs

        case_configs("quick", 1, args.sim)
    results, failed = run(names, args.out, args.quick, args.seed, args.tracking, tuple(args.sim))
    return 1 if failed else 0


def run(names: list[str], out: Path, quick: bool, seed: int, tracking: str, sim: tuple[str, ...] = ()):
    """Run `names` into `out`; returns (results, names that failed). Writes report.md and results.json."""
    from tqdm import tqdm

    from rlhfless.core.jsonl import write_json
    from rlhfless.repro.real_studies import REPO
    from rlhfless.repro.report import track, write_report, write_results
    from rlhfless.repro.studies import STUDIES, ReproContext

    ctx = ReproContext(out.resolve(), quick, seed, tracking, sim)
    ctx.out.mkdir(parents=True, exist_ok=True)
    results, failed = [], []
    bar = tqdm(names, desc="repro", unit="study", file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        try:
            r = STUDIES[name].fn(ctx)
        except Exception:  # noqa: BLE001 - one study's failure must not lose the others' figures
            err = ctx.out / name / "error.txt"
            err.parent.mkdir(parents=True, exist_ok=True)
            err.write_text(traceback.format_exc())
            print(f"rlhfless repro: {name} failed; traceback in {err}", file=sys.stderr)
            failed.append(name)
            continue
        r.seconds = time.perf_counter() - t0
        r.artifacts.append(write_json(r.numbers, ctx.out / name / "numbers.json"))
        track(r, ctx)
        results.append(r)
        for row in r.rows:
            tqdm.write(f"{name}: {row.metric}: paper {row.paper}; ours {row.ours} ({row.kind})", file=sys.stderr)
    report = write_report(write_results(results, ctx), ctx, REPO)
    print(f"report: {report} ({len(results)} studies, {sum(len(r.figures) for r in results)} figures"
          + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
    return results, failed
