"""Typed config of the GRPO/PPO policy-gradient math (`algo.*` in YAML).

Purpose: one source of truth for the loss knobs consumed by `rlhfless.algo.grpo`.
Non-goals: optimiser settings (learning rate, grad clipping) and batch sizes belong to the learner's config.
Deviations from the paper: the paper runs standard GRPO/PPO from verl and does not publish its loss settings;
the defaults here are verl's GRPO defaults where verl has one (clip 0.2/0.2, std-scaled advantages,
token-level mean) and 0.0 for the KL coefficient (a reference model is optional; DAPO/Dr.GRPO drop it).
PPO (`name: ppo`) takes verl's PPO defaults: gamma 1.0, lam 1.0, value clip 0.5, whitened advantages; its KL to
the reference goes into the reward by default (`kl_in: auto`), as verl's `use_kl_in_reward` and InstructGPT do,
and into the loss for GRPO (verl's `use_kl_loss`). G defaults to 8 for GRPO and 1 for PPO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rlhfless.core.errors import require

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAgg)
ALGOS = ("grpo", "ppo")
DEFAULT_GROUP_SIZE = {"grpo": 8, "ppo": 1}


@dataclass
class GRPOConfig:
    """Loss and advantage settings of one GRPO or PPO update."""

    name: Literal["grpo", "ppo"] = "grpo"
    """grpo: group-normalised outcome advantages, no critic; ppo: a learned critic, GAE, clipped value loss."""
    group_size: int | None = None
    """G: responses sampled per prompt; None = 8 for grpo, 1 for ppo. GRPO normalises within each group of G
    (>= 2); PPO takes any G >= 1 (its advantages come from the critic, not the group)."""
    adv_estimator: str = "auto"
    """Advantage estimator by its declared name (`rlhfless.algo.variants`): grpo (group-normalised outcome
    rewards), rloo (leave-one-out baseline), gae (PPO's, from the critic); auto = grpo for name grpo, gae for ppo.
    An estimator without a critic needs name grpo; gae needs name ppo."""
    policy_loss: str = "clip"
    """Policy loss by its registered name: clip (PPO's clipped surrogate, clip_eps_low/high) or dual_clip (also
    bounds the loss of negative-advantage tokens at clip_ratio_c * |A|, as verl's vanilla loss does)."""
    clip_ratio_c: float = 3.0
    """dual_clip only: the lower bound on the ratio's effect for A < 0 (> 1; verl's default 3.0)."""
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
    """Drop groups whose G rewards are all equal: their advantages are 0, so they only dilute the mean (GRPO)."""
    kl_in: Literal["auto", "reward", "loss"] = "auto"
    """Where kl_coef applies: reward = a per-token penalty kl_coef * (logp - ref_logp) on the reward (verl's
    use_kl_in_reward, needs ppo); loss = the k3 term in the loss (verl's use_kl_loss); auto = reward for ppo,
    loss for grpo."""
    gamma: float = 1.0
    """PPO: GAE discount in [0, 1] (verl's default 1.0: the outcome reward reaches every token undiscounted)."""
    lam: float = 1.0
    """PPO: GAE lambda in [0, 1] (verl's default 1.0: Monte-Carlo returns, the critic only as a baseline)."""
    value_clip: float = 0.5
    """PPO: the new value prediction is clipped to old value +- value_clip in the value loss (> 0; verl's
    cliprange_value 0.5)."""
    whiten_advantages: bool = True
    """PPO: shift and scale GAE advantages to mean 0, std 1 over the batch's valid tokens (verl always does)."""
    ppo_epochs: int = 1
    """PPO: passes over the rollout batch (>= 1); each pass runs `ppo_mini_batches` optimiser steps."""
    ppo_mini_batches: int = 1
    """PPO: optimiser steps per pass, over disjoint shuffled slices of the batch's sequences (>= 1)."""

    @property
    def estimator(self) -> str:
        """The advantage estimator's registered name (`adv_estimator` with auto resolved)."""
        if self.adv_estimator != "auto":
            return self.adv_estimator
        return "gae" if self.name == "ppo" else "grpo"

    def __post_init__(self) -> None:
        require(self.name in ALGOS, "algo.name", f"must be one of {list(ALGOS)} (got {self.name!r})")
        require(self.clip_ratio_c > 1, "algo.clip_ratio_c", f"must be > 1 (got {self.clip_ratio_c})")
        if self.group_size is None:
            self.group_size = DEFAULT_GROUP_SIZE[self.name]
        low = 2 if self.name == "grpo" else 1
        require(self.group_size >= low, "algo.group_size", "must be >= 2 with algo.name=grpo (advantages need a "
                f"group's spread), >= 1 with ppo (got {self.group_size} with algo.name={self.name})")
        require(self.kl_in in ("auto", "reward", "loss"), "algo.kl_in",
                f"must be auto, reward or loss (got {self.kl_in!r})")
        require(self.name == "ppo" or self.kl_in != "reward", "algo.kl_in",
                "reward puts the KL into PPO's per-token reward; GRPO's outcome reward has no tokens: use loss")
        for key in ("gamma", "lam"):
            v = getattr(self, key)
            require(0 <= v <= 1, f"algo.{key}", f"must be in [0, 1] (got {v})")
        require(self.value_clip > 0, "algo.value_clip", f"must be > 0 (got {self.value_clip})")
        require(self.ppo_epochs >= 1, "algo.ppo_epochs", f"must be >= 1 (got {self.ppo_epochs})")
        require(self.ppo_mini_batches >= 1, "algo.ppo_mini_batches", f"must be >= 1 (got {self.ppo_mini_batches})")
        require(self.name == "grpo" or self.inner_epochs == 1, "algo.inner_epochs",
                f"is GRPO's; PPO's passes are algo.ppo_epochs (got inner_epochs={self.inner_epochs})")
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

    @property
    def kl_in_reward(self) -> bool:
        """True when kl_coef applies as a per-token reward penalty (PPO's default), False when in the loss."""
        return self.kl_in == "reward" or (self.kl_in == "auto" and self.name == "ppo")

    @property
    def kl_loss_coef(self) -> float:
        """The coefficient of the k3 KL term in the loss (0 when the KL goes into the reward)."""
        return 0.0 if self.kl_in_reward else self.kl_coef
