"""CLI wiring of the planner: `rlhfless bench planner` and `rlhfless bench plan-trace`.

Only argparse wiring lives here; the work is `rlhfless.plan.bench.run_planner_bench` and
`rlhfless.plan.report.trace_report`, which tests call directly. Non-goals: no planning command of its own (the
training loop and the simulator call the planner as a library). Deviations from the paper: none.
"""

from __future__ import annotations

import argparse
import json

from rlhfless.core.cliargs import count
from rlhfless.core.configbase import build_config, load_yaml
from rlhfless.core.errors import ConfigError
from rlhfless.core.jsonl import write_json

SET_EXAMPLE = "max_actors=16"  # a valid --set of the plan commands (tests apply it)


def load_plan_config(config: str | None, overrides: list[str]):
    """PlanConfig from an optional YAML (its `plan:` section, or the whole file) plus `plan.key=value` overrides.

    A file that is not a YAML mapping, or whose fields are unknown, wrongly typed or out of range, raises a
    one-line `ConfigError` naming the file (`build_config`); a bad override is named by its key instead.
    """
    from rlhfless.plan.config import PlanConfig

    data = load_yaml(config) if config else {}
    section = data.get("plan", data) if config else {}
    if not isinstance(section, dict):
        raise ConfigError(f"{config}: 'plan' must be a mapping of PlanConfig fields")
    plan_overrides = [o[len("plan."):] if o.startswith("plan.") else o for o in overrides]
    return build_config(PlanConfig, section or {}, plan_overrides, source=config, prefix="plan",
                        example=SET_EXAMPLE)


def _write(obj: dict, path: str | None) -> None:
    if path:
        write_json(obj, path, indent=2)
    print(json.dumps(obj, indent=2, sort_keys=True))


def cmd_bench_planner(args: argparse.Namespace) -> int:
    from rlhfless.plan.bench import run_planner_bench

    _write(run_planner_bench(n_groups=args.groups, group_size=args.group_size, n_actors=args.n_actors,
                             n_candidates=args.candidates, policy=args.policy, capacity=args.capacity,
                             repeats=args.repeats, seed=args.seed, compare_exact=not args.no_exact), args.json)
    return 0


def cmd_plan_trace(args: argparse.Namespace) -> int:
    from rlhfless.plan.report import trace_report

    cfg = load_plan_config(args.config, args.set or [])
    _write(trace_report(args.trace, cfg, n_actors=args.n_actors, steps=args.steps), args.json)
    return 0


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser(
        "planner", help="planning time of the full decision over 64 candidate N (plan_ms_p50) and of one assign",
        description="Time the full planning decision (scaler choose() over N=1..candidates: assignment, T(N) and "
                    "C(N) of every candidate, the chosen plan simulated exactly) for a heavy-tailed workload "
                    "(default 1,024 groups x 8 = 8,192 sequences), one assign() at --n-actors, and the exact "
                    "(simulate-every-candidate) sweep for comparison; prints and optionally writes JSON.",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--groups", type=count(1, 100_000), default=1024, help="prompt groups (default 1024)")
    p.add_argument("--group-size", type=count(1, 4096), default=8, help="samples per group (default 8)")
    p.add_argument("--n-actors", type=count(1, 4096), default=16, help="actors for the timed assign() (default 16)")
    p.add_argument("--candidates", type=count(1, 4096), default=64, help="scaler sweep over N=1..this (default 64)")
    p.add_argument("--policy", default="contiguous",
                   help="round_robin | contiguous | lpt | karmarkar_karp (default contiguous)")
    p.add_argument("--capacity", type=count(1, 1_000_000), default=256,
                   help="max concurrent sequences per actor (default 256)")
    p.add_argument("--repeats", type=count(1, 10_000), default=21,
                   help="timed repetitions of each measurement (default 21)")
    p.add_argument("--no-exact", action="store_true", help="skip the slow exact sweep used for comparison")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.set_defaults(func=cmd_bench_planner)

    t = bench.add_parser(
        "plan-trace", help="policies and scaler on a recorded length trace with true lengths",
        description="On a TraceRow JSONL trace (true lengths), compare round-robin, contiguous, LPT and "
                    "Karmarkar-Karp (predicted idle device-seconds and makespan, with and without cut-and-migrate) "
                    "and report the scaler's choice with its T/C against every fixed N.",
    )
    t.add_argument("--trace", required=True,
                   help="length trace (JSONL of TraceRow), e.g. data/traces/quickstart.jsonl.gz")
    t.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    t.add_argument("--config", help="YAML with a `plan:` section (PlanConfig fields)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help=f"override a PlanConfig field, e.g. --set {SET_EXAMPLE} (repeatable)")
    t.add_argument("--n-actors", type=count(1, 4096), default=None,
                   help="actors for the policy comparison (default max_actors)")
    t.add_argument("--steps", choices=("last_epoch", "all"), default="last_epoch",
                   help="which steps of the trace to plan (default: the last epoch's)")
    t.set_defaults(func=cmd_plan_trace)
