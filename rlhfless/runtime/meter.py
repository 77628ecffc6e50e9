"""The billing meter: the only place the runtime turns what workers did into device-seconds and dollars.

The rule it keeps (per worker, both modes): a worker is billed from request to release, cold start and idle
included, rounded up to `granularity_s`, times its device units, by `plan.cost.BillingRules`, the rules the
planner prices with (`billing_rules(runtime_cfg)`). Per-step numbers slice lifetimes at step boundaries, unrounded;
off-the-clock intervals (`StepClock.off_clock`) are cut from every worker's held time; a hybrid function's time is
split by role (`role_split`). Details: docs/internals.md#runtimemeterpy.

Deviations from the paper's platform (start to stop plus a few seconds of idle, rounded up to 1 s):
1. Rounding is 1 ms (CPU steps last about a second); `runtime.billing_granularity_s=1` restores 1 s.
2. Idle is billed as it really happened (keep-alive), not as a constant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from rlhfless.core import metrics as M
from rlhfless.plan.cost import BillingRules, DevicePrice
from rlhfless.runtime.records import InvocationRecord, WorkerRecord, role


@dataclass(frozen=True)
class Bill:
    """Billed device-seconds and dollars over a window, with the parts that explain them."""

    device_s: float
    usd: float
    by_kind: dict[str, float] = field(default_factory=dict)
    """Billed device-seconds per function kind (a pool worker's time is billed to "pool")."""
    busy_s: float = 0.0
    """Device-seconds spent inside invocations."""
    cold_starts: int = 0
    cold_start_s: float = 0.0

    @property
    def idle_fraction(self) -> float:
        """Share of billed device-seconds not spent inside an invocation (cold starts and keep-alive included)."""
        return 1.0 - self.busy_s / self.device_s if self.device_s > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        out = {M.COST_DEVICE_S: self.device_s, M.COST_USD: self.usd, M.RUNTIME_IDLE_FRACTION: self.idle_fraction,
               M.RUNTIME_COLD_STARTS: float(self.cold_starts), M.RUNTIME_COLD_START_S: self.cold_start_s}
        out.update({M.function_billed(k): v for k, v in self.by_kind.items()})
        return out


def billing_rules(rt, decode: bool = False) -> BillingRules:
    """The billing rules of a runtime config (`runtime.billing`, `runtime.billing_granularity_s`,
    `runtime.keep_alive_s`: `RuntimeConfig.billing_rules`): what this meter bills with and what the planner must
    price with (`plan.billing`). decode=True: the rules of a decode function as the planner prices it: with the
    hybrid image (serverless) its time after the decode may go on as a learner rank and is then billed to the
    learner (`role_split`), so no keep-alive is priced after the decode."""
    base = rt.billing_rules() if hasattr(rt, "billing_rules") else \
        BillingRules.metered(rt.billing_granularity_s, rt.keep_alive_s)
    hybrid = decode and rt.hybrid and rt.mode == "serverless"
    return replace(base, keep_alive_s=0.0) if hybrid else base


def _rules(rules: float | BillingRules) -> BillingRules:
    """A bare granularity (the older signature) as rules: no minimum, cold start billed; the keep-alive is not
    added by the meter (it measures the idle that happened), so it does not matter here."""
    return rules if isinstance(rules, BillingRules) else BillingRules.metered(float(rules), 0.0)


def rounded(seconds: float, granularity_s: float | BillingRules) -> float:
    """`seconds` rounded up to a multiple of the granularity (an exact multiple stays, despite float noise)."""
    return _rules(granularity_s).bill_held(seconds) if seconds > 0 else 0.0


def _kind(w: WorkerRecord) -> str:
    return role(tuple(w.kinds))


_BILLED_AS = {"reward": "decode"}
"""Invocation kinds billed to the function they run inside (scoring runs in the decode function)."""


def role_split(w: WorkerRecord, invocations: Sequence[InvocationRecord], a: float, b: float,
               paused: Paused = ()) -> dict[str, float]:
    """Seconds of [a, b) inside w's lifetime (less `paused`), by the role it was in: a single-kind worker's all
    go to its kind; a hybrid worker's instant t goes to the kind of its last invocation requested at or before t
    (idle after work is that work's keep-alive), before its first one to the first's kind (its cold start).
    A multi-kind worker not invoked yet is billed to its image's first kind: a hybrid one is a pre-warmed decode
    function (a learner rank is invoked from its start), PPO's critic image a pre-warmed value function. `invocations`: w's own, any order, all of them so far (a window's split needs the ones before it: a
    worker's idle at a step's start is the keep-alive of its previous step's work). Pure; the parts sum to the
    held seconds."""
    end = w.released_s if w.released_s is not None else b
    lo, hi = max(w.spawned_s, a), min(end, b)
    if hi <= lo:
        return {}
    mine = sorted((i for i in invocations if i.worker == w.worker), key=lambda i: i.requested_s)
    if len(w.kinds) == 1 or role(tuple(w.kinds)) == "pool":
        return {_kind(w): hi - lo - overlap_s(lo, hi, paused)}
    if not mine:
        return {w.kinds[0]: hi - lo - overlap_s(lo, hi, paused)}
    cuts = [lo] + [i.requested_s for i in mine[1:] if lo < i.requested_s < hi] + [hi]
    kinds = [_BILLED_AS.get(mine[0].kind, mine[0].kind)]
    for i in mine[1:]:
        if lo < i.requested_s < hi:
            kinds.append(_BILLED_AS.get(i.kind, i.kind))
        elif i.requested_s <= lo:
            kinds[0] = _BILLED_AS.get(i.kind, i.kind)
    out: dict[str, float] = {}
    for k, s, e in zip(kinds, cuts, cuts[1:]):
        out[k] = out.get(k, 0.0) + (e - s) - overlap_s(s, e, paused)
    return out


def _usd_per_s(price: DevicePrice, serverful: bool) -> float:
    if serverful and price.ondemand_usd_per_h is not None:
        return price.ondemand_usd_per_h / 3600.0
    return price.serverless_usd_per_s


Paused = Sequence[tuple[float, float]]
"""Run-relative [start, end) intervals billed to no one (see "Off the clock" above)."""


def overlap_s(a: float, b: float, paused: Paused) -> float:
    """Seconds of [a, b) inside the (disjoint) `paused` intervals."""
    return sum(max(0.0, min(b, p1) - max(a, p0)) for p0, p1 in paused)


def _held(w: WorkerRecord, t0: float, t1: float, now: float, paused: Paused) -> float:
    end = w.released_s if w.released_s is not None else now
    return w.held(t0, t1, now) - overlap_s(max(w.spawned_s, t0), min(end, t1), paused)


def _by_worker(invocations: Sequence[InvocationRecord]) -> dict[str, list[InvocationRecord]]:
    """Invocations by worker id: `role_split` per worker without scanning the run's every invocation each time."""
    out: dict[str, list[InvocationRecord]] = {}
    for i in invocations:
        out.setdefault(i.worker, []).append(i)
    return out


def _billed_as(kind: str) -> str:
    return _BILLED_AS.get(kind, kind)


def invocation_span(i: InvocationRecord, w: WorkerRecord | None, rules: BillingRules) -> tuple[float, float]:
    """[start, end) of an invocation as per-invocation billing bills it: request to reply; a cold invocation from
    its worker's start when cold starts are billed (the cold start is part of the call that caused it)."""
    start = w.spawned_s if (i.cold and w is not None and rules.bill_cold_start) else i.requested_s
    return min(start, i.requested_s), i.finished_s


def _invocation_bill(workers: Sequence[WorkerRecord], invocations: Sequence[InvocationRecord], t0: float,
                     t1: float, rules: BillingRules, paused: Paused, rounded_: bool) -> tuple[float, dict[str, float]]:
    """Per-invocation billing (`BillingRules.billed == "invocations"`, the paper's cost proxy): every invocation's
    span inside [t0, t1) times its units, less `paused`; `rounded_`: each whole span rounded through `bill_held`
    (the run total), else clipped to the window (a step)."""
    by_worker = {w.worker: w for w in workers}
    by_kind: dict[str, float] = {}
    total = 0.0
    for i in invocations:
        a, b = invocation_span(i, by_worker.get(i.worker), rules)
        lo, hi = max(a, t0), min(b, t1)
        if hi <= lo:
            continue
        held = hi - lo - overlap_s(lo, hi, paused)
        s = (rules.bill_held(held) if rounded_ else held) * i.units
        by_kind[_billed_as(i.kind)] = by_kind.get(_billed_as(i.kind), 0.0) + s
        total += s
    return total, by_kind


def bill_window(workers: Sequence[WorkerRecord], invocations: Iterable[InvocationRecord], t0: float, t1: float,
                now: float, price: DevicePrice, serverful: bool, paused: Paused = (),
                rules: BillingRules | None = None) -> Bill:
    """Device-seconds billed inside [t0, t1): every worker's held time in the window, less any `paused` time,
    times its units (unrounded); under per-invocation rules (`rules.billed == "invocations"`) the invocations'
    spans instead. `invocations`: every one so far, not only the window's (a hybrid worker's split by role needs
    its earlier ones; busy time is clipped to the window).

    Cold starts are counted for workers that became ready inside the window.
    """
    by_kind: dict[str, float] = {}
    total = cold_s = 0.0
    colds = 0
    invocations = list(invocations)
    by_worker = _by_worker(invocations)
    for w in workers:
        # unrounded: rounding is per lifetime, which a window's slice is not (`bill_run` rounds each lifetime once)
        held = _held(w, t0, t1, now, paused) * w.units
        if held > 0:
            for k, s in role_split(w, by_worker.get(w.worker, ()), t0, min(t1, now), paused).items():
                by_kind[k] = by_kind.get(k, 0.0) + s * w.units
            total += held
        if w.ready_s is not None and t0 <= w.ready_s < t1:
            colds += 1
            cold_s += w.cold_start_s
    if rules is not None and rules.billed == "invocations" and not serverful:
        total, by_kind = _invocation_bill(workers, invocations, t0, min(t1, now), rules, paused, False)
    busy = sum(i.busy_in(t0, t1) * i.units for i in invocations)
    return Bill(total, total * _usd_per_s(price, serverful), by_kind, min(busy, total), colds, cold_s)


def bill_run(workers: Sequence[WorkerRecord], invocations: Iterable[InvocationRecord], now: float,
             price: DevicePrice, serverful: bool, granularity_s: float | BillingRules, paused: Paused = ()) -> Bill:
    """The whole run under the rules (a float is a granularity): lifetime billing bills each lifetime (spawn to
    release, measured idle included, `paused` time cut out) once through `BillingRules.bill_held`, times its
    units; per-invocation billing (serverless only) each invocation's span (`invocation_span`) instead."""
    rules = _rules(granularity_s)
    by_kind: dict[str, float] = {}
    total = 0.0
    invocations = list(invocations)
    by_worker = _by_worker(invocations)
    for w in workers:
        end = w.released_s if w.released_s is not None else now
        cold = w.cold_start_s if w.ready_s is not None else 0.0
        held = end - w.spawned_s - overlap_s(w.spawned_s, end, paused)
        billed = rules.bill_held(held, cold) * w.units
        # the rounded bill shared out like the measured held time
        for k, s in role_split(w, by_worker.get(w.worker, ()), w.spawned_s, end, paused).items():
            by_kind[k] = by_kind.get(k, 0.0) + (billed * s / held if held > 0 else 0.0)
        total += billed
    if rules.billed == "invocations" and not serverful:
        total, by_kind = _invocation_bill(workers, invocations, float("-inf"), now, rules, paused, True)
    busy = sum(i.busy_s * i.units for i in invocations)
    colds = [w for w in workers if w.ready_s is not None]
    return Bill(total, total * _usd_per_s(price, serverful), by_kind, min(busy, total), len(colds),
                sum(w.cold_start_s for w in colds))


USAGE = ("busy", "idle", "cold")
"""How a held device-second was spent (`usage_window`): computing, held but idle, or starting."""


def usage_window(workers: Sequence[WorkerRecord], invocations: Iterable[InvocationRecord], t0: float, t1: float,
                 now: float, paused: Paused = ()) -> dict[str, dict[str, float]]:
    """Held device-seconds inside [t0, t1) by role and by how they were spent: {role: {busy, idle, cold}}.
    cold: from a worker's start to its ready; busy: inside its invocations' compute intervals
    (`InvocationRecord.busy_spans`: a learner rank waiting for groups is not busy); idle: the rest of its held
    time (keep-alive, waiting for groups or peers). Roles as billed (`role_split`; a serverful pool worker is
    "pool" throughout). Counts every held second, whatever the billing rules bill. Pure."""
    out: dict[str, dict[str, float]] = {}
    invocations = list(invocations)
    by_worker = _by_worker(invocations)

    def add(role_: str, what: str, s: float) -> None:
        if s > 0:
            d = out.setdefault(role_, dict.fromkeys(USAGE, 0.0))
            d[what] += s

    for w in workers:
        end = min(w.released_s if w.released_s is not None else now, t1)
        mine = by_worker.get(w.worker, ())
        held = role_split(w, mine, t0, end, paused)
        if not held:
            continue
        pool = _kind(w) == "pool"
        ready = w.ready_s if w.ready_s is not None else end
        cold = role_split(w, mine, t0, min(ready, end), paused) if ready > max(w.spawned_s, t0) else {}
        busy: dict[str, float] = {}
        for i in mine:
            k = "pool" if pool else _billed_as(i.kind)
            spans = [(max(a, t0), min(b, end)) for a, b in i.busy_spans()]
            busy[k] = busy.get(k, 0.0) + sum(b - a - overlap_s(a, b, paused) for a, b in spans if b > a)
        for k, h in held.items():
            c, b = cold.get(k, 0.0), min(busy.get(k, 0.0), h - cold.get(k, 0.0))
            add(k, "cold", c * w.units)
            add(k, "busy", b * w.units)
            add(k, "idle", max(0.0, h - c - b) * w.units)
    return out


def usage_metrics(usage: dict[str, dict[str, float]]) -> dict[str, float]:
    """`function/<role>/{busy,idle,cold}_s` of a `usage_window`."""
    return {M.function_usage(k, what): v for k, d in usage.items() for what, v in d.items()}
