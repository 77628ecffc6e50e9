"""Run checkpoints: everything a GRPO run needs to continue bit for bit after a crash, in safe formats only.

`OUT/checkpoints/last/` holds the policy, AdamW's tensors, torch's CPU generator state, the length predictor,
PPO's critic and ``state.json`` (the `RunState`: step, counters, prompt-stream position, rewards so far, byte
sizes of every output file, W&B run id): JSON and safetensors only, never pickle. The rule it keeps: writing is
crash-safe: `last.tmp` is written, then two renames make it `last` (the old one `last.prev`), so at any moment
of a `kill -9` a complete checkpoint exists and `find_checkpoint` takes the newest. Resuming truncates the
outputs to the recorded sizes, after copying what is cut to `OUT/resumed/step-<k>/`.
File by file: docs/internals.md#runrunstatepy.
Non-goals: multi-device optimizer sharding; resuming a run across different torch versions bit for bit.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from rlhfless.core.errors import DataError
from rlhfless.learn.optimstate import optimizer_tensors, set_optimizer_tensors
from rlhfless.run.runfolder import (  # noqa: F401  (the torch-free half, re-exported: one import for callers)
    FORMAT,
    FORMAT_VERSION,
    OPTIMIZER_FILE,
    RESUME_SAFE_KEYS,
    RNG_FILE,
    STATE_FILE,
    RunState,
    check_outputs,
    config_changes,
    find_checkpoint,
    flat_config,
    no_rng,
    read_state,
    require_in_checkpoint,
)

# --- writing ---------------------------------------------------------------------------------------------
def save_run_checkpoint(ckpt_root: Path, policy, opt, state: RunState, predictor=None, tokenizer=None,
                        critic=None) -> Path:
    """Write `ckpt_root/last` crash-safely (see the module header); returns its path. `tokenizer`: the policy's
    (default: the byte tokenizer); `critic`: PPO's `rlhfless.learn.critic.Critic`."""
    from safetensors.torch import save_file

    from rlhfless.model.factory import os_errors, save_checkpoint

    tmp, last, prev = ckpt_root / "last.tmp", ckpt_root / "last", ckpt_root / "last.prev"
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # a full disk stops here: `last` stays whole, and the partial copy is removed to give the space back
        save_checkpoint(policy, tmp, {"kind": "grpo", "step": state.step}, tokenizer=tokenizer)
        tensors, state.optimizer_groups = optimizer_tensors(opt)
        with os_errors(tmp / OPTIMIZER_FILE):
            save_file(tensors, str(tmp / OPTIMIZER_FILE))
            save_file({"cpu": torch.get_rng_state()}, str(tmp / RNG_FILE))
        if predictor is not None:
            predictor.save(tmp / "predictor")
        if critic is not None:
            from rlhfless.learn.critic import STATE_FILE as CRITIC_FILE, save_critic_state

            with os_errors(tmp / CRITIC_FILE):
                save_critic_state(critic, tmp / CRITIC_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **asdict(state)}))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if last.exists():
        shutil.rmtree(prev, ignore_errors=True)
        last.rename(prev)  # two renames: at every moment a complete `last` or `last.prev` exists
    tmp.rename(last)
    shutil.rmtree(prev, ignore_errors=True)
    return last


def file_sizes(out: Path, paths: list[Path]) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_size for p in paths if p.is_file()}


def nonfinite_parameter(model: torch.nn.Module) -> str | None:
    """Name of the first parameter holding a NaN or an infinity, else None (read only: no numeric path changes).

    The learner's guard watches the loss and the gradient norm; an update with finite gradients can still make
    weights non-finite (an absurd learning rate), and such weights must never be saved as a checkpoint."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not bool(torch.isfinite(p).all()):
                return name
    return None


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    require_in_checkpoint(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: corrupt or truncated safetensors file ({exc})") from None


def restore_optimizer(opt: torch.optim.Optimizer, ckpt: Path, groups: list[dict]) -> None:
    """Load optimizer.safetensors into `opt`; a tensor set that does not fit the model raises `DataError`."""
    path = ckpt / OPTIMIZER_FILE
    set_optimizer_tensors(opt, load_tensors(path), groups, path)


def read_rng(ckpt: Path) -> torch.Tensor:
    """The saved global generator state (set it with `torch.set_rng_state` once set-up is done)."""
    path = ckpt / RNG_FILE
    t = load_tensors(path).get("cpu")
    if t is None or t.dtype != torch.uint8 or t.dim() != 1:
        raise no_rng(path)
    return t


def rewind_outputs(out: Path, sizes: dict[str, int], step: int, outputs: list[Path]) -> None:
    """Cut every output file back to its size at the checkpoint; what is cut is kept under OUT/resumed/."""
    check_outputs(out, sizes, step, outputs)
    keep = out / "resumed" / f"step-{step}"
    for p in outputs:
        rel = str(p.relative_to(out))
        size = sizes.get(rel, 0)
        if not p.is_file() or p.stat().st_size == size:
            continue
        (keep / rel).parent.mkdir(parents=True, exist_ok=True)
        with p.open("rb") as src, (keep / rel).open("ab") as dst:
            src.seek(size)
            shutil.copyfileobj(src, dst)
        with p.open("r+b") as fh:
            fh.truncate(size)
