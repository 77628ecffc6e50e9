"""Algorithm variants by name: an advantage estimator or a policy loss is one decorated function.

As verl's `core_algos` registers them, a variant is added by writing one function and decorating it; a config names
it (`algo.adv_estimator`, `algo.policy_loss`), and every mode (inline, serverless, serverful) calls the same
function, so a new variant keeps the modes bitwise equal. Two kinds of estimator:
- outcome estimators (no critic): `fn(rewards [B*G], group_size, cfg) -> (GroupAdvantages, metrics)`. Each must be
  group-local (a group's advantages depend on its own G rewards only): the runtime's learner computes them group by
  group as groups finish, which is what keeps the streamed update equal to the batched one;
- critic estimators (`needs_critic=True`, PPO): `fn(token_rewards [N, T], values [N, T], mask [N, T], cfg)
  -> (advantages [N, T], returns [N, T], metrics)`.
A policy loss is `fn(logp [N, T], old_logp [N, T], advantages [N] or [N, T], mask [N, T], cfg)
-> (per-token loss [N, T], 0 off the mask; metrics)`; `grpo_loss` adds the KL term and aggregates it.
A name is registered only when `variants` declares it (the torch-free list the config checks and `config show`
reads); an estimator's `needs_critic` comes from that declaration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlhfless.algo.variants import ESTIMATOR_NAMES, POLICY_LOSS_NAMES
from rlhfless.core.errors import ConfigError


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable
    needs_critic: bool


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}
POLICY_LOSSES: dict[str, Callable] = {}


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the advantage estimator `name`, declared in `variants.ESTIMATOR_NAMES`
    (a name is registered once)."""
    def wrap(fn: Callable) -> Callable:
        _check_new(name, ESTIMATOR_NAMES, ADVANTAGE_ESTIMATORS, "advantage estimator", "ESTIMATOR_NAMES")
        ADVANTAGE_ESTIMATORS[name] = Estimator(name, fn, ESTIMATOR_NAMES[name].needs_critic)
        return fn
    return wrap


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the policy loss `name`, declared in `variants.POLICY_LOSS_NAMES` (a name is
    registered once)."""
    def wrap(fn: Callable) -> Callable:
        _check_new(name, POLICY_LOSS_NAMES, POLICY_LOSSES, "policy loss", "POLICY_LOSS_NAMES")
        POLICY_LOSSES[name] = fn
        return fn
    return wrap


def _check_new(name: str, declared: dict, registered: dict, kind: str, table: str) -> None:
    if name not in declared:
        raise ValueError(f"{kind} {name!r} is not declared: add it to rlhfless.algo.variants.{table} first")
    if name in registered:
        raise ValueError(f"{kind} {name!r} is registered twice")


def advantage_estimator(name: str) -> Estimator:
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"algo.adv_estimator: unknown estimator {name!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name]


def policy_loss(name: str) -> Callable:
    if name not in POLICY_LOSSES:
        raise ConfigError(f"algo.policy_loss: unknown policy loss {name!r}; registered: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]
