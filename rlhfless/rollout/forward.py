"""Teacher-forced forward passes over (prompt, response) rows: per-token log-probs for learner and reference.

Layout: each row is ``[pad ... pad | prompt | response | pad ... pad]`` (prompt left-padded, response
right-padded) so every prompt ends at the same column and response token t sits at column P + t.

Prompt reuse (`reuse_prefix=True`): the G responses of a group share their prompt, so the prompt runs once per
group, its KV is repeated G times (`DynamicCache.batch_repeat_interleave`, differentiable, so gradients from all
G rows add up on the one prompt pass), and the responses run against that cache. Same log-probs up to float
rounding and the same gradient (tested); it saves (G-1)/G of the prompt tokens in the forward and the backward,
which pays when prompts are long next to responses (a few-shot template; `rlhfless bench prefill` measures it).
Devices: ids, masks and positions are laid out on the CPU and moved to the model's device; the log-probs, mask
and entropy come back there, in float32 whatever the model's dtype.
Non-goals: sampling (see `engine.py`); sharing prefixes ACROSS prompts here (the learner's batches are split
into micro-batches, where cross-prompt sharing would save little).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfless.algo.logprobs import entropy_from_logits, token_logprobs
from rlhfless.core.devices import model_device
from rlhfless.core.errors import UserError
from rlhfless.model.tokenizer import PAD_ID
from rlhfless.rollout.engine import left_pad


@dataclass
class ResponseLogprobs:
    logp: torch.Tensor
    """[R, T] log-prob of each response token under the model (0 where mask is 0)."""
    mask: torch.Tensor
    """[R, T] float, 1 for real response tokens."""
    entropy: torch.Tensor | None
    """[R, T] entropy of the predictive distribution, when asked for."""


def pad_responses(responses: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to [R, T] ids and a float mask."""
    width = max(1, max(len(r) for r in responses))
    ids = torch.full((len(responses), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.float32)
    for i, r in enumerate(responses):
        if r:
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1.0
    return ids, mask


def response_logprobs(model, prompts: list[list[int]], responses: list[list[int]], group_size: int,
                      *, with_entropy: bool = False, reuse_prefix: bool = False) -> ResponseLogprobs:
    """Log-probs of `responses` (rows group-major, row g*G+s answers prompts[g]) given their prompts.

    Runs with autograd when the caller has it enabled (the learner) and without under `torch.no_grad()`
    (old and reference log-probs). reuse_prefix: run each prompt once per group (see the module docstring).
    """
    if len(responses) != len(prompts) * group_size:
        raise UserError(f"got {len(responses)} responses for {len(prompts)} prompts x group_size {group_size}; "
                        f"need exactly {len(prompts) * group_size}, group-major")
    if reuse_prefix and group_size > 1:
        return _finish(_logits_reusing_prompt(model, prompts, responses, group_size), responses, with_entropy)
    rows = [p for p in prompts for _ in range(group_size)]
    p_ids, p_mask = left_pad(rows)
    r_ids, r_mask = pad_responses(responses)
    dev = model_device(model)
    ids = torch.cat([p_ids, r_ids], dim=1).to(dev)
    attn = torch.cat([p_mask, r_mask.long()], dim=1).to(dev)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    P = p_ids.shape[1]
    # logits at column c predict the token at column c+1: response token t is predicted at P + t - 1.
    return _finish(logits[:, P - 1: P - 1 + r_ids.shape[1], :], responses, with_entropy)


def _logits_reusing_prompt(model, prompts: list[list[int]], responses: list[list[int]], G: int) -> torch.Tensor:
    """[R, T, V] logits predicting each response token, with each prompt run once and its KV repeated G times."""
    from transformers import DynamicCache

    dev = model_device(model)
    p_ids, p_mask = (t.to(dev) for t in left_pad(prompts))
    cache = DynamicCache(config=model.config)
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1:, :].repeat_interleave(G, dim=0)  # predicts response token 0
    cache.batch_repeat_interleave(G)
    r_ids, r_mask = (t.to(dev) for t in pad_responses(responses))
    attn = torch.cat([p_mask.repeat_interleave(G, dim=0), r_mask.long()], dim=1)
    pos = p_mask.sum(-1).repeat_interleave(G).unsqueeze(-1) + torch.arange(r_ids.shape[1], device=dev)
    rest = model(input_ids=r_ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                 use_cache=True).logits
    return torch.cat([first, rest[:, :-1, :]], dim=1)


def _finish(resp_logits: torch.Tensor, responses: list[list[int]], with_entropy: bool) -> ResponseLogprobs:
    r_ids, r_mask = (t.to(resp_logits.device) for t in pad_responses(responses))
    resp_logits = resp_logits.float()
    logp = token_logprobs(resp_logits, r_ids) * r_mask
    ent = entropy_from_logits(resp_logits) * r_mask if with_entropy else None
    return ResponseLogprobs(logp, r_mask, ent)
