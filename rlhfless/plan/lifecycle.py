"""A serverless function's life, written once: the runtime's serverless policy and the simulator both call it.

A function is COLD (none exists), STARTING (requested: its cold start runs), BUSY (an invocation runs), WARM_IDLE
(ready, no invocation: its keep-alive runs) or RELEASED (its keep-alive lapsed, or it was let go). What it decides:
  * keep-alive buys warmth: a function invoked again within its keep-alive of its last invocation is warm (no cold
    start) and, under lifetime billing, is billed the gap, not a fresh keep-alive per invocation (`idle_billed_s`,
    `life_billed_s`);
  * hold or release: with work predicted `next_work_s` ahead, a function is kept when the gap is inside its
    keep-alive, else let go at once (kept, it would bill the keep-alive and lapse before the work anyway)
    (`release_now`); the simulator's planner also lets go one whose held gap would bill more than the cold start
    it saves (`hold_pays`);
  * pre-warm that reaches its stage: start at the predicted end of the stage before - cold start - buffer, floored
    only at now (never at the stage before's start: a cold start longer than that stage then came too late);
    `prewarm_start_s`; retried by the caller as units free up;
  * the device budget: never more devices held than exist (`free_devices`, `peak_devices`: the invariant both
    sides test). Who calls what: the runtime's modes (`prewarm_start_s`, `let_go`), `runtime.streaming` (the
    decode pre-warm retried into units ranks free at their share), `plan.cost` (`idle_billed_s`), the simulator's
    `RLHFless` (`hold_pays`, `warm_after`, `free_devices`, `share_release`), the scaler's learner price
    (`plan.overlap`: `share_release`) and arm model (`prewarm_start_s`).
Pure, numpy-free, no I/O. Times are seconds on any one clock.

Deviations from the paper: its platform keeps a function "a few seconds" after each invocation; here the keep-alive
is the platform's rule (`plan.billing.BillingRules.keep_alive_s`), and releasing a function early, when the plan
knows its next work is past its keep-alive, is ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from rlhfless.plan.billing import BillingRules


class State(str, Enum):
    COLD = "cold"
    STARTING = "starting"
    WARM_IDLE = "warm_idle"
    BUSY = "busy"
    RELEASED = "released"


def billed_in(state: State, rules: BillingRules) -> bool:
    """Whether seconds spent in `state` are billed under `rules`: busy always; starting when cold starts are billed;
    warm and idle under lifetime billing only; cold and released never."""
    if state is State.BUSY:
        return True
    if state is State.STARTING:
        return rules.bill_cold_start
    if state is State.WARM_IDLE:
        return rules.billed == "lifetime"
    return False


def warm_after(gap_s: float, keep_alive_s: float) -> bool:
    """Whether a function idle `gap_s` seconds after its last invocation is still warm (keep-alive buys warmth)."""
    if keep_alive_s < 0:
        raise ValueError(f"keep_alive_s must be >= 0 (got {keep_alive_s})")
    return keep_alive_s > 0 and 0.0 <= gap_s <= keep_alive_s


def idle_billed_s(gap_s: float | None, rules: BillingRules) -> float:
    """Idle seconds billed after an invocation (per device, before rounding): the gap to the function's next
    invocation when it comes inside the keep-alive (kept warm through it), else the whole keep-alive (then released);
    `gap_s` None: no next invocation (released at the lapse). None under per-invocation billing."""
    if rules.billed != "lifetime":
        return 0.0
    if gap_s is not None and warm_after(gap_s, rules.keep_alive_s):
        return max(0.0, gap_s)
    return rules.keep_alive_s


def release_now(next_work_s: float | None, keep_alive_s: float) -> bool:
    """Whether an idle function is let go now: its next work is predicted past its keep-alive (kept, it would bill
    the keep-alive and lapse first). Unknown next work: kept (the platform's own rule releases it at the lapse)."""
    if keep_alive_s < 0:
        raise ValueError(f"keep_alive_s must be >= 0 (got {keep_alive_s})")
    if next_work_s is None:
        return keep_alive_s == 0
    return not warm_after(next_work_s, keep_alive_s)


def hold_pays(gap_s: float, cold_s: float, keep_alive_s: float) -> bool:
    """Whether a function idle for a gap of `gap_s` seconds before its next work is held through it (warm, billed
    the gap) rather than released at once and started again (billed a cold start of `cold_s`, which a pre-warm
    keeps off the critical path): only when its keep-alive covers the gap and the gap bills less than the cold
    start. The planner's hold-or-release, on the numbers it bills."""
    return warm_after(gap_s, keep_alive_s) and gap_s < cold_s


def let_go(next_work_s: float | None, cold_s: float, keep_alive_s: float) -> bool:
    """Whether an idle function is released now rather than held to its next work, `next_work_s` ahead (None:
    unknown): unknown work keeps it unless there is no keep-alive (the platform releases it at the lapse); known
    work keeps it only when holding pays (`hold_pays`: inside the keep-alive, and the gap bills less than the
    cold start). The runtime's hold-or-release for separate-image functions."""
    if keep_alive_s < 0:
        raise ValueError(f"keep_alive_s must be >= 0 (got {keep_alive_s})")
    if next_work_s is None:
        return keep_alive_s == 0
    return not hold_pays(next_work_s, cold_s, keep_alive_s)


def life_billed_s(spans: list[tuple[float, float]], cold_s: float, rules: BillingRules) -> float:
    """Billed seconds (per device) of one function's life: its invocations `spans` [(start, end)] in order, the
    first of which began with a cold start of `cold_s` seconds (0: it was warm), each gap idle-billed by
    `idle_billed_s`. A gap past the keep-alive ends a life (released: the next span would be another function's
    cold start, which the caller bills as such). Lifetime billing rounds each life once; per-invocation billing
    rounds each invocation (a single span equals `plan.cost.billed_seconds` of that invocation)."""
    if not spans:
        return 0.0
    if rules.billed != "lifetime":
        return sum(rules.bill_held(b - a, cold_s if k == 0 else 0.0) for k, (a, b) in enumerate(spans))
    total, held, cold = 0.0, 0.0, cold_s
    for k, (a, b) in enumerate(spans):
        held += b - a
        gap = spans[k + 1][0] - b if k + 1 < len(spans) else None
        held += idle_billed_s(gap, rules)
        if gap is None or not warm_after(gap, rules.keep_alive_s):
            total += rules.bill_held(held, cold)
            held, cold = 0.0, 0.0
    return total


PREWARM_HISTORY = 3
"""Steps of measured durations and cold starts the pre-warm rules read (the runtime's `policy.History`)."""


def planned_start_s(predicted_makespan_s: float, ratios) -> float:
    """A stage's expected start from the plan: the predicted makespan x the mean recent measured / predicted
    ratio (the plan alone runs early: a group's mean predicted length misses its longest sample); x 1 before any
    ratio is measured."""
    return predicted_makespan_s * sum(ratios) / len(ratios) if ratios else predicted_makespan_s


def prewarm_start_s(expected_s: float, cold_s: float, buffer_s: float, now_s: float = 0.0) -> float:
    """When to start a function so it is ready at its stage's expected start `expected_s` (the predicted end of the
    stage before, on the caller's clock): expected - its cold start - a buffer, floored only at `now_s` (start at
    once when that is already past). The one copy of the pre-warm rule (the runtime's modes, the simulator)."""
    return max(now_s, expected_s - cold_s - buffer_s)


def free_devices(n_devices: float, held: float) -> float:
    """Devices a function may take (pre-warm, or be kept on) while others hold `held` of the `n_devices`."""
    return max(0.0, n_devices - held)


def share_release(go: bool, waiting: bool, n_devices: float, held: float, rank_devices: float) -> bool:
    """Whether a separate-image learner's ranks but the reducer are let go at their share (the runtime's
    `LearnerStream._shared`, the simulator's play of it and the scaler's price of it): `go` (`let_go` said so: its
    next work is past its keep-alive, or holding bills more than the cold start), or a pre-warm `waiting` for
    devices while the learner's ranks hold `held` of the `n_devices` and leave fewer than one rank's
    (`rank_devices`) free (the runtime's "no free unit": it asks the ranks to go)."""
    return go or (waiting and free_devices(n_devices, held) < rank_devices)


def peak_devices(spans: Iterable[tuple[float, float, float]]) -> float:
    """The most devices held at once over intervals [(start, end, devices)] (an end frees its devices before a
    start at the same instant takes them: a unit handed over is not held twice)."""
    # instants within a nanosecond are one (a hand-over computed along two float paths differs in the last bit)
    events = sorted([(round(a, 9), 1, d) for a, b, d in spans if b > a] +
                    [(round(b, 9), 0, -d) for a, b, d in spans if b > a])
    held = peak = 0.0
    for _, _, d in events:
        held += d
        peak = max(peak, held)
    return peak


def within_budget(spans: Iterable[tuple[float, float, float]], n_devices: float) -> bool:
    """The device-count invariant: never more devices held (or billed) at once than exist (1e-9: float sums)."""
    return peak_devices(spans) <= n_devices + 1e-9
