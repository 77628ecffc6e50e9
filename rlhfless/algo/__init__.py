"""GRPO and PPO math as pure tensor functions (no model code, no optimisers).

Importing a name from the package registers every variant (`registry`: advantage estimators grpo, rloo, gae;
policy losses clip, dual_clip). The names load on first use (PEP 562), so `rlhfless.algo.config`, which the run
config imports, costs no torch: `rlhfless config show` and the config's own checks of plain fields stay fast.
The variants' names (what a config may say) are declared in the torch-free `variants`, which the config checks
read; the registries hold the torch functions registered against them."""

from __future__ import annotations

import importlib

_WHERE = {
    "LOSS_AGG_MODES": "config", "GRPOConfig": "config",
    "gae_advantages": "gae",
    "GroupAdvantages": "grpo", "aggregate": "grpo", "apply_group_skip": "grpo", "clipped_surrogate": "grpo",
    "group_advantages": "grpo", "grpo_loss": "grpo", "kl_k3": "grpo", "loss_denominator": "grpo",
    "entropy_from_logits": "logprobs", "token_logprobs": "logprobs",
    "ADVANTAGE_ESTIMATORS": "registry", "POLICY_LOSSES": "registry", "advantage_estimator": "registry",
    "policy_loss": "registry", "ESTIMATOR_NAMES": "variants", "POLICY_LOSS_NAMES": "variants",
}
VARIANT_MODULES = ("rlhfless.algo.grpo", "rlhfless.algo.ppo")
"""The modules whose decorated functions fill the registries (imported before a registry is handed out)."""


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rlhfless.algo' has no attribute {name!r}")
    if _WHERE[name] == "registry":
        for m in VARIANT_MODULES:
            importlib.import_module(m)
    value = getattr(importlib.import_module(f"rlhfless.algo.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_WHERE)
