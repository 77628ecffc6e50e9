"""One op table for every device: which request runs which method of the worker that serves it.

A `Device` is what a worker process serves requests with: `worker.Worker` (cpu and cuda: the units differ, set by
`worker.bind_device` before anything loads) and `emulated.EmulatedWorker` (compute replaced by modelled time). The
request loop (`wire.serve`) calls `device.handle(msg, conn)`, which is `dispatch` for both: the table below picks
the method, so the two ladders of `if op == ...` the devices once had cannot drift apart. A device that does not
serve an op (an emulated device has no prefill or profile function) answers with its own error.
"""

from __future__ import annotations

from typing import Protocol

PPO_OPS = ("values_chunk", "values_end", "ppo_old", "ppo_actor", "critic_learn")
"""PPO's requests (`devices.ppo_worker`, algo.name=ppo): each device's `op_ppo` serves them all."""

OPS: dict[str, str] = {"decode": "op_decode", "adopt": "op_decode", "prefill": "op_prefill",
                       "profile": "op_profile", "cut": "op_cut", "learn_begin": "op_learn_begin",
                       "learn_group": "op_learn_group", "learn_end": "op_learn_end", "reference": "op_reference",
                       **{op: "op_ppo" for op in PPO_OPS}}
"""request op -> the device method that serves it, `(msg, conn) -> reply or None`."""


class Device(Protocol):
    """What `wire.serve` needs of a worker: requests a decode read but did not serve (`deferred`), `handle`
    (= `dispatch`), `close`; and what `dispatch` needs: the `op_*` methods it serves and `unsupported`."""

    deferred: list[dict]

    def handle(self, msg: dict, conn) -> dict | None: ...

    def unsupported(self, op: str) -> Exception: ...

    def close(self) -> None: ...


def late_cut(msg: dict) -> dict:
    """The reply to a `cut` that arrived after the worker had finished its decode: nothing left to hand over."""
    return {"op": "cut_rows", "step": msg.get("step"), "rows": [], "late": True}


def dispatch(device: Device, msg: dict, conn) -> dict | None:
    """Serve one request on `device` by the table (a method of every device class: `handle = ops.dispatch`)."""
    op = msg["op"]
    method = getattr(device, OPS[op], None) if op in OPS else None
    if method is None:
        raise device.unsupported(op)
    return method(msg, conn)
