"""`rlhfless predictor {train,eval,convert,compare}` and `rlhfless data {gsm8k-lengths,synthetic-trace,trace-stats}`.

Only argparse wiring: each command calls a function of `rlhfless.predictor.commands` (tests call those
directly). Heavy libraries are imported inside the functions so `rlhfless --help` stays instant.
Non-goals and deviations: see `rlhfless.predictor.commands`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlhfless.core.cliargs import count
from rlhfless.core.errors import ConfigError
from rlhfless.core.jsonl import write_json

SET_EXAMPLE = "alpha=0.3"  # valid --set examples the help and messages give (tests apply them)
SYNTHETIC_SET_EXAMPLE = "n_prompts=256"


def _split_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--test-epoch", type=int, default=None,
                   help="traces: test on this epoch, train on earlier ones (default: the last epoch)")
    p.add_argument("--test-frac", type=float, default=0.2,
                   help="text-only data: fraction of prompts held out for testing (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out prompt split (default 0)")


def _trust_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-pickle", action="store_true",
                   help="also read a learned predictor saved by rlhfless 0.1 (model.pkl). Unpickling runs code the "
                        "file holds: only for files you made yourself")


def _config(name: str, sets: list[str]):
    from rlhfless.core.configbase import parse_override
    from rlhfless.predictor.config import PredictorConfig

    data = {"name": name}
    for item in sets:
        keys, value = parse_override(item, SET_EXAMPLE)
        if len(keys) != 1:
            raise ConfigError(f"--set {item}: predictor keys are not nested (for example --set {SET_EXAMPLE})")
        data[keys[0]] = value
    return PredictorConfig.from_dict(data)


def _spec(args):
    from rlhfless.predictor.commands import SplitSpec

    if not 0.0 < args.test_frac < 1.0:
        raise ConfigError(f"--test-frac: must be in (0, 1) (got {args.test_frac})")
    return SplitSpec(args.test_epoch, args.test_frac, args.seed)


def cmd_train(args) -> int:
    from rlhfless.predictor.commands import train_predictor

    cfg = _config(args.model, args.set)
    train_predictor(args.data, cfg, args.out, split=_spec(args), use_all=args.all, progress=not args.no_progress)
    print(f"saved {cfg.name} predictor to {args.out}")
    return 0


def cmd_eval(args) -> int:
    from rlhfless.predictor.commands import eval_predictor

    result = eval_predictor(args.model, args.data, n_actors=args.actors, trust_pickle=args.trust_pickle,
                            progress=not args.no_progress)
    if args.json:
        write_json(result, args.json)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))
    return 0


def cmd_convert(args) -> int:
    from rlhfless.predictor.commands import convert_predictor

    p = convert_predictor(args.model, args.out, trust_pickle=args.trust_pickle)
    print(f"saved {p.name} predictor to {args.out} (current format, no pickle)")
    return 0


def cmd_compare(args) -> int:
    from rlhfless.predictor.commands import compare_predictors, plot_comparison
    from rlhfless.predictor.config import PREDICTOR_NAMES
    from rlhfless.predictor.data import read_lengths

    from rlhfless.core.errors import quote

    names = tuple(args.models.split(",")) if args.models else PREDICTOR_NAMES
    bad = [n for n in names if n not in PREDICTOR_NAMES]
    if bad:
        raise ConfigError(f"--models: unknown predictor {quote(bad[0])}; allowed: {', '.join(PREDICTOR_NAMES)}")
    comp = compare_predictors(read_lengths(args.data), names=names, base=_config(names[0], args.set),
                              split=_spec(args), n_actors=args.actors, progress=not args.no_progress)
    fig = Path(args.figure) if args.figure else Path(args.json).with_suffix(".png")
    plot_comparison(comp, fig)
    write_json(comp.to_json(), args.json)
    for name, m in comp.metrics.items():
        print(f"{name:14s} mae={m['mae']:.1f} kendall_tau={m['kendall_tau']:.3f} "
              f"makespan_ratio={m['makespan_ratio']:.3f}")
    print(f"wrote {args.json} and {fig}")
    return 0


def cmd_gsm8k(args) -> int:
    from rlhfless.predictor.data import gsm8k_lengths

    n = gsm8k_lengths(args.inp, args.out)
    print(f"wrote {n} rows to {args.out} (response_length = UTF-8 bytes of the reference answer + EOS)")
    return 0


def cmd_trace_stats(args) -> int:
    from rlhfless.core.traces import length_stats, read_trace

    from rlhfless.core.errors import DataError

    rows = list(read_trace(args.trace))
    if not rows:
        raise DataError(f"{args.trace}: the trace has no rows")
    stats = length_stats(rows)
    for k, v in stats.items():
        print(f"{k:30s} {v:.4g}" if isinstance(v, float) else f"{k:30s} {v}")
    if args.json:
        write_json(stats, args.json)
    return 0


def _synthetic_params(sets: list[str]) -> dict:
    """``--set key=value`` items of `data synthetic-trace` as a dict of generator parameters."""
    from rlhfless.core.configbase import parse_override

    params = {}
    for item in sets:
        keys, value = parse_override(item, SYNTHETIC_SET_EXAMPLE)
        params[".".join(keys)] = value
    return params


def cmd_synthetic(args) -> int:
    from rlhfless.predictor.commands import synthetic_trace_file

    params = _synthetic_params(args.set)
    n = synthetic_trace_file(args.out, seed=args.seed, fit_from=args.fit_from, **params)
    print(f"wrote {n} rows to {args.out}")
    return 0


def register(sub, bench_sub) -> None:
    """Add the `predictor` and `data` command groups."""
    _register_predictor(sub)
    _register_data(sub)


def _register_predictor(sub) -> None:
    pred = sub.add_parser("predictor", help="train, evaluate and compare response-length predictors",
                          description="Response-length predictors: ewma (the paper), sibling, learned, "
                                      "global_mean, prompt_length.")
    psub = pred.add_subparsers(dest="predictor_command", metavar="ACTION", required=True)

    t = psub.add_parser("train", help="fit a predictor and save it to a directory",
                        description="Fit on the train split of --data (traces: epochs before the test epoch; "
                                    "text-only data: prompts outside the held-out fraction), or on all rows.")
    t.add_argument("--data", required=True, help="length data or loop trace (JSONL)")
    t.add_argument("--model", required=True, help="ewma, sibling, learned, global_mean or prompt_length")
    t.add_argument("--out", required=True, help="directory to save the model in")
    t.add_argument("--all", action="store_true", help="train on every row (for deployment; no held-out test)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"predictor config field, e.g. --set {SET_EXAMPLE} (repeatable)")
    _split_args(t)
    t.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    t.set_defaults(func=cmd_train)

    e = psub.add_parser("eval", help="metrics of a saved predictor on held-out data",
                        description="Evaluate on the test split recorded at training time.")
    e.add_argument("--model", required=True, help="directory written by rlhfless predictor train (its --out)")
    e.add_argument("--data", required=True, help="length data or loop trace (JSONL)")
    e.add_argument("--json", default=None, help="write the metrics (mae, kendall_tau, ...) to this JSON file")
    e.add_argument("--actors", type=count(1, 4096), default=4, help="actors of the makespan check (default 4)")
    _trust_arg(e)
    e.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    e.set_defaults(func=cmd_eval)

    v = psub.add_parser("convert", help="re-save a predictor in the current format (drops an old pickle)",
                        description="Load a saved predictor and write it to --out in the current format: plain JSON "
                                    "and .npz arrays that load without running code. A learned predictor saved by "
                                    "rlhfless 0.1 is a pickle: convert it once, with --trust-pickle, if you made it.")
    v.add_argument("--model", required=True, help="directory of the saved predictor")
    v.add_argument("--out", required=True, help="directory to write the converted predictor to")
    _trust_arg(v)
    v.set_defaults(func=cmd_convert)

    c = psub.add_parser("compare", help="all predictors side by side (JSON + seaborn figure)",
                        description="Fit every predictor on the same split and compare them.")
    c.add_argument("--data", required=True, help="length data or loop trace (JSONL)")
    c.add_argument("--json", required=True, help="output JSON (metrics per predictor)")
    c.add_argument("--figure", default=None, help="output PNG (default: the JSON path with .png)")
    c.add_argument("--models", default=None, help="comma-separated subset of predictors (default: all)")
    c.add_argument("--actors", type=count(1, 4096), default=4, help="actors of the makespan check (default 4)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"config field shared by all predictors, e.g. --set {SET_EXAMPLE}")
    _split_args(c)
    c.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    c.set_defaults(func=cmd_compare)


def _register_data(sub) -> None:
    data = sub.add_parser("data", help="make length data sets", description="Make length data sets.")
    dsub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    g = dsub.add_parser("gsm8k-lengths", help="GSM8K JSONL -> length data (reference-answer lengths)",
                        description="Length of each reference answer under the byte tokenizer (bytes + EOS).")
    g.add_argument("--in", dest="inp", required=True, help="GSM8K JSONL with question and answer fields")
    g.add_argument("--out", required=True, help="output length data (JSONL)")
    g.set_defaults(func=cmd_gsm8k)
    s = dsub.add_parser("synthetic-trace", help="write a synthetic multi-epoch length trace",
                        description="Synthetic trace (heavy-tailed per-prompt lengths, group noise, drift, "
                                    "truncation); optionally with parameters fitted to a real trace.")
    s.add_argument("--out", required=True, help="output trace (JSONL of TraceRow)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--fit-from", default=None, help="fit the parameters to this trace first")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"generator parameter, e.g. --set {SYNTHETIC_SET_EXAMPLE} (repeatable)")
    s.set_defaults(func=cmd_synthetic)
    ts = dsub.add_parser("trace-stats", help="how RLHF-like a trace's lengths are (spread, stability, tail)",
                         description="Per-prompt mean-length spread, consecutive-epoch correlation of per-prompt "
                                     "means, within-group coefficient of variation, and the tail's token share.")
    ts.add_argument("--trace", required=True, help="loop trace (.jsonl or .jsonl.gz)")
    ts.add_argument("--json", default=None, help="also write the numbers as JSON")
    ts.set_defaults(func=cmd_trace_stats)
