"""Rollout engine: deduplicated prefill, then batched KV-cache decoding that drops finished rows.

Two separate calls, so a later stage can run them in different serverless functions and ship the KV between them:
- `prefill(model, prompts, group_size, dedup=...)` -> `PrefillState` (KV cache, masks, positions, next-token
  logits, and the `PrefillPlan` of what was shared: see `rollout.prefix` for the rule and its cost model)
- `decode(model, state, params, seed)` -> `RolloutOutput` (responses, per-iteration time profile)

Why the sampling is written by hand: every step draws one uniform number for every ORIGINAL row from a
generator seeded by (seed, step), and a row uses its own number whatever the batch looks like. So outputs do not
depend on compaction, on prefill dedup or on how rows are split between decode actors: the same seed gives the
same tokens, which is what makes the dedup/no-dedup and migration ablations exact comparisons. (Exact up to float
rounding: a different batch layout can change the last bits of a logit, which could flip a sampled token only at
a near-tie; the tests check token identity on real runs.) HF `generate` draws from torch's global stream, so its
samples differ from ours for the same seed; tests compare the two distributions instead.

Speed: tokens are written into a preallocated [R, max_new] tensor, the KV lives in a preallocated buffer
(`rollout.stepper.FastStepper`), and finished rows are dropped once enough have finished to pay for the copy.
Deviation from a production engine (vLLM): no paged KV and no continuous admission of new prompts; the batch
only shrinks. That is the behaviour of one synchronous rollout stage, which is what the paper's decode actors run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rlhfless.errors import require
from rlhfless.model.tokenizer import EOS_ID, PAD_ID
from rlhfless.rollout.prefix import (
    PrefillPlan,
    PrefixCost,
    check_prompts,
    left_pad,
    plan_prefill,
    run_plan,
)
from rlhfless.rollout.stepper import make_stepper

__all__ = ["SamplingParams", "PrefillStats", "PrefillState", "IterationRecord", "RolloutOutput", "left_pad",
           "prefill", "decode", "generate", "sample_tokens"]


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

    def __post_init__(self) -> None:
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


@dataclass
class PrefillState:
    """Everything decode needs: one row per sample, rows ordered group-major (row = g * G + s)."""

    cache: object
    attention_mask: torch.Tensor  # [R, P] long, 1 = real token
    next_pos: torch.Tensor  # [R] long, position id of the next token
    next_logits: torch.Tensor  # [R, V] logits for the first response token
    stats: PrefillStats


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


def _row_uniforms(seed: int, step: int, n_rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.rand(n_rows, generator=g, dtype=torch.float64)


def sample_tokens(logits: torch.Tensor, u: torch.Tensor | None, temperature: float, top_p: float) -> torch.Tensor:
    """Pick one token per row from `logits` [R, V] with one uniform `u` [R] per row (inverse-CDF sampling).

    temperature 0 is greedy (argmax) and ignores `u`.
    """
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        probs = probs * ((probs.cumsum(-1) - probs) < top_p)  # the first token is always kept
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).clamp(max=probs.shape[-1] - 1)
    return idx.squeeze(-1) if order is None else order.gather(-1, idx).squeeze(-1)


def _responses(tokens: torch.Tensor) -> tuple[list[list[int]], list[bool]]:
    """Cut each row of [R, T] tokens after its first EOS (rows without EOS ran the full T: truncated)."""
    is_eos = tokens == EOS_ID
    has_eos = is_eos.any(-1)
    lengths = torch.where(has_eos, is_eos.int().argmax(-1) + 1, tokens.shape[1])
    rows = [r[:n] for r, n in zip(tokens.tolist(), lengths.tolist())]
    return rows, (~has_eos).tolist()


@torch.no_grad()
def decode(model, state: PrefillState, params: SamplingParams, seed: int = 0,
           row_ids: torch.Tensor | None = None, *, impl: str = "auto") -> RolloutOutput:
    """Sample until every row emits EOS or reaches max_new_tokens, dropping finished rows from the batch.

    row_ids: the original row index of each state row (for sampling streams); default 0..R-1. Pass it when a
    decode actor holds a subset of a step's rows so its samples match the single-actor run.
    impl: "auto" (fast preallocated-KV step for Qwen2 models, else the HF forward), "fast" or "hf".
    The state's cache is consumed (the HF path mutates it; the fast path copies it).
    """
    t_start = time.perf_counter()
    n = state.attention_mask.shape[0]
    orig = torch.arange(n) if row_ids is None else row_ids.clone()
    n_total = int(orig.max()) + 1
    tokens = torch.full((n, params.max_new_tokens), PAD_ID, dtype=torch.long)
    local = torch.arange(n)  # row of `tokens` for each batch row
    live = torch.ones(n, dtype=torch.bool)  # batch rows that have not emitted EOS
    stepper = make_stepper(model, state.cache, state.attention_mask, params.max_new_tokens, impl)
    logits, pos = state.next_logits, state.next_pos.clone()
    iters: list[IterationRecord] = []
    for step in range(params.max_new_tokens):
        t0 = time.perf_counter()
        u = None if params.temperature == 0 else _row_uniforms(seed, step, n_total)[orig]
        tok = sample_tokens(logits, u, params.temperature, params.top_p)
        tokens[local[live], step] = tok[live]
        live = live & (tok != EOS_ID)
        n_live = int(live.sum())
        if n_live == 0 or step == params.max_new_tokens - 1:
            break
        # Compacting copies the whole cache, so wait until enough rows have finished to make it pay.
        if len(live) - n_live >= max(1, params.compact_fraction * len(live)):
            keep = live.nonzero().squeeze(-1)
            stepper.select(keep)
            tok, pos, local, orig, live = tok[keep], pos[keep], local[keep], orig[keep], live[keep]
        logits = stepper.step(torch.where(live, tok, PAD_ID), pos, live)
        pos = pos + 1
        iters.append(IterationRecord(len(live), stepper.context, time.perf_counter() - t0))
    responses, truncated = _responses(tokens)
    return RolloutOutput(responses, truncated, state.stats, time.perf_counter() - t_start, iters)


def generate(model, prompts: list[list[int]], group_size: int, params: SamplingParams, *, seed: int = 0,
             dedup: bool = True, share_prefixes: bool = True, impl: str = "auto") -> RolloutOutput:
    """prefill + decode in one call (rows group-major: row g*G + s is sample s of prompt g)."""
    state = prefill(model, prompts, group_size, dedup=dedup, share_prefixes=share_prefixes)
    return decode(model, state, params, seed=seed, impl=impl)
