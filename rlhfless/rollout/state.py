"""The rollout's data and its primitives: sampling parameters, the prefill state (KV cache, masks, logits, what
dedup shared), one decode iteration's record, the output, `prefill`, and the per-row random streams.

`rollout.engine` is the public entry (it re-exports these); `rollout.session` builds the decode actor on them.
They live apart from the engine so that the engine can run a session and the session can use them, each
importing only downward. The sampling rule (one uniform per ORIGINAL row and step) is explained in
`rollout.engine`'s header.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rlhfless.core.errors import require
from rlhfless.model.tokenizer import EOS_ID
from rlhfless.rollout.prefix import (
    PrefillPlan,
    PrefixCost,
    check_prompts,
    plan_prefill,
    run_plan,
)


@dataclass(frozen=True)
class SamplingParams:
    """How responses are sampled."""

    max_new_tokens: int
    """Hard cap on generated tokens (EOS included); rows that hit it are marked truncated."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    compact_fraction: float = 0.05
    """Drop finished rows once at least this fraction of the live batch (and at least one row) has finished."""
    stop_ids: tuple[int, ...] = (EOS_ID,)
    """Token ids that end a row (kept as its last token): the policy tokenizer's `stop_ids`."""

    def __post_init__(self) -> None:
        require(len(self.stop_ids) >= 1 and all(isinstance(i, int) and i >= 0 for i in self.stop_ids),
                "rollout.stop_ids", f"must be one or more token ids >= 0 (got {self.stop_ids!r})")
        require(self.max_new_tokens >= 1, "rollout.max_new_tokens", f"must be >= 1 (got {self.max_new_tokens})")
        require(self.temperature >= 0, "rollout.temperature", f"must be >= 0 (got {self.temperature})")
        require(0 < self.top_p <= 1, "rollout.top_p", f"must be in (0, 1] (got {self.top_p})")
        require(0 <= self.compact_fraction <= 1, "rollout.compact_fraction",
                f"must be in [0, 1] (got {self.compact_fraction})")


@dataclass
class PrefillStats:
    """What one prefill computed (logged as prefill/dedup_ratio, prefill/saved_tokens, timing_s/prefill)."""

    tokens_computed: int
    """Prompt tokens the prefill actually ran through the model (padding excluded)."""
    tokens_naive: int
    """Prompt tokens a prefill of every row would run (B x G x prompt length)."""
    seconds: float
    """Wall seconds of planning and running the prefill (KV expansion included)."""
    plan: PrefillPlan | None = None
    """What was computed once and which rows reuse it."""

    @property
    def saved_tokens(self) -> int:
        return self.tokens_naive - self.tokens_computed

    @property
    def dedup_ratio(self) -> float:
        """Naive tokens over computed tokens (>= 1; G for pure within-group dedup of equal prompts)."""
        return self.tokens_naive / max(1, self.tokens_computed)


def dynamic_cache(layers: list[tuple[torch.Tensor, torch.Tensor]]):
    """A `transformers.DynamicCache` of plain (full-attention) layers holding these (keys, values) tensors."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=layers)


@dataclass
class PrefillState:
    """Everything decode needs: one row per sample, rows ordered group-major (row = g * G + s).

    `cache` is a `transformers.DynamicCache`; layer i holds `.layers[i].keys/.values` [R, kv_heads, P, head_dim]
    aligned with `attention_mask`. Decoding consumes it (see `rollout.session`).
    """

    cache: object
    attention_mask: torch.Tensor  # [R, P] long, 1 = real token
    next_pos: torch.Tensor  # [R] long, position id of the next token
    next_logits: torch.Tensor  # [R, V] logits for the first response token
    stats: PrefillStats
    """Of the whole prefill this state came from (a `select`ed slice keeps them)."""

    def select(self, rows: torch.Tensor | list[int]) -> PrefillState:
        """A new state holding only `rows` (in that order), for the decode actor that owns them; this state is
        left intact. Its cache holds copies, so the two can be decoded independently."""
        from transformers.cache_utils import DynamicLayer

        R = int(self.attention_mask.shape[0])
        idx = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        require(len(idx) >= 1, "prefill.select", "needs at least one row")
        require(int(idx.min()) >= 0 and int(idx.max()) < R, "prefill.select",
                f"rows must be in [0, {R}) (got {int(idx.min())}..{int(idx.max())})")
        idx = idx.to(self.attention_mask.device)
        layers = list(self.cache.layers)
        require(all(type(layer) is DynamicLayer for layer in layers), "prefill.select",
                "only full-attention DynamicCache layers can be sliced (not sliding-window or static ones)")
        cache = dynamic_cache([(layer.keys[idx], layer.values[idx]) for layer in layers])
        return PrefillState(cache, self.attention_mask[idx], self.next_pos[idx], self.next_logits[idx], self.stats)


@dataclass
class IterationRecord:
    """One decode forward: rows in the batch, keys attended (context incl. padding), wall seconds."""

    batch_size: int
    context: int
    seconds: float


@dataclass
class RolloutOutput:
    responses: list[list[int]]
    """Generated ids per row (EOS included when emitted), rows group-major."""
    truncated: list[bool]
    prefill: PrefillStats
    decode_seconds: float
    iterations: list[IterationRecord] = field(default_factory=list)

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.responses]

    @property
    def generated_tokens(self) -> int:
        return sum(self.lengths)


@torch.no_grad()
def prefill(model, prompts: list[list[int]], group_size: int, *, dedup: bool = True, share_prefixes: bool = True,
            prefix_cost: PrefixCost | None = None, shared_prefix_len: int | None = None) -> PrefillState:
    """Run the prompts through the model with shared work done once; lay out one cache row per sample.

    dedup=True computes each prompt once and repeats its KV G times, and (share_prefixes) computes prefixes shared
    across prompts once when the cost model in `rollout.prefix` says it pays; dedup=False runs every one of the
    B*G rows (the naive path, kept for ablation). shared_prefix_len forces one prefix shared by all prompts.
    """
    check_prompts(prompts, group_size, model.config.max_position_embeddings)
    t0 = time.perf_counter()
    plan = plan_prefill(prompts, group_size, dedup=dedup, share_prefixes=share_prefixes, cost=prefix_cost,
                        shared_prefix_len=shared_prefix_len)
    cache, mask, logits = run_plan(model, prompts, plan)
    stats = PrefillStats(plan.tokens_computed, plan.tokens_naive, time.perf_counter() - t0, plan)
    return PrefillState(cache, mask, mask.sum(-1), logits, stats)


def row_uniforms(seed: int, step: int, n_rows: int) -> torch.Tensor:
    # a CPU generator in float64 on every device, one draw per ORIGINAL row: a row's number ignores the batch
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.rand(n_rows, generator=g, dtype=torch.float64)


def sample_tokens(logits: torch.Tensor, u: torch.Tensor | None, temperature: float, top_p: float) -> torch.Tensor:
    """Pick one token per row from `logits` [R, V] with one uniform `u` [R] per row (inverse-CDF sampling).

    temperature 0 is greedy (argmax) and ignores `u`. `u` may live on the CPU (the per-row streams are drawn there
    so a seed gives the same uniforms on every device); the result is on `logits`' device.
    """
    if temperature == 0:
        return logits.argmax(-1)
    u = u.to(logits.device)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        probs = probs * ((probs.cumsum(-1) - probs) < top_p)  # the first token is always kept
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).clamp(max=probs.shape[-1] - 1)
    return idx.squeeze(-1) if order is None else order.gather(-1, idx).squeeze(-1)
