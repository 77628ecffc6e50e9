"""Fixed schedules the runtime and the simulator share: the learner's work by group index (the pre-warm rule is
in `plan.lifecycle`, with the rest of a function's life).

Both sides read these, so the simulator can model what the runtime does without importing it (or torch): a rank's
groups are fixed by index, never by arrival, which is what keeps an overlapped update bitwise the sequential one.
"""

from __future__ import annotations

def microbatches(n_groups: int, per_microbatch: int, world: int) -> list[list[list[int]]]:
    """The fixed plan of an accumulated update: [rank][chunk] -> group indices, by group index only.

    Args:
        n_groups: B groups of the step, indexed 0..B-1.
        per_microbatch: m >= 1 groups per micro-batch (chunk k = groups k*m .. k*m+m-1; the last may be shorter).
        world: L >= 1 learner ranks; rank r gets a contiguous run of chunks, run sizes differing by at most one.
    Returns:
        L lists of chunks (each a list of group indices), in index order; ranks may have no chunk.
    """
    if per_microbatch < 1 or world < 1:
        raise ValueError(f"per_microbatch and world must be >= 1 (got {per_microbatch}, {world})")
    chunks = [list(range(k, min(k + per_microbatch, n_groups))) for k in range(0, n_groups, per_microbatch)]
    base, extra = divmod(len(chunks), world)
    out, pos = [], 0
    for r in range(world):
        n = base + (1 if r < extra else 0)
        out.append(chunks[pos:pos + n])
        pos += n
    return out
