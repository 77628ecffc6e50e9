"""Planner-side cost of each length predictor: ms per step for predict + update (and sibling refine).

The paper reports scheduling overhead under 30 ms per step; the predictor is part of it. Measured side by side
in one run on one synthetic trace; prints ms per step and the ratio to the EWMA. Not a test: never asserted.

    .venv/bin/python benchmarks/bench_predictors.py [--prompts 512] [--per-step 64] [--epochs 3]
"""

from __future__ import annotations

import argparse
import time

from rlhfless.predictor.config import PREDICTOR_NAMES, PredictorConfig, build_predictor
from rlhfless.predictor.data import group_observations, rows_from_trace
from rlhfless.predictor.synthetic import SyntheticParams, generate_trace


def bench(n_prompts: int, per_step: int, epochs: int) -> dict[str, float]:
    """Mean wall ms per step of predict + update over the last epoch, after fitting on the earlier ones."""
    rows = rows_from_trace(generate_trace(SyntheticParams(n_prompts=n_prompts, n_epochs=epochs,
                                                          prompts_per_step=per_step), seed=0))
    train = [r for r in rows if r.epoch < epochs - 1]
    steps = group_observations([r for r in rows if r.epoch == epochs - 1])
    out = {}
    for name in PREDICTOR_NAMES:
        p = build_predictor(PredictorConfig(name=name, learned_refit_every_epochs=0))
        p.fit(train)
        t0 = time.perf_counter()
        for batch in steps:
            p.predict([o.prompt_id for o in batch], [o.prompt for o in batch])
            if name == "sibling":  # one refinement per group, at half the group finished
                for o in batch:
                    xs = sorted(o.lengths)
                    p.refine(o.prompt_id, xs[: len(xs) // 2], len(xs) - len(xs) // 2, prompt=o.prompt)
            p.update(batch)
        out[name] = (time.perf_counter() - t0) * 1000 / len(steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--per-step", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    res = bench(a.prompts, a.per_step, a.epochs)
    print(f"{a.per_step} prompts per step, {a.prompts} prompts, fitted on {a.epochs - 1} epochs")
    for name, ms in res.items():
        print(f"{name:14s} {ms:8.2f} ms/step   x{ms / res['ewma']:.1f} vs ewma")


if __name__ == "__main__":
    main()
