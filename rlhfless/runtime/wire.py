"""What crosses a process boundary: small JSON messages over a pipe, tensors in safetensors files.

Nothing is unpickled: a message is UTF-8 JSON (`send` / `recv`), and tensors (weights, learner state, batches,
prefix KV, log-probs) are safetensors files in the run's scratch folder (a tmpfs under /dev/shm when there is
one), written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rlhfless.core.errors import DataError

if TYPE_CHECKING:  # torch is imported where tensors are: an emulated worker (`runtime.devices.emulated`) never loads it
    import torch

# ---- the vocabulary the driver, the platform and the worker share ------------------------------------------
GROUP_BROKEN_EXIT = 75
"""The exit status of a learner rank that leaves on its own because a peer died inside the all-reduce: the
driver records it as ended by the restart (released), not as a death of its own (`Pool.dead`)."""
LEFT = "left"
"""The op of the last message such a rank sends before it exits: the driver learns why it ended from the pipe, in
order, before the pipe's EOF. The exit status alone arrived too late on a loaded machine (the pipe closes before
the process has exited, and a bounded wait for the status expired), which counted the rank as a second death."""


# Imported in the fork server once, so a forked worker's cold start is fork + model load, not imports.
PRELOAD = ["torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "rlhfless.rollout.engine",
           "rlhfless.rollout.session", "rlhfless.learn.learner", "rlhfless.runtime.devices.dist",
           "rlhfless.tasks.config", "rlhfless.step.textenv", "rlhfless.config", "rlhfless.learn.dataparallel",
           "safetensors.torch"]
# rollout.engine=vllm: vLLM's import (about 10 s here) moves out of the cold start too; importing it starts no
# thread, so forking after it is safe. The local backend only: a Ray node's fork server preloads PRELOAD.
VLLM_PRELOAD = ["vllm", "vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "rlhfless.rollout.vllm_engine"]


def preload(engine: str, device: str = "cpu") -> list[str]:
    """Modules the fork server imports once for a run with this rollout engine (emulated devices: no torch)."""
    if device == "emulated":
        return EMULATED_PRELOAD
    return PRELOAD + (VLLM_PRELOAD if engine == "vllm" else [])


EMULATED_PRELOAD = ["numpy", "rlhfless.runtime.devices.emulated", "rlhfless.sim.perf", "rlhfless.plan.timemodel"]
"""What the fork server imports for emulated workers: no torch, no transformers (`preload`)."""


def send(conn, msg: dict) -> None:
    conn.send_bytes(json.dumps(msg, separators=(",", ":")).encode())


def recv(conn) -> dict:
    msg = json.loads(conn.recv_bytes().decode())
    if not isinstance(msg, dict) or "op" not in msg:
        raise DataError(f"runtime: malformed message {str(msg)[:80]!r}")
    return msg


def scratch_dir(prefix: str = "rlhfless-", base: str | None = None) -> Path:
    """A private folder for the run's tensor files: under `base` when given (a filesystem every node of a
    cluster mounts), else on tmpfs when /dev/shm is writable."""
    base = base or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def remove_scratch(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def write_tensors(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, str] | None = None) -> None:
    """Atomically write `tensors` (contiguous copies) with string metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta or {})
    os.replace(tmp, path)


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def pack_lists(lists: list[list[int]]) -> dict[str, torch.Tensor]:
    """Ragged token lists as (flat int64 values, int64 offsets of length n + 1)."""
    import torch

    lengths = torch.tensor([len(x) for x in lists], dtype=torch.long)
    offsets = torch.zeros(len(lists) + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    flat = torch.tensor([t for x in lists for t in x], dtype=torch.long)
    return {"values": flat, "offsets": offsets}


def unpack_lists(values: torch.Tensor, offsets: torch.Tensor) -> list[list[int]]:
    v, o = values.tolist(), offsets.tolist()
    return [v[o[i]:o[i + 1]] for i in range(len(o) - 1)]


def write_batch(path: Path, prompts: list[list[int]], responses: list[list[int]], rewards: torch.Tensor,
                ref_logp: torch.Tensor | None) -> None:
    """A learner/reference batch: prompts (B), responses (B*G), rewards [B*G], optional reference log-probs."""
    p, r = pack_lists(prompts), pack_lists(responses)
    t = {"prompt_values": p["values"], "prompt_offsets": p["offsets"], "resp_values": r["values"],
         "resp_offsets": r["offsets"], "rewards": rewards.float()}
    if ref_logp is not None:
        t["ref_logp"] = ref_logp
    write_tensors(path, t)


def read_batch(path: Path) -> tuple[list[list[int]], list[list[int]], torch.Tensor, torch.Tensor | None]:
    t = read_tensors(path)
    return (unpack_lists(t["prompt_values"], t["prompt_offsets"]), unpack_lists(t["resp_values"], t["resp_offsets"]),
            t["rewards"], t.get("ref_logp"))


def serve(worker, conn) -> None:
    """A worker's request loop (real and emulated alike): say ready, then answer requests until `shutdown` or the
    driver's pipe closes. Requests a decode read while it polled its control messages (`worker.deferred`) come
    first, in arrival order; `worker.handle(msg, conn)` returns the reply or None; `worker.close()` on shutdown."""
    from rlhfless.runtime.records import now

    send(conn, {"op": "ready", "t": now(), "pid": os.getpid()})
    while True:
        try:
            msg = worker.deferred.pop(0) if worker.deferred else recv(conn)
        except (EOFError, OSError):
            return
        if msg["op"] == "shutdown":
            worker.close()
            return
        reply = worker.handle(msg, conn)
        if reply is not None:
            send(conn, reply)
