"""Naive vs deduplicated prefill, side by side (same as `rlhfless bench prefill`).

usage: python benchmarks/bench_prefill.py --json runs/bench/prefill.json [--repeats 5 ...]
"""

import sys

from rlhfless.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "prefill", *sys.argv[1:]]))
