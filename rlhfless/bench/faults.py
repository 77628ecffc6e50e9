"""`rlhfless bench faults`: kill random workers with SIGKILL during a short run; nothing may be lost.

Each mode (serverless, or the serverful control) runs `repeats` times undisturbed and `repeats` times under a chaos
thread that kills a random busy worker at the points of one step-relative schedule, the same for both modes
(`kill_schedule`), alternating so a shared machine's drift hits both alike; the runtime notices each death, bills
the lost time and re-runs the work from the same random streams. The report (kills, lost steps, runs stopped,
sample identity, extra cost and time with their noise, lost device-seconds): docs/internals.md#benchfaultspy.
What it checks: no run stops, no step is lost and every faulty run's samples equal the undisturbed run's
(`failed_runs`: the CLI exits 1 otherwise). `KillOn` is the chaos the tests use instead: a kill at a protocol
event, no clock.
"""

from __future__ import annotations

import math
import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rlhfless.core.errors import TrainingError
from rlhfless.core.rundir import RunDir
from rlhfless.runtime import executor


def kill_schedule(kills: int, steps: int, seed: int) -> list[tuple[int, float]]:
    """Where each kill lands, in step-relative time: (step, fraction of that step's undisturbed window). Kill k
    lies at a uniform point of the k-th of `kills` equal slices of the run's `steps`, so kills spread evenly over
    the run whatever its speed; the same schedule for every mode (it depends on nothing else). Pure."""
    rng = random.Random(seed)
    out = []
    for k in range(kills):
        pos = (k + rng.random()) * steps / kills  # in [0, steps)
        step = min(int(pos), steps - 1)
        out.append((step + 1, pos - step))
    return out


class Chaos:
    """Kills a random busy worker (else a random live one) at each point of a `kill_schedule`: kill (s, f) lands
    f x (step s's window in the undisturbed run of this mode) after step s began in the faulty run. Both modes
    get the same schedule in step-relative time, so a mode's speed does not change where its kills land."""

    def __init__(self, kills: int, step_s: list[float], seed: int):
        self.schedule = kill_schedule(kills, len(step_s), seed) if step_s else []
        self.step_s = step_s
        self.rng = random.Random(seed)
        self.killed: list[dict] = []
        self.runtime = None
        self.begun: dict[int, float] = {}  # step -> when it began in the faulty run (`StepClock.step_t0`)
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def attach(self, runtime) -> None:
        self.runtime = runtime
        begin = runtime.begin_step

        def begun(step: int) -> None:
            begin(step)
            with self._cv:
                self.begun[step] = runtime.clock.step_t0
                self._cv.notify_all()

        runtime.begin_step = begun
        if not self._thread.is_alive():
            self._thread.start()

    def _victim(self):
        pool = self.runtime.workers.pool
        try:
            live = [h for h in list(pool.handles.values()) if h.ready_s is not None]
            busy = [h for h in live if h.worker in pool.working]
        except RuntimeError:  # the pool changed while we looked: try again next tick
            return None
        cands = busy or live
        return self.rng.choice(cands) if cands else None

    def _run(self) -> None:
        for step, frac in self.schedule:
            with self._cv:
                while step not in self.begun and not self._stop.is_set():
                    self._cv.wait()
            at = self.begun.get(step, 0.0) + frac * self.step_s[step - 1]
            if self._stop.wait(max(0.0, at - time.monotonic())):
                return
            h = self._victim()
            if h is None:
                continue
            try:
                os.kill(h.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append({"worker": h.worker, "pid": h.pid, "step": step, "fraction": round(frac, 4),
                                "t": time.monotonic()})

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()


@dataclass(frozen=True)
class KillRule:
    """Kill the worker the driver just sent `op` to ("sent"), or just received `op` from ("received"), in `step`
    (None: a message that names no step, such as a worker's `ready`); at the `nth` such message."""

    when: str
    op: str
    step: int | None
    nth: int = 1
    gone: bool = False
    """Wait until the killed process has exited, so the driver's very next send to it fails (a death found on
    sending, deterministically; else the next message may still land in the pipe and the death is read later)."""


class KillOn:
    """Chaos at protocol events instead of on a clock: SIGKILL a worker the moment the driver sends it (or reads
    from it) a message matching a rule; each rule fires once. No thread and no sleep, so the kill lands at the same
    point of the protocol on every run, loaded machine or not, and a test can assert what had to be recovered
    (`fired`: (rule, worker) in firing order). Attach it with `executor.RUNTIME_HOOKS.append(k.attach)`."""

    def __init__(self, *rules: KillRule):
        self.rules = list(rules)
        self.fired: list[tuple[KillRule, str]] = []
        self.seen: dict[int, int] = {}  # rule (by id) -> messages it matched so far

    @property
    def killed(self) -> list[dict]:
        """The kills as the bench reports them (`Chaos.killed`), the protocol event in place of a time."""
        return [{"worker": w, "event": f"{r.when} {r.op} step {r.step}"} for r, w in self.fired]

    def stop(self) -> None:
        """Nothing runs between events (the bench stops a `Chaos` thread here)."""

    def attach(self, runtime) -> None:
        backend = runtime.workers.backend
        send, poll = backend.send, backend.poll

        def sent(h, msg: dict) -> None:
            send(h, msg)
            self._maybe_kill("sent", h, msg)

        def polled(handles, timeout):
            out = poll(handles, timeout)
            for h, msg in out:
                if msg is not None:
                    self._maybe_kill("received", h, msg)
            return out

        backend.send, backend.poll = sent, polled

    def _maybe_kill(self, when: str, h, msg: dict) -> None:
        matched = [r for r in self.rules if r.when == when and r.op == msg.get("op") and r.step == msg.get("step")]
        for rule in matched:
            self.seen[id(rule)] = self.seen.get(id(rule), 0) + 1
        for rule in matched:
            if self.seen[id(rule)] == rule.nth:
                self.rules = [r for r in self.rules if r is not rule]
                try:
                    os.kill(h.pid, signal.SIGKILL)
                except ProcessLookupError:
                    return
                if rule.gone and getattr(h, "process", None) is not None:
                    h.process.join(10.0)  # an event: the exit of the process just killed
                self.fired.append((rule, h.worker))
                return


MODES = ("serverless", "serverful")


def run_fault_bench(cfg, out: Path, train, kills: int = 20, seed: int = 0, progress: bool = True,
                    repeats: int = 1, mode: str = "serverless", chaos=None) -> dict:
    """`repeats` pairs of runs in `mode` (undisturbed, then under `kills` SIGKILLs with chaos seed `seed + i`)
    into out/undisturbed-<i> and out/faulty-<i>; returns the report (docs/internals.md#benchfaultspy) with the
    mode and the run's shape (device, keep-alive, hybrid) at its head.

    train: the runner's `train(cfg, out_dir, progress=...)` (the runner sits above the runtime).
    chaos: `(kills, step_s, seed) -> chaos` (`attach`, `stop`, `killed`; step_s: the undisturbed run's step
    windows, step 1 first); default a `Chaos` thread on `kill_schedule`."""
    if mode not in MODES:
        raise ValueError(f"mode: one of {', '.join(MODES)} (got {mode!r})")
    cfg = replace(cfg, runtime=replace(cfg.runtime, mode=mode))
    pairs = [_pair(cfg, out, train, i, kills, seed + i - 1, progress, chaos or Chaos) for i in range(1, repeats + 1)]
    rt = cfg.runtime
    shape = {"mode": mode, "device": rt.device, "keep_alive_s": rt.keep_alive_s, "hybrid": rt.hybrid}
    return {**shape, **fault_report(pairs, kills)}


def _pair(cfg, out: Path, train, i: int, kills: int, seed: int, progress: bool, make_chaos) -> dict:
    from rlhfless.run.compare import samples_match

    clean_dir, faulty_dir = out / f"undisturbed-{i}", out / f"faulty-{i}"
    clean = train(cfg, clean_dir, progress=progress)
    chaos = make_chaos(kills, _step_windows(clean_dir), seed)
    executor.RUNTIME_HOOKS.append(chaos.attach)
    lost, stopped = 0, None
    try:
        faulty = train(cfg, faulty_dir, progress=progress)
    except TrainingError as exc:
        faulty, lost, stopped = None, cfg.train.steps - _steps_done(faulty_dir), str(exc)
        print(f"rlhfless: bench faults: {cfg.runtime.mode} faulty-{i} stopped: {exc}")
    finally:
        chaos.stop()
        executor.RUNTIME_HOOKS.remove(chaos.attach)
    identical, first_diff, n = samples_match(clean_dir, faulty_dir)
    return {"undisturbed": clean["runtime"], "faulty": (faulty or {}).get("runtime", {}), "lost_steps": lost,
            "stopped": stopped, "samples_identical": identical and lost == 0, "first_divergent_step": first_diff,
            "steps_compared": n, "lost_device_s": _lost_device_s(faulty_dir), "killed": chaos.killed}


def _step_windows(run_dir: Path) -> list[float]:
    """Each step's window in seconds (`runtime/window_s`), step 1 first: the scale of step-relative kill times."""
    rows = RunDir(run_dir).read_step_metrics()
    return [float(rows[s].get("runtime/window_s", rows[s]["timing_s/step"])) for s in sorted(rows)]


def failed_runs(modes: dict[str, dict]) -> list[str]:
    """One line per faulty run that stopped, lost a step or diverged from its undisturbed twin, naming its mode
    and run (`modes`: mode -> `run_fault_bench` report); empty when every faulty run equals its twin."""
    lines = []
    for mode, report in modes.items():
        for i, p in enumerate(report["pairs"], 1):
            if p.get("stopped"):
                what = f"stopped, {p['lost_steps']} of {p['steps_compared']} steps lost: {p['stopped']}"
            elif p["lost_steps"]:
                what = f"lost {p['lost_steps']} steps"
            elif not p["samples_identical"]:
                what = f"samples differ from its undisturbed run's from step {p['first_divergent_step']}"
            else:
                continue
            lines.append(f"{mode} faulty-{i}: {what}")
    return lines


def spread(values: list[float]) -> dict:
    """{mean, std (sample; None for one value), min, max, n} of `values` (all None when empty)."""
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def resolved(s: dict) -> bool | None:
    """Whether a spread's mean lies more than two standard errors from 0 (None: fewer than two values)."""
    if s["n"] < 2:
        return None
    return abs(s["mean"]) > 2 * s["std"] / math.sqrt(s["n"])


def fault_report(pairs: list[dict], kills: int) -> dict:
    """The bench's report from its pairs (`_pair` rows); faulty runs that stopped count in lost_steps only."""
    done = [p for p in pairs if p["faulty"]]
    cost = spread([p["faulty"]["cost_device_s"] / p["undisturbed"]["cost_device_s"] - 1 for p in done])
    time_ = spread([p["faulty"]["loop_wall_s"] / p["undisturbed"]["loop_wall_s"] - 1 for p in done])
    clean = [p["undisturbed"]["cost_device_s"] for p in pairs]
    return {
        "repeats": len(pairs),
        "kills": sum(len(p["killed"]) for p in pairs),
        "kills_requested": kills * len(pairs),
        "lost_steps": sum(p["lost_steps"] for p in pairs),
        "runs_stopped": sum(1 for p in pairs if p.get("stopped")),
        "samples_identical": all(p["samples_identical"] for p in pairs),
        "retries": sum(p["faulty"].get("retries", 0) for p in done),
        "extra_cost_fraction": cost,
        "extra_time_fraction": time_,
        "extra_cost_resolved": resolved(cost),
        "undisturbed_cost_device_s": spread(clean),
        "undisturbed_noise_fraction": (max(clean) - min(clean)) / statistics.fmean(clean) if len(clean) > 1 else None,
        "lost_device_s": spread([p["lost_device_s"] for p in done]),
        "pairs": pairs,
    }


def _lost_device_s(run_dir: Path) -> float:
    """Device-seconds of a run's failed invocations (request to death): the work the kills threw away."""
    rows = RunDir(run_dir).read_invocations()
    return sum((r["finished_s"] - r["requested_s"]) * r["units"] for r in rows if not r["ok"])


def _steps_done(run_dir: Path) -> int:
    return len(RunDir(run_dir).read_digests())
