"""One PPO update of the policy and the critic from a scored rollout batch (math in `rlhfless.algo.ppo`).

    values (the critic, before any update) + rewards -> per-token rewards (KL penalty when algo.kl_in is reward)
    -> GAE advantages (whitened) and returns -> algo.ppo_epochs passes, each over algo.ppo_mini_batches shuffled
    slices of the sequences: one actor step (clipped surrogate) and one critic step (clipped value loss) each.

Deviations from verl: mini-batches are counted (`ppo_mini_batches`), not sized (verl's ppo_mini_batch_size); the
actor and the critic step on the same mini-batch in turn (verl updates the critic over the whole batch first,
then the actor: the two are independent given the advantages, so the order changes nothing but timing); every
pass reshuffles with a seed of (update, epoch). Old log-probs are the sampling policy's: recomputed under
no_grad when more than one optimiser step follows or the KL enters the reward; with one step and no KL reward
they are the update's own detached forward (bitwise the same, one forward cheaper), as in `rlhfless.learner`.
Metrics are means over the update's mini-batch steps (verl's reduction); `timing_s/update_critic` is the sum of the
critic's mini-batch steps (forward, backward, optimiser step), so the actor's share of `timing_s/update` is the rest
(what `rlhfless simulate --validate` sets beside the simulator's `perf.PPO_MODELS` structure).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from rlhfless import metrics as M
from rlhfless.algo.grpo import grpo_loss
from rlhfless.algo.ppo import mini_batches, ppo_advantages, token_rewards, value_loss
from rlhfless.critic import Critic, response_values
from rlhfless.learner import Learner
from rlhfless.rollout.forward import pad_responses, response_logprobs


def ppo_update(learner: Learner, critic: Critic, prompts: list[list[int]], responses: list[list[int]],
               rewards: torch.Tensor, values: torch.Tensor, ref_logp: torch.Tensor | None = None,
               seed: int = 0) -> dict[str, float]:
    """One PPO update. prompts: B token lists; responses: B*G (group-major); rewards: [B*G] outcome rewards;
    values: [B*G, T] the critic's values of the rollout (`Critic.values`); ref_logp: [B*G, T] when kl_coef > 0.

    Raises TrainingError on a non-finite loss or gradient (policy or critic), before that optimiser's step.
    """
    cfg, G = learner.algo, learner.algo.group_size
    rows_prompts = [prompts[r // G] for r in range(len(responses))]  # mini-batches cut across groups
    mask = pad_responses(responses)[1].bool()
    kl_reward = cfg.kl_coef if cfg.kl_in_reward else 0.0
    n_steps = cfg.ppo_epochs * min(cfg.ppo_mini_batches, len(responses))
    old = None
    if n_steps > 1 or kl_reward > 0:
        with torch.no_grad():
            old = response_logprobs(learner.model, rows_prompts, responses, 1).logp
    tok_r, metrics = token_rewards(rewards, mask, kl_reward, old, ref_logp)
    adv, returns, adv_metrics = ppo_advantages(tok_r, values, mask, cfg.gamma, cfg.lam, cfg.whiten_advantages)
    metrics.update(adv_metrics)
    lr = learner.lr_for_update()
    steps: dict[str, list[float]] = defaultdict(list)
    critic_s = 0.0
    for epoch in range(cfg.ppo_epochs):
        for rows in mini_batches(len(responses), cfg.ppo_mini_batches, seed=f"{seed}:{learner.updates}:{epoch}"):
            mb, secs = _mini_batch_step(learner, critic, rows, rows_prompts, responses, adv, returns, values, old,
                                        ref_logp, mask)
            critic_s += secs
            for k, v in mb.items():
                steps[k].append(v)
    metrics.update({k: sum(v) / len(v) for k, v in steps.items()})
    metrics[M.timing("update_critic")] = critic_s
    metrics[M.LR] = lr
    metrics.update(critic.metrics())
    learner.updates += 1
    critic.updates += 1
    return metrics


def _mini_batch_step(learner: Learner, critic: Critic, rows: list[int], rows_prompts, responses, adv, returns,
                     values, old, ref_logp, mask) -> tuple[dict[str, float], float]:
    """One actor step and one critic step on the sequences `rows` (each cut to its own longest response); returns
    the step's metrics and the critic step's wall seconds."""
    cfg = learner.algo
    sub_p, sub_r = [rows_prompts[r] for r in rows], [responses[r] for r in rows]
    learner.model.train()
    out = response_logprobs(learner.model, sub_p, sub_r, 1, with_entropy=True)
    T = out.logp.shape[1]
    m = mask[rows, :T]
    ref = ref_logp[rows, :T] if ref_logp is not None else None
    old_mb = out.logp.detach() if old is None else old[rows, :T]
    loss, metrics = grpo_loss(out.logp, old_mb, ref, adv[rows, :T], m, cfg, entropy=out.entropy)
    learner.step_loss(loss)
    metrics[M.GRAD_NORM] = learner.last_grad_norm
    t0 = time.perf_counter()
    critic.model.train()
    vpred = response_values(critic.model, sub_p, sub_r, 1)
    vloss, vm = value_loss(vpred, values[rows, :T], returns[rows, :T], m, cfg.value_clip, cfg.loss_agg,
                           cfg.max_seq_len_norm)
    vm[M.CRITIC_GRAD_NORM] = critic.step(vloss)
    return {**metrics, **vm}, time.perf_counter() - t0
