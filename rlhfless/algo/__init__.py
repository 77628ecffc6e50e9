"""GRPO and PPO math as pure tensor functions (no model code, no optimisers).

Importing the package registers every variant (`registry`: advantage estimators grpo, rloo, gae; policy losses
clip, dual_clip)."""

from rlhfless.algo.config import LOSS_AGG_MODES, GRPOConfig
from rlhfless.algo.gae import gae_advantages
from rlhfless.algo.grpo import (
    GroupAdvantages,
    aggregate,
    apply_group_skip,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    kl_k3,
    loss_denominator,
)
from rlhfless.algo.logprobs import entropy_from_logits, token_logprobs
from rlhfless.algo.ppo import gae_estimator  # noqa: F401  (registers gae)
from rlhfless.algo.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, advantage_estimator, policy_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "advantage_estimator",
    "policy_loss",
    "LOSS_AGG_MODES",
    "GRPOConfig",
    "GroupAdvantages",
    "aggregate",
    "apply_group_skip",
    "clipped_surrogate",
    "entropy_from_logits",
    "gae_advantages",
    "group_advantages",
    "grpo_loss",
    "kl_k3",
    "loss_denominator",
    "token_logprobs",
]
