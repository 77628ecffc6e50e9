"""GPU units for the runtime (runtime.device=cuda): which GPUs there are, which one a function gets, and the
environment a worker sets before it touches CUDA.

`visible_gpus()` lists the GPUs this process may use; `GpuLayout(gpus, per_gpu=k)` maps the pool's integer slots
to GPUs (k slots per GPU, interleaved); `layout.worker_env(units)` gives a worker its GPUs through
CUDA_VISIBLE_DEVICES plus its memory fraction (1/k), applied by `apply_worker_env`. The rule it keeps: a worker sets
its GPUs before any CUDA call and is spawned, never forked (CUDA reads the variable once and a process that
initialised CUDA cannot be forked safely). Details: docs/internals.md#runtimedevicesgpuspy.
Not built: Ray actors asking for num_gpus, NCCL for the learner group, weights moved device to device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlhfless.core.errors import ConfigError

ENV = "CUDA_VISIBLE_DEVICES"
MEMORY_FRACTION = "RLHFLESS_GPU_MEMORY_FRACTION"


def parse_visible(value: str) -> list[str]:
    """GPU ids of a CUDA_VISIBLE_DEVICES value, in order; CUDA stops at the first invalid entry (-1 hides all)."""
    out = []
    for part in (p.strip() for p in value.split(",")):
        if not part or part.startswith("-"):
            break
        out.append(part)
    return out


def visible_gpus(environ: dict | None = None) -> list[str]:
    """GPUs this process may hand to functions (see the module docstring)."""
    env = os.environ if environ is None else environ
    if ENV in env:
        return parse_visible(env[ENV])
    import torch

    return [str(i) for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]


@dataclass(frozen=True)
class GpuLayout:
    """Slots over GPUs: `per_gpu` functions per GPU, slot u on ``gpus[u % len(gpus)]``."""

    gpus: tuple[str, ...]
    per_gpu: int = 1

    def __post_init__(self) -> None:
        if not self.gpus:
            raise ConfigError("runtime.device=cuda: no GPU to hand out (CUDA_VISIBLE_DEVICES names none)")
        if len(set(self.gpus)) != len(self.gpus):
            raise ConfigError(f"runtime.device=cuda: {ENV} names a GPU twice ({','.join(self.gpus)})")
        if self.per_gpu < 1:
            raise ConfigError(f"runtime.functions_per_gpu: must be >= 1 (got {self.per_gpu})")

    @property
    def slots(self) -> int:
        return len(self.gpus) * self.per_gpu

    def gpu_of(self, unit: int) -> str:
        if not 0 <= unit < self.slots:
            raise ValueError(f"unit {unit} is not a slot of this layout (0..{self.slots - 1})")
        return self.gpus[unit % len(self.gpus)]

    def worker_env(self, units: tuple[int, ...] | list[int]) -> dict[str, str]:
        """The environment of a worker holding `units`: its GPUs (each once, in slot order) and its memory share."""
        gpus = list(dict.fromkeys(self.gpu_of(u) for u in units))
        return {ENV: ",".join(gpus), MEMORY_FRACTION: repr(1.0 / self.per_gpu)}

    def to_json(self) -> dict:
        return {"gpus": list(self.gpus), "per_gpu": self.per_gpu}

    @classmethod
    def from_json(cls, d: dict) -> GpuLayout:
        return cls(tuple(d["gpus"]), int(d["per_gpu"]))


def apply_worker_env(env: dict[str, str]) -> None:
    """In a fresh worker, before any CUDA call: make only its GPUs visible. `limit_memory` applies the share."""
    os.environ.update(env)


def limit_memory(env: dict[str, str]) -> None:
    """Cap this process's allocations on each of its GPUs at its share (a no-op for a whole GPU)."""
    frac = float(env.get(MEMORY_FRACTION, "1.0"))
    if frac < 1.0:
        import torch

        for i in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(frac, i)
