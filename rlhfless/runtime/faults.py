"""`rlhfless bench faults`: kill random workers with SIGKILL during a short serverless run; nothing may be lost.

The same config runs twice: undisturbed, then with a chaos thread that kills a random busy worker (decode,
learner or reference function, mid-invocation where one is running) at intervals sized to spread `kills` kills
over the run. The runtime notices each death (the process sentinel), bills the lost time, and re-runs the dead
worker's work from the same random streams. The report compares the two runs:
  kills, lost_steps (steps that did not complete), samples_identical (every step's responses equal the
  undisturbed run's), retries, extra_cost_fraction (billed device-seconds, faulty / undisturbed - 1).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

from rlhfless.errors import TrainingError
from rlhfless.runtime import executor


class Chaos:
    """Kills a random busy worker of the runtime every `interval_s` until `kills` are done or it is stopped."""

    def __init__(self, kills: int, interval_s: float, seed: int):
        self.target, self.interval_s = kills, interval_s
        self.rng = random.Random(seed)
        self.killed: list[dict] = []
        self.runtime = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def attach(self, runtime) -> None:
        self.runtime = runtime
        if not self._thread.is_alive():
            self._thread.start()

    def _victim(self):
        pool = self.runtime.pool
        try:
            live = [h for h in list(pool.handles.values()) if h.ready_s is not None]
            busy = [h for h in live if h.worker in pool.working]
        except RuntimeError:  # the pool changed while we looked: try again next tick
            return None
        cands = busy or live
        return self.rng.choice(cands) if cands else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s * self.rng.uniform(0.5, 1.5)):
            if len(self.killed) >= self.target:
                return
            h = self._victim()
            if h is None:
                continue
            try:
                os.kill(h.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append({"worker": h.worker, "pid": h.pid, "t": time.monotonic()})

    def stop(self) -> None:
        self._stop.set()


def run_fault_bench(cfg, out: Path, train, kills: int = 20, seed: int = 0, progress: bool = True) -> dict:
    """Undisturbed run, then the same run under `kills` SIGKILLs; returns (and writes) the comparison.

    train: the runner's `train(cfg, out_dir, progress=...)` (the runner sits above the runtime)."""
    from rlhfless.runtime.compare import samples_match

    cfg = replace(cfg, runtime=replace(cfg.runtime, mode="serverless"))
    clean = train(cfg, out / "undisturbed", progress=progress)
    wall = clean["runtime"]["loop_wall_s"]
    chaos = Chaos(kills, interval_s=max(0.05, wall / (kills + 2)), seed=seed)
    executor.RUNTIME_HOOKS.append(chaos.attach)
    lost = 0
    try:
        faulty = train(cfg, out / "faulty", progress=progress)
    except TrainingError as exc:
        faulty, lost = None, cfg.train.steps - _steps_done(out / "faulty")
        print(f"rlhfless: bench faults: the faulty run stopped: {exc}")
    finally:
        chaos.stop()
        executor.RUNTIME_HOOKS.remove(chaos.attach)
    identical, first_diff, n = samples_match(out / "undisturbed", out / "faulty")
    c, f = clean["runtime"], (faulty or {}).get("runtime", {})
    return {
        "kills": len(chaos.killed),
        "kills_requested": kills,
        "lost_steps": lost,
        "samples_identical": identical and lost == 0,
        "first_divergent_step": first_diff,
        "steps_compared": n,
        "retries": f.get("retries"),
        "extra_cost_fraction": (f["cost_device_s"] / c["cost_device_s"] - 1.0) if f else None,
        "extra_time_fraction": (f["loop_wall_s"] / c["loop_wall_s"] - 1.0) if f else None,
        "undisturbed": c,
        "faulty": f,
        "killed": chaos.killed,
    }


def _steps_done(run_dir: Path) -> int:
    p = run_dir / "traces" / "samples_digest.jsonl"
    return sum(1 for _ in p.open()) if p.is_file() else 0
