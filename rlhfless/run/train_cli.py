"""`rlhfless train` and `rlhfless pretrain`: the GRPO run and the SFT warm start that makes its checkpoint."""

from __future__ import annotations

import argparse
import json
import sys

from rlhfless.core.errors import ConfigError

QUICKSTART = "experiments/configs/quickstart.yaml"
OVERRIDES_EXAMPLE = "algo.group_size=8 optim.lr=1e-4 rollout.dedup_prefill=false"  # valid (tests apply them)
PRETRAIN_EXAMPLE = "steps=300"


def register(sub, bench) -> None:
    p = sub.add_parser(
        "train",
        help="run synchronous GRPO from a checkpoint and write summary, traces, metrics and W&B files",
        description=(
            "Run GRPO from a checkpoint on a task: by default the shipped tiny SFT checkpoint on the synthetic "
            "chained-addition task; policy.checkpoint takes any local Hugging Face causal-LM folder (its own "
            "tokenizer and chat template) and task.name=gsm8k|jsonl a verifiable-reward dataset "
            "(experiments/configs/gsm8k_hf.yaml). Every step's metrics "
            "go to W&B (offline by default) and OUT/metrics.jsonl; every response goes to OUT/traces/rollouts.jsonl. "
            "runtime.mode=serverless runs every stage as a function on worker processes (billed per lifetime: "
            "OUT/invocations.jsonl, OUT/workers.jsonl, Gantt charts); runtime.mode=serverful is the verl-like control; "
            "runtime.mode=compare runs serverful, serverful + overlap and serverless on one seed and writes "
            "OUT/comparison.json. Every config key with its type, default and allowed values: "
            "docs/config-reference.md, or `rlhfless config show KEY`."
        ),
        epilog="example: rlhfless train --config experiments/configs/quickstart.yaml train.steps=50 --out runs/demo",
    )
    p.add_argument("--config", default=None, help="YAML config (default: built-in defaults)")
    p.add_argument("--out", default=None,
                   help="run folder: a new path or an empty folder (an earlier run only with --resume; never data/); "
                        "not needed with --dry-run")
    p.add_argument("--wandb", choices=["offline", "online", "disabled"], default=None,
                   help="W&B mode (overrides tracking.mode; default offline)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in OUT from its last checkpoint (train.checkpoint_every); the result is "
                        "identical to an uninterrupted run. Extend a finished run with a larger train.steps")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept a config that differs in keys that change results")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the run makes before its first step (config, machine, checkpoint, "
                        "critic, task, context, time profile, predictor, emulated length trace; with --out, the run "
                        "folder), print the resolved config, and stop; reads the checkpoints without importing "
                        "torch, except to build the policy folder first when policy.build says so, as the run would")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=f"dotted config overrides, e.g. {OVERRIDES_EXAMPLE}")
    p.set_defaults(func=_train)

    q = sub.add_parser(
        "pretrain",
        help="SFT warm start: train the tiny model on written solutions and save a checkpoint",
        description="Train the tiny Qwen2-style model from scratch on solutions of the task (reproducible from a seed).",
    )
    q.add_argument("--out", required=True, help="checkpoint folder to write: a new path or an empty folder (a "
                   "checkpoint is never overwritten)")
    q.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=f"pretrain config overrides, e.g. {PRETRAIN_EXAMPLE}")
    q.set_defaults(func=_pretrain)


def _train(args: argparse.Namespace) -> int:
    from rlhfless.config import load_run_config
    from rlhfless.core.outpaths import check_run_dir, claim_run_dir
    from rlhfless.run.tracking import check_reachable

    if args.allow_config_change and not args.resume:
        raise ConfigError("--allow-config-change only applies with --resume")
    if args.out is None and not args.dry_run:
        raise ConfigError("--out: name the run folder, e.g. --out runs/demo (only --dry-run runs without one)")
    if args.out is not None:
        check_run_dir(args.out, args.resume)  # before loading anything: a refused folder is never touched
    overrides = list(args.overrides) + ([f"tracking.mode={args.wandb}"] if args.wandb else [])
    cfg = load_run_config(args.config, overrides)
    check_reachable(cfg.tracking)  # bounded, before any work: W&B's own start would hang ~100 s offline
    if args.resume and cfg.runtime.mode == "compare":
        raise ConfigError("--resume: runtime.mode=compare runs two fresh runs; resume OUT/serverful or "
                          "OUT/serverless with its own config instead")
    if args.dry_run:
        return _dry_run(cfg, args.out, args.resume, args.allow_config_change, not args.no_progress)
    from rlhfless.run.launch import train

    with claim_run_dir(args.out, args.resume):  # the check again, under the folder's lock: no two runs mix
        summary = train(cfg, args.out, progress=not args.no_progress, resume=args.resume,
                        allow_config_change=args.allow_config_change)
    if cfg.runtime.mode == "compare":
        _print_comparison(summary)
    else:
        _print_table(summary)
    return 0


def _print_comparison(c: dict) -> None:
    arms = c["arms"]
    print(f"\n{'':24s}" + "".join(f"{a:>18s}" for a in arms), file=sys.stderr)
    for name, key in (("step wall time (s)", "step_time_s"), ("billed device-seconds", "cost_device_s")):
        print(f"{name:24s}" + "".join(f"{c[a][key]:18.3f}" for a in arms), file=sys.stderr)
    print(f"serverless / serverful: step time {c['step_time_ratio']:.3f}x, device-seconds {c['cost_ratio']:.3f}x",
          file=sys.stderr)
    by = c.get("cost_ratio_by_billing") or {}
    print(f"serverless released {c.get('released_mid_step')} functions mid-step ({c.get('released_expired')} at a "
          f"keep-alive's lapse in all, {c.get('ranks_released_early')} learner ranks at their share), held nothing in {c.get('zero_held_intervals')} intervals; device-seconds "
          f"billed per invocation (the paper's proxy) {by.get('invocations', float('nan')):.3f}x", file=sys.stderr)
    o = c["overlap_only"]
    if o is not None:  # PPO has no overlap arm
        print(f"serverful-overlap / serverful: step time {o['step_time_ratio']:.3f}x, device-seconds "
              f"{o['cost_ratio']:.3f}x", file=sys.stderr)
    g = c["gap_core_s_per_step"]
    busy = ", ".join(f"{k} busy {v:+.3f}" for k, v in g["busy"].items())
    print(f"serverless - serverful, core-seconds per step: {g['billed']:+.3f} = cold starts {g['cold_start']:+.3f}, "
          f"{busy}, held idle {g['held_idle']:+.3f}", file=sys.stderr)
    print(f"samples identical in every step: {c['samples_identical']}; final weights identical: "
          f"{c['weights_identical']}; final state (policy, optimizer, critic) identical: "
          f"{c.get('final_state_identical')}; gantt: {', '.join(c['gantt'])}", file=sys.stderr)
    shares = {a: c[a]["machine"]["other_cpu_fraction"] for a in arms}
    if None not in shares.values():
        share = ", ".join(f"{a} {v:.0%}" for a, v in shares.items())
        note = ("the arms ran alone: the ratios are clean" if max(shares.values()) < 0.05 else
                "other jobs shared the cores while the arms ran one after another: the ratios above are not clean")
        print(f"machine CPU taken by other processes: {share} ({note})", file=sys.stderr)


def _dry_run(cfg, out: str | None, resume: bool, allow_config_change: bool, progress: bool) -> int:
    """Every check `train` makes before its first step, with its refusals, without writing anything and without
    importing torch (`rlhfless.run.preflight.dry_run`: checkpoints are read, not loaded), then the resolved config.
    Building the policy folder first, when `policy.build` says so, is a real action the run would take first: it
    imports torch, and its progress phase says so. A progress bar names the check running."""
    from dataclasses import asdict

    import yaml

    from rlhfless.run.preflight import dry_run

    train_prompts, eval_prompts = dry_run(cfg, out, resume, allow_config_change, progress)
    print(yaml.safe_dump(asdict(cfg), sort_keys=False), end="")
    print(f"rlhfless: config OK ({len(train_prompts)} train / {len(eval_prompts)} eval prompts, "
          f"checkpoint {cfg.policy.resolved()})", file=sys.stderr)
    return 0


def _print_table(s: dict) -> None:
    def pct(v):
        return "   n/a" if v is None else f"{100 * v:6.2f}%"

    rows = [
        ("held-out accuracy, sampled (mean of G)", s["eval_accuracy_initial"], s["eval_accuracy_final"]),
        ("held-out accuracy, greedy", s["eval_greedy_accuracy_initial"], s["eval_greedy_accuracy_final"]),
        ("train reward (first/last 10% of steps)", s["reward_mean_first"], s["reward_mean_last"]),
    ]
    print(f"\n{'':42s} {'start':>8s} {'end':>8s}", file=sys.stderr)
    for name, a, b in rows:
        print(f"{name:42s} {pct(a):>8s} {pct(b):>8s}", file=sys.stderr)
    print(f"steps {s['steps']}, wall {s['wall_s']} s, trace {s['trace_path']}", file=sys.stderr)


def _pretrain(args: argparse.Namespace) -> int:
    from rlhfless.core.configbase import apply_overrides, from_dict
    from rlhfless.run.pretrain import PretrainConfig, pretrain
    from rlhfless.core.outpaths import check_new_checkpoint

    check_new_checkpoint(args.out)
    cfg = from_dict(PretrainConfig, apply_overrides({}, args.overrides, PRETRAIN_EXAMPLE))
    summary = pretrain(cfg, args.out, progress=not args.no_progress)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=1))
    return 0
