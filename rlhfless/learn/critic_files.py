"""The critic's files checked without torch: its trunk folder, its vocabulary against the policy's, and its saved
state (``critic.safetensors`` in a run checkpoint), with the refusals `critic.load_critic` and
`critic.load_critic_state` raise (they call these same functions), so `train --dry-run` of a PPO run refuses what
the run refuses, in the same line, without importing torch (issue 42).

`check_state` reads the file through safetensors' numpy framework. What only torch can judge (an unreadable
tensor, AdamW's own `load_state_dict` checks of the param groups) it leaves to the real load: it returns False, and
the caller builds the critic and loads the state as the run does.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlhfless.core.errors import ConfigError, DataError

STATE_FORMAT = "rlhfless-critic-state"
STATE_VERSION = "1"
STATE_FILE = "critic.safetensors"


def trunk_folder(checkpoint: str | None, path: Path) -> Path:
    """`path` (critic.checkpoint resolved, `CriticConfig.resolved`) when it is a folder; a named one that is not is
    refused naming critic.checkpoint."""
    if checkpoint and not path.is_dir():
        raise ConfigError(f"critic.checkpoint: no folder at {path}; name a policy folder (rlhfless pretrain or "
                          "build-hf-model make one) or leave it null to start from policy.checkpoint")
    return path


def check_vocab(path: Path, got: int, vocab_size: int | None) -> None:
    """A critic trunk with another vocabulary would read the policy's token ids as other tokens."""
    if vocab_size is not None and got != vocab_size:
        raise ConfigError(f"critic.checkpoint: {path} has a vocabulary of {got} tokens, the policy {vocab_size}; "
                          "the critic reads the policy's token ids, so it needs the policy's tokenizer")


def require_state(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"{path}: missing; this run uses algo.name=ppo, so its checkpoint must carry the critic")


def check_format(path: Path, meta: dict) -> None:
    if meta.get("format") != STATE_FORMAT or meta.get("version") != STATE_VERSION:
        raise DataError(f"{path}: not an rlhfless critic state v{STATE_VERSION} (format {meta.get('format')!r})")


def check_fit(path: Path, shapes: dict[str, tuple], own: dict[str, tuple]) -> None:
    """The saved weights' names and shapes against the critic model's `own` (name -> shape)."""
    if set(shapes) != set(own) or any(tuple(shapes[k]) != tuple(own[k]) for k in own):
        raise DataError(f"{path}: critic weights do not fit the critic model (is critic.checkpoint the same?)")


def parse_meta(path: Path, meta: dict) -> tuple[int, float | None, list]:
    """(updates, last_grad_norm, optimizer param groups) of the state's metadata."""
    try:
        updates, norm = int(meta["updates"]), json.loads(meta["last_grad_norm"])
        groups = json.loads(meta["optimizer_groups"])
    except (KeyError, ValueError) as exc:
        raise DataError(f"{path}: corrupt critic state metadata ({exc})") from None
    return updates, norm, groups


def value_model_shapes(raw: dict) -> dict[str, list[int]]:
    """Name -> shape of every tensor of `critic.ValueModel`'s state dict on the trunk of a byte checkpoint whose
    checked config.json is `raw`, in its parameter order (the trunk's, then the head's)."""
    from rlhfless.model.factory import expected_tensors

    trunk = {"trunk." + k.removeprefix("model."): v for k, v in expected_tensors(raw).items()}
    return {**trunk, "head.weight": [1, raw["hidden_size"]], "head.bias": [1]}


def check_state(path: Path, own: dict[str, list[int]]) -> bool:
    """`load_critic_state`'s checks of `path` against a critic whose state dict is `own` (`value_model_shapes`),
    without torch, in its order: True when all passed; False when only the real load can judge (see the header)."""
    from safetensors import SafetensorError, safe_open

    from rlhfless.learn.optimstate import check_optimizer_layout
    from rlhfless.model.factory import check_finite_np

    require_state(path)
    try:  # every tensor read first, as the real load does: a file it cannot read is refused before any other check
        with safe_open(str(path), framework="np") as fh:
            meta = fh.metadata() or {}
            flat = {k: fh.get_tensor(k) for k in fh.keys()}
    except (SafetensorError, OSError, ValueError):  # numpy reads no bfloat16, for one: the real load judges
        return False
    check_format(path, meta)
    weights = {k[len("model/"):]: a for k, a in flat.items() if k.startswith("model/")}
    check_fit(path, {k: a.shape for k, a in weights.items()}, own)
    _, _, groups = parse_meta(path, meta)
    check_finite_np(weights.items(), path)
    check_optimizer_layout({k[len("optim/"):]: a.shape for k, a in flat.items() if k.startswith("optim/")},
                           list(own.values()), path)
    # AdamW's load_state_dict: one param group holding every parameter, as the critic's optimizer has
    return (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)
            and isinstance(groups[0].get("params"), list) and len(groups[0]["params"]) == len(own))
