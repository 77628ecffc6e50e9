"""`rlhfless simulate` of another git revision vs this working tree: CPU seconds side by side, in ONE run.

Exports `rlhfless/` of --old (default 39957bb, the revision issue 41 measured) into a temporary folder and runs
the same command with each package on PYTHONPATH, in a subprocess each, interleaved repeat by repeat so machine
load hits both alike. A run's CPU is the subprocess's user + system seconds together with its forked children
(`resource.getrusage(RUSAGE_CHILDREN)`: the processes that play the policies), the figure the issue's targets
name. It prints each design's least CPU over the repeats, old/new ratios, and whether the two JSON reports are
byte-identical once `sim_wall_s` (the wall time the report records of itself) is dropped. Needs git; times are
never asserted (tests/test_sim_exact.py holds short cases equal to the straightforward implementation, built in
the test from that code path, not from a stored file).

usage: python benchmarks/bench_sim_speed.py [--old 39957bb] [--steps 100] [--designs paper extended] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def export(rev: str, into: Path) -> None:
    """`rlhfless/` at `rev` under `into` (the folder to put on PYTHONPATH)."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev, "rlhfless"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)


def run(pythonpath: Path, args: list[str], out: Path) -> float:
    """CPU seconds (user + system, forked children included) of one `rlhfless simulate` on `pythonpath`'s
    package, its JSON report written to `out`."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath), HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "rlhfless.cli", "simulate", *args, "--no-progress", "--json", str(out)],
                   env=env, check=True, stdout=subprocess.DEVNULL, cwd=pythonpath)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def report_bytes(path: Path) -> bytes:
    """The report as written, less its own wall time (the one field that differs between runs)."""
    data = json.loads(path.read_text())
    data.pop("sim_wall_s", None)
    return json.dumps(data, sort_keys=True).encode()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} x {os.cpu_count()}"
    return f"unknown CPU x {os.cpu_count()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default="39957bb", help="git revision to compare with (default 39957bb)")
    ap.add_argument("--scenario", default="paper-sim")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--designs", nargs="+", default=["paper", "extended"], choices=["paper", "extended"])
    ap.add_argument("--repeats", type=int, default=1, help="interleaved runs of each side per design (least CPU)")
    args = ap.parse_args(argv)
    print(f"{cpu_model()}; load average at start {os.getloadavg()[0]:.2f}")
    print(f"rlhfless simulate --scenario {args.scenario} --steps {args.steps}: {args.old} vs this tree")
    print(f"{'design':10s} {'old CPU s':>10s} {'new CPU s':>10s} {'old/new':>8s}  report")
    same_all = True
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        export(args.old, old)
        for design in args.designs:
            cmd = ["--scenario", args.scenario, "--steps", str(args.steps), f"design={design}"]
            cpu = {"old": [], "new": []}
            reports = {}
            for _ in range(args.repeats):
                for side, path in (("old", old), ("new", REPO)):
                    out = Path(tmp) / f"{side}-{design}.json"
                    cpu[side].append(run(path, cmd, out))
                    reports[side] = report_bytes(out)
            same = reports["old"] == reports["new"]
            same_all &= same
            o, n = min(cpu["old"]), min(cpu["new"])
            print(f"{design:10s} {o:10.2f} {n:10.2f} {o / n:7.2f}x  {'byte-identical' if same else 'DIFFERS'}",
                  flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
