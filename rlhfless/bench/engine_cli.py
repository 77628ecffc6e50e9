"""`rlhfless bench prefill` and `rlhfless bench engine`: argparse wiring and printed tables (work in `bench.py`)."""

from __future__ import annotations

import argparse
import sys

from rlhfless.core.cliargs import count
from rlhfless.core.jsonl import write_json


def register(sub, bench) -> None:
    p = bench.add_parser(
        "prefill",
        help="naive vs deduplicated prefill (within-group and shared template), token identity, learner reuse",
        description=(
            "Time naive prefill (every one of B x G rows), group dedup (each prompt once) and prefix dedup (shared "
            "template computed once too), side by side and interleaved, on arithmetic prompts behind a template "
            "and on GSM8K few-shot prompts (skipped when the file is absent). Also checks that greedy outputs are "
            "identical and times the learner forward+backward with and without prompt reuse."
        ),
        epilog="example: rlhfless bench prefill --json runs/bench/prefill.json",
    )
    p.add_argument("--json", required=True, help="where to write the JSON report")
    p.add_argument("--prompts", type=count(1, 100_000), default=16, help="B, distinct arithmetic prompts (default 16)")
    p.add_argument("--group-size", type=count(1, 4096), default=8, help="G, samples per prompt (default 8)")
    p.add_argument("--repeats", type=count(1, 10_000), default=5,
                   help="timed repeats per mode, medians reported (default 5)")
    p.add_argument("--gsm8k", default="../shared/data/gsm8k/train.jsonl", help="GSM8K-format JSONL (optional)")
    p.add_argument("--gsm8k-prompts", type=count(0, 100_000), default=8, help="B for the GSM8K workload (default 8)")
    p.add_argument("--gsm8k-shots", type=count(0, 64), default=2,
                   help="worked examples in the GSM8K template (default 2)")
    p.add_argument("--checkpoint", default="data/checkpoints/sft", help="policy for the arithmetic workload")
    p.add_argument("--threads", type=count(1, 1024), default=1, help="torch threads (default 1)")
    p.set_defaults(func=_prefill)

    e = bench.add_parser(
        "engine",
        help="this rollout engine vs HF model.generate (plain and with the same deduplicated prefill) on a "
             "long-tailed length mix; saves the TPOT profile",
        description=(
            "Generate B x G responses to the task's heavy-tailed prompts with this engine and with HF "
            "model.generate on the same batch and seed, greedy (outputs must match) and sampled; report tokens/s "
            "and the speedup against static-batch HF generate and against HF generate given the engine's "
            "deduplicated prefill (each prompt once, KV repeated G times), so the decode loop's own share shows; "
            "save the per-iteration decode time profile (TPOT) as JSON for the planner. --engines own,hf,vllm adds "
            "the optional vLLM engine (rollout.vllm_engine) to the side-by-side tokens/s table."
        ),
        epilog="example: rlhfless bench engine --json runs/bench/engine.json --engines own,hf,vllm",
    )
    e.add_argument("--json", required=True, help="where to write the JSON report")
    e.add_argument("--tpot", default=None, help="TPOT profile path (default: <json stem>_tpot.json beside --json)")
    e.add_argument("--prompts", type=count(1, 100_000), default=32, help="B, distinct prompts (default 32)")
    e.add_argument("--group-size", type=count(1, 4096), default=8, help="G, samples per prompt (default 8)")
    e.add_argument("--max-new-tokens", type=count(1, 100_000), default=192, help="response cap (default 192)")
    e.add_argument("--temperature", type=float, default=1.0, help="sampled comparison temperature (default 1.0)")
    e.add_argument("--repeats", type=count(1, 10_000), default=3, help="timed repeats per engine (default 3)")
    e.add_argument("--checkpoint", default="data/checkpoints/sft", help="policy checkpoint")
    e.add_argument("--threads", type=count(1, 1024), default=None,
                   help="torch threads (default: the cores this process may use; 1 gives steadier timings on a "
                        "shared machine)")
    e.add_argument("--no-progress", action="store_true", help="hide the progress bar (the plan is still printed)")
    e.add_argument("--no-hf-step", action="store_true", help="skip the ablation with the HF forward as decode step")
    e.add_argument("--gsm8k", default="../shared/data/gsm8k/train.jsonl",
                   help="GSM8K-format JSONL of the second workload (skipped when absent)")
    e.add_argument("--gsm8k-prompts", type=count(0, 100_000), default=8,
                   help="B of the GSM8K workload (default 8; 0 = skip)")
    e.add_argument("--gsm8k-max-new-tokens", type=count(1, 100_000), default=64, help="response cap there (default 64)")
    e.add_argument("--engines", default="own,hf", type=_engine_list,
                   help="comma list from own,hf,vllm timed side by side (default own,hf; own is always needed; "
                        "vllm is skipped, saying why, where it cannot be imported: `make env-vllm` installs it)")
    e.set_defaults(func=_engine)


def _engine_list(text: str) -> tuple[str, ...]:
    from rlhfless.bench.engine_bench import ENGINES

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in ENGINES]
    if bad or "own" not in names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose a comma list from {','.join(ENGINES)}, own included")
    return names


def _write(report: dict, path: str) -> None:
    print(f"wrote {write_json(report, path)}")


def check_checkpoint(path: str) -> None:
    """Before any work: a --checkpoint the user names must be a policy folder. Only the default may be absent
    (a fresh model is then used and the report says so: `engine_bench.load_policy`)."""
    from pathlib import Path

    from rlhfless.config import DEFAULT_CHECKPOINT
    from rlhfless.core.errors import ConfigError

    p = Path(path)
    if (p / "model.safetensors").is_file() or path == DEFAULT_CHECKPOINT:
        return
    why = "does not exist" if not p.exists() else "is a file" if not p.is_dir() else "holds no model.safetensors"
    raise ConfigError(f"--checkpoint: {path} {why}; name a policy checkpoint folder (default {DEFAULT_CHECKPOINT})")


def _prefill(args: argparse.Namespace) -> int:
    from rlhfless.bench.engine_bench import PrefillBenchConfig, bench_prefill

    check_checkpoint(args.checkpoint)
    cfg = PrefillBenchConfig(prompts=args.prompts, group_size=args.group_size, repeats=args.repeats,
                             gsm8k_path=args.gsm8k, gsm8k_prompts=args.gsm8k_prompts, gsm8k_shots=args.gsm8k_shots,
                             checkpoint=args.checkpoint, threads=args.threads)
    report = bench_prefill(cfg)
    print(prefill_table(report))
    _write(report, args.json)
    return 0


def _engine(args: argparse.Namespace) -> int:
    check_checkpoint(args.checkpoint)  # before the imports and the workloads (seconds to minutes of work)
    from rlhfless.bench.engine_bench import EngineBenchConfig, bench_engine
    from rlhfless.bench.engineprogress import describe

    threads = {} if args.threads is None else {"threads": args.threads}  # unset: the config's default
    cfg = EngineBenchConfig(prompts=args.prompts, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, repeats=args.repeats, checkpoint=args.checkpoint,
                            tpot_path=args.tpot, hf_step_ablation=not args.no_hf_step,
                            engines=args.engines, gsm8k_path=args.gsm8k, gsm8k_prompts=args.gsm8k_prompts,
                            gsm8k_max_new_tokens=args.gsm8k_max_new_tokens, **threads)
    print(describe(cfg), file=sys.stderr, flush=True)  # before the first (slow) call: what runs, roughly how long
    report = bench_engine(cfg, args.json, progress=not args.no_progress)
    print(engine_table(report))
    _write(report, args.json)
    return 0


def prefill_table(report: dict) -> str:
    cols = [("model", "{}"), ("prompts", "{}"), ("prompt_tokens_mean", "{:.0f}"), ("plan_mode", "{}"),
            ("theoretical_ratio", "{:.2f}"), ("t_naive_s", "{:.4f}"), ("t_group_s", "{:.4f}"),
            ("t_dedup_s", "{:.4f}"), ("prefill_time_ratio", "{:.2f}"), ("fraction_of_theoretical_saving", "{:.3f}"),
            ("group_only_fraction_of_theoretical_saving", "{:.3f}"), ("tokens_identical", "{}"),
            ("forward_time_ratio", "{:.2f}")]
    lines = []
    for name, w in report["workloads"].items():
        lines.append(f"-- {name}")
        if "skipped" in w:
            lines.append(f"   skipped: {w['skipped']}")
            continue
        lines += [f"   {k:<44} {f.format(w[k])}" for k, f in cols]
    return "\n".join(lines)


def engine_table(report: dict) -> str:
    lines = [f"model {report['model']}  B={report['prompts']} G={report['group_size']} "
             f"max_new={report['max_new_tokens']}"]
    if "hf_generate_tokens_per_s" in report["sampled"]:
        lines += _hf_rows(report)
    lines += _side_by_side_rows(report)
    if "vllm" in report:
        v = report["vllm"]
        lines.append(f"vllm: skipped: {v['skipped']}" if "skipped" in v else
                     f"vllm {v['version']}: started in {v['start_s']:.1f} s, greedy identical to own: "
                     f"{report['greedy'].get('vllm_greedy_identical')}, prefix cache hits/queries "
                     f"{v['prefix_cache']['hits']}/{v['prefix_cache']['queries']}")
    g = report.get("gsm8k", {})
    if "skipped" in g:
        lines.append(f"gsm8k workload: skipped: {g['skipped']}")
    elif g:
        lines.append(f"gsm8k workload: {g['model']}  B={g['prompts']} (prompts {g['prompt_tokens_mean']:.0f} tokens "
                     f"on average) G={report['group_size']} max_new={g['max_new_tokens']}")
        lines += _side_by_side_rows(g)[1:]
    lines.append(f"TPOT profile: {report['tpot_profile']}")
    return "\n".join(lines)


def _hf_rows(report: dict) -> list[str]:
    lines = [f"{'mode':<8} {'engine tok/s':>13} {'HF gen tok/s':>13} {'speedup':>8} {'HF+dedup tok/s':>15} "
             f"{'speedup':>8} {'HF-step tok/s':>14} {'len mean':>9} {'len max':>8}"]
    for mode in ("greedy", "sampled"):
        r = report[mode]
        lines.append(f"{mode:<8} {r['tokens_per_s']:>13.0f} {r['hf_generate_tokens_per_s']:>13.0f} "
                     f"{r['speedup_vs_hf_generate']:>8.2f} {r['hf_generate_dedup_tokens_per_s']:>15.0f} "
                     f"{r['speedup_vs_hf_generate_dedup']:>8.2f} "
                     f"{r.get('engine_hf_step_tokens_per_s', float('nan')):>14.0f} "
                     f"{r['length_mean']:>9.1f} {r['length_max']:>8}")
    lines.append(f"greedy_identical={report['greedy_identical']}")
    return lines


def _side_by_side_rows(report: dict) -> list[str]:
    """tokens/s of each engine and its ratio to own (> 1: faster than own), per mode."""
    names = list(report["greedy"]["tokens_per_s_by_engine"])
    head = " ".join(f"{n + ' tok/s':>12}" for n in names) + " " + " ".join(f"{n + '/own':>9}" for n in names[1:])
    lines = ["engines side by side", f"{'mode':<8} {head}"]
    for mode in ("greedy", "sampled"):
        r = report[mode]
        row = " ".join(f"{r['tokens_per_s_by_engine'][n]:>12.0f}" for n in names)
        row += " " + " ".join(f"{r['ratio_to_own'][n]:>9.2f}" for n in names[1:])
        lines.append(f"{mode:<8} {row}")
    return lines
