"""The run folder's torch-free half of a run checkpoint: its `RunState` (``state.json``), finding the newest
complete checkpoint, and the checks `--resume` makes before any model is loaded (`check_resume`).

Split from `runstate` (which writes checkpoints and restores tensors, with torch) so that `train --dry-run --resume`
makes the same checks, in the same functions, without importing torch (issue 42). `runstate` re-exports every name.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhfless.core.errors import ConfigError, DataError, one_line
from rlhfless.core.rundir import RunDir

if TYPE_CHECKING:
    from rlhfless.config import RunConfig


STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
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


# --- the checks of --resume that need no model ----------------------------------------------------------------
def check_resume(cfg: RunConfig, out: Path, allow_config_change: bool) -> tuple[Path, RunState]:
    """The checks of `--resume` that need no model: a complete checkpoint, its state, the config, the steps."""
    ckpt = find_checkpoint(out)
    state = read_state(ckpt)
    check_resume_config(cfg, out, allow_config_change)
    if state.step >= cfg.train.steps:
        raise ConfigError(f"train.steps: the run in {out} already has {state.step} steps; "
                          f"set train.steps above {state.step} to extend it")
    return ckpt, state


def check_resume_config(cfg: RunConfig, out: Path, allow: bool) -> None:
    """The run's saved config against `cfg`: a change that alters results is refused unless `allow` (then warned)."""
    from rlhfless.core.configbase import load_yaml

    path = RunDir(out).config
    try:
        saved = load_yaml(path)  # bounded loader: size, depth and aliases (a run folder may come from elsewhere)
    except ConfigError as exc:
        raise DataError(f"cannot read the run's config: {exc}") from None
    changes = config_changes(saved, asdict(cfg))
    if changes and not allow:
        raise ConfigError(f"--resume: the config differs from the run in {out} in {', '.join(changes)}, which would "
                          "change results; resume with the same config, or pass --allow-config-change to accept it")
    if changes:
        print(f"rlhfless: warning: resuming with changed {', '.join(changes)}; results differ from an "
              "uninterrupted run from here on", file=sys.stderr)


def output_files(out: Path) -> list[Path]:
    """The files steps append to: rewound to their checkpoint sizes on resume."""
    tables = sorted(RunDir(out).tables.glob("*.jsonl")) if RunDir(out).tables.is_dir() else []
    return [RunDir(out).metrics, RunDir(out).trace, RunDir(out).digests,
            *tables, RunDir(out).invocations]


def check_outputs(out: Path, sizes: dict[str, int], step: int, outputs: list[Path]) -> None:
    """Every output file must still hold at least what it held at the checkpoint (checked before any change)."""
    for p in outputs:
        rel = str(p.relative_to(out))
        have = p.stat().st_size if p.is_file() else 0
        if have < sizes.get(rel, 0):
            raise DataError(f"{p}: {have} bytes but the checkpoint at step {step} recorded {sizes[rel]}; the file "
                            "was truncated or replaced after the checkpoint, so the run cannot resume exactly")


def check_outputs_of(out: Path, state: RunState) -> None:
    """`check_outputs` of the run in `out` against its checkpoint's `state`."""
    check_outputs(out, state.file_sizes, state.step, output_files(out))


# --- the checkpoint's tensor files, read without torch (`train --dry-run --resume`) ------------------------------
def require_in_checkpoint(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"{path}: missing from the run checkpoint")


def no_rng(path: Path) -> DataError:
    return DataError(f"{path}: no 1-D uint8 'cpu' generator state")


def check_tensor_files(ckpt: Path, state: RunState, param_shapes: list[list[int]]) -> bool:
    """`runstate.restore_optimizer`'s and `read_rng`'s checks of a run checkpoint whose policy has parameters of
    `param_shapes` (in order), without torch, in their order: True when all passed; False when only the real
    load can judge (a file safetensors' numpy reader refuses, AdamW's own check of the param groups)."""
    from safetensors import SafetensorError, safe_open

    import numpy as np

    from rlhfless.learn.optimstate import check_optimizer_layout

    opt, rng = ckpt / OPTIMIZER_FILE, ckpt / RNG_FILE
    require_in_checkpoint(opt)
    try:  # opening checks the header and that the file holds every byte it names: no tensor need be read
        with safe_open(str(opt), framework="np") as fh:
            shapes = {k: fh.get_slice(k).get_shape() for k in fh.keys()}
    except (SafetensorError, OSError, ValueError):
        return False
    check_optimizer_layout(shapes, param_shapes, opt)
    groups = state.optimizer_groups
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)
            and isinstance(groups[0].get("params"), list) and len(groups[0]["params"]) == len(param_shapes)):
        return False
    require_in_checkpoint(rng)
    try:
        with safe_open(str(rng), framework="np") as fh:
            t = fh.get_tensor("cpu") if "cpu" in fh.keys() else None
    except (SafetensorError, OSError, ValueError):
        return False
    if t is None or t.dtype != np.uint8 or t.ndim != 1:
        raise no_rng(rng)
    return True
