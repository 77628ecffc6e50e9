"""How much of the machine other processes took while a run measured itself (Linux /proc).

A comparison's arms run one after another, so a job that starts or ends beside them changes one arm's step time
and not the other's, and the ratio with it. `CpuWindow` samples, at an arm's start and end, the machine's busy CPU
time (`/proc/stat`: user, nice, system, irq, softirq, steal over every CPU) and this process tree's (this process
and every descendant: the fork server and its workers, `utime + stime + cutime + cstime` of `/proc/<pid>/stat`, so
a reaped worker's time stays counted through its parent). What the machine spent beyond the tree is other
processes' work: `other_cpu_fraction` = that / (wall x CPUs). Near 0 the arm ran alone; 0.25 on 2 CPUs is half a
core taken by someone else for the whole arm.

Limits: only this machine's processes are seen (a Ray cluster's workers run under its raylet, not in this tree:
the fraction then counts them as "other"); a process that ends inside the window takes its CPU time with it from
the machine's count only if nobody reaps it into a tree we read (its time then shows as neither ours nor other).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_s(proc: Path = PROC) -> float | None:
    """Busy CPU seconds of the whole machine since boot (None without /proc/stat)."""
    try:
        first = (proc / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    busy = [int(first[i]) for i in (1, 2, 3, 6, 7, 8) if i < len(first)]
    return sum(busy) / _TICK


def _stat(pid_dir: Path) -> tuple[int, float] | None:
    """(parent pid, utime + stime + cutime + cstime in seconds) of one process, or None if it is gone."""
    try:
        raw = (pid_dir / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... (comm may hold spaces)
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK


def tree_cpu_s(root: int | None = None, proc: Path = PROC) -> float:
    """CPU seconds of `root` (default: this process) and all its descendants, reaped children included."""
    root = os.getpid() if root is None else root
    parent, cpu = {}, {}
    for d in proc.iterdir():
        if d.name.isdigit():
            s = _stat(d)
            if s is not None:
                parent[int(d.name)], cpu[int(d.name)] = s
    ours = {root}
    changed = True
    while changed:  # a few passes: a tree is shallow (driver -> fork server -> worker)
        changed = False
        for pid, ppid in parent.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                changed = True
    return sum(cpu.get(p, 0.0) for p in ours)


@dataclass
class CpuWindow:
    """Opened at an arm's start (`CpuWindow.open()`), closed at its end: other processes' share of the machine."""

    t0: float
    machine0: float | None
    tree0: float
    root: int | None = None
    """The tree's root pid (None: this process)."""

    @classmethod
    def open(cls, root: int | None = None) -> CpuWindow:
        return cls(time.monotonic(), machine_busy_s(), tree_cpu_s(root), root)

    def close(self) -> dict:
        """{wall_s, machine_busy_s, own_cpu_s, other_cpu_s, other_cpu_fraction (None without /proc)}."""
        wall, machine = time.monotonic() - self.t0, machine_busy_s()
        own = tree_cpu_s(self.root) - self.tree0
        if machine is None or self.machine0 is None or wall <= 0:
            return {"wall_s": wall, "machine_busy_s": None, "own_cpu_s": own, "other_cpu_s": None,
                    "other_cpu_fraction": None}
        busy = machine - self.machine0
        other = max(0.0, busy - own)
        return {"wall_s": wall, "machine_busy_s": busy, "own_cpu_s": own, "other_cpu_s": other,
                "other_cpu_fraction": other / (wall * (os.cpu_count() or 1))}
