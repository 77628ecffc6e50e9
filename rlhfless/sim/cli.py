"""CLI wiring of the simulator: `rlhfless simulate`.

    rlhfless simulate --scenario paper-testbed [--steps N] [key=value ...] [--json OUT] [--out DIR]
    rlhfless simulate --validate RUN_DIR [--calibrate-from RUN_DIR2] [--json OUT]

Only argparse wiring and printing live here; the work is `rlhfless.sim.scenario.run_scenario`,
`rlhfless.sim.report` and `rlhfless.sim.validate.validate`, which tests call directly. Errors the user can fix
(unknown scenario, device or model, a model that does not fit, impossible capacities, a bad override, a missing
run file) print one line naming the field and exit 2. Non-goals: no sweeps (the notebook does them).
Deviations from the paper: none.
"""

from __future__ import annotations

import argparse
import json

from rlhfless.cliargs import count
from rlhfless.sim import MAX_SIM_STEPS, SCENARIO_HELP
from rlhfless.errors import ConfigError


def _print_case(case: dict) -> None:
    print(f"{case['name']}: tp={case['tp']} x {case['replicas']} replicas, capacity {case['capacity']}, "
          f"{case['steps']} steps of {case['seqs_per_step']} sequences ({case['workload_note']})")
    for name, p in case["policies"].items():
        print(f"  {name:16s} step {p['step_time_s']:8.2f} s  (rollout {p['rollout_s']:7.2f})  "
              f"{p['cost_device_s']:10.1f} device-s  ${p['cost_usd']:.3f}  actors {p['n_actors']:.1f}")
    print(f"  rlhfless vs verl: speedup {case['speedup']:.3f}x, cost reduction {case['cost_reduction']:.1%} "
          f"(device-s; {case['cost_reduction_usd']:.1%} in $); gap to oracle: time "
          f"{case['gap_to_oracle_time']:+.1%}, cost {case['gap_to_oracle_cost']:+.1%}")


def _strip(report: dict) -> dict:
    return {**report, "cases": [{k: v for k, v in c.items() if not k.startswith("_")} for c in report["cases"]]}


def cmd_simulate(args: argparse.Namespace) -> int:
    from rlhfless.jsonl import write_json

    if args.validate:
        from rlhfless.sim.validate import validate

        if args.overrides or args.scenario:
            raise ConfigError("validate: --validate takes no --scenario and no key=value overrides")
        report = validate(args.validate, args.calibrate_from)
        for m in report["modes"].values():
            rows = ", ".join(f"{k} {v['simulated']:.3f}/{v['measured']:.3f} s ({v['rel_error']:.1%})"
                             for k, v in m["stages"].items())
            print(f"{m['mode']}: simulated/measured mean per step: {rows}")
        print(f"step_time_error {report['step_time_error']:.1%}, cost_error {report['cost_error']:.1%}")
    else:
        from rlhfless.sim.scenario import run_scenario

        if not args.scenario:
            raise ConfigError(f"scenario: give --scenario NAME ({', '.join(SCENARIO_HELP)}) or --validate RUN_DIR")
        report = run_scenario(args.scenario, args.steps, args.overrides, keep_timelines=bool(args.out))
        for case in report["cases"]:
            _print_case(case)
        if args.out:
            _figures(report, args.out)
        report = _strip(report)
        print(f"sim_wall_s {report['sim_wall_s']:.2f}")
    if args.json:
        write_json(report, args.json, indent=2)
    elif args.print_json:
        print(json.dumps(report, indent=2, default=str))
    return 0


def _figures(report: dict, out: str) -> None:
    from pathlib import Path

    from rlhfless.sim.report import breakdown, gantt

    for case in report["cases"]:
        stem = case["name"].replace("/", "_")
        tls = case["_timelines"]
        mid = case["steps"] // 2  # a step after the predictor has seen every prompt at least once, usually
        paths = [gantt(tls, mid, Path(out) / f"{stem}_gantt.png"), breakdown(case, Path(out) / f"{stem}_stages.png")]
        print("figures: " + ", ".join(str(p) for p in paths))


class _NoHyphenBreaks(argparse.HelpFormatter):
    """Wraps help without splitting at hyphens, so a scenario name (`local-cpu`) stays whole and copyable."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", formatter_class=_NoHyphenBreaks,
        help="large-scale simulation of every policy (verl, RLHFuse-like, RLHFless, oracle), or "
             "validation of the simulator against a real run",
        description="Simulate a scenario's cases with the real planner and report time and cost per policy, "
                    "RLHFless vs verl (speedup, cost reduction) and the gap to the oracle; or, with --validate, "
                    "simulate a run recorded on this machine and compare with what it measured.",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="override a case field (SimConfig), e.g. lam=0.8 n_devices=32 lengths.median=400")
    p.add_argument("--scenario", help="; ".join(f"{k} ({v})" for k, v in SCENARIO_HELP.items()))
    p.add_argument("--steps", type=count(1, MAX_SIM_STEPS),
                   help=f"steps per case, at most {MAX_SIM_STEPS:,} (default: the scenario's, three epochs)")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON to OUT")
    p.add_argument("--print-json", action="store_true", help="print the JSON report (without --json)")
    p.add_argument("--out", metavar="DIR", help="also write Gantt charts and stage breakdowns (PNG) to DIR")
    p.add_argument("--validate", metavar="RUN_DIR", help="simulate a recorded run and compare with its metrics")
    p.add_argument("--calibrate-from", metavar="RUN_DIR",
                   help="with --validate: calibrate on this other run (default: the first half of RUN_DIR)")
    p.set_defaults(func=cmd_simulate)
