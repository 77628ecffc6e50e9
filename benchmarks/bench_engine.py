"""This rollout engine vs HF `model.generate` on a long-tailed length mix, plus the TPOT profile
(same as `rlhfless bench engine`).

usage: python benchmarks/bench_engine.py --json runs/bench/engine.json [--repeats 3 ...]
"""

import sys

from rlhfless.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "engine", *sys.argv[1:]]))
