"""AdamW state as safetensors-ready tensors and back: one format for the run checkpoint (`runstate`), the learner's
state file (`learner`) and PPO's critic (`critic`), in a module below all three."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rlhfless.core.errors import DataError

if TYPE_CHECKING:  # only the annotations name torch: `check_optimizer_layout` runs without it (`--dry-run`)
    import torch


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """AdamW state as flat safetensors-ready tensors plus JSON-able param groups."""
    sd = opt.state_dict()
    tensors = {f"{idx}/{name}": t.detach().clone().contiguous()
               for idx, st in sd["state"].items() for name, t in st.items()}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, groups


def set_optimizer_tensors(opt: torch.optim.Optimizer, flat: dict[str, torch.Tensor], groups: list[dict],
                          path: Path) -> None:
    """Inverse of `optimizer_tensors`; `path` names the source in the `DataError` raised on a mismatch."""
    params = [p for g in opt.param_groups for p in g["params"]]
    check_optimizer_layout({k: tuple(t.shape) for k, t in flat.items()}, [tuple(p.shape) for p in params], path)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        idx, _, name = key.partition("/")
        state.setdefault(int(idx), {})[name] = t
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: optimizer state does not load ({exc})") from None


def check_optimizer_layout(shapes: dict[str, Sequence[int]], param_shapes: list[Sequence[int]], path: Path) -> None:
    """The names and shapes of saved optimizer tensors ("<param index>/<name>" -> shape) against the model's
    parameter shapes, before any tensor is read: `set_optimizer_tensors`' checks, also without torch."""
    state: dict[int, dict[str, tuple]] = {}
    for key, shape in shapes.items():
        idx, _, name = key.partition("/")
        if not idx.isdigit() or not name:
            raise DataError(f"{path}: unexpected tensor name {key!r}")
        state.setdefault(int(idx), {})[name] = tuple(shape)
    for idx, st in state.items():
        if idx >= len(param_shapes) or any(n != "step" and s != tuple(param_shapes[idx]) for n, s in st.items()):
            raise DataError(f"{path}: optimizer state does not match the model's parameters (index {idx})")
