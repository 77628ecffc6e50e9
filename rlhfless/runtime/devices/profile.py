"""The planner's decode-time profile, measured on this machine for the workers' own thread count, and cached.

The shipped profile (`data/profiles/tpot_tiny_cpu.json`) came from a two-thread engine elsewhere; the runtime's
one-thread workers slow down far more with batch size here, and the per-step scale fixes only the level. So at start
(`runtime.measure_profile`, own engine only) a profile keyed by CPU, threads, model, torch and workload is looked up
under `runtime.profile_cache`, measured in a worker started like a decode function on a miss (not billed), priced
with (`Planner.use_profile`) and kept as `time_profile.json`. The rule it keeps: the per-step scale calibration runs
on top of it. Why, the cache key and the measured shape: docs/internals.md#runtimedevicesprofilepy.

Deviations:
1. Prefill seconds per token come from the rollout's deduplicated prefill; the per-actor fixed and KV-transfer
   seconds keep the base profile's values.
2. A Ray cluster's nodes are keyed by the driver's CPU.
3. rollout.engine=vllm keeps `plan.time_profile` (vLLM's batching has another shape; not measured here yet).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from rlhfless.core.errors import DataError
from rlhfless.core.rundir import RunDir
from rlhfless.plan.timemodel import TimeModel, check_profile_rows
from rlhfless.rollout.tpot import PROFILE_GROUP, PROFILE_PROMPTS, PROFILE_ROLLOUTS

FORMAT = 2
"""Bumped whenever what `measure_profile` measures changes, so older cache files are measured again."""


def cpu_name() -> str:
    """This machine's CPU model name (/proc/cpuinfo), or what the platform says elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def model_digest(checkpoint: Path) -> str:
    """sha256 of the checkpoint's model config (its shapes decide the time; the weights do not)."""
    cfg = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    cfg.pop("transformers_version", None)  # written by whatever version saved it: no bearing on the shapes
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def workload_digest(cfg) -> str:
    """sha256 of what shapes the timed rollout besides the model: the task (its prompts' lengths) and sampling."""
    r = cfg.rollout
    what = {"task": asdict(cfg.task), "max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
            "top_p": r.top_p, "rows": [PROFILE_ROLLOUTS, PROFILE_PROMPTS, PROFILE_GROUP]}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def profile_key(cfg, threads: int) -> dict:
    """What a measured profile depends on: the CPU, the threads of one worker, the model's shapes, torch, and the
    rollout that is timed (`workload_digest`)."""
    return {"format": FORMAT, "cpu": cpu_name(), "threads": int(threads),
            "model_config": model_digest(cfg.policy.resolved()), "torch": torch.__version__,
            "workload": workload_digest(cfg)}


def cache_dir(setting: str) -> Path:
    """`runtime.profile_cache`, or the user's cache folder when it is empty."""
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlhfless" / "profiles"


def cache_path(folder: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"tpot-{digest}.json"


def read_cached(path: Path, key: dict) -> dict | None:
    """The cached profile {"rows", "prefill_s_per_token"} for `key`, or None (missing, unreadable, other key)."""
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry.get("key") != key:
            raise DataError("written for another key")
        profile = entry["profile"]
        check_profile_rows(profile["rows"], str(path))
        float(profile["prefill_s_per_token"])
        return profile
    except (ValueError, KeyError, TypeError, AttributeError, DataError) as exc:
        print(f"rlhfless: measuring the time profile again: the cached {path} is unusable ({exc})", file=sys.stderr)
        return None


def write_cached(path: Path, key: dict, profile: dict, measured_s: float) -> None:
    """Write the entry atomically (runs in parallel may measure the same key; the last rename wins, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "measured_s": measured_s, "profile": profile}, indent=1))
    tmp.replace(path)


def time_model(profile: dict, base: TimeModel, source: str) -> TimeModel:
    """The measured rows and prefill seconds; per-actor fixed and KV-transfer seconds from `base`."""
    return TimeModel.from_rows(profile["rows"], source=source, prefill_s_per_token=float(profile["prefill_s_per_token"]),
                               actor_fixed_s=base.actor_fixed_s, kv_transfer_s_per_token=base.kv_transfer_s_per_token)


def measure_in_worker(backend, setup: dict, cores: tuple[int, ...], progress: bool, timeout_s: float,
                      max_new_tokens: int) -> tuple[dict, float]:
    """Start one decode worker as every decode function starts (pinned to `cores`, as many torch threads), have
    it measure (`Worker.handle("profile")`), release it; returns (profile, seconds including its start)."""
    from rlhfless.core.errors import TrainingError
    from rlhfless.core.progress import count_bar
    from rlhfless.runtime.devices.worker import now

    t0 = now()
    h = backend.start("profile-0", ("decode",), cores, setup)
    total = PROFILE_ROLLOUTS * max_new_tokens
    advance, close = count_bar(total, "time profile of this machine", progress, unit="iteration")
    shown = 0
    try:
        backend.send(h, {"op": "profile"})  # waits in the pipe until the worker has loaded the model
        while now() - t0 < timeout_s:
            for _, msg in backend.poll([h], 1.0):
                if msg is None:
                    raise TrainingError("runtime: the worker measuring the time profile died "
                                        "(runtime.measure_profile=false uses plan.time_profile instead)")
                if msg["op"] == "profiling":
                    advance(msg["done"] - shown)
                    shown = msg["done"]
                elif msg["op"] == "profiled":
                    return {"rows": msg["rows"], "prefill_s_per_token": msg["prefill_s_per_token"]}, now() - t0
        raise TrainingError(f"runtime: measuring the time profile took over runtime.invocation_timeout_s="
                            f"{timeout_s:g} s")
    finally:
        close()
        backend.release(h)


def save_for_run(profile: dict, out: Path) -> Path:
    """OUT/time_profile.json: what the run's planner priced with, loadable as `plan.time_profile`."""
    path = RunDir(out).time_profile
    path.write_text(json.dumps({"rows": profile["rows"], "prefill_s_per_token": profile["prefill_s_per_token"]},
                               indent=1))
    return path
