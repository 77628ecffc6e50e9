"""One engine iteration from two independent sources, side by side (issue 41 item 4).

usage: python benchmarks/bench_iteration_sources.py [--vidur DIR] [--context 1024] [--json OUT]
A: the simulator's decode/prefill time (`PerfModel`, fitted to vLLM's measured whole iterations at batch 1-7).
B: Vidur's kernel-level accounting summed over one iteration from its public per-operator profiles
(../shared/data/vidur-profiles, read in place): every layer's norms, projections, RoPE, activation and add, the
TP all-reduces from its NCCL profile, the attention from A's model (Vidur's attention tables are not public).
Printed for every profiled (GPU, model) at batch 1, 64, 256 and a 2,048-token prefill, with A - B split into
host overhead, LM head, matmuls, elementwise kernels and all-reduces (`rlhfless.sim.itersources`). Modelled and
profiled numbers, no wall time: the output does not depend on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def default_root() -> Path:
    """../shared/data/vidur-profiles beside the checkout (a worktree looks one level up too)."""
    for p in (REPO.parent, REPO.parent.parent):
        if (p / "shared/data/vidur-profiles").is_dir():
            return p / "shared/data/vidur-profiles"
    return REPO.parent / "shared/data/vidur-profiles"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from rlhfless.core.errors import DataError
    from rlhfless.sim.itersources import POINTS, Point, compare_all, table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur", type=Path, default=default_root(), help="Vidur profiles folder (compute/, network/)")
    ap.add_argument("--context", type=float, default=POINTS[0].context, help="decode context tokens per sequence")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    points = tuple(Point(p.kind, p.tokens, args.context) for p in POINTS)
    try:
        rows = compare_all(args.vidur, points)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"A = simulator (iteration=vllm), B = Vidur kernel sum ({args.vidur}); milliseconds; "
          f"Akern = simulator with iteration=kernels")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{"gpu": r.gpu, "model": r.model, "tp": r.tp, "point": r.point.label,
                                          "a_s": r.a.whole_s, "b_s": r.b.total_s, "a_kernels_s": r.a_kernels.whole_s,
                                          "gap_s": r.gap_terms()} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
