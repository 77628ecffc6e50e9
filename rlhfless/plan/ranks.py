"""When a learner rank starts and when it goes: the runtime's learner width, decided per step from the backlog.

The data-parallel degree (how many shares the update is cut into, `plan.schedule.microbatches`) is equal in both
modes: the shares' sum is what makes the weights bitwise equal across modes. What the plan decides is when each
rank's function holds a device:
  * start: a rank starts when its first groups are ready (or a pre-warm ahead of them), never to wait idle;
  * go: a rank whose share is written is done (the reducer sums the shares); it is released at once unless work
    the plan knows of (the next step's decode, for a hybrid function) comes before its keep-alive would lapse;
  * hold: instead, a hybrid rank's function stays held (billed, idle) to the update's end where it would lapse
    before the next step otherwise, its keep-alive then covers the driver's gap, and the hold bills less than the
    cold start of the function that would replace it (`hold_after_share`).
Pure and numpy-free; the runtime (`runtime.streaming`) calls it, the simulator's `size_learner` is the same idea
at block level (start only what the backlog needs).
"""

from __future__ import annotations


def release_after_share(next_work_s: float | None, keep_alive_s: float) -> bool:
    """Whether a rank whose share is written is released now (True) or kept warm for its keep-alive (False).

    next_work_s: predicted seconds until the plan gives the function work again (None: unknown).
    keep_alive_s: the platform's idle window (>= 0).
    A function kept idle past its keep-alive is released at the lapse anyway: kept for nothing, it bills
    keep_alive_s of held-idle time. Work due inside the window keeps it (warm: no cold start later). Unknown:
    keep it (the platform's own rule, which releases at the lapse)."""
    if keep_alive_s < 0:
        raise ValueError(f"keep_alive_s must be >= 0 (got {keep_alive_s})")
    if next_work_s is None:
        return keep_alive_s == 0
    return next_work_s > keep_alive_s


def hold_after_share(tail_s: float | None, between_s: float | None, keep_alive_s: float,
                     cold_start_s: float) -> bool:
    """Whether a rank whose share is written stays held (its function billed, idle, out of the step's group) to
    the update's end instead of going at its share (then `release_after_share` does not apply).

    tail_s: predicted seconds from the share to the update's end (None: unknown);
    between_s: predicted driver gap from the update's end to the next step's decode (None: unknown, taken as 0);
    keep_alive_s: the platform's idle window; cold_start_s: a new function's measured cold start.
    Let go at its share, a function whose next work comes past its keep-alive lapses, and the next step starts
    a new one in its place: the cold start is billed and, when the gap is shorter than it, sits on the next
    rollout's critical path (a pre-warm cannot start it early enough). Held, it bills the tail as held-idle and,
    idle from the update's end, is still warm at the next step when its keep-alive covers the gap. So: hold when
    the function would lapse (tail + gap > keep-alive), the gap fits inside the keep-alive, and the tail bills
    less than the cold start it saves. Unknown tail (no update measured yet): hold (bounded by one update's tail;
    the platform's own default keeps a function for its keep-alive anyway). Keep-alive 0 holds nothing."""
    if keep_alive_s < 0 or cold_start_s < 0:
        raise ValueError(f"keep_alive_s and cold_start_s must be >= 0 (got {keep_alive_s}, {cold_start_s})")
    if keep_alive_s == 0:
        return False
    gap = max(0.0, between_s or 0.0)
    if gap > keep_alive_s:
        return False  # it would lapse between steps anyway: holding buys nothing
    if tail_s is None:
        return True
    tail = max(0.0, tail_s)
    return tail + gap > keep_alive_s and tail < cold_start_s


def next_work_after_share(tails_s: list[float], between_s: list[float]) -> float | None:
    """Predicted seconds from a rank's share to its next work: the shortest recent tail of the update after the
    first share came in, plus the shortest recent driver gap between steps (the pre-warm rule's optimism: a
    function released too early costs a cold start, one kept too long only its idle). None before any history."""
    if not tails_s:
        return None
    return max(0.0, min(tails_s)) + (max(0.0, min(between_s)) if between_s else 0.0)


def reducer(replied: list[int]) -> int:
    """The rank that reduces the shares and steps: the last whose share came in (it is still warm and holds the
    step's version; the earlier ones may be gone). replied: ranks in the order their shares came in."""
    if not replied:
        raise ValueError("no share came in")
    return replied[-1]
