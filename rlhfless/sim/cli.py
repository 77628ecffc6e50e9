"""CLI wiring of the simulator: `rlhfless simulate`.

    rlhfless simulate --scenario paper-testbed [--steps N] [key=value ...] [--json OUT] [--out DIR]
    rlhfless simulate --validate RUN_DIR [--calibrate-from RUN_DIR2] [--json OUT]
    rlhfless plan what-if --model NAME --devices KIND:COUNT [--prices FILE] [--deadline-ratio R | --budget-usd B]
                          [--trace TRACE] [--json OUT]

Only argparse wiring and printing live here; the work is `rlhfless.sim.scenario.run_scenario`,
`rlhfless.sim.report`, `rlhfless.sim.validate.validate` and `rlhfless.sim.whatif.what_if`, which tests call
directly. Errors the user can fix
(unknown scenario, device or model, a model that does not fit, impossible capacities, a bad override, a missing
run file) print one line naming the field and exit 2. Non-goals: no sweeps (the notebook does them).
Deviations from the paper: none.
"""

from __future__ import annotations

import argparse
import json

from rlhfless.core.cliargs import count
from rlhfless.sim import MAX_SIM_STEPS, SCENARIO_HELP
from rlhfless.core.errors import ConfigError


def _print_case(case: dict) -> None:
    print(f"{case['name']}: tp={case['tp']} x {case['replicas']} replicas, capacity {case['capacity']}, "
          f"{case['steps']} steps of {case['seqs_per_step']} sequences ({case['workload_note']})")
    for name, p in case["policies"].items():
        print(f"  {name:16s} step {p['step_time_s']:8.2f} s  (rollout {p['rollout_s']:7.2f})  "
              f"{p['cost_device_s']:10.1f} device-s  ${p['cost_usd']:.3f}  actors {p['n_actors']:.1f}")
    for name, b in case["baselines"].items():
        mark = " (headline)" if name == case["baseline"] else ""
        print(f"  rlhfless vs verl {name}{mark}: speedup {b['speedup']:.3f}x, cost reduction "
              f"{b['cost_reduction']:.1%} (device-s; {b['cost_reduction_usd']:.1%} in $)")
    for name, b in case.get("paper_range", {}).items():
        print(f"  rlhfless vs paper verl {name} (tp={b['tp']}): speedup {b['speedup']:.3f}x, cost reduction "
              f"{b['cost_reduction']:.1%}")
    if "shapley" in case:
        from rlhfless.sim.shapley import prose

        print(f"  {prose(case['shapley'], 'rlhfless vs verl ' + case['baseline'])}")
    print(f"  design {case['design']}, learner {case['learner']} (both systems); "
          f"gap to oracle: time {case['gap_to_oracle_time']:+.1%}, cost {case['gap_to_oracle_cost']:+.1%}; "
          f"paper verl: tp={case['paper_tp']}, capacity {case['paper_capacity']}")


def _strip(report: dict) -> dict:
    return {**report, "cases": [{k: v for k, v in c.items() if not k.startswith("_")} for c in report["cases"]]}


def arm_line(a: dict) -> str:
    """One arm of the arm model's validation: step time, bill and the bill's split, simulated/measured."""
    def r(x: dict) -> str:
        return f"{x['simulated']:.3f}/{x['measured']:.3f}"

    c = a["core_s_per_step"]
    busy = ", ".join(f"busy {k} {r(v)}" for k, v in c["busy"].items())
    return (f"arm {a['arm']}: step {r(a['step_time_s'])} s ({a['step_time_s']['rel_error']:.1%}), billed "
            f"{r(a['cost_device_s'])} core-s ({a['cost_device_s']['rel_error']:.1%}): cold {r(c['cold_start'])}, "
            f"{busy}, held idle {r(c['held_idle'])} (simulated/measured per step, {a['steps_validated']} steps)"
            + _load_part(a.get("at_measured_load")))


def _load_part(load: dict | None) -> str:
    """The arm's load term (armmodel.at_measured_load), or nothing for a report written before it."""
    if not load:
        return ""
    f = ", ".join(f"{x:.2f}" for x in load["decode_load_factor"])
    return (f"; load factor per step {f}: at that load step {load['step_time_s']['rel_error']:.1%}, "
            f"billed {load['cost_device_s']['rel_error']:.1%}")


def ppo_line(p: dict) -> str:
    """The PPO structure check of a validated PPO run: the simulator's ratios beside the measured ones."""
    def r(x: dict) -> str:
        meas = f"measured {x['measured']:.2f} ({x['rel_error']:.1%})" if "measured" in x else \
            f"not measured: {x['missing']}"
        return f"simulated {x['simulated']:.2f}, {meas}"

    return (f"PPO structure over {p['steps']} steps: value forward / reference forward "
            f"{r(p['values_over_reference'])}; update / its actor part {r(p['update_over_actor_update'])}")


class _Bar:
    """`scenario.Progress` as one tqdm bar on stderr over every (case, policy) pair; its total grows as each case
    names its policies (known once its clusters are built). Made at the first case, so a refused config or case
    prints its one line alone."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar, self.name = enabled, None, ""

    def case(self, name: str, policies: list[str]) -> None:
        if not self.enabled:  # --no-progress: no bar, and no tqdm import (30 ms of start-up)
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=0, desc="simulate", unit="policy", disable=not self.enabled, leave=False)
        self.name = name
        self.bar.total += len(policies)
        self.bar.set_postfix_str(f"{name}: {len(policies)} policies", refresh=True)

    def played(self, policy: str) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix_str(f"{self.name}: {policy} done", refresh=False)
        self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_simulate(args: argparse.Namespace) -> int:
    from rlhfless.core.jsonl import write_json

    if args.validate:
        from rlhfless.sim.validate import validate

        if args.overrides or args.scenario:
            raise ConfigError("validate: --validate takes no --scenario and no key=value overrides")
        report = validate(args.validate, args.calibrate_from)
        for name, m in report["modes"].items():  # by folder: serverful-overlap's mode is serverful
            if "skipped" in m:
                print(f"{name}: not validated: {m['skipped']}")
                continue
            rows = ", ".join(f"{k} {v['simulated']:.3f}/{v['measured']:.3f} s ({v['rel_error']:.1%})"
                             for k, v in m["stages"].items())
            print(f"{name}: simulated/measured mean per step: {rows}")
            if "ppo" in m:
                print(f"{name}: {ppo_line(m['ppo'])}")
        for a in report.get("arms", {}).values():
            print(f"arm {a['arm']}: not played: {a['skipped']}" if "skipped" in a else arm_line(a))
        if "emulated" in report:
            from rlhfless.sim.modelled import arm_line as emulated_line

            for a in report["emulated"].values():
                print(emulated_line(a))
        print(f"step_time_error {report['step_time_error']:.1%}, cost_error {report['cost_error']:.1%}")
        if "step_time_error_at_measured_load" in report:  # armmodel.at_measured_load: the load's share taken out
            print(f"at each step's measured load: step_time_error {report['step_time_error_at_measured_load']:.1%}, "
                  f"cost_error {report['cost_error_at_measured_load']:.1%}")
    else:
        from rlhfless.sim.scenario import run_scenario

        if not args.scenario:
            raise ConfigError(f"scenario: give --scenario NAME ({', '.join(SCENARIO_HELP)}) or --validate RUN_DIR")
        bar = _Bar(enabled=not args.no_progress)
        try:
            report = run_scenario(args.scenario, args.steps, args.overrides, keep_timelines=bool(args.out),
                                  progress=bar)
        finally:
            bar.close()  # before any line is printed, an error's included
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


def cmd_what_if(args: argparse.Namespace) -> int:
    from rlhfless.core.jsonl import write_json
    from rlhfless.sim.whatif import render, what_if

    report = what_if(args.model, args.devices, args.prices, args.deadline_ratio, args.budget_usd, args.trace,
                     args.steps, args.prompts_per_step, args.group_size, args.seed, args.overrides)
    print(render(report))
    print(f"wall_s {report['wall_s']:.2f}")
    if args.json:
        write_json(report, args.json, indent=2)
    return 0


def _register_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="what-if planning for your own devices and prices (simulated)")
    plan = p.add_subparsers(dest="plan_command", metavar="COMMAND", required=True)
    w = plan.add_parser(
        "what-if", help="recommended mode, N, tau and lambda, and seconds and dollars per step, serverful beside "
                        "serverless",
        description="Simulate your model on your devices (serverful verl at its fastest TP; RLHFless at several "
                    "lambdas and, with --deadline-ratio, the min_cost_at_deadline objective) and recommend the best "
                    "point under the constraint: the cheapest whose step is at most R x the serverful step "
                    "(--deadline-ratio R, default 1), or the fastest within --budget-usd per step. Bands: 10th-90th "
                    "percentile over the simulated steps.")
    w.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="override a simulator setting (SimConfig, as simulate takes), e.g. design=extended "
                        "learner=single_step hybrid=false paper_verl.tp=8")
    w.add_argument("--model", required=True, help="model shape, e.g. llama-70b, qwen2.5-7b (rlhfless.sim.hardware)")
    w.add_argument("--devices", required=True, metavar="KIND:COUNT", help="e.g. H100:160, L40S:16")
    w.add_argument("--prices", metavar="FILE", help="YAML/JSON {KIND: {serverless_usd_per_s, ondemand_usd_per_h}} "
                                                    "replacing the catalog's prices")
    c = w.add_mutually_exclusive_group()
    c.add_argument("--deadline-ratio", type=float, metavar="R", help="step at most R x the serverful step")
    c.add_argument("--budget-usd", type=float, metavar="B", help="at most B dollars per step")
    w.add_argument("--trace", help="replay this length trace (JSONL of TraceRow) instead of synthetic lengths")
    w.add_argument("--steps", type=count(1, 1000), default=6, help="steps to simulate (default 6)")
    w.add_argument("--prompts-per-step", type=count(1, 100_000), default=512, help="prompts per step (default 512)")
    w.add_argument("--group-size", type=count(1, 1024), default=8, help="samples per prompt (default 8)")
    w.add_argument("--seed", type=int, default=0, help="synthetic workload seed (default 0)")
    w.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    w.set_defaults(func=cmd_what_if)


class _NoHyphenBreaks(argparse.HelpFormatter):
    """Wraps help without splitting at hyphens, so a scenario name (`local-cpu`) stays whole and copyable."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    _register_plan(sub)
    p = sub.add_parser(
        "simulate", formatter_class=_NoHyphenBreaks,
        help="large-scale simulation of every policy (verl, RLHFuse-like, RLHFless, oracle), or "
             "validation of the simulator against a real run",
        description="Simulate a scenario's cases with the real planner and report time and cost per policy, "
                    "RLHFless vs verl (speedup, cost reduction) and the gap to the oracle; or, with --validate, "
                    "simulate a run recorded on this machine and compare with what it measured.",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="override a case field (SimConfig), e.g. baseline=paper lam=0.8 n_devices=32 "
                        "lengths.median=400")
    p.add_argument("--scenario", help="; ".join(f"{k} ({v})" for k, v in SCENARIO_HELP.items()))
    p.add_argument("--steps", type=count(1, MAX_SIM_STEPS),
                   help=f"steps per case, at most {MAX_SIM_STEPS:,} (default: the scenario's, three epochs)")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON to OUT")
    p.add_argument("--print-json", action="store_true", help="print the JSON report (without --json)")
    p.add_argument("--out", metavar="DIR", help="also write Gantt charts and stage breakdowns (PNG) to DIR")
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bar (stderr: one step per case and policy simulated)")
    p.add_argument("--validate", metavar="RUN_DIR", help="simulate a recorded run and compare with its metrics")
    p.add_argument("--calibrate-from", metavar="RUN_DIR",
                   help="with --validate: calibrate on this other run (default: the first half of RUN_DIR)")
    p.set_defaults(func=cmd_simulate)
