"""Time-per-output-token profile: seconds per decode iteration vs batch size, from the engine's IterationRecords.

Format (what `rlhfless.plan.timemodel.TimeModel.from_rows` reads): a JSON list of rows
``{"batch_size": int, "context": int, "s_per_iter": float, "n": int}``, one per batch-size bucket (powers of
two: 1, 2-3, 4-7, ...): batch_size is the median batch size in the bucket, context the mean number of keys
attended, s_per_iter the median seconds of one iteration, n the iterations aggregated.
`load_profile` refuses, with one line naming the file: a missing file, invalid JSON, and any row that
`rlhfless.plan.timemodel.check_profile_rows` refuses (missing keys, wrong types, times that are not > 0).
`measure_profile` measures the rows directly, batch size by batch size, in the calling process's torch threads
(the runtime runs it inside a worker, pinned, with the workers' own thread count: `rlhfless.runtime.profile`):
one prompt of random token ids is prefilled once and repeated b times, then every row decodes with no stop token
it can sample, so the batch stays exactly b; the median of `iters` timed iterations (after `warmup`) is the
row's s_per_iter. Shipped profiles come from real rollouts (`rlhfless bench engine`), whose batches shrink as
rows finish; both are one row per batch size.
Non-goals: fitting a model to the rows (the planner does that).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

from rlhfless.errors import DataError


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


PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Batch sizes `measure_profile` times by default (the planner extrapolates beyond the last one)."""


def measure_profile(model, batch_sizes=PROFILE_BATCHES, prompt_len: int = 128, iters: int = 16, warmup: int = 3,
                    seed: int = 0, on_batch=None) -> tuple[list[dict], float]:
    """(rows, prefill seconds per prompt token) of `model` decoding at each batch size (module header).

    on_batch(i): called after the i-th batch size (a progress bar). The prompt is `prompt_len` token ids drawn
    with `seed`; prefill seconds per token are the median of three single-prompt prefills.
    """
    import torch

    from rlhfless.rollout.engine import SamplingParams, prefill
    from rlhfless.rollout.session import DecodeSession

    vocab = int(model.config.vocab_size)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    # an id the model cannot emit: no row ever stops, so the batch stays b for every iteration
    params = SamplingParams(max_new_tokens=warmup + iters + 1, temperature=1.0, stop_ids=(vocab,))
    model.eval()
    with torch.no_grad():
        prefill_s = statistics.median(prefill(model, [prompt], 1).stats.seconds for _ in range(3)) / prompt_len
        rows = []
        for i, b in enumerate(batch_sizes):
            session = DecodeSession(model, prefill(model, [prompt], b), params, seed)
            session.advance(warmup + iters)
            timed = session.iterations[warmup:]
            rows.append({"batch_size": int(b), "context": int(round(statistics.fmean(t.context for t in timed))),
                         "s_per_iter": float(statistics.median(t.seconds for t in timed)), "n": len(timed)})
            if on_batch is not None:
                on_batch(i)
    return rows, prefill_s
