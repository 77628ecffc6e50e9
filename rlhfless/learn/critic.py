"""PPO's critic: a value model (a causal LM's trunk with a scalar head), its AdamW, and its state on disk.

The value of response token t is read from the trunk's hidden state at the column that predicts token t (the
prompt plus tokens < t), the position the policy's logits for token t come from and the one verl reads values at.
The trunk is the `critic.checkpoint` folder's (default: the policy's starting checkpoint, so the critic starts
from the SFT model's representations); its language-model head is dropped.

Deviations from verl: the value head is a zero-initialised linear layer (verl's token-classification head is
randomly initialised), so every run's first values are exactly 0 and explained variance starts at 0; the forward
runs each (prompt, response) row in full (no prompt-KV reuse across a group: PPO's default G is 1).
State on disk: one safetensors file, tensors ``model/<name>`` and ``optim/<param index>/<name>``, metadata
format, version, updates, last_grad_norm and optimizer_groups (JSON) -- no pickle.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from rlhfless.core import metrics as M
from rlhfless.learn.config import CriticConfig
from rlhfless.core.errors import DataError, TrainingError
from rlhfless.learn import critic_files
from rlhfless.learn.critic_files import STATE_FILE, STATE_FORMAT, STATE_VERSION  # noqa: F401  (this module's names)
from rlhfless.learn.dataparallel import CRITIC_ROW, Shard, reduce_step
from rlhfless.rollout.engine import left_pad
from rlhfless.rollout.forward import pad_responses



class ValueModel(nn.Module):
    """A transformer trunk and a linear scalar head: [R, L] token ids -> [R, L] values."""

    def __init__(self, trunk: nn.Module, hidden_size: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids).last_hidden_state
        # the head's dtype (float32 as built; a float64 test replica stays float64 throughout)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


def build_value_model(checkpoint: Path) -> ValueModel:
    """The value model on the trunk of the causal LM in `checkpoint` (its LM head dropped)."""
    from rlhfless.model.factory import load_policy

    lm = load_policy(checkpoint)
    return ValueModel(lm.base_model, int(lm.config.hidden_size)).float()


def response_values(model: ValueModel, prompts: list[list[int]], responses: list[list[int]],
                    group_size: int) -> torch.Tensor:
    """[R, T] V(s_t) of each response token t (0 off the mask); rows group-major as `response_logprobs`.

    Runs with autograd when the caller has it on (the critic update) and without under `torch.no_grad()`.
    """
    rows = [p for p in prompts for _ in range(group_size)]
    p_ids, p_mask = left_pad(rows)
    r_ids, r_mask = pad_responses(responses)
    ids = torch.cat([p_ids, r_ids], dim=1)
    attn = torch.cat([p_mask, r_mask.long()], dim=1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    values = model(ids, attn, pos)
    P = p_ids.shape[1]
    # column c has seen tokens <= c, so the state before response token t is column P + t - 1
    return values[:, P - 1: P - 1 + r_ids.shape[1]] * r_mask


def value_chunks(n_groups: int, group_size: int, chunk_seqs: int) -> list[list[int]]:
    """The value forward's chunks: lists of consecutive group indices, max(1, chunk_seqs // group_size) groups
    each (the last may be shorter); chunk_seqs = 0: one chunk of every group. Fixed by index only (pure)."""
    if n_groups < 1 or group_size < 1 or chunk_seqs < 0:
        raise ValueError(f"need n_groups >= 1, group_size >= 1, chunk_seqs >= 0 "
                         f"(got {n_groups}, {group_size}, {chunk_seqs})")
    m = max(1, chunk_seqs // group_size) if chunk_seqs else n_groups
    return [list(range(k, min(k + m, n_groups))) for k in range(0, n_groups, m)]


def join_chunks(parts: list[torch.Tensor]) -> torch.Tensor:
    """[R, T] from the chunks' [r_k, T_k] values in chunk order, zero-padded on the right to the longest T_k."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


class Critic:
    """The value model and its own AdamW; `step(loss)` is one clipped optimiser step."""

    def __init__(self, model: ValueModel, cfg: CriticConfig):
        self.model = model
        self.cfg = cfg
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.updates = 0
        self.last_grad_norm: float | None = None

    def lr(self) -> float:
        w = self.cfg.warmup_steps
        return self.cfg.lr * min(1.0, (self.updates + 1) / w) if w else self.cfg.lr

    @torch.no_grad()
    def values(self, prompts: list[list[int]], responses: list[list[int]], group_size: int) -> torch.Tensor:
        """[R, T] values of the rollout before any update (the value forward stage), chunk by chunk
        (`value_chunks` with critic.values_chunk): the same numbers as the runtime's value function."""
        G = group_size
        parts = [self.chunk_values([prompts[g] for g in gs], responses[gs[0] * G:(gs[-1] + 1) * G], G)
                 for gs in value_chunks(len(prompts), G, self.cfg.values_chunk)]
        return join_chunks(parts)

    @torch.no_grad()
    def chunk_values(self, prompts: list[list[int]], responses: list[list[int]], group_size: int) -> torch.Tensor:
        """[r, T_chunk] values of one chunk's rows (T_chunk: its own longest response)."""
        self.model.eval()
        return response_values(self.model, prompts, responses, group_size)

    def step(self, loss: torch.Tensor) -> float:
        """Backward `loss`, clip to critic.grad_clip, step; returns the gradient norm before clipping."""
        if not torch.isfinite(loss):
            raise TrainingError(f"non-finite critic loss ({loss.item()}) at update {self.updates}")
        for g in self.opt.param_groups:
            g["lr"] = self.lr()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip).item()
        if not math.isfinite(norm):
            raise TrainingError(f"non-finite critic gradient norm at update {self.updates}")
        self.last_grad_norm = norm
        self.opt.step()
        return norm

    def step_shard(self, loss: torch.Tensor | None, local: dict[str, float], n_tok: int,
                   shard: Shard) -> tuple[dict[str, float], float]:
        """One data-parallel step: backward this rank's share (loss computed with the mini-batch's global
        normaliser; None on a rank with no rows), all-reduce the gradients and metric rows (`reduce_step` with
        `CRITIC_ROW`), clip, step. Returns (the mini-batch's metrics, the gradient norm), the same on every rank.
        A non-finite local loss is not raised before the all-reduce (the peers would wait in it): it poisons the
        summed loss, so every rank raises after."""
        for g in self.opt.param_groups:
            g["lr"] = self.lr()
        self.opt.zero_grad(set_to_none=True)
        if loss is not None:
            loss.backward()
        params = [p for p in self.model.parameters() if p.requires_grad]
        metrics = reduce_step(params, shard, local, n_tok, with_kl=False, layout=CRITIC_ROW)
        if not math.isfinite(metrics[M.VF_LOSS]):
            raise TrainingError(f"non-finite critic loss ({metrics[M.VF_LOSS]}) at update {self.updates}")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip).item()
        if not math.isfinite(norm):
            raise TrainingError(f"non-finite critic gradient norm at update {self.updates}")
        self.last_grad_norm = norm
        self.opt.step()
        return metrics, norm

    def metrics(self) -> dict[str, float]:
        return {M.CRITIC_LR: self.lr()}


def load_critic(cfg: CriticConfig, policy_checkpoint: Path, vocab_size: int | None = None) -> Critic:
    """A fresh critic on the trunk of `critic.checkpoint` (default: the policy's starting checkpoint).

    vocab_size: the policy's; a critic trunk with another vocabulary would read the policy's token ids as other
    tokens, so it is refused naming critic.checkpoint."""
    path = critic_files.trunk_folder(cfg.checkpoint, cfg.resolved(policy_checkpoint))
    model = build_value_model(path)
    critic_files.check_vocab(path, int(model.trunk.config.vocab_size), vocab_size)
    return Critic(model, cfg)


def save_critic_state(critic: Critic, path: Path) -> Path:
    """Weights, AdamW state and counters of `critic` in one safetensors file at `path`."""
    from safetensors.torch import save_file

    from rlhfless.learn.optimstate import optimizer_tensors

    tensors = {f"model/{k}": v.detach().contiguous() for k, v in critic.model.state_dict().items()}
    opt_tensors, groups = optimizer_tensors(critic.opt)
    tensors.update({f"optim/{k}": v for k, v in opt_tensors.items()})
    meta = {"format": STATE_FORMAT, "version": STATE_VERSION, "updates": str(critic.updates),
            "last_grad_norm": json.dumps(critic.last_grad_norm), "optimizer_groups": json.dumps(groups)}
    save_file(tensors, str(path), metadata=meta)
    return path


def load_critic_state(critic: Critic, path: Path) -> None:
    """Inverse of `save_critic_state` into a critic of the same architecture; anything off raises `DataError`."""
    from safetensors import SafetensorError, safe_open

    from rlhfless.learn.optimstate import set_optimizer_tensors

    critic_files.require_state(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            flat = {k: fh.get_tensor(k) for k in fh.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable critic state ({exc})") from None
    critic_files.check_format(path, meta)
    weights = {k[len("model/"):]: v for k, v in flat.items() if k.startswith("model/")}
    critic_files.check_fit(path, {k: tuple(v.shape) for k, v in weights.items()},
                           {k: tuple(v.shape) for k, v in critic.model.state_dict().items()})
    updates, norm, groups = critic_files.parse_meta(path, meta)
    from rlhfless.model.factory import check_finite

    check_finite(weights.items(), path)
    critic.model.load_state_dict(weights)
    set_optimizer_tensors(critic.opt, {k[len("optim/"):]: v for k, v in flat.items() if k.startswith("optim/")},
                          groups, path)
    critic.updates, critic.last_grad_norm = updates, norm
