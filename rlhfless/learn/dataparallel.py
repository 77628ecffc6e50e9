"""Data-parallel pieces of the learner: which rank trains which groups, and one flat all-reduce per optimiser step.

W worker processes run one GRPO update with the same math as `Learner.update` (each rank a full replica, like
DDP; the paper's learner is FSDP): every rank computes advantages and the zero-variance filter on the FULL batch
(cheap and deterministic, so no communication), trains its contiguous chunk of the kept groups (`split_groups`)
and uses the full batch's normaliser (`algo.grpo.loss_denominator`), so rank gradients SUM to the full batch's.
The rule it keeps: gradients, the loss and metric rows travel in ONE flat buffer all-reduced with SUM before
clipping (`reduce_step`), and every rank steps its own AdamW on identical inputs, so the replicas stay bitwise
equal without broadcasting weights. Transport: `Shard.all_reduce` (`rlhfless.runtime.devices.dist` builds a gloo one).
Non-goals: sharded parameters or optimiser state (FSDP/ZeRO), bucketed overlap with the backward, micro-batching.
Deviation: results equal the single-process update up to float rounding (other summation order), not bitwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfless.core import metrics as M


@dataclass(frozen=True)
class Shard:
    """This process's place in a data-parallel group."""

    rank: int
    """0 .. world - 1."""
    world: int
    """Number of ranks (>= 1)."""
    all_reduce: Callable[[torch.Tensor], None]
    """Sums a CPU floating-point tensor (the parameters' dtype) in place across all ranks (blocking; every rank
    calls it the same number of times with the same shape). Must raise, not hang, when a peer is gone (see
    `runtime.devices.dist`)."""

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")


def split_groups(weights: list[int], world: int) -> list[tuple[int, int]]:
    """Contiguous chunks of items balanced by weight: [(start, end)] per rank, deterministic in the inputs only.

    Args:
        weights: [n] non-negative cost of each item (the learner uses response tokens + G per group).
        world: number of chunks (>= 1).
    Returns:
        world half-open ranges covering 0..n in order; boundary k is the prefix whose weight is nearest to
        k/world of the total (ties: the shorter prefix). Chunks may be empty (fewer items than ranks).
    """
    if world < 1:
        raise ValueError(f"world must be >= 1 (got {world})")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    total, n = prefix[-1], len(weights)
    bounds = [0]
    for k in range(1, world):
        lo = bounds[-1]
        # integer arithmetic (prefix * world vs k * total) so every rank computes the same boundaries
        best = min(range(lo, n + 1), key=lambda i: (abs(prefix[i] * world - k * total), i))
        bounds.append(best)
    bounds.append(n)
    return [(bounds[r], bounds[r + 1]) for r in range(world)]


@dataclass(frozen=True)
class RowLayout:
    """Which metrics a rank's row carries and how the rows combine: `shares` sum across ranks (loss shares of
    the full batch, computed with its normaliser), `means` are token-weighted means, `mins` / `maxs` are taken
    over ranks with tokens; `empty` is what the single process reports over zero valid tokens."""

    shares: tuple[str, ...]
    means: tuple[str, ...]
    mins: tuple[str, ...] = ()
    maxs: tuple[str, ...] = ()
    empty: tuple[tuple[str, float], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return (*self.shares, *self.means, *self.mins, *self.maxs)

    def with_means(self, *keys: str) -> RowLayout:
        """This layout with more token-mean metrics (e.g. dual_clip's actor/pg_clipfrac_lower)."""
        return RowLayout(self.shares, (*self.means, *keys), self.mins, self.maxs,
                         (*self.empty, *((k, 0.0) for k in keys)))


POLICY_ROW = RowLayout((M.LOSS, M.PG_LOSS), (M.CLIP_FRAC, M.PPO_KL, M.RATIO_MEAN, M.ENTROPY, M.KL),
                       (M.RATIO_MIN,), (M.RATIO_MAX,),
                       ((M.CLIP_FRAC, 0.0), (M.PPO_KL, 0.0), (M.RATIO_MEAN, 1.0), (M.ENTROPY, 0.0), (M.KL, 0.0),
                        (M.RATIO_MIN, 1.0), (M.RATIO_MAX, 1.0)))
"""`grpo_loss`'s metrics (the empty values: its `_masked_mean` clamps, ratio stats default to 1)."""
CRITIC_ROW = RowLayout((M.VF_LOSS,), (M.VF_CLIPFRAC, M.VPRED_MEAN), empty=((M.VF_CLIPFRAC, 0.0), (M.VPRED_MEAN, 0.0)))
"""`algo.ppo.value_loss`'s metrics."""


def reduce_step(params: list[torch.nn.Parameter], shard: Shard, local: dict[str, float], n_tok: int,
                with_kl: bool, layout: RowLayout = POLICY_ROW) -> dict[str, float]:
    """All-reduce (SUM) gradients and metrics in one buffer; set every param's .grad to the global gradient.

    Args:
        params: the model's trainable parameters, same order on every rank; .grad None where this rank has none.
        local: this rank's metrics in `layout` (`grpo_loss`'s by default, computed with the global denom), {} on
            a rank with nothing to train.
        n_tok: this rank's valid response tokens (weights its token-mean metrics).
        with_kl: whether actor/kl is reported (a reference was given), so every rank returns the same keys.
        layout: the metric row (`POLICY_ROW`; PPO's critic: `CRITIC_ROW`).
    Returns:
        the full-batch metrics (same on every rank). A param that no rank has a gradient for keeps .grad None,
        as in the single-process backward (AdamW then skips it there too).
    """
    sizes = [p.numel() for p in params]
    n_grad, n_par, width = sum(sizes), len(params), 1 + len(layout.keys)
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        raise ValueError(f"one flat buffer needs one parameter dtype (got {sorted(map(str, dtypes))})")
    # the gradient's own dtype: .grad must match its parameter, and float64 models reduce in float64
    buf = torch.zeros(n_grad + n_par + shard.world * width, dtype=dtypes.pop() if dtypes else torch.float32,
                      device=params[0].device if params else None)
    off = 0
    for i, p in enumerate(params):
        if p.grad is not None:
            buf[off: off + sizes[i]] = p.grad.reshape(-1)
            buf[n_grad + i] = 1.0  # "this rank has a gradient for param i"
        off += sizes[i]
    row = buf[n_grad + n_par + shard.rank * width: n_grad + n_par + (shard.rank + 1) * width]
    row[0] = float(n_tok)
    for j, key in enumerate(layout.keys):
        row[1 + j] = local.get(key, 0.0)
    shard.all_reduce(buf)
    off = 0
    for i, p in enumerate(params):
        # a view of the reduced buffer: no copy; clipping scales it in place and AdamW only reads it
        p.grad = buf[off: off + sizes[i]].view_as(p) if buf[n_grad + i] > 0 else None
        off += sizes[i]
    return _combine(buf[n_grad + n_par:].view(shard.world, width), with_kl, layout)


def _combine(rows: torch.Tensor, with_kl: bool, layout: RowLayout) -> dict[str, float]:
    """Full-batch metrics from the gathered [world, 1 + len(layout.keys)] rows (float64, same on all ranks)."""
    rows = rows.double()
    n = rows[:, 0]
    col = {key: rows[:, 1 + j] for j, key in enumerate(layout.keys)}
    empty = dict(layout.empty)
    out = {key: col[key].sum().item() for key in layout.shares}
    total = n.sum().item()
    has = n > 0
    for key in layout.means:
        out[key] = (col[key] * n).sum().item() / total if total else empty[key]
    for key in layout.mins:
        out[key] = col[key][has].min().item() if total else empty[key]
    for key in layout.maxs:
        out[key] = col[key][has].max().item() if total else empty[key]
    if not with_kl:
        out.pop(M.KL, None)
    return out
