"""PPO math as pure tensor functions: per-token rewards, whitened GAE advantages, the clipped value loss,
explained variance and the mini-batch order. The actor loss is `grpo.grpo_loss` with per-token advantages.

Shapes: N = sequences (B prompts x G responses, G >= 1), T = padded response length; `mask[N, T]` is True on
response tokens (right padding). The rule it keeps: `values[N, T]` is V(s_t), the critic's value of the state
before response token t (prompt plus tokens < t), the position verl reads values from.

Deviations from verl:
1. The KL reward penalty is verl's `kl` estimator with a fixed coefficient (no adaptive KL controller).
2. Whitening: unbiased masked variance, rsqrt(var + 1e-8), mean shifted back; one valid token is only centred.
3. The value loss is 0.5 * max of the clipped and unclipped squared errors, aggregated like the actor's loss;
   `critic/vf_clipfrac` counts tokens where the clamp acts and the clipped branch is strictly larger (no gradient).
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from rlhfless.core import metrics as M
from rlhfless.algo.gae import gae_advantages
from rlhfless.algo.grpo import aggregate
from rlhfless.algo.registry import register_advantage

def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def token_rewards(outcome: Tensor, mask: Tensor, kl_coef: float = 0.0, logp: Tensor | None = None,
                  ref_logp: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Per-token rewards: the outcome reward on each row's last valid token, minus kl_coef * (logp - ref_logp)
    on every valid token when kl_coef > 0 (the KL as a reward penalty).

    Args:
        outcome: [N] scalar reward of each response.
        mask: [N, T] bool valid response tokens (a prefix of each row; a row may be empty and then gets nothing).
        logp, ref_logp: [N, T] sampling-policy and reference log-probs (needed when kl_coef > 0).
    Returns:
        ([N, T] rewards, 0 off the mask; metrics critic/kl_penalty = mean per-token penalty when kl_coef > 0).
    """
    m = mask.bool()
    rewards = torch.zeros(m.shape, dtype=torch.float32)
    lengths = m.sum(dim=1)
    rows = (lengths > 0).nonzero().squeeze(-1)
    rewards[rows, lengths[rows] - 1] = outcome.to(torch.float32)[rows]
    metrics: dict[str, float] = {}
    if kl_coef > 0:
        if logp is None or ref_logp is None:
            raise ValueError(f"kl_coef={kl_coef} > 0 in the reward needs logp and ref_logp")
        kl = torch.where(m, logp.detach() - ref_logp.detach(), torch.zeros_like(rewards))
        rewards = rewards - kl_coef * kl
        metrics[M.KL_PENALTY] = (kl_coef * _masked_mean(kl, m)).item()
    return rewards, metrics


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the valid tokens (unbiased variance), 0 off the mask.

    Args: x [N, T] float; mask [N, T] bool. Returns [N, T]. With fewer than 2 valid tokens: centred only.
    """
    m = mask.to(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1.0)
    centred = (x - mean) * m
    if n < 2:
        return centred
    var = (centred ** 2).sum() / (n - 1)  # unbiased, as verl's masked_whiten
    return centred * torch.rsqrt(var + eps)


@register_advantage("gae")
def gae_estimator(rewards: Tensor, values: Tensor, mask: Tensor, cfg) -> tuple[Tensor, Tensor, dict[str, float]]:
    """The registered `gae` estimator: `ppo_advantages` with the config's gamma, lambda and whitening."""
    return ppo_advantages(rewards, values, mask, cfg.gamma, cfg.lam, cfg.whiten_advantages)


def ppo_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float,
                   whiten: bool = True) -> tuple[Tensor, Tensor, dict[str, float]]:
    """GAE advantages (optionally whitened) and returns (unwhitened: the critic's targets).

    Args: rewards [N, T] (`token_rewards`), values [N, T] V(s_t) from the critic before the update, mask [N, T].
    Returns: (advantages [N, T], returns [N, T], metrics: critic/returns/mean, critic/values/mean,
        critic/advantages/mean (before whitening), critic/vf_explained_var of these values against the returns).
    """
    m = mask.bool()
    adv, returns = gae_advantages(rewards, values, m, gamma, lam)
    metrics = {
        M.RETURNS_MEAN: _masked_mean(returns, m).item(),
        M.VALUES_MEAN: _masked_mean(values.detach(), m).item(),
        M.ADV_MEAN: _masked_mean(adv, m).item(),
        M.VF_EXPLAINED_VAR: explained_variance(values.detach(), returns, m),
    }
    if whiten:
        adv = masked_whiten(adv, m)
    return adv, returns, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over valid tokens: 1 = a perfect critic, 0 = no better than the
    mean, negative = worse. Returns 0.0 when the returns have no variance (nothing to explain).

    Args: values, returns [N, T]; mask [N, T] bool.
    """
    m = mask.bool()
    r, v = returns[m], values[m]
    if r.numel() < 2:
        return 0.0
    var_r = r.var()
    if var_r <= 0:
        return 0.0
    return (1.0 - (r - v).var() / var_r).item()


def value_loss(vpred: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float, mode: str,
               max_len_norm: int | None = None, denom: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss: 0.5 * max((vpred - R)^2, (clip(vpred, old - clip, old + clip) - R)^2), aggregated.

    Args:
        vpred: [N, T] the critic's current predictions (carries the gradient).
        old_values: [N, T] predictions of the critic that computed the advantages (constants).
        returns: [N, T] targets (GAE returns).
        mask: [N, T] bool valid tokens; clip > 0; mode/max_len_norm/denom as `grpo.aggregate`.
    Returns:
        (0-dim loss, metrics critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean).
    """
    m = mask.bool()
    old = old_values.detach()
    clipped = old + torch.clamp(vpred - old, -clip, clip)
    l1 = (vpred - returns.detach()) ** 2
    l2 = (clipped - returns.detach()) ** 2
    per_tok = 0.5 * torch.where(m, torch.maximum(l1, l2), torch.zeros_like(l1))
    loss = aggregate(per_tok, m, mode, max_len_norm, denom)
    with torch.no_grad():
        metrics = {
            M.VF_LOSS: loss.item(),
            # only where the clamp acts: inside the range `old + (vpred - old)` can differ from vpred by one
            # rounding, and counting that noise made the metric depend on the batch's padding (data parallelism)
            M.VF_CLIPFRAC: _masked_mean(((l2 > l1) & ((vpred - old).abs() > clip)).to(vpred.dtype), m).item(),
            M.VPRED_MEAN: _masked_mean(vpred, m).item(),
        }
    return loss, metrics


def mini_batches(n: int, k: int, seed: int | str) -> list[list[int]]:
    """Row indices of `k` disjoint mini-batches covering range(n), in an order shuffled by `seed` (an epoch's).

    Sizes differ by at most one; with k > n the extra mini-batches are dropped (never empty ones).
    """
    order = random.Random(seed).sample(range(n), n)
    k = max(1, min(k, n))
    base, extra = divmod(n, k)
    out, lo = [], 0
    for i in range(k):
        hi = lo + base + (i < extra)
        out.append(sorted(order[lo:hi]))
        lo = hi
    return out
