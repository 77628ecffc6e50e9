"""Summarise the summary.json of several runs (for example the quickstart at 3 seeds) as one table.

usage: python experiments/summarize_runs.py runs/qs_seed0 runs/qs_seed1 runs/qs_seed2
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

KEYS = [("eval_accuracy_initial", "eval_accuracy_final", "held-out sampled (mean of G)"),
        ("eval_greedy_accuracy_initial", "eval_greedy_accuracy_final", "held-out greedy"),
        ("reward_mean_first", "reward_mean_last", "train reward (first/last 10%)")]


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = []
    for p in paths:
        f = Path(p) / "summary.json"
        if not f.is_file():
            print(f"error: {f} not found (did the run finish?)", file=sys.stderr)
            return 2
        runs.append(json.loads(f.read_text()))
    print(f"{'run':24s} {'seed':>4s} " + " ".join(f"{name[:28]:>30s}" for _, _, name in KEYS) + f" {'wall_s':>7s}")
    deltas = {name: [] for _, _, name in KEYS}
    for p, r in zip(paths, runs):
        cells = []
        for a, b, name in KEYS:
            d = 100 * (r[b] - r[a])
            deltas[name].append(d)
            cells.append(f"{100 * r[a]:6.2f} -> {100 * r[b]:6.2f} ({d:+5.2f})")
        print(f"{Path(p).name:24s} {r.get('seed', '?'):>4} " + " ".join(f"{c:>30s}" for c in cells)
              + f" {r['wall_s']:7.1f}")
    sd = {n: statistics.stdev(v) if len(v) > 1 else 0.0 for n, v in deltas.items()}
    print("mean change (points): " + ", ".join(f"{n}: {statistics.mean(v):+.2f} (sd {sd[n]:.2f})"
                                                for n, v in deltas.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
