"""GRPO (and PPO-style clipped) policy-gradient math as pure tensor functions, each returning (result, metrics).

Advantages, the k3 KL, the clipped surrogate, loss aggregation and the GRPO loss; no model, optimiser or batching.
Shapes: N = B * G sequences, T = padded response length; `mask[N, T]` is True on trained response tokens. The
rule it keeps: given the full batch's normaliser `denom`, a shard's loss (and gradient) is exactly its share of
the full-batch one, so shards sum to the whole. Details: docs/internals.md#algogrpopy.

Deviations from the paper (it runs verl's GRPO/PPO and publishes no loss details):
1. Group std is unbiased (divisor G - 1, as verl), eps added to the std. 2. Equal-reward groups get advantage 0
   and are flagged `zero_variance` (DAPO-style drop, no resampling). 3. Default aggregation is token_mean (also
   GRPO's per-sequence mean and Dr.GRPO's). 4. The k3 KL is in the loss, unclamped (verl clamps to [-10, 10]).
5. Clipping may be asymmetric; dual-clip is a registered loss. 6. Per-sequence modes skip rows with no token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhfless.algo.config import LOSS_AGG_MODES, GRPOConfig
from rlhfless.algo.registry import policy_loss, register_advantage, register_policy_loss
from rlhfless.core import metrics as M


@dataclass(frozen=True)
class GroupAdvantages:
    """Result of `group_advantages`."""

    advantages: Tensor
    """[B * G] float: group-normalised advantage of each response (0 in zero-variance groups)."""
    zero_variance: Tensor
    """[B] bool: True where all G rewards of the group are equal (no learning signal)."""
    group_size: int
    """G, the responses per prompt."""

    @property
    def keep(self) -> Tensor:
        """[B * G] bool: True for responses whose group has a learning signal."""
        return (~self.zero_variance).repeat_interleave(self.group_size)


def group_advantages(
    rewards: Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> tuple[GroupAdvantages, dict[str, float]]:
    """GRPO outcome advantages: reward minus its group mean, optionally over (group std + eps).

    Args:
        rewards: [B * G] (groups contiguous: rows g*G .. g*G+G-1 share a prompt) or [B, G] scalar rewards.
        group_size: G >= 2.
        scale_by_std: divide by the unbiased group std (divisor G - 1) plus eps; False keeps raw centring.
        eps: > 0, added to the std.
    Returns:
        (GroupAdvantages with advantages [B * G] and zero_variance [B], metrics with actor/groups_skipped_frac
        (fraction of zero-variance groups) and actor/advantages/abs_mean).
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 (got {group_size})")
    if rewards.dim() == 2 and rewards.shape[1] != group_size:
        raise ValueError(f"rewards {tuple(rewards.shape)} is [B, G] but group_size is {group_size}")
    if rewards.dim() not in (1, 2) or rewards.numel() % group_size:
        raise ValueError(f"rewards {tuple(rewards.shape)} is not [B * G] or [B, G] with G = {group_size}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    r = rewards.reshape(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale_by_std:
        # unbiased std (divisor G - 1), as verl's GRPO advantage; eps added to the std, not under the root
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    # exact equality, not std < eps: a tiny but real reward difference is still a signal
    zero_var = r.amax(dim=1) == r.amin(dim=1)
    adv = torch.where(zero_var.unsqueeze(1), torch.zeros_like(centred), centred).reshape(-1)
    metrics = {
        M.GROUPS_SKIPPED: zero_var.float().mean().item(),
        M.ADV_ABS_MEAN: adv.abs().mean().item(),
    }
    return GroupAdvantages(adv, zero_var, group_size), metrics


@register_advantage("grpo")
def grpo_advantages(rewards: Tensor, group_size: int, cfg: GRPOConfig) -> tuple[GroupAdvantages, dict[str, float]]:
    """The registered `grpo` estimator: `group_advantages` with the config's std scaling and eps (Dr.GRPO's
    unscaled variant is `algo.scale_adv_by_std=false`)."""
    return group_advantages(rewards, group_size, cfg.scale_adv_by_std, cfg.adv_eps)


@register_advantage("rloo")
def rloo_advantages(rewards: Tensor, group_size: int, cfg: GRPOConfig) -> tuple[GroupAdvantages, dict[str, float]]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024; verl's `rloo`): each response's reward minus the mean of
    the other G - 1 rewards of its group, r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - mean).

    Args: rewards [B * G] or [B, G], group_size G >= 2; cfg unused (no std scaling: the baseline is unbiased).
    Returns: as `group_advantages` (zero-variance groups get exactly 0 and are flagged).
    """
    groups, metrics = group_advantages(rewards, group_size, scale_by_std=False)
    adv = groups.advantages * (group_size / (group_size - 1))
    metrics[M.ADV_ABS_MEAN] = adv.abs().mean().item()
    return GroupAdvantages(adv, groups.zero_variance, group_size), metrics


def apply_group_skip(mask: Tensor, groups: GroupAdvantages, cfg: GRPOConfig) -> Tensor:
    """Training mask with zero-variance groups removed when `cfg.skip_zero_variance_groups` is set.

    Args:
        mask: [B * G, T] bool response mask.
        groups: the `group_advantages` result for the same rows.
    Returns:
        [B * G, T] bool; unchanged when skipping is off.
    """
    if not cfg.skip_zero_variance_groups:
        return mask
    return mask & groups.keep.to(mask.device).unsqueeze(1)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1.

    Args:
        logp: [N, T] log pi of the sampled tokens (samples drawn from pi).
        ref_logp: [N, T] log ref of the same tokens.
    Returns:
        [N, T] non-negative estimates, 0 exactly where logp == ref_logp; unbiased for KL(pi || ref).
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0  # unclamped (verl clamps to [-10, 10]) so it can be tested exactly


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """PPO/GRPO clipped objective per token, negated for minimisation.

    loss = max(-A * r, -A * clip(r, 1 - clip_eps_low, 1 + clip_eps_high)),  r = exp(logp - old_logp).

    Args:
        logp: [N, T] current-policy log-probs (carries the gradient).
        old_logp: [N, T] log-probs of the policy that sampled the tokens (treated as constants).
        advantages: [N] per-sequence (GRPO) or [N, T] per-token (PPO/GAE) advantages.
        mask: [N, T] bool, True on trained tokens.
        clip_eps_low, clip_eps_high: clip range offsets, > 0.
    Returns:
        ([N, T] per-token loss, 0 where mask is False; metrics actor/clip_frac (fraction of valid tokens where
        the clipped branch is strictly larger, i.e. has no gradient), actor/ppo_kl (mean old_logp - logp),
        actor/ratio/{mean,min,max} over valid tokens).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    # zero the log-ratio on padding so exp() cannot overflow there and poison the gradient with 0 * inf
    log_ratio = torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss = torch.where(mask, torch.maximum(unclipped, clipped), torch.zeros_like(unclipped))
    with torch.no_grad():
        valid = ratio[mask]
        metrics = {
            M.CLIP_FRAC: _masked_mean((clipped > unclipped).to(logp.dtype), mask).item(),
            M.PPO_KL: _masked_mean(-log_ratio, mask).item(),
            M.RATIO_MEAN: valid.mean().item() if valid.numel() else 1.0,
            M.RATIO_MIN: valid.min().item() if valid.numel() else 1.0,
            M.RATIO_MAX: valid.max().item() if valid.numel() else 1.0,
        }
    return loss, metrics


@register_policy_loss("clip")
def clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
              cfg: GRPOConfig) -> tuple[Tensor, dict[str, float]]:
    """The registered `clip` loss: `clipped_surrogate` with the config's clip range."""
    return clipped_surrogate(logp, old_logp, advantages, mask, cfg.clip_eps_low, cfg.clip_eps_high)


@register_policy_loss("dual_clip")
def dual_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: GRPOConfig) -> tuple[Tensor, dict[str, float]]:
    """Dual-clip PPO (Ye et al. 2020, as in verl's vanilla loss): the clipped surrogate, and for tokens with
    A < 0 the loss capped at -A * clip_ratio_c, so a very large ratio on a bad token cannot dominate the batch.

    loss = clip(...) if A >= 0 else min(clip(...), -A * c). Shapes as `clipped_surrogate`; metrics add
    actor/pg_clipfrac_lower (fraction of valid tokens where the cap is active).
    """
    loss, metrics = clipped_surrogate(logp, old_logp, advantages, mask, cfg.clip_eps_low, cfg.clip_eps_high)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    adv = adv.expand_as(loss)
    cap = -adv * cfg.clip_ratio_c
    capped = torch.where((adv < 0) & mask, torch.minimum(loss, cap), loss)
    with torch.no_grad():
        metrics[M.CLIP_FRAC_LOWER] = _masked_mean(((adv < 0) & (cap < loss)).to(logp.dtype), mask).item()
    return capped, metrics


def loss_denominator(mask: Tensor, mode: str) -> float:
    """The normaliser `aggregate` divides by for `mask` [N, T] (bool): valid tokens (token_mean) or sequences
    with at least one valid token (per-sequence modes), at least 1. Pass the FULL batch's value as `denom`."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; allowed: {list(LOSS_AGG_MODES)}")
    m = mask.bool()
    n = m.sum() if mode == "token_mean" else m.any(dim=1).sum()
    return float(max(int(n.item()), 1))


def aggregate(loss_tok: Tensor, mask: Tensor, mode: str, max_len_norm: int | None = None,
              denom: float | None = None) -> Tensor:
    """Reduce per-token losses to one scalar.

    Args:
        loss_tok: [N, T] per-token loss.
        mask: [N, T] bool, True on tokens that count.
        mode: "token_mean": sum over valid tokens / number of valid tokens (verl/DAPO);
            "seq_mean_token_mean": mean over each sequence's valid tokens, then mean over sequences (GRPO);
            "seq_mean_token_sum_norm": each sequence's sum / max_len_norm, then mean over sequences (Dr.GRPO).
            Sequence means run over sequences with at least one valid token.
        max_len_norm: the constant divisor of the Dr.GRPO mode (tokens, >= 1); required there only.
        denom: global normaliser replacing this batch's own token / sequence count (> 0): with the full batch's
            `loss_denominator`, the result is this shard's share of the full-batch loss (data parallelism).
    Returns:
        0-dim tensor; 0 when no token is valid.
    """
    if denom is not None and not denom > 0:
        raise ValueError(f"denom must be > 0 (got {denom})")
    m = mask.to(loss_tok.dtype)
    masked = loss_tok * m
    if mode == "token_mean":
        return masked.sum() / (m.sum().clamp(min=1.0) if denom is None else denom)
    tokens_per_seq = m.sum(dim=1)
    # a row with no valid token is not counted, so masking a row out equals dropping it from the batch
    n_seq = (tokens_per_seq > 0).to(loss_tok.dtype).sum().clamp(min=1.0) if denom is None else denom
    if mode == "seq_mean_token_mean":
        return (masked.sum(dim=1) / tokens_per_seq.clamp(min=1.0)).sum() / n_seq
    if mode == "seq_mean_token_sum_norm":
        if max_len_norm is None or max_len_norm < 1:
            raise ValueError(f"mode {mode!r} needs max_len_norm >= 1 (got {max_len_norm})")
        return (masked.sum(dim=1) / float(max_len_norm)).sum() / n_seq
    raise ValueError(f"unknown aggregation mode {mode!r}; allowed: {list(LOSS_AGG_MODES)}")


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig,
    entropy: Tensor | None = None,
    denom: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO loss: the registered policy loss `cfg.policy_loss` (the clipped surrogate by default) + kl_loss_coef *
    k3 KL(pi || ref), aggregated by `cfg.loss_agg` (also PPO's actor loss, with per-token advantages).

    Args:
        logp, old_logp: [N, T] current and sampling-policy log-probs of the response tokens.
        ref_logp: [N, T] reference-model log-probs, or None (allowed only when cfg.kl_coef == 0).
        advantages: [N] (or [N, T]) advantages, e.g. `group_advantages(...)[0].advantages`.
        mask: [N, T] bool trained tokens (see `apply_group_skip`).
        entropy: optional [N, T] entropies, only logged (actor/entropy, token mean).
        denom: global loss normaliser (see `aggregate`); it scales actor/loss and actor/pg_loss too, while the
            token-mean metrics (clip_frac, ppo_kl, ratio/*, kl, entropy) stay means over this shard's tokens.
    Returns:
        (0-dim loss, metrics: actor/loss, actor/pg_loss, actor/clip_frac, actor/ppo_kl, actor/ratio/*, and
        actor/kl (token mean of k3) when ref_logp is given, actor/entropy when entropy is given).
    """
    if cfg.kl_loss_coef > 0 and ref_logp is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} > 0 needs ref_logp")
    pg_tok, metrics = policy_loss(cfg.policy_loss)(logp, old_logp, advantages, mask, cfg)
    loss_tok = pg_tok
    if ref_logp is not None:
        zero = torch.zeros_like(logp)
        kl_tok = kl_k3(torch.where(mask, logp, zero), torch.where(mask, ref_logp, zero))
        metrics[M.KL] = _masked_mean(kl_tok.detach(), mask).item()
        if cfg.kl_loss_coef > 0:  # 0 when the KL went into PPO's reward instead (cfg.kl_in)
            loss_tok = pg_tok + cfg.kl_loss_coef * kl_tok
    loss = aggregate(loss_tok, mask, cfg.loss_agg, cfg.max_seq_len_norm, denom)
    metrics[M.LOSS] = loss.item()
    metrics[M.PG_LOSS] = aggregate(pg_tok.detach(), mask, cfg.loss_agg, cfg.max_seq_len_norm, denom).item()
    if entropy is not None:
        metrics[M.ENTROPY] = _masked_mean(entropy.detach(), mask).item()
    return loss, metrics
