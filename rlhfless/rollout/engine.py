"""Rollout engine: deduplicated prefill, then batched KV-cache decoding that drops finished rows.

Two calls, so a later stage can run them in different serverless functions and ship the KV between them:
`prefill(model, prompts, group_size, dedup=...)` -> `PrefillState` (KV cache, masks, positions, next-token
logits, the `PrefillPlan` of what was shared: `rollout.prefix`), and `decode(model, state, params, seed)` ->
`RolloutOutput`, a `rollout.session.DecodeSession` run to completion. The rule it keeps, and why sampling is
written by hand: every step draws one uniform per ORIGINAL row from a CPU generator seeded by (seed, step), so
outputs do not depend on compaction, dedup, the split between actors or the device (up to float rounding at
near-ties). Devices, HF `generate` and speed: docs/internals.md#rolloutenginepy.

Deviation from a production engine (vLLM): no paged KV and no continuous admission of new prompts; the batch
only shrinks, the behaviour of one synchronous rollout stage, which is what the paper's decode actors run.
"""

from __future__ import annotations

import time

import torch

# The data and primitives are in rollout.state; re-exported here, the public entry.
from rlhfless.rollout.prefix import left_pad
from rlhfless.rollout.session import DecodeSession
from rlhfless.rollout.state import (
    IterationRecord,
    PrefillState,
    PrefillStats,
    RolloutOutput,
    SamplingParams,
    dynamic_cache,
    prefill,
    sample_tokens,
)

__all__ = ["SamplingParams", "PrefillStats", "PrefillState", "IterationRecord", "RolloutOutput", "left_pad",
           "prefill", "decode", "generate", "sample_tokens", "dynamic_cache"]


@torch.no_grad()
def decode(model, state: PrefillState, params: SamplingParams, seed: int = 0,
           row_ids: torch.Tensor | None = None, *, n_total: int | None = None, impl: str = "auto") -> RolloutOutput:
    """Sample until every row emits EOS or reaches max_new_tokens, dropping finished rows from the batch.

    A `DecodeSession` advanced until done. row_ids: the original row index of each state row (for sampling
    streams); default 0..R-1. Pass it when a decode actor holds a subset of a step's rows so its samples match the
    single-actor run; n_total: rows in the step's full batch (default: largest row id + 1, which draws the same
    numbers because a row's uniform does not depend on how many are drawn after it).
    impl: "auto" (fast preallocated-KV step for Qwen2 models, else the HF forward), "fast" or "hf".
    The state's cache is consumed (the HF path mutates it; the fast path copies it).
    """
    t_start = time.perf_counter()
    if row_ids is not None and n_total is None:
        n_total = int(torch.as_tensor(row_ids).max()) + 1
    session = DecodeSession(model, state, params, seed, row_ids=row_ids, n_total=n_total, impl=impl)
    session.advance(params.max_new_tokens)  # every row ends within max_new_tokens iterations
    responses, truncated = session.outputs()
    return RolloutOutput(responses, truncated, state.stats, time.perf_counter() - t_start, session.iterations)


def generate(model, prompts: list[list[int]], group_size: int, params: SamplingParams, *, seed: int = 0,
             dedup: bool = True, share_prefixes: bool = True, impl: str = "auto") -> RolloutOutput:
    """prefill + decode in one call (rows group-major: row g*G + s is sample s of prompt g)."""
    state = prefill(model, prompts, group_size, dedup=dedup, share_prefixes=share_prefixes)
    return decode(model, state, params, seed=seed, impl=impl)
