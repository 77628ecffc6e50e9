"""One PPO update of the policy and the critic from a scored rollout batch (math in `rlhfless.algo.ppo`).

`ppo_targets` (critic values, per-token rewards, whitened GAE advantages and returns), then `algo.ppo_epochs`
passes over `algo.ppo_mini_batches` shuffled slices, one actor step (`actor_steps`) and one critic step
(`critic_steps`) per slice. The rule it keeps: given the targets the two updates are independent, so the inline
loop runs them in turn (`ppo_update`) and the runtime side by side (`runtime.ppo_stages`), bit for bit the same
at the same thread count. Old log-probs and the timing metrics: docs/internals.md#learnppo_updatepy.

Data parallelism (`shard=`, as GRPO's `Learner.update`): every rank computes the targets on the full batch (cheap
and deterministic: no communication) and walks the same schedule; each optimiser step's global mini-batch is split
across the ranks (`rank_rows`: contiguous, balanced by tokens), every rank's loss uses the mini-batch's normaliser,
and gradients plus metric rows are summed in one all-reduce before clipping, for the actor and for the critic
alike. So N ranks take the same ppo_epochs x ppo_mini_batches steps as one, on the same global mini-batches, and
end with the one-rank weights up to float rounding (other summation order), every replica bitwise equal.

Deviations from verl: 1. Mini-batches are counted (`ppo_mini_batches`), not sized. 2. Every pass reshuffles with
a seed of (update, epoch). 3. The actor is updated before the critic (verl: critic first; only timing differs).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from rlhfless.core import metrics as M
from rlhfless.algo.grpo import grpo_loss
from rlhfless.algo.ppo import mini_batches, token_rewards, value_loss
from rlhfless.algo.registry import advantage_estimator
from rlhfless.algo.config import GRPOConfig
from rlhfless.learn.critic import Critic, response_values
from rlhfless.learn.dataparallel import POLICY_ROW, RowLayout, Shard, split_groups
from rlhfless.learn.learner import Learner, batch_denominator
from rlhfless.rollout.forward import pad_responses, response_logprobs


@dataclass
class PpoTargets:
    """What both updates train towards, fixed before either steps. N = B*G rows (group-major), T = the padded
    response length."""

    rows_prompts: list[list[int]]
    """[N] each row's prompt (mini-batches cut across groups)."""
    mask: torch.Tensor
    """[N, T] bool response tokens."""
    old: torch.Tensor | None
    """[N, T] the sampling policy's log-probs, when recomputed (several optimiser steps or the KL in the reward)."""
    advantages: torch.Tensor
    """[N, T] GAE advantages (whitened with algo.whiten_advantages)."""
    returns: torch.Tensor
    """[N, T] the critic's regression targets."""
    metrics: dict[str, float]


def ppo_targets(learner: Learner, prompts: list[list[int]], responses: list[list[int]], rewards: torch.Tensor,
                values: torch.Tensor, ref_logp: torch.Tensor | None = None,
                old: torch.Tensor | None = None) -> PpoTargets:
    """Advantages and returns of a batch. prompts: B token lists; responses: B*G (group-major); rewards: [B*G]
    outcome rewards; values: [B*G, T] the critic's values of the rollout (`Critic.values`); ref_logp: [B*G, T]
    when kl_coef > 0; old: `old_logprobs` computed ahead (the runtime's actor does it during the value forward),
    else computed here when needed. Uses the policy only for the old log-probs, before any step."""
    cfg = learner.algo
    rows_prompts = row_prompts(prompts, len(responses), cfg.group_size)
    mask = pad_responses(responses)[1].bool()
    kl_reward = cfg.kl_coef if cfg.kl_in_reward else 0.0
    if old is None and needs_old_logprobs(cfg, len(responses)):
        old = old_logprobs(learner, prompts, responses)
    tok_r, metrics = token_rewards(rewards, mask, kl_reward, old, ref_logp)
    adv, returns, adv_metrics = advantage_estimator(cfg.estimator).fn(tok_r, values, mask, cfg)
    metrics.update(adv_metrics)
    return PpoTargets(rows_prompts, mask, old, adv, returns, metrics)


def needs_old_logprobs(cfg: GRPOConfig, n_rows: int) -> bool:
    """Whether the sampling policy's log-probs must be recomputed: several optimiser steps (the ratio moves away
    from 1 after the first) or the KL in the reward."""
    return cfg.ppo_epochs * min(cfg.ppo_mini_batches, n_rows) > 1 or (cfg.kl_in_reward and cfg.kl_coef > 0)


@torch.no_grad()
def old_logprobs(learner: Learner, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    """[B*G, T] the sampling policy's log-probs of every response token (rows in full, no prefix reuse), in eval
    mode as the rollout sampled them, whatever mode the model was left in (a worker's, or the inline loop's)."""
    learner.model.eval()
    rows = row_prompts(prompts, len(responses), learner.algo.group_size)
    return response_logprobs(learner.model, rows, responses, 1).logp


@torch.no_grad()
def shard_old_logprobs(learner: Learner, prompts: list[list[int]], responses: list[list[int]],
                       shard: Shard) -> torch.Tensor:
    """[B*G, T] `old_logprobs` with the forward split across a data-parallel group: each rank runs its contiguous
    rows (`split_groups`, balanced by response tokens + 1) and one all-reduce of the zero-filled [B*G, T] tensor
    gathers them (adding zeros is exact, so every rank holds the same tensor). Equal to the one-rank forward up
    to float rounding (other batch shapes); bitwise the same in every mode at the same world size."""
    learner.model.eval()
    rows = row_prompts(prompts, len(responses), learner.algo.group_size)
    lo, hi = split_groups([len(r) + 1 for r in responses], shard.world)[shard.rank]
    full = torch.zeros(len(responses), max((len(r) for r in responses), default=0),
                       dtype=next(learner.model.parameters()).dtype)
    if hi > lo:
        mine = response_logprobs(learner.model, rows[lo:hi], responses[lo:hi], 1).logp
        full[lo:hi, :mine.shape[1]] = mine.to(full.dtype)
    shard.all_reduce(full)
    return full


def row_prompts(prompts: list[list[int]], n_rows: int, group_size: int) -> list[list[int]]:
    """[n_rows] each group-major row's prompt: PPO's mini-batches cut across groups, so rows go one by one."""
    return [prompts[r // group_size] for r in range(n_rows)]


def ppo_schedule(cfg: GRPOConfig, n_rows: int, seed: int, updates: int) -> list[list[int]]:
    """The update's mini-batches in order (row indices), epochs after one another; the actor and the critic step
    on the same ones. `updates`: updates done before this one (the policy's and the critic's counters agree)."""
    # a fresh shuffle every pass, seeded by (update, epoch): the same order inline and in the runtime
    return [rows for epoch in range(cfg.ppo_epochs)
            for rows in mini_batches(n_rows, cfg.ppo_mini_batches, seed=f"{seed}:{updates}:{epoch}")]


def _means(steps: dict[str, list[float]]) -> dict[str, float]:
    return {k: sum(v) / len(v) for k, v in steps.items()}


def rank_rows(rows: list[int], responses: list[list[int]], shard: Shard | None) -> list[int]:
    """This rank's rows of a global mini-batch: the shard's contiguous slice balanced by response tokens + 1 per
    row (`split_groups`, the same on every rank); all of them without a shard. May be empty."""
    if shard is None:
        return rows
    lo, hi = split_groups([len(responses[r]) + 1 for r in rows], shard.world)[shard.rank]
    return rows[lo:hi]


def actor_row(cfg: GRPOConfig) -> RowLayout:
    """The actor's metric row in a data-parallel step (`grpo_loss`'s, plus dual_clip's lower clip fraction)."""
    return POLICY_ROW.with_means(M.CLIP_FRAC_LOWER) if cfg.policy_loss == "dual_clip" else POLICY_ROW


def actor_steps(learner: Learner, t: PpoTargets, responses: list[list[int]], ref_logp: torch.Tensor | None,
                schedule: list[list[int]], shard: Shard | None = None) -> dict[str, float]:
    """The policy's optimiser steps, one per mini-batch (each cut to its own longest response); returns the actor's
    metrics (means over the steps) and counts the update. Raises TrainingError on a non-finite loss or gradient.

    shard: this rank of a data-parallel actor (every rank passes the same targets and schedule): each global
    mini-batch is split across the ranks (`rank_rows`), every rank's loss uses the mini-batch's normaliser, and the
    gradients are summed across ranks before clipping (`Learner.step_shard`), so every rank steps alike and the
    update equals the one-rank update up to float rounding (module header)."""
    cfg = learner.algo
    lr = learner.lr_for_update()
    steps: dict[str, list[float]] = defaultdict(list)
    for rows in schedule:
        mine = rank_rows(rows, responses, shard)
        loss, metrics, n_tok = None, {}, 0
        if mine:  # a rank with no rows of this mini-batch still joins the all-reduce, with zeros
            sub_p, sub_r = [t.rows_prompts[r] for r in mine], [responses[r] for r in mine]
            learner.model.train()
            out = response_logprobs(learner.model, sub_p, sub_r, 1, with_entropy=True)
            T = out.logp.shape[1]
            ref = ref_logp[mine, :T] if ref_logp is not None else None
            old = out.logp.detach() if t.old is None else t.old[mine, :T]
            denom = None if shard is None else batch_denominator([len(responses[r]) for r in rows], cfg.loss_agg)
            loss, metrics = grpo_loss(out.logp, old, ref, t.advantages[mine, :T], t.mask[mine, :T], cfg,
                                      entropy=out.entropy, denom=denom)
            n_tok = int(t.mask[mine, :T].sum().item())
        if shard is None:
            learner.step_loss(loss)
        else:
            metrics = learner.step_shard(loss, metrics, n_tok, shard, ref_logp is not None, actor_row(cfg))
        metrics[M.GRAD_NORM] = learner.last_grad_norm
        for k, v in metrics.items():
            steps[k].append(v)
    learner.updates += 1
    return {**_means(steps), M.LR: lr}


def critic_steps(critic: Critic, cfg: GRPOConfig, rows_prompts: list[list[int]], responses: list[list[int]],
                 values: torch.Tensor, returns: torch.Tensor, schedule: list[list[int]],
                 shard: Shard | None = None) -> dict[str, float]:
    """The critic's optimiser steps on the same mini-batches; returns its metrics (means over the steps, its
    learning rate, and `timing_s/update_critic`: the seconds of the steps) and counts the update. shard: a
    data-parallel critic rank, split and reduced as `actor_steps` (`Critic.step_shard`)."""
    mask = pad_responses(responses)[1].bool()
    steps: dict[str, list[float]] = defaultdict(list)
    lr = critic.metrics()
    t0 = time.perf_counter()
    for rows in schedule:
        mine = rank_rows(rows, responses, shard)
        vloss, vm, n_tok = None, {}, 0
        if mine:
            sub_p, sub_r = [rows_prompts[r] for r in mine], [responses[r] for r in mine]
            critic.model.train()
            vpred = response_values(critic.model, sub_p, sub_r, 1)
            T = vpred.shape[1]
            denom = None if shard is None else batch_denominator([len(responses[r]) for r in rows], cfg.loss_agg)
            vloss, vm = value_loss(vpred, values[mine, :T], returns[mine, :T], mask[mine, :T], cfg.value_clip,
                                   cfg.loss_agg, cfg.max_seq_len_norm, denom)
            n_tok = int(mask[mine, :T].sum().item())
        if shard is None:
            vm[M.CRITIC_GRAD_NORM] = critic.step(vloss)
        else:
            vm, norm = critic.step_shard(vloss, vm, n_tok, shard)
            vm[M.CRITIC_GRAD_NORM] = norm
        for k, v in vm.items():
            steps[k].append(v)
    critic.updates += 1
    return {**_means(steps), **lr, M.timing("update_critic"): time.perf_counter() - t0}


def ppo_update(learner: Learner, critic: Critic, prompts: list[list[int]], responses: list[list[int]],
               rewards: torch.Tensor, values: torch.Tensor, ref_logp: torch.Tensor | None = None,
               seed: int = 0, shard: Shard | None = None) -> dict[str, float]:
    """One PPO update in this process (the inline loop). Arguments as `ppo_targets`; seed: the run's seed;
    shard: this rank of a data-parallel actor and critic (`actor_steps`; every rank passes the same batch).

    Raises TrainingError on a non-finite loss or gradient (policy or critic), before that optimiser's step.
    """
    t = ppo_targets(learner, prompts, responses, rewards, values, ref_logp)
    schedule = ppo_schedule(learner.algo, len(responses), seed, learner.updates)
    metrics = dict(t.metrics)
    metrics.update(actor_steps(learner, t, responses, ref_logp, schedule, shard))
    metrics.update(critic_steps(critic, learner.algo, t.rows_prompts, responses, values, t.returns, schedule, shard))
    return metrics
