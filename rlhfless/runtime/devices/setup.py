"""What a device kind asks of the driver before any worker starts: how workers are spawned, what their setup
carries (a GPU layout, an emulated length table), and the time model the planner should price them with.

The one place that branches on `runtime.device`, so the driver does not: `start_method`, `prepare` (returns a
`DeviceModel`, data the planner's holder applies). cpu: the planner's profile measured in a one-thread worker
(`profile`); cuda: the same, with each worker's GPU slots in its setup (`gpus`); emulated: the simulator's model of
one emulated GPU (`emulated`), whose length table is also kept in the run folder for the validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.rundir import RunDir


@dataclass(frozen=True)
class DeviceModel:
    """What the planner prices this device with: a time model (None: the planner's own), the KV slots of one
    replica (None: the plan's), where the model came from (a profile path, the emulated model's name; None) and the
    seconds spent measuring it (platform set-up, before the run's clock starts: not billed)."""

    time_model: object | None = None
    capacity: int | None = None
    source: str | None = None
    measured_s: float = 0.0


def start_method(rt) -> str:
    """CUDA cannot be used in a process forked from one that initialised it (the driver may have: train.device), so
    GPU workers start as fresh interpreters and pay the imports in their cold start."""
    return "spawn" if rt.device == "cuda" else rt.start_method


def prepare(cfg, setup: dict, scratch: Path, out: Path, backend, base_time_model, progress: bool) -> DeviceModel:
    """Fill the workers' `setup` for this device kind; the model the planner should price with. `base_time_model`:
    the planner's own (None: no planner, nothing to price)."""
    rt = cfg.runtime
    if rt.device == "cuda":  # units are GPU slots; each worker makes only its GPUs visible
        from rlhfless.runtime.devices.gpus import GpuLayout, visible_gpus

        setup["gpu_layout"] = GpuLayout(tuple(visible_gpus()), rt.functions_per_gpu).to_json()
    if rt.device == "emulated":  # units are emulated GPUs: the planner prices with their model
        return _emulated(cfg, setup, scratch, out)
    return _measured(cfg, setup, out, backend, base_time_model, progress)


def _emulated(cfg, setup: dict, scratch: Path, out: Path) -> DeviceModel:
    """The length table into the scratch folder, the workers' `emulated` setup, and the time model and KV slots the
    emulated workers sleep by, as the simulator sizes them."""
    from rlhfless.runtime.devices import emulated

    setup["emulated"] = emulated.setup_for(cfg, scratch, cfg.train.steps)
    table = emulated.LengthTable.load(setup["emulated"]["table"])
    out.mkdir(parents=True, exist_ok=True)
    table.save(RunDir(out).emulated_lengths)  # what `sim.modelled` validates the run with
    tm = emulated.time_model(table)
    return DeviceModel(tm, table.capacity, tm.source)


def _measured(cfg, setup: dict, out: Path, backend, base_time_model, progress: bool) -> DeviceModel:
    """This machine's decode-time profile for one-unit workers, from the cache or measured now in a worker. Off
    with runtime.measure_profile=false, without a planner, and for vLLM decode (`profile`)."""
    rt = cfg.runtime
    if base_time_model is None or not rt.measure_profile or cfg.rollout.engine != "own":
        return DeviceModel()
    from rlhfless.runtime.devices import profile as P

    key = P.profile_key(cfg, threads=1)  # a worker holds one unit: one torch thread
    path = P.cache_path(P.cache_dir(rt.profile_cache), key)
    measured_s, found = 0.0, P.read_cached(path, key)
    if found is None:
        found, measured_s = P.measure_in_worker(backend, setup, (0,), progress, rt.invocation_timeout_s,
                                                cfg.rollout.max_new_tokens)
        P.write_cached(path, key, found, measured_s)
    tm = P.time_model(found, base_time_model, str(path))
    P.save_for_run(found, out)
    return DeviceModel(tm, None, str(path), measured_s)
