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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlhfless.core.errors import ConfigError


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable
    needs_critic: bool


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}
POLICY_LOSSES: dict[str, Callable] = {}


def register_advantage(name: str, needs_critic: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the advantage estimator `name` (a name is registered once)."""
    def wrap(fn: Callable) -> Callable:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADVANTAGE_ESTIMATORS[name] = Estimator(name, fn, needs_critic)
        return fn
    return wrap


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the policy loss `name` (a name is registered once)."""
    def wrap(fn: Callable) -> Callable:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = fn
        return fn
    return wrap


def advantage_estimator(name: str) -> Estimator:
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(f"algo.adv_estimator: unknown estimator {name!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name]


def policy_loss(name: str) -> Callable:
    if name not in POLICY_LOSSES:
        raise ConfigError(f"algo.policy_loss: unknown policy loss {name!r}; registered: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]
