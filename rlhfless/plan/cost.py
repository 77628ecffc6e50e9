"""Cost model: a price catalog and the cost of invocations, steps and runs, in GPU-seconds and dollars.

Serverless: each invocation is billed on its own (`cost_invocation`, `cost_step`, `cost_run`); serverful: devices
x wall time x hourly price (`cost_serverful`). Prices are per device (one GPU, or one CPU core locally). The rule
it keeps: billing comes only from `plan.billing` (re-exported here), which the simulator and the runtime's meter
read too, so a step's predicted and billed device-seconds compare. The billed-seconds formula and how planner
and meter apply it: docs/internals.md#plancostpy.

Deviations from the paper:
1. Its platform bills "worker start to stop including a few seconds of idle, rounded up to 1 s"; each part is a
   rule here, by default (`PAPER_PLATFORM`) 1 s, no minimum, cold start billed, 2 s of billed keep-alive.
2. On-demand prices are the paper's 8-GPU VM prices / 8; H200 has none, so serverful H200 costing refuses.
3. The "cpu-core" unit is ours (`CPU_GB_PER_CORE`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from rlhfless.core import metrics as M
from rlhfless.core.errors import ConfigError, require
from rlhfless.plan import lifecycle
from rlhfless.plan.billing import PAPER_PLATFORM, BillingRules  # noqa: F401  (the one definition; re-exported)
from rlhfless.plan.records import Invocation

PRICE_DATE = "late 2026 public list prices as recorded in PAPER.md"
_SERVERLESS_SRC = "serverless GPU per-second list price (PAPER.md, 'Reference prices')"
_VM_SRC = "on-demand 8-GPU VM hourly list price / 8 (PAPER.md, 'Reference prices')"

# Memory per CPU core assumed when pricing a core from the CPU serverless GB-second price (an assumption:
# a common serverless memory-to-vCPU ratio; no source in PAPER.md states one).
CPU_GB_PER_CORE = 2.0
CPU_USD_PER_GB_S = 0.0000166667


@dataclass(frozen=True)
class DevicePrice:
    """Prices of one device kind.

    serverless_usd_per_s: serverless price per device-second.
    ondemand_usd_per_h: on-demand price per device-hour (None when not recorded).
    source, date: where the numbers come from, for reports.
    """

    kind: str
    serverless_usd_per_s: float
    ondemand_usd_per_h: float | None
    source: str
    date: str = PRICE_DATE


CATALOG: dict[str, DevicePrice] = {
    "H100": DevicePrice("H100", 0.00116, 55.04 / 8, f"{_SERVERLESS_SRC}; {_VM_SRC} ($55.04/h for 8)"),
    "A100-80G": DevicePrice("A100-80G", 0.00076, 21.96 / 8, f"{_SERVERLESS_SRC}; {_VM_SRC} ($21.96/h for 8)"),
    "H200": DevicePrice("H200", 0.00155, None, f"{_SERVERLESS_SRC}; no on-demand price recorded"),
    "L40S": DevicePrice("L40S", 0.00053, 30.13 / 8, f"{_SERVERLESS_SRC}; {_VM_SRC} ($30.13/h for 8)"),
    "cpu-core": DevicePrice(
        "cpu-core", CPU_USD_PER_GB_S * CPU_GB_PER_CORE, CPU_USD_PER_GB_S * CPU_GB_PER_CORE * 3600,
        f"CPU serverless ${CPU_USD_PER_GB_S}/GB-s (PAPER.md) x {CPU_GB_PER_CORE} GB per core (assumed); "
        "on-demand taken equal to the serverless rate (no CPU VM price recorded)",
    ),
}


def price(kind: str) -> DevicePrice:
    """Catalog entry of `kind`; an unknown kind raises ConfigError listing the known ones."""
    if kind not in CATALOG:
        raise ConfigError(f"plan.gpu_kind: unknown device kind {kind!r}; allowed: {', '.join(CATALOG)}")
    return CATALOG[kind]


@dataclass(frozen=True)
class CostSummary:
    """GPU-seconds (billed seconds x devices) and dollars, with billed seconds summed per function kind."""

    gpu_seconds: float
    usd: float
    billed_s_by_kind: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = {M.COST_GPU_S: self.gpu_seconds, M.COST_USD: self.usd}
        out.update({M.function_billed(k): v for k, v in self.billed_s_by_kind.items()})
        return out

    def __add__(self, other: CostSummary) -> CostSummary:
        kinds = dict(self.billed_s_by_kind)
        for k, v in other.billed_s_by_kind.items():
            kinds[k] = kinds.get(k, 0.0) + v
        return CostSummary(self.gpu_seconds + other.gpu_seconds, self.usd + other.usd, kinds)


def billed_seconds(inv: Invocation, rules: BillingRules, gap_s: float | None = None) -> float:
    """Billed seconds of one invocation (per device): its duration plus the idle billed after it, through
    `BillingRules.bill_held` (rounded up, at least the minimum; never negative). The idle is the function's life's
    (`plan.lifecycle.idle_billed_s`): under lifetime billing the gap `gap_s` to the same function's next invocation
    when its keep-alive covers it (kept warm through it), else the whole keep-alive (then released; gap_s None: no
    next invocation); none under per-invocation billing."""
    return rules.bill_held(inv.duration_s + lifecycle.idle_billed_s(gap_s, rules),
                           inv.cold_start_s if inv.cold else 0.0)


def billed_seconds_array(duration_s: np.ndarray, cold: np.ndarray, cold_start_s: np.ndarray | float,
                         rules: BillingRules) -> np.ndarray:
    """`billed_seconds` of many invocations at once; duration_s, cold (bool), cold_start_s broadcast together."""
    raw = np.asarray(duration_s, dtype=np.float64) + rules.idle_billed_s
    if not rules.bill_cold_start:
        raw = raw - np.where(cold, cold_start_s, 0.0)
    units = np.where(raw > 0, np.ceil(raw / rules.granularity_s - 1e-9), 0.0)  # 1e-9: as `bill_held`
    return np.maximum(rules.minimum_s, units * rules.granularity_s)


def cost_invocation(inv: Invocation, device: DevicePrice, rules: BillingRules) -> CostSummary:
    """Serverless cost of one invocation: billed seconds x devices x per-second price."""
    billed = billed_seconds(inv, rules)
    gpu_s = billed * inv.gpus
    return CostSummary(gpu_s, gpu_s * device.serverless_usd_per_s, {inv.kind: billed})


def cost_step(invocations: Iterable[Invocation], device: DevicePrice, rules: BillingRules,
              gaps: dict[tuple[str, int], float] | None = None) -> tuple[CostSummary, dict[str, float]]:
    """Serverless cost of one step: the sum over its invocations. Returns (summary, metrics).

    gaps: (kind, instance) -> seconds to that function's next invocation, for the functions kept warm into the
    next step (`billed_seconds`: billed the gap, not a fresh keep-alive); None or absent: released at its lapse.
    The sum of `cost_invocation`s in the same order (the same floats), without a summary per invocation."""
    total = step_cost(invocations, device, rules, gaps)
    return total, total.metrics()


def step_cost(invocations: Iterable[Invocation], device: DevicePrice, rules: BillingRules,
              gaps: dict[tuple[str, int], float] | None = None) -> CostSummary:
    """`cost_step`'s summary without its metrics dict: the scaler costs every candidate of every draw of every
    step with it (21k steps costed in 100 steps of design=extended) and reads only the totals. `billed_seconds`
    inlined, the same float operations in the same order (tests/test_plan_cost.py holds them equal for every
    rule set): its rule lookups are made once per step, not once per invocation."""
    gpu_s, usd, kinds = 0.0, 0.0, {}
    rate = device.serverless_usd_per_s
    gran, least, bill_cold = rules.granularity_s, rules.minimum_s, rules.bill_cold_start
    idle = lifecycle.idle_billed_s(None, rules)  # no next invocation: the shared rule, asked once a step
    gaps = gaps if gaps and rules.billed == "lifetime" else None  # a gap bills only under lifetime billing
    ceil, kind_s = math.ceil, kinds.get
    for inv in invocations:
        gap = gaps.get((inv.kind, inv.actor_id)) if gaps is not None else None
        held = (inv.end_s - inv.start_s) + (idle if gap is None else lifecycle.idle_billed_s(gap, rules))
        # `BillingRules.bill_held(held, cold_start_s if cold else 0.0)` (x - 0.0 is x: left out)
        raw = held if bill_cold or not inv.cold else held - inv.cold_start_s
        units = ceil(raw / gran - 1e-9) if raw > 0 else 0
        billed = units * gran
        if not billed > least:  # max(least, billed): the first unless the second is larger
            billed = least
        g = billed * inv.gpus
        gpu_s, usd = gpu_s + g, usd + g * rate
        kinds[inv.kind] = kind_s(inv.kind, 0.0) + billed
    return CostSummary(gpu_s, usd, kinds)


def cost_run(steps: Iterable[CostSummary]) -> tuple[CostSummary, dict[str, float]]:
    """Cost of a run: the sum of its steps' summaries. Returns (summary, metrics)."""
    total = CostSummary(0.0, 0.0)
    for s in steps:
        total = total + s
    return total, total.metrics()


def cost_serverful(n_devices: float, wall_s: float, device: DevicePrice) -> tuple[CostSummary, dict[str, float]]:
    """Serverful pool cost: n_devices held for wall_s seconds at the on-demand hourly price.

    Raises ConfigError for a device kind without a recorded on-demand price, or negative inputs.
    """
    require(n_devices >= 0, "serverful.n_devices", f"must be >= 0 (got {n_devices})")
    require(wall_s >= 0, "serverful.wall_s", f"must be >= 0 s (got {wall_s})")
    if device.ondemand_usd_per_h is None:
        raise ConfigError(f"plan.gpu_kind: {device.kind} has no on-demand price in the catalog; serverful cost "
                          f"needs one of: {', '.join(k for k, v in CATALOG.items() if v.ondemand_usd_per_h)}")
    gpu_s = n_devices * wall_s
    s = CostSummary(gpu_s, gpu_s * device.ondemand_usd_per_h / 3600.0)
    return s, s.metrics()
