"""The planner of another git revision vs this working tree, side by side in ONE process.

Exports `rlhfless/` of --old (a commit, tag or branch) into a temporary folder as the package `rlhfless_old`,
then times the same calls of both, interleaved repeat by repeat so machine load hits them alike, and prints
CPU-time medians and old/new ratios: one full decision `choose()` (8,192 sequences, N = 1..64, capacity 256,
plan.migrate=false) per policy, and one `assign()` into 16 actors per policy. It also checks that both pick
the same N and the same placement. Needs git; times are never asserted.

usage: python benchmarks/bench_planner_ab.py --old 2fae8f7 [--repeats 21]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def export_old(rev: str, into: Path) -> None:
    """`rlhfless/` at `rev` as `into/rlhfless_old`, its absolute imports rewritten."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev, "rlhfless"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    (into / "rlhfless").rename(into / "rlhfless_old")
    for f in (into / "rlhfless_old").rglob("*.py"):
        f.write_text(re.sub(r"\brlhfless(?=[.\s])", "rlhfless_old", f.read_text()))


def calls(plan, bench) -> dict:
    jobs, tm = bench.heavy_tailed_jobs(), plan.TimeModel.default_tiny_cpu()
    out = {}
    for pol in plan.POLICIES:
        cfg = plan.PlanConfig(min_actors=1, max_actors=64, policy=pol, migrate=False)
        out[f"choose {pol}"] = lambda cfg=cfg: plan.choose(jobs, cfg, tm)
    for pol in plan.POLICIES:
        out[f"assign16 {pol}"] = lambda pol=pol: plan.assign(jobs, 16, 256, tm, pol)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="git revision to compare with (e.g. 2fae8f7)")
    ap.add_argument("--repeats", type=int, default=21, help="interleaved repeats per call (default 21)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        export_old(args.old, Path(tmp))
        sys.path.insert(0, tmp)
        import rlhfless_old.plan as old_plan
        import rlhfless_old.plan.bench as old_bench

        import rlhfless.plan as new_plan
        import rlhfless.plan.bench as new_bench

        old, new = calls(old_plan, old_bench), calls(new_plan, new_bench)
        print(f"CPU: {new_bench.cpu_name()}; old = {args.old}, new = working tree; CPU-time medians")
        print(f"{'call':28s} {'old ms':>8s} {'new ms':>8s} {'old/new':>8s}  same decision")
        for key in old:
            reps = args.repeats if "assign" in key or "contiguous" in key else max(3, args.repeats // 4)
            t = {"old": [], "new": []}
            a, b = old[key](), new[key]()
            for _ in range(reps):
                for name, fn in (("old", old[key]), ("new", new[key])):
                    t0 = time.process_time()
                    fn()
                    t[name].append(time.process_time() - t0)
            o, n = np.median(t["old"]) * 1e3, np.median(t["new"]) * 1e3
            pa, pb = (a[0].plan, b[0].plan) if "choose" in key else (a[0], b[0])
            ids = lambda plan: [[j.group_id for j in js] for js in plan.actor_jobs]  # noqa: E731
            same = ids(pa) == ids(pb)
            print(f"{key:28s} {o:8.2f} {n:8.2f} {o / n:8.2f}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
