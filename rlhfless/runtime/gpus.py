"""GPU units for the runtime (runtime.device=cuda): which GPUs there are, which one a function gets, and the
environment a worker sets before it touches CUDA.

The pool (`runtime.pool`) already hands out units as integers from a free list: a unit a live worker holds is
never handed out again until the worker is released or found dead, so releases and faults give devices back by
construction. With runtime.device=cuda a unit is a GPU slot; this module maps slots to GPUs:

- `visible_gpus()`: the GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (that variable when set,
  else 0..torch.cuda.device_count()-1);
- `GpuLayout(gpus, per_gpu=k)`: k slots per GPU, slot u on GPU ``gpus[u % len(gpus)]`` (slots interleave, so the
  pool's lowest-free-first claims from an empty pool spread functions over the GPUs before any GPU takes a second
  one; after releases they may double up while a GPU is free: the claim does not rebalance); with k = 1 (the
  default) two functions never share a GPU;
- `layout.worker_env(units)`: ``CUDA_VISIBLE_DEVICES`` = exactly the GPUs of those units, so inside the worker
  its GPU is ``cuda:0``, plus the fraction of that GPU's memory it may allocate (1/k), which the worker applies
  with `torch.cuda.set_per_process_memory_fraction` (`apply_worker_env`).

Why a worker is given its GPUs through the environment: CUDA reads CUDA_VISIBLE_DEVICES once, when the process
first initialises it, so the worker must set it before any CUDA call; and a process that initialised CUDA cannot
be forked safely, so with runtime.device=cuda workers are spawned (`runtime.executor`), never forked.
Not built: Ray actors asking for num_gpus (runtime.backend=ray is refused with cuda), NCCL for the learner group
(its all-reduce stays gloo), weights moved device to device (they still travel as safetensors files).
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
