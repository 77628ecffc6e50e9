"""Memory of emulated workers (`runtime.device=emulated`): start N of them through the real backend, read /proc.

    python benchmarks/bench_emulated_memory.py [N] [forkserver|spawn]

Prints each worker's RSS and the proportional set size (PSS: shared pages split among the processes sharing them)
of all N together: what N emulated devices cost this machine's memory (docs/emulated.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rlhfless.runtime.platform.backend import LocalBackend
from rlhfless.runtime.devices.emulated import LengthTable
from rlhfless.runtime.wire import EMULATED_PRELOAD as PRELOAD


def _kib(pid: int, key: str, name: str = "status") -> int:
    lines = Path(f"/proc/{pid}/{name}").read_text().splitlines()
    return sum(int(x.split()[1]) for x in lines if x.startswith(key))


def main(n: int = 16, method: str = "forkserver") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "lengths.json"
        LengthTable([[[300] * 8]], None, "L40S", "qwen2.5-7b", 512, 400.0, "bench").save(table)
        setup = {"emulated": {"table": str(table), "time_scale": 0.01, "algo": "grpo", "G": 8, "max_new_tokens": 2048,
                              "skip_zero_variance": False}, "version": 0}
        be = LocalBackend(method, PRELOAD)
        be.boot()
        hs = [be.start(f"w{i}", ("decode", "learner"), (i,), setup) for i in range(n)]
        ready = 0
        while ready < n:
            ready += len(be.poll(hs, 120.0))
        rss = [_kib(h.pid, "VmRSS") / 1024 for h in hs]
        pss = sum(_kib(h.pid, "Pss:", "smaps_rollup") for h in hs) / 1024
        torch = sum("libtorch" in Path(f"/proc/{h.pid}/maps").read_text() for h in hs)
        print(f"{n} emulated workers ({method}): RSS {min(rss):.0f}-{max(rss):.0f} MiB each, PSS {pss:.0f} MiB "
              f"together; {torch} map libtorch")
        for h in hs:
            be.release(h)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16, sys.argv[2] if len(sys.argv) > 2 else "forkserver")
