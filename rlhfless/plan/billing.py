"""Billing rules: the one definition of what a platform bills, read by the runtime's meter, the planner's cost
model (`plan.cost`) and the simulator (`sim`).

A `BillingRules` record holds the granularity (billed time is rounded up to a multiple of it), the minimum per
billed span, whether a cold start is billed, the keep-alive (idle timeout) and what is billed: "invocations"
(GPU-seconds summed over invocations, the paper's cost proxy: idle is not billed) or "lifetime" (a worker from
start to release, idle timeout included: what commercial serverless GPU platforms bill). The rule it keeps:
nothing else turns held time into billed seconds, so predicted and metered device-seconds compare. The named
rule sets (`runtime.billing`) and the cited sources of the runpod and modal presets:
docs/internals.md#planbillingpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlhfless.core.errors import ConfigError, require

BILLED = ("invocations", "lifetime")


@dataclass(frozen=True)
class BillingRules:
    """How a serverless platform turns function time into billed seconds; each field says its part."""

    granularity_s: float = 1.0
    """Each billed span is rounded up to a multiple of this (> 0 s; 1 s on Runpod and Modal)."""
    minimum_s: float = 0.0
    """Least billed per span (>= 0 s)."""
    bill_cold_start: bool = True
    """Whether the seconds from request to ready are billed (a worker is billed from its request)."""
    keep_alive_s: float = 2.0
    """Seconds an idle function stays warm, and billed under lifetime billing, before it is released (>= 0)."""
    billed: str = "lifetime"
    """lifetime: a worker's whole held time (commercial platforms); invocations: the sum over its invocations
    (the paper's GPU-second proxy)."""

    def __post_init__(self) -> None:
        require(self.granularity_s > 0, "plan.billing.granularity_s", f"must be > 0 s (got {self.granularity_s})")
        require(self.minimum_s >= 0, "plan.billing.minimum_s", f"must be >= 0 s (got {self.minimum_s})")
        require(self.keep_alive_s >= 0, "plan.billing.keep_alive_s", f"must be >= 0 s (got {self.keep_alive_s})")
        require(self.billed in BILLED, "plan.billing.billed", f"must be one of {list(BILLED)} (got {self.billed!r})")

    @classmethod
    def metered(cls, granularity_s: float, keep_alive_s: float, billed: str = "lifetime") -> BillingRules:
        """The rules a runtime bills with: its granularity and keep-alive (an idle worker stays warm that long),
        no minimum, cold start billed (a worker is billed from request)."""
        return cls(granularity_s=granularity_s, minimum_s=0.0, bill_cold_start=True, keep_alive_s=keep_alive_s,
                   billed=billed)

    @property
    def idle_billed_s(self) -> float:
        """Idle seconds billed after each invocation: the keep-alive under lifetime billing, none per invocation."""
        return self.keep_alive_s if self.billed == "lifetime" else 0.0

    def bill_held(self, held_s: float, cold_start_s: float = 0.0) -> float:
        """Billed seconds (per device) of a span held `held_s` seconds, of which `cold_start_s` were a cold start:
        rounded up to the granularity, at least the minimum, never negative."""
        raw = held_s - (0.0 if self.bill_cold_start else cold_start_s)
        # 1e-9 keeps an exact multiple (e.g. 3.0000000001 from float sums) from rounding up a whole unit
        units = math.ceil(raw / self.granularity_s - 1e-9) if raw > 0 else 0
        return max(self.minimum_s, units * self.granularity_s)


RUNPOD_IDLE_TIMEOUT_S = 5.0
"""Runpod docs, "Pricing" (Serverless): idle timeout default 5 seconds."""
MODAL_IDLE_TIMEOUT_S = 60.0
"""Modal docs, "Cold start performance": containers spin down after 60 seconds of inactivity by default."""
PER_SECOND = 1.0
"""Both platforms bill per second, rounded up (Runpod docs, "Pricing"; Modal: per second of container time)."""

PRESETS: dict[str, BillingRules] = {
    "runpod": BillingRules(PER_SECOND, 0.0, True, RUNPOD_IDLE_TIMEOUT_S, "lifetime"),
    "modal": BillingRules(PER_SECOND, 0.0, True, MODAL_IDLE_TIMEOUT_S, "lifetime"),
}
RULE_SETS = BILLED + tuple(PRESETS)
"""Names `runtime.billing` accepts."""


def rule_set(name: str, granularity_s: float, keep_alive_s: float) -> BillingRules:
    """The rules named `name`: invocations|lifetime with the given granularity and keep-alive; a platform preset
    with its own (sources: docs/internals.md#planbillingpy)."""
    if name in PRESETS:
        return PRESETS[name]
    if name not in BILLED:
        raise ConfigError(f"runtime.billing: must be one of {list(RULE_SETS)} (got {name!r})")
    return BillingRules.metered(granularity_s, keep_alive_s, name)


PAPER_PLATFORM = BillingRules()
"""The paper's platform as the planner and simulator price it by default: 1 s granularity, 2 s of billed
keep-alive, cold start billed ("worker start to stop including a few seconds of idle, rounded up to 1 s")."""
