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
import os
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from rlhfless.core.errors import DataError, one_line
from rlhfless.core.rundir import RunDir
from rlhfless.learn.optimstate import optimizer_tensors, set_optimizer_tensors

STATE_FILE = "state.json"
FORMAT = "rlhfless-run-checkpoint"
FORMAT_VERSION = 1

# Keys that may change on --resume without changing what is learned: run length (extend a run), how often
# tables and checkpoints are written, and W&B naming. Anything else changes results and needs
# --allow-config-change.
RESUME_SAFE_KEYS = frozenset({
    "train.steps", "train.table_every", "train.checkpoint_every",
    "tracking.mode", "tracking.project", "tracking.name", "tracking.group",
})


@dataclass
class RunState:
    """The non-tensor state of a run at the end of step `step` (JSON in state.json)."""

    step: int
    learner_updates: int
    last_grad_norm: float | None
    stream_epoch: int
    stream_pos: int
    rewards: list[float]
    initial_eval: dict[str, dict] = field(default_factory=dict)
    """kind ("sampled"/"greedy") -> EvalResult fields, so the final summary compares against the same start."""
    file_sizes: dict[str, int] = field(default_factory=dict)
    """Output file (relative to OUT) -> byte size at this step; files not listed did not exist yet."""
    wandb_id: str | None = None
    elapsed_s: float = 0.0
    optimizer_groups: list[dict] = field(default_factory=list)
    """AdamW param_groups (hyper-parameters; tensors live in optimizer.safetensors)."""


def flat_config(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flat_config(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def config_changes(saved: dict, new: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts and would change results (sorted)."""
    a, b = (flat_config(json.loads(json.dumps(d))) for d in (saved, new))  # tuples and lists compare equal
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k not in RESUME_SAFE_KEYS)


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
        with os_errors(tmp / "optimizer.safetensors"):
            save_file(tensors, str(tmp / "optimizer.safetensors"))
            save_file({"cpu": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
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


# --- reading ---------------------------------------------------------------------------------------------
def find_checkpoint(out: Path) -> Path:
    """The newest complete run checkpoint in `out` (`last`, else `last.prev` left by a kill mid-swap)."""
    for name in ("last", "last.prev"):
        d = RunDir(out).checkpoint(name)
        if (d / STATE_FILE).is_file():
            return d
    from rlhfless.core.outpaths import start_over

    left = [out / "checkpoints" / n for n in ("last", "last.prev") if os.path.lexists(out / "checkpoints" / n)]
    if left:  # the run had a checkpoint: say what is wrong with it, not that it never made one
        what = "a link to nothing" if not left[0].exists() else f"incomplete (no {STATE_FILE})"
        raise DataError(f"{left[0]}: the run's checkpoint is {what}, so there is nothing to resume from; restore "
                        f"it, or {start_over(out)}")
    raise DataError(f"{out}: no run checkpoint to resume (the run stopped before its first one, "
                    f"train.checkpoint_every); {start_over(out)}")


def read_state(ckpt: Path) -> RunState:
    """Parse and check state.json; anything unexpected raises `DataError` naming the file."""
    path = ckpt / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # also a huge integer or deep nesting
        raise DataError(f"{path}: not a readable run checkpoint state ({one_line(exc, 120)})") from None
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if fmt != FORMAT:
        raise DataError(f"{path}: not an rlhfless run checkpoint (format {fmt!r})")
    if doc.get("version") != FORMAT_VERSION:
        raise DataError(f"{path}: checkpoint format version {doc.get('version')!r}, "
                        f"this rlhfless reads {FORMAT_VERSION}")
    names = {f.name for f in fields(RunState)}
    try:
        state = RunState(**{k: v for k, v in doc.items() if k in names})
    except TypeError as exc:
        raise DataError(f"{path}: incomplete run checkpoint state ({exc})") from None
    _check_types(state, path)
    return state


def _check_types(s: RunState, path: Path) -> None:
    ints = ("step", "learner_updates", "stream_epoch", "stream_pos")
    bad = [n for n in ints if not isinstance(getattr(s, n), int) or getattr(s, n) < 0]
    if bad or not isinstance(s.rewards, list) or len(s.rewards) != s.step or \
            not all(isinstance(r, (int, float)) for r in s.rewards) or \
            not isinstance(s.file_sizes, dict) or not all(isinstance(v, int) for v in s.file_sizes.values()):
        raise DataError(f"{path}: corrupt run checkpoint state (fields {bad or 'rewards/file_sizes'} are invalid)")


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise DataError(f"{path}: missing from the run checkpoint")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: corrupt or truncated safetensors file ({exc})") from None


def restore_optimizer(opt: torch.optim.Optimizer, ckpt: Path, groups: list[dict]) -> None:
    """Load optimizer.safetensors into `opt`; a tensor set that does not fit the model raises `DataError`."""
    path = ckpt / "optimizer.safetensors"
    set_optimizer_tensors(opt, load_tensors(path), groups, path)


def read_rng(ckpt: Path) -> torch.Tensor:
    """The saved global generator state (set it with `torch.set_rng_state` once set-up is done)."""
    path = ckpt / "rng.safetensors"
    t = load_tensors(path).get("cpu")
    if t is None or t.dtype != torch.uint8 or t.dim() != 1:
        raise DataError(f"{path}: no 1-D uint8 'cpu' generator state")
    return t


def check_outputs(out: Path, sizes: dict[str, int], step: int, outputs: list[Path]) -> None:
    """Every output file must still hold at least what it held at the checkpoint (checked before any change)."""
    for p in outputs:
        rel = str(p.relative_to(out))
        have = p.stat().st_size if p.is_file() else 0
        if have < sizes.get(rel, 0):
            raise DataError(f"{p}: {have} bytes but the checkpoint at step {step} recorded {sizes[rel]}; the file "
                            "was truncated or replaced after the checkpoint, so the run cannot resume exactly")


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
