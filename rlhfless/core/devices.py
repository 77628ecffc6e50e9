"""Where a run's tensors live: the device and dtype settings, their checks, and placing a model.

device: ``auto`` (cuda:0 when CUDA is visible, else cpu), ``cpu``, ``cuda`` (= cuda:0) or ``cuda:k``; dtype:
``float32`` or ``bfloat16`` (weights, KV cache, activations; sampling, log-probs and the loss stay in float32 or
float64 whatever the model's dtype: `rollout.state.sample_tokens`, `rollout.forward`). `check_device(spec,
field)` is the machine check every entry point runs before any work, also `--dry-run` (a CUDA setting without a
CUDA device is one `ConfigError` naming the field); `syntax_problem` is the part that needs no machine.
The rule it keeps: the CPU path is the reference: `place(model, cpu, float32)` returns the model untouched and
every added `.to(device)` is a no-op on a CPU tensor, so a CPU run is bitwise the run it was before devices
existed (checked on the quickstart; docs/gpu.md). torch is imported where a function needs it, so the config's
syntax checks (`syntax_problem`) cost no torch (`rlhfless config show`).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rlhfless.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda", "cuda:k")
DTYPES = ("float32", "bfloat16")
"""train.dtype's values, each the name of a torch dtype."""
_CUDA = re.compile(r"cuda(:(\d{1,3}))?")


def syntax_problem(spec: object) -> str | None:
    """Why `spec` is not a device setting (None when it is one); needs no machine."""
    if not isinstance(spec, str) or not (spec in ("auto", "cpu") or _CUDA.fullmatch(spec)):
        return f"must be auto, cpu, cuda or cuda:k (got {spec!r})"
    return None


def wants_cuda(spec: str) -> bool:
    return spec.startswith("cuda")


def cuda_visible() -> int:
    """CUDA devices torch can see (0 on a CPU build or when none is visible)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def no_cuda_message() -> str:
    import torch

    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    why = "this torch build has no CUDA" if torch.version.cuda is None else "torch.cuda.is_available() is False"
    return f"no CUDA device is visible ({why}; CUDA_VISIBLE_DEVICES={cvd!r})"


def check_device(spec: str, field: str) -> None:
    """Raise a one-line `ConfigError` naming `field` when this machine cannot give the device `spec` asks for."""
    problem = syntax_problem(spec)
    if problem:
        raise ConfigError(f"{field}: {problem}")
    if not wants_cuda(spec):
        return
    n = cuda_visible()
    if n == 0:
        raise ConfigError(f"{field}={spec}: {no_cuda_message()}; use {field}=cpu")
    index = int(spec.partition(":")[2] or 0)
    if index >= n:
        raise ConfigError(f"{field}={spec}: torch sees {n} CUDA device(s), so the index must be < {n}")


def resolve_device(spec: str) -> torch.device:
    """The torch device a checked setting names (auto: cuda:0 when visible, else cpu)."""
    import torch

    if spec == "auto":
        return torch.device("cuda:0" if cuda_visible() else "cpu")
    return torch.device("cuda:0" if spec == "cuda" else spec)


def resolve_dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPES:
        raise ConfigError(f"dtype: must be one of {list(DTYPES)} (got {name!r})")
    return getattr(torch, name)


def model_device(model) -> torch.device:
    """The device of a model's weights (where its inputs must be put)."""
    return next(model.parameters()).device


def place(model, device: torch.device, dtype: torch.dtype):
    """`model` on `device` in `dtype`; untouched (the same object, no copy) when it is there already."""
    p = next(model.parameters())
    if p.device == device and p.dtype == dtype:
        return model
    return model.to(device=device, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on `device` (a no-op on CPU), so a wall-clock time covers the work."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


@contextmanager
def as_cpu_float32(model):
    """`model` on the CPU in float32 for the block (checkpoints are float32 files), then back where it was.

    Moves the parameters in place (`Module.to` keeps the Parameter objects, so an optimizer holding them stays
    valid); bfloat16 -> float32 -> bfloat16 is exact. A CPU float32 model is not touched."""
    import torch

    p = next(model.parameters())
    device, dtype = p.device, p.dtype
    if device.type == "cpu" and dtype == torch.float32:
        yield model
        return
    model.to(device="cpu", dtype=torch.float32)
    try:
        yield model
    finally:
        model.to(device=device, dtype=dtype)
