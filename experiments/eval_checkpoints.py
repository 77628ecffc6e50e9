"""Held-out accuracy of one or more checkpoints, sampled and greedy, overall and per number of terms k.

Uses the quickstart's evaluation exactly (`rlhfless.run.runner.run_eval`: its eval prompts, temperature, G samples,
seed), so the numbers compare with a run's summary.json.

usage: python experiments/eval_checkpoints.py CKPT [CKPT ...] [--config C] [--json OUT]
example (the SFT checkpoint before the disjoint split, then the shipped one):
    mkdir -p runs/sft_old && for f in config.json generation_config.json model.safetensors rlhfless.json tokenizer.json; do
        git show 9417010:data/checkpoints/sft/$f > runs/sft_old/$f; done
    python experiments/eval_checkpoints.py runs/sft_old data/checkpoints/sft --json runs/perk.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoints", nargs="+", help="checkpoint folders (from rlhfless pretrain or a run)")
    ap.add_argument("--config", default="experiments/configs/quickstart.yaml", help="run config for the eval")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)

    import torch

    from rlhfless.config import load_run_config
    from rlhfless.core.errors import UserError
    from rlhfless.core.jsonl import write_json
    from rlhfless.model.factory import load_policy
    from rlhfless.run.runner import run_eval
    from rlhfless.step.textenv import make_env

    try:
        cfg = load_run_config(args.config)
        torch.set_num_threads(cfg.train.threads)
        env = make_env(cfg)
        _, evals = env.task.splits()
        evals = evals[: cfg.train.eval_prompts]
        out = {}
        for ckpt in args.checkpoints:
            res = run_eval(load_policy(ckpt), evals, cfg, env)
            out[ckpt] = {kind: {"accuracy": r.accuracy, "per_k": r.per_k} for kind, r in res.items()}
            for kind, r in res.items():
                per_k = " ".join(f"{k}:{100 * v:.0f}" for k, v in r.per_k.items())
                print(f"{ckpt:40s} {kind:8s} {100 * r.accuracy:6.2f}%  per k: {per_k}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        write_json({"eval_prompts": len(evals), "results": out}, Path(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
