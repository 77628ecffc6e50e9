"""The learner: one GRPO update of the policy from a scored rollout batch (model + optimiser, math in `algo`).

Deviation from a literal reading of "old log-probs recomputed": with `algo.inner_epochs == 1` the sampling
policy and the policy being updated are the same weights, so the old log-probs are the detached log-probs of the
update's own forward pass (bitwise identical to a separate no-grad pass, one forward cheaper). With more inner
epochs they are recomputed once, before the first update, under `torch.no_grad()`.
Groups whose G rewards are all equal carry no signal; they are dropped before the forward pass, not masked after.
"""

from __future__ import annotations

import math

import torch

from rlhfless import metrics as M
from rlhfless.algo import GRPOConfig, group_advantages, grpo_loss
from rlhfless.config import OptimConfig
from rlhfless.errors import TrainingError
from rlhfless.rollout.forward import response_logprobs


class Learner:
    """Owns the trainable policy and its AdamW state."""

    def __init__(self, model, optim: OptimConfig, algo: GRPOConfig, reuse_prefix: bool = True):
        self.model = model
        self.reuse_prefix = reuse_prefix
        self.algo = algo
        self.optim_cfg = optim
        self.opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
        self.updates = 0
        """Optimizer steps taken or skipped (a batch without reward variance still counts: warm-up is per step)."""
        self.last_grad_norm: float | None = None

    def _lr(self) -> float:
        w = self.optim_cfg.warmup_steps
        return self.optim_cfg.lr * min(1.0, (self.updates + 1) / w) if w else self.optim_cfg.lr

    def update(self, prompts: list[list[int]], responses: list[list[int]], rewards: torch.Tensor,
               ref_logp: torch.Tensor | None = None) -> dict[str, float]:
        """One GRPO update. prompts: B token lists; responses: B*G (group-major); rewards: [B*G].

        ref_logp: [B*G, T] reference log-probs (needed when algo.kl_coef > 0).
        Raises TrainingError on a non-finite loss or gradient, before the optimiser step.
        """
        G = self.algo.group_size
        adv, metrics = group_advantages(rewards, G, self.algo.scale_adv_by_std, self.algo.adv_eps)
        keep_groups = (~adv.zero_variance).nonzero().squeeze(-1).tolist()
        if self.algo.skip_zero_variance_groups:
            if not keep_groups:
                lr = self._lr()
                self.updates += 1
                return {**metrics, M.LR: lr}
        else:
            keep_groups = list(range(len(prompts)))
        rows = [g * G + s for g in keep_groups for s in range(G)]
        sub_prompts = [prompts[g] for g in keep_groups]
        sub_resp = [responses[r] for r in rows]
        sub_adv = adv.advantages[rows]
        sub_ref = ref_logp[rows] if ref_logp is not None else None
        old = None
        if self.algo.inner_epochs > 1:
            with torch.no_grad():
                old = response_logprobs(self.model, sub_prompts, sub_resp, G, reuse_prefix=self.reuse_prefix).logp
        for g in self.opt.param_groups:
            g["lr"] = self._lr()
        for _ in range(self.algo.inner_epochs):
            out = response_logprobs(self.model, sub_prompts, sub_resp, G, with_entropy=True,
                                    reuse_prefix=self.reuse_prefix)
            mask = out.mask.bool()
            ref = sub_ref[:, : out.logp.shape[1]] if sub_ref is not None else None
            loss, m = grpo_loss(out.logp, out.logp.detach() if old is None else old, ref, sub_adv, mask,
                                self.algo, entropy=out.entropy)
            self._step(loss)
            metrics.update(m)
        metrics[M.GRAD_NORM] = self.last_grad_norm
        metrics[M.LR] = self._lr()
        self.updates += 1
        return metrics

    def _step(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise TrainingError(f"non-finite loss ({loss.item()}) at update {self.updates}")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        if not math.isfinite(norm.item()):
            raise TrainingError(f"non-finite gradient norm at update {self.updates}")
        self.last_grad_norm = norm.item()
        self.opt.step()
