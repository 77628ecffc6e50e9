"""Generalised Advantage Estimation for PPO with a learned value function.

Purpose: per-token advantages and value targets from per-token rewards and values, for the PPO path
(GRPO needs no critic and uses `rlhfless.algo.grpo.group_advantages`).
Non-goals: the value model, value-loss clipping, advantage whitening (the caller may whiten).
Deviations from the paper: none stated there; this is textbook GAE (Schulman et al. 2016) as in verl,
with episodes ending at the last valid token (no bootstrap past the response).
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns, computed backwards over time.

    delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t;  A_t = delta_t + gamma * lam * m_{t+1} * A_{t+1}.

    Args:
        rewards: [N, T] per-token rewards (e.g. the outcome reward on the last valid token, minus a KL term).
        values: [N, T] value estimates V(s_t).
        mask: [N, T] bool, True on valid response tokens; valid tokens are a prefix of each row (right padding).
        gamma: discount in [0, 1]; lam: GAE lambda in [0, 1].
    Returns:
        (advantages [N, T], returns [N, T] = advantages + values), both 0 where mask is False.
    """
    m = mask.to(values.dtype)
    v = values.detach() * m
    n, t_len = rewards.shape
    adv = torch.zeros_like(v)
    next_adv = torch.zeros(n, dtype=v.dtype, device=v.device)
    next_v = torch.zeros_like(next_adv)
    next_m = torch.zeros_like(next_adv)
    for t in reversed(range(t_len)):
        delta = rewards[:, t] + gamma * next_v * next_m - v[:, t]
        next_adv = (delta + gamma * lam * next_m * next_adv) * m[:, t]
        adv[:, t] = next_adv
        next_v, next_m = v[:, t], m[:, t]
    return adv, (adv + v) * m
