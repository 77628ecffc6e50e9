"""`rlhfless profile`: argparse wiring and the printed table (the measurements are in `bench.profile`)."""

from __future__ import annotations

import argparse
import sys

from rlhfless.core.cliargs import count


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers (got {text!r})") from None


def register(sub, bench) -> None:
    p = sub.add_parser(
        "profile",
        help="measure decode-iteration, prefill and cold-start times of a model shape on a device (cpu or cuda) "
             "and write a time profile the planner and simulator read",
        description=(
            "Build a model of the named shape with random weights (nothing downloaded), time one decode iteration "
            "of this project's engine over batch size x context length, prefill over prompt tokens, a cold start "
            "(fresh process + imports + weight load) and, on CUDA, host<->device weight copies; write "
            "{rows, prefill_s_per_token, profile} to --out (plan.time_profile=OUT reads it) with the simulator's "
            "prediction and the measured/predicted ratio beside every point."
        ),
        epilog="example: rlhfless profile --device cuda --model qwen2.5-0.5b --out data/profiles/qwen0.5b_h200.json",
    )
    p.add_argument("--out", required=True, help="where to write the profile JSON")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:k (default cpu)")
    p.add_argument("--model", default="tiny", help="tiny, qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-3b (default tiny)")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu), float32 or bfloat16")
    p.add_argument("--batch-sizes", type=_ints, default=(), help="comma list (default by device type)")
    p.add_argument("--contexts", type=_ints, default=(), help="comma list of context lengths (default by device type)")
    p.add_argument("--prefill-tokens", type=_ints, default=(), help="comma list of prefill sizes (default by device)")
    p.add_argument("--iters", type=count(1, 100_000), default=8, help="timed decode iterations per point (default 8)")
    p.add_argument("--repeats", type=count(1, 10_000), default=3, help="timed prefills per size (default 3)")
    p.add_argument("--threads", type=count(1, 1024), default=1, help="torch threads (default 1)")
    p.add_argument("--no-cold-start", action="store_true", help="skip the cold-start measurement")
    p.add_argument("--no-progress", action="store_true", help="do not print each point as it is measured")
    p.set_defaults(func=_profile)


def _profile(args: argparse.Namespace) -> int:
    from rlhfless.bench.device_profile import ProfileConfig, run_profile, save, summary_lines

    cfg = ProfileConfig(model=args.model, device=args.device, dtype=args.dtype, batch_sizes=args.batch_sizes,
                        contexts=args.contexts, prefill_tokens=args.prefill_tokens, iters=args.iters,
                        repeats=args.repeats, threads=args.threads, cold_start=not args.no_cold_start)
    say = None if args.no_progress else (lambda line: print(f"rlhfless profile: {line}", file=sys.stderr))
    doc = run_profile(cfg, say)
    path = save(doc, args.out)
    print("\n".join(summary_lines(doc)), file=sys.stderr)
    print(f"rlhfless profile: wrote {path}", file=sys.stderr)
    return 0
