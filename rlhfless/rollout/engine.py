"""Rollout engine: deduplicated prefill, then batched KV-cache decoding that drops finished rows.

Two separate calls, so a later stage can run them in different serverless functions and ship the KV between them:
- `prefill(model, prompts, group_size, dedup=...)` -> `PrefillState` (KV cache, masks, positions, next-token
  logits, and the `PrefillPlan` of what was shared: see `rollout.prefix` for the rule and its cost model)
- `decode(model, state, params, seed)` -> `RolloutOutput` (responses, per-iteration time profile): a
  `rollout.session.DecodeSession` run to completion. The session is the decode actor's interface (run in slices,
  hand unfinished rows over for migration, resume them elsewhere); `PrefillState.select` and
  `session.state_to_tensors` / `state_from_tensors` ship a slice of the prefill KV to another process.

Why the sampling is written by hand: every step draws one uniform number for every ORIGINAL row from a
generator seeded by (seed, step), and a row uses its own number whatever the batch looks like. So outputs do not
depend on compaction, on prefill dedup or on how rows are split between decode actors: the same seed gives the
same tokens (`rollout.session` states the contract), which is what makes the dedup/no-dedup and migration
ablations exact comparisons. (Exact up to float rounding: a different batch layout can change the last bits of a
logit, which could flip a sampled token only at a near-tie; the tests check token identity on real runs.)
Devices (`train.device`, `rlhfless.core.devices`): the model, KV cache, masks and logits live on the model's device,
but the per-row uniforms are always drawn from a CPU generator (float64) and moved to the logits, so a seed gives
the same uniforms on CPU and GPU. Where samples can still differ across devices: the kernels (matmul and
attention reductions, bfloat16 rounding) give logits that differ in their last bits, which flips a sampled or
greedy token at a near-tie, and from there the row's continuation differs. On one device greedy and sampled
outputs are reproducible run to run (the same kernels in the same order; tests marked `gpu` check it).
HF `generate` draws from torch's global stream, so its samples differ from ours for the same seed; tests compare
the two distributions instead.

Speed: tokens are written into a preallocated [R, max_new] tensor, the KV lives in a preallocated buffer
(`rollout.stepper.FastStepper`), and finished rows are dropped once enough have finished to pay for the copy.
Deviation from a production engine (vLLM): no paged KV and no continuous admission of new prompts; the batch
only shrinks. That is the behaviour of one synchronous rollout stage, which is what the paper's decode actors run.
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
