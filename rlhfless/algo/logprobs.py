"""Per-token log-probabilities and entropies from logits, without materialising a [N, T, V] log-softmax.

Purpose: the two reductions every policy-gradient learner needs from a forward pass.
Non-goals: running the model, shifting logits against labels (the caller aligns logits[:, t] with the token
at t), and padding logic (masked positions are computed like any other and the caller masks them).
Deviations from the paper: none (the paper does not specify these; they are standard).
"""

from __future__ import annotations

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _upcast(logits: Tensor) -> Tensor:
    # logsumexp over a large vocabulary in bf16 loses ~2 decimal digits; do the reduction in float32.
    return logits.float() if logits.dtype in _LOW_PRECISION else logits


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log pi(tokens[n, t] | context) for every position.

    Args:
        logits: [N, T, V] unnormalised scores; row (n, t) is the distribution of tokens[n, t].
        tokens: [N, T] int64 token ids in [0, V).
    Returns:
        [N, T] log-probabilities, float32 for half-precision logits, else logits' dtype.

    Memory: gathers the chosen logit and subtracts logsumexp, so the only [N, T, V] tensor is the
    (upcast) logits themselves; low-precision inputs are upcast one sequence at a time.
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree on [N, T]")
    if logits.dtype in _LOW_PRECISION:
        return torch.stack([token_logprobs(_upcast(row), tok) for row, tok in zip(logits, tokens)])
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (nats) of the softmax distribution at every position.

    Args:
        logits: [N, T, V] unnormalised scores.
    Returns:
        [N, T] entropies, H = logsumexp(l) - sum_v softmax(l)_v * l_v, float32 for half-precision logits.
    """
    logits = _upcast(logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
