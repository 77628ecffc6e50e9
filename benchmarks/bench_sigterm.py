"""How long a serverless run's processes outlive their driver after SIGTERM, beside a busy loop on every core.

    python benchmarks/bench_sigterm.py [--runs 10] [--json OUT]

Each run is a real `rlhfless train` (serverless, 2 units, the tiny model) started while one busy loop per core
spins; it is sent SIGTERM (i % 5) * 0.5 s after an event (step 1's invocations in invocations.jsonl), so the signal
lands in different stages of step 2: decode, learner ranks joining their group, the update.
This process is the child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every process of the run (the fork
server, the workers, the resource tracker) is reaped here once its parent is gone: a survivor's time is the
instant it was reaped minus the driver's exit (0 when it went first). A survivor still there after `--bound` s is
killed and reported.
Prints one line per run and the worst survivor time; tests/test_signals.py runs it once.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = ["--no-progress", "runtime.mode=serverless", "runtime.units=2", "plan.max_actors=2", "train.steps=40",
       "task.arith.num_train=48", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=48",
       "train.checkpoint_every=0", "train.eval_prompts=0", "train.threads=1", "tracking.mode=disabled",
       "predictor.name=ewma", "runtime.gantt_every=0"]
PR_SET_CHILD_SUBREAPER = 36


def busy_loops(n: int) -> list[int]:
    """`n` busy loops started through a short-lived parent, before this process becomes a subreaper: they are
    nobody's children here (init reaps them), so waiting for the run's orphans never waits for them."""
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True,\n"
            "                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid)")
    return [int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
            for _ in range(n)]


def _rows(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0


def one_run(i: int, tmp: Path, bound_s: float) -> dict:
    out = tmp / f"run{i}"
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "rlhfless.cli", "train", "--out", str(out), *RUN], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + 900
    while _rows(out / "invocations.jsonl") < 1:  # the event: step 1's invocations are recorded
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"run {i}: ended or stalled before the signal: {proc.stderr.read().decode()[-800:]}")
        time.sleep(0.01)
    delay = (i % 5) * 0.5  # spread the signal over step 2's stages (decode, ranks joining, update): a benchmark's
    time.sleep(delay)      # choice; the test signals at the event itself
    os.kill(proc.pid, signal.SIGTERM)
    err = proc.communicate(timeout=bound_s)[1].decode()
    t_exit = time.monotonic()
    worst, survivors, left = 0.0, 0, []

    def timeout(signum, frame):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(int(bound_s))
    try:
        while True:  # every orphan of the run is reparented here: reap each as it exits
            pid, _ = os.waitpid(-1, 0)
            dt = time.monotonic() - t_exit
            survivors += 1
            worst = max(worst, dt)
    except ChildProcessError:
        pass
    except TimeoutError:
        left = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _ppid(int(d.name)) == os.getpid()]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        worst = max(worst, bound_s)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    line = err.strip().splitlines()[-1] if err.strip() else ""
    return {"run": i, "signal_after_step1_s": delay, "rc": proc.returncode, "reaped_after_driver": survivors,
            "worst_survivor_s": round(worst, 3), "killed_at_bound": left, "message": line}


def _ppid(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--bound", type=float, default=60.0, help="seconds a survivor may live before it is killed")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    spin = busy_loops(cores)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                rows.append(one_run(i, Path(tmp), args.bound))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for pid in spin:
            os.kill(pid, signal.SIGKILL)
    worst = max(r["worst_survivor_s"] for r in rows)
    report = {"runs": rows, "worst_survivor_s": worst, "busy_loops": cores, "cpu": _cpu(),
              "all_exit_143": all(r["rc"] == 143 for r in rows)}
    print(f"worst survivor {worst:.3f} s after the driver's exit over {len(rows)} runs, beside {cores} busy loops "
          f"({report['cpu']})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
