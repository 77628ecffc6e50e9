"""Other processes' share of the machine during a window (rlhfless.run.contention), on real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from rlhfless.run.contention import CpuWindow, tree_cpu_s

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _burn(seconds: float) -> None:
    exec(BURN.format(s=seconds))


def test_a_child_of_ours_counts_as_ours_even_after_it_is_reaped():
    before = tree_cpu_s()
    p = mp.get_context("fork").Process(target=_burn, args=(0.3,))
    p.start()
    p.join()
    assert tree_cpu_s() - before >= 0.29


def test_work_outside_the_measured_tree_is_other_and_work_inside_is_own():
    """Two children of this test: a sleeper (the measured tree's root) and a burner (not in its tree). The burner's
    0.4 CPU-seconds are other work for the sleeper's window and own work for this process's window."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        theirs, ours = CpuWindow.open(root=sleeper.pid), CpuWindow.open()
        subprocess.run([sys.executable, "-c", BURN.format(s=0.4)], check=True)
        t, o = theirs.close(), ours.close()
    finally:
        sleeper.stdin.close()
        sleeper.wait()
    # own: the sleeper's interpreter start, which a slow CI machine may stretch past 0.1 s
    assert t["own_cpu_s"] < 0.2 and t["other_cpu_s"] >= 0.38 and 0 < t["other_cpu_fraction"] <= 1
    assert o["own_cpu_s"] >= 0.38
