"""One optimiser step accumulated micro-batch by micro-batch, in any arrival order, bitwise independent of it.

The runtime's learner trains each finished GRPO group while the rest of the step still decodes: each
micro-batch's gradient is taken of its UNNORMALISED loss (`denom=1`), and the sum is divided by the full batch's
normaliser once every group is in (`finish`), then all-reduced, clipped and stepped as `Learner.update(shard=)`.
The rule it keeps: micro-batches are fixed by group index and added in index order (an early one is buffered), so
streamed, all-at-once, serverless and serverful updates give bitwise equal weights. The memory this costs, and
`exact=False`: docs/internals.md#learnaccumulatepy.

Deviation from `Learner.update`: the normaliser divides the summed gradient after the backward, and the forward
runs per micro-batch, so results equal the batched update up to float rounding (the inline loop keeps the batched
one). Non-goals: several inner epochs (a second epoch needs the updated weights: refused by the runtime config).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlhfless.core import metrics as M
from rlhfless.algo import advantage_estimator, grpo_loss
from rlhfless.learn.dataparallel import Shard
from rlhfless.learn.learner import batch_denominator
from rlhfless.rollout.forward import response_logprobs

_MEANS = (M.CLIP_FRAC, M.PPO_KL, M.RATIO_MEAN, M.ENTROPY, M.KL)


@dataclass
class GroupBatch:
    """One finished group as the learner needs it (the rows of one prompt)."""

    g: int
    prompt: list[int]
    responses: list[list[int]]
    """G token lists."""
    rewards: torch.Tensor
    """[G] rewards."""
    ref_logp: torch.Tensor | None = None
    """[G, T] reference log-probs (T >= the longest response), when algo.kl_coef > 0."""


@dataclass
class _Stats:
    """Sums over a rank's micro-batches: loss terms before normalisation and token-weighted metric sums."""

    chunks: int = 0
    n_tok: int = 0
    loss: float = 0.0
    pg_loss: float = 0.0
    weighted: dict = field(default_factory=dict)
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")

    def add(self, m: dict[str, float], n_tok: int) -> None:
        self.chunks += 1
        self.n_tok += n_tok
        self.loss += m[M.LOSS]
        self.pg_loss += m[M.PG_LOSS]
        for key in _MEANS:
            if key in m:
                self.weighted[key] = self.weighted.get(key, 0.0) + m[key] * n_tok
        if n_tok:
            self.ratio_min = min(self.ratio_min, m[M.RATIO_MIN])
            self.ratio_max = max(self.ratio_max, m[M.RATIO_MAX])


class AccumulatedUpdate:
    """One rank's share of an accumulated GRPO update: `add` groups in any order, then `finish` once."""

    def __init__(self, learner, chunks: list[list[int]], with_ref: bool, exact: bool = True):
        """learner: the rank's `Learner` (its model is updated in place by `finish`).
        chunks: this rank's micro-batches (`microbatches(...)[rank]`), each a list of group indices.
        with_ref: groups carry reference log-probs (algo.kl_coef > 0); every rank must pass the same.
        exact: fold gradients in chunk order (bitwise independent of arrival); False folds in arrival order."""
        self.learner, self.chunks, self.with_ref, self.exact = learner, chunks, with_ref, exact
        self.G = learner.algo.group_size
        self.chunk_of = {g: k for k, c in enumerate(chunks) for g in c}
        self.params = [p for p in learner.model.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        self._have: dict[int, GroupBatch] = {}
        self._done: dict[int, tuple | None] = {}  # chunk -> (flat grad, has-grad flags, metrics, n_tok) or None
        self._next = 0
        self._acc: torch.Tensor | None = None
        self._flags = torch.zeros(len(self.params), dtype=torch.bool)
        self.stats = _Stats()
        self.buffered_peak = 0
        """Most gradients held at once waiting for a lower chunk (the memory price of exactness)."""

    @property
    def complete(self) -> bool:
        return self._next == len(self.chunks)

    def add(self, batch: GroupBatch) -> bool:
        """Take one finished group; computes its micro-batch's gradient once every group of it is in.
        Returns True when a micro-batch was computed."""
        if batch.g not in self.chunk_of:
            raise ValueError(f"group {batch.g} is not one of this rank's groups")
        if batch.g in self._have or self.chunk_of[batch.g] in self._done:
            raise ValueError(f"group {batch.g} was added twice")
        self._have[batch.g] = batch
        k = self.chunk_of[batch.g]
        if not all(g in self._have for g in self.chunks[k]):
            return False
        self._done[k] = self._gradient([self._have.pop(g) for g in self.chunks[k]])
        self._fold(k)
        self.buffered_peak = max(self.buffered_peak, sum(v is not None for v in self._done.values()))
        return True

    def _gradient(self, batches: list[GroupBatch]) -> tuple | None:
        """The micro-batch's gradient of its unnormalised loss (denom 1), flat, computed from zero."""
        algo = self.learner.algo
        kept = []
        for b in batches:
            adv, _ = advantage_estimator(algo.estimator).fn(b.rewards, self.G, algo)
            if not (algo.skip_zero_variance_groups and bool(adv.zero_variance.all())):
                kept.append((b, adv.advantages))
        if not kept:
            return None
        out = response_logprobs(self.learner.model, [b.prompt for b, _ in kept],
                                [r for b, _ in kept for r in b.responses], self.G, with_entropy=True,
                                reuse_prefix=self.learner.reuse_prefix)
        mask, T = out.mask.bool(), out.logp.shape[1]
        ref = None
        if self.with_ref:
            ref = torch.cat([torch.nn.functional.pad(b.ref_logp[:, :T], (0, max(0, T - b.ref_logp.shape[1])))
                             for b, _ in kept])
        dev = out.logp.device  # advantages and shipped reference log-probs arrive on the CPU
        ref = ref.to(dev) if ref is not None else None
        loss, m = grpo_loss(out.logp, out.logp.detach(), ref, torch.cat([a for _, a in kept]).to(dev), mask, algo,
                            entropy=out.entropy, denom=1.0)  # the batch's normaliser is known only at `finish`
        for p in self.params:
            p.grad = None
        loss.backward()
        flat = torch.zeros(sum(self.sizes), dtype=self.params[0].dtype, device=self.params[0].device)
        flags = torch.zeros(len(self.params), dtype=torch.bool)
        off = 0
        for i, p in enumerate(self.params):
            if p.grad is not None:
                flat[off:off + self.sizes[i]] = p.grad.reshape(-1)
                flags[i] = True
            off += self.sizes[i]
            p.grad = None
        return flat, flags, m, int(mask.sum().item())

    def _fold(self, arrived: int) -> None:
        """Add computed gradients into the sum: in chunk order (exact), or as they come (not exact)."""
        if self.exact:
            order = []
            while self._next in self._done:  # only the run from the lowest chunk: one addition order, any arrival
                order.append(self._next)
                self._next += 1
        else:
            order = [arrived]
            self._next += 1
        for k in order:
            entry = self._done.pop(k)
            if entry is None:
                continue
            flat, flags, m, n_tok = entry
            if self._acc is None:
                self._acc = flat
            else:
                self._acc += flat
            self._flags |= flags
            self.stats.add(m, n_tok)

    def finish(self, rewards: torch.Tensor, lengths: list[int], shard: Shard | None = None) -> dict[str, float]:
        """The optimiser step, once every chunk of this rank is in (every rank calls it with the same inputs).

        rewards: [B*G] every group's rewards; lengths: [B*G] response lengths (they give the normaliser).
        Returns the full-batch metrics (same on every rank); raises TrainingError on a non-finite loss or norm.
        """
        if not self.complete:
            missing = sorted(g for k, c in enumerate(self.chunks) if k >= self._next for g in c)
            raise ValueError(f"finish before every group arrived (missing {missing[:8]})")
        learner, algo, G = self.learner, self.learner.algo, self.G
        adv, metrics = advantage_estimator(algo.estimator).fn(rewards, G, algo)
        keep = [g for g in range(len(lengths) // G) if not (algo.skip_zero_variance_groups and adv.zero_variance[g])]
        if not keep:
            lr = learner._lr()
            learner.updates += 1
            return {**metrics, M.LR: lr}
        denom = batch_denominator([lengths[g * G + s] for g in keep for s in range(G)], algo.loss_agg)
        for group in learner.opt.param_groups:
            group["lr"] = learner._lr()
        off = 0
        if self._acc is not None:
            self._acc.div_(denom)
        for i, p in enumerate(self.params):
            p.grad = self._acc[off:off + self.sizes[i]].view_as(p) if self._flags[i] else None
            off += self.sizes[i]
        metrics.update(learner.step_reduced(self._local(denom), self.stats.n_tok,
                                            shard or Shard(0, 1, lambda t: None), self.with_ref))
        metrics[M.GRAD_NORM] = learner.last_grad_norm
        metrics[M.LR] = learner._lr()
        learner.updates += 1
        return metrics

    def _local(self, denom: float) -> dict[str, float]:
        """This rank's metric row for `reduce_step`: loss shares of the full batch, token means of its own."""
        s = self.stats
        if not s.chunks:  # nothing trained on this rank: it joins the all-reduce with zeros
            return {}
        out = {M.LOSS: s.loss / denom, M.PG_LOSS: s.pg_loss / denom,
               M.RATIO_MIN: s.ratio_min if s.n_tok else 1.0, M.RATIO_MAX: s.ratio_max if s.n_tok else 1.0}
        for key, v in s.weighted.items():
            out[key] = v / s.n_tok if s.n_tok else 0.0
        return out
