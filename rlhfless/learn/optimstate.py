"""AdamW state as safetensors-ready tensors and back: one format for the run checkpoint (`runstate`), the learner's
state file (`learner`) and PPO's critic (`critic`), in a module below all three."""

from __future__ import annotations

from pathlib import Path

import torch

from rlhfless.core.errors import DataError


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
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        idx, _, name = key.partition("/")
        if not idx.isdigit() or not name:
            raise DataError(f"{path}: unexpected tensor name {key!r}")
        state.setdefault(int(idx), {})[name] = t
    params = [p for g in opt.param_groups for p in g["params"]]
    for idx, st in state.items():
        if idx >= len(params) or any(n != "step" and t.shape != params[idx].shape for n, t in st.items()):
            raise DataError(f"{path}: optimizer state does not match the model's parameters (index {idx})")
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: optimizer state does not load ({exc})") from None
