"""Time-per-output-token profile: seconds per decode iteration vs batch size, from the engine's IterationRecords.

Rows (what `plan.timemodel.TimeModel.from_rows` reads): ``{"batch_size", "context", "s_per_iter", "n"}``, one
per power-of-two batch-size bucket (median batch size, mean keys attended, median seconds, iterations).
`load_profile` refuses a missing file, invalid JSON or a bad row with one line naming the file.
The rule it keeps: `measure_profile` times real rollouts (deduplicated prefill, then a batch that decays as rows
finish, compactions included), several pooled, in the caller's torch threads, so every batch size is timed at
the contexts a real decode reaches (a fixed batch that never shrinks misses the compactions and the tail's
contexts). The format, and what a fixed batch mispriced: docs/internals.md#rollouttpotpy.
Non-goals: fitting a model to the rows (the planner does that).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

from rlhfless.core.errors import DataError


def profile_rows(iterations: Iterable) -> list[dict]:
    """Aggregate `IterationRecord`s (batch_size, context, seconds) into one row per power-of-two batch bucket."""
    buckets: dict[int, list] = {}
    for it in iterations:
        buckets.setdefault(max(1, it.batch_size).bit_length(), []).append(it)
    rows = []
    for key in sorted(buckets):
        its = buckets[key]
        rows.append({
            "batch_size": int(statistics.median_low([i.batch_size for i in its])),
            "context": int(round(statistics.fmean(i.context for i in its))),
            "s_per_iter": float(statistics.median(i.seconds for i in its)),
            "n": len(its),
        })
    return rows


def save_profile(rows: list[dict], path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return out


def load_profile(path: str | Path) -> list[dict]:
    """The checked rows of a TPOT profile written by `save_profile`."""
    from rlhfless.plan.timemodel import check_profile_rows

    p = Path(path)
    if not p.is_file():
        raise DataError(f"TPOT profile not found: {p} (make one with `rlhfless bench engine --json OUT`)")
    try:
        rows = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a huge integer, deep nesting
        raise DataError(f"{p}: not valid JSON") from None
    return check_profile_rows(rows, str(p))


PROFILE_PROMPTS, PROFILE_GROUP, PROFILE_ROLLOUTS = 32, 8, 3
"""What the runtime times: 3 rollouts of 32 prompts x 8 samples (256 rows at the start)."""


def measure_profile(model, prompts: list[list[int]], group_size: int, params, rollouts: int = PROFILE_ROLLOUTS,
                    slice_iters: int = 16, on_slice=None) -> tuple[list[dict], float]:
    """(rows, prefill seconds per computed prompt token) of `rollouts` rollouts (seeds 0, 1, ...) of `prompts` x
    `group_size` with `params`, their iterations pooled (one rollout passes the large batches in a few iterations).

    on_slice(iterations so far): called every `slice_iters` decode iterations (a progress bar; each rollout ends
    within params.max_new_tokens iterations, so the total is at most rollouts x max_new_tokens).
    """
    import torch

    from rlhfless.rollout.engine import prefill
    from rlhfless.rollout.session import DecodeSession

    model.eval()
    iterations, prefill_s, prefill_tokens, done = [], 0.0, 0, 0
    with torch.no_grad():
        for seed in range(rollouts):
            state = prefill(model, prompts, group_size)
            prefill_s, prefill_tokens = prefill_s + state.stats.seconds, prefill_tokens + state.stats.tokens_computed
            session = DecodeSession(model, state, params, seed)
            while not session.done:
                session.advance(slice_iters)
                done += slice_iters
                if on_slice is not None:
                    on_slice(min(done, (seed + 1) * params.max_new_tokens))
            done = (seed + 1) * params.max_new_tokens
            iterations += session.iterations
    return profile_rows(iterations), prefill_s / max(1, prefill_tokens)
