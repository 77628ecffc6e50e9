"""The algorithm variants a config may name, with what each does: the one list of names, torch-free.

`algo.adv_estimator` and `algo.policy_loss` name a variant; the run config checks the name here, and `rlhfless
config show` and the reference page list these names, without importing torch (issue 42: the torch modules that
implement them cost 1.7-2.3 s of CPU). The implementations register against this list (`registry`): a function
can only be registered under a declared name, and an estimator's `needs_critic` is the declaration's, so the
names a config accepts and the functions a run calls cannot drift apart (`tests/test_algo_registry.py` checks
that they are the same set). Adding a variant: declare it here (or with `declare_*` from outside the package),
then decorate its function in a torch module listed in `rlhfless.algo.VARIANT_MODULES`.
Non-goals: the functions themselves (`grpo`, `ppo`), their signatures (`registry`'s docstring).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """A declared variant: what it does (one line) and, for an advantage estimator, whether it needs a critic."""

    doc: str
    needs_critic: bool = False


ESTIMATOR_NAMES: dict[str, Variant] = {
    "grpo": Variant("group-normalised outcome rewards (GRPO; Dr.GRPO's unscaled form with "
                    "algo.scale_adv_by_std=false)"),
    "rloo": Variant("REINFORCE leave-one-out: each reward minus the mean of its group's other rewards"),
    "gae": Variant("PPO's generalised advantage estimation from the critic's values", needs_critic=True),
}
"""Advantage estimator name -> declaration (`algo.adv_estimator`)."""

POLICY_LOSS_NAMES: dict[str, Variant] = {
    "clip": Variant("PPO's clipped surrogate, ratio clipped to [1 - clip_eps_low, 1 + clip_eps_high]"),
    "dual_clip": Variant("the clipped surrogate, and a negative-advantage token's loss capped at "
                         "clip_ratio_c * |A| (verl's vanilla loss)"),
}
"""Policy loss name -> declaration (`algo.policy_loss`)."""


def declare_estimator(name: str, doc: str, needs_critic: bool = False) -> None:
    """Declare an advantage estimator defined outside this package (before registering its function)."""
    _declare(ESTIMATOR_NAMES, "advantage estimator", name, Variant(doc, needs_critic))


def declare_policy_loss(name: str, doc: str) -> None:
    """Declare a policy loss defined outside this package (before registering its function)."""
    _declare(POLICY_LOSS_NAMES, "policy loss", name, Variant(doc))


def _declare(table: dict[str, Variant], kind: str, name: str, variant: Variant) -> None:
    if name in table:
        raise ValueError(f"{kind} {name!r} is declared twice")
    table[name] = variant
