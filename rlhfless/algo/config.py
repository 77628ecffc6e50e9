"""Typed config of the GRPO/PPO policy-gradient math (`algo.*` in YAML).

Purpose: one source of truth for the loss knobs consumed by `rlhfless.algo.grpo`.
Non-goals: optimiser settings (learning rate, grad clipping) and batch sizes belong to the learner's config.
Deviations from the paper: the paper runs standard GRPO/PPO from verl and does not publish its loss settings;
the defaults here are verl's GRPO defaults where verl has one (clip 0.2/0.2, std-scaled advantages,
token-level mean) and 0.0 for the KL coefficient (a reference model is optional; DAPO/Dr.GRPO drop it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rlhfless.errors import require

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAgg)


@dataclass
class GRPOConfig:
    """Loss and advantage settings of one GRPO (or PPO-style clipped) update."""

    group_size: int = 8
    """G: responses sampled per prompt; advantages are normalised within each group of G (>= 2)."""
    scale_adv_by_std: bool = True
    """Divide group-centred rewards by the group std (original GRPO); False is Dr.GRPO's unscaled variant."""
    adv_eps: float = 1e-6
    """Added to the group std before dividing, so near-constant groups do not explode (> 0)."""
    clip_eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at 1 - clip_eps_low (in (0, 1))."""
    clip_eps_high: float = 0.2
    """Upper clip range: the ratio is clipped at 1 + clip_eps_high (> 0; DAPO's clip-higher uses 0.28)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL(pi || ref) penalty added to the per-token loss (>= 0; 0 needs no reference model)."""
    loss_agg: LossAgg = "token_mean"
    """How per-token losses become one scalar: token_mean (DAPO/verl), seq_mean_token_mean (original GRPO),
    seq_mean_token_sum_norm (Dr.GRPO: per-sequence sum divided by the constant max_seq_len_norm)."""
    inner_epochs: int = 1
    """Optimiser passes over one rollout batch (>= 1); with 1 the ratio is exactly 1 and clipping is inert."""
    max_seq_len_norm: int | None = None
    """Constant divisor of the Dr.GRPO mode, normally the generation max length (required by that mode)."""
    skip_zero_variance_groups: bool = True
    """Drop groups whose G rewards are all equal: their advantages are 0, so they only dilute the mean."""

    def __post_init__(self) -> None:
        require(self.group_size >= 2, "algo.group_size", f"must be >= 2 (got {self.group_size})")
        require(self.adv_eps > 0, "algo.adv_eps", f"must be > 0 (got {self.adv_eps})")
        require(0 < self.clip_eps_low < 1, "algo.clip_eps_low", f"must be in (0, 1) (got {self.clip_eps_low})")
        require(self.clip_eps_high > 0, "algo.clip_eps_high", f"must be > 0 (got {self.clip_eps_high})")
        require(self.kl_coef >= 0, "algo.kl_coef", f"must be >= 0 (got {self.kl_coef})")
        require(
            self.loss_agg in LOSS_AGG_MODES,
            "algo.loss_agg",
            f"must be one of {list(LOSS_AGG_MODES)} (got {self.loss_agg!r})",
        )
        require(self.inner_epochs >= 1, "algo.inner_epochs", f"must be >= 1 (got {self.inner_epochs})")
        if self.max_seq_len_norm is not None:
            require(
                self.max_seq_len_norm >= 1,
                "algo.max_seq_len_norm",
                f"must be a positive token count (got {self.max_seq_len_norm})",
            )
        require(
            self.loss_agg != "seq_mean_token_sum_norm" or self.max_seq_len_norm is not None,
            "algo.max_seq_len_norm",
            "must be set (the generation max length) when algo.loss_agg is 'seq_mean_token_sum_norm'",
        )
