"""The ledger: every invocation of the run (`InvocationRecord`), the step's counters and the run's totals, the
releases counted per step, and `invocations.jsonl`. The meter (`runtime.meter`) turns its records into the bill.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlhfless.core import metrics as M
from rlhfless.runtime.records import InvocationRecord, zero_held


class Ledger:
    """What ran, on which worker, when (on the step clock: `clock.rel`), and the counts a step reports."""

    def __init__(self, clock):
        self.clock = clock
        self.invocations: list[InvocationRecord] = []
        self.counters: dict[str, float] = {}
        self.totals: dict[str, float] = {}
        self._written = 0
        self._invoked: set[str] = set()
        self._expired_seen = 0  # releases at a lapse already counted in a step's metrics
        self._early_seen = 0  # learner ranks released at their share already counted

    def count(self, key: str, n: float = 1.0) -> None:
        self.counters[key] = self.counters.get(key, 0.0) + n

    def record(self, step: int, kind: str, h, requested: float, started: float, finished: float, cold: bool,
               attempt: int = 1, ok: bool = True, groups: list[int] | None = None, engine: str = "",
               busy: list | None = None, **extra) -> None:
        """One invocation; `busy`: its compute intervals (monotonic clock) when it did not compute throughout."""
        rel = self.clock.rel
        started = max(started, requested)
        spans = [[rel(a), rel(b)] for a, b in busy or [] if b > a]
        self.invocations.append(InvocationRecord(step, kind, h.worker, float(len(h.cores)), rel(requested),
                                                 rel(started), rel(max(finished, started)), cold,
                                                 attempt, ok, {k: float(v) for k, v in extra.items()},
                                                 sorted(groups or []), engine, spans))

    def first_use(self, h) -> bool:
        """True the first time a worker is invoked (its invocation carries the cold start)."""
        if h.worker in self._invoked:
            return False
        self._invoked.add(h.worker)
        return True

    def decode_busy_s(self, step: int) -> float:
        """Busy seconds of the step's decode invocations that succeeded."""
        return sum(i.busy_s for i in self.invocations if i.step == step and i.kind == "decode" and i.ok)

    def add_totals(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.totals[k] = self.totals.get(k, 0.0) + v

    def release_counts(self, pool, rows: list[dict], a: float, b: float) -> dict[str, float]:
        """Functions released at their keep-alive's lapse since the last step's end (mid-step: the lapse after this
        step's rollout began and before its update ended; one noticed late is counted when noticed, at its lapse
        instant), and the intervals in [a, b) with nothing held at all (before the run's first worker started is
        not one)."""
        clock = self.clock
        lapses = [t for t, _ in pool.expired[self._expired_seen:]]
        self._expired_seen = len(pool.expired)
        early = [t for t, _ in pool.released_early[self._early_seen:]]  # learner ranks whose share was done
        self._early_seen = len(pool.released_early)
        s0 = clock.rel(clock.stage_t0) if clock.stage_t0 is not None else b
        s1 = clock.rel(clock.last_learn_end) if clock.last_learn_end is not None and \
            clock.rel(clock.last_learn_end) >= s0 else b
        first = min((r["spawned_s"] for r in rows), default=b)
        zeros = zero_held(rows, max(a, first), b)
        return {M.RUNTIME_RELEASED_EXPIRED: float(len(lapses)),
                M.RUNTIME_RELEASED_MID_STEP: float(sum(s0 <= t <= s1 for t in lapses + early)),
                M.RUNTIME_RANKS_RELEASED_EARLY: float(len(early)),
                M.RUNTIME_ZERO_HELD: float(len(zeros)), M.RUNTIME_ZERO_HELD_S: sum(y - x for x, y in zeros)}

    def write(self, path: Path) -> None:
        """Append the invocations not written yet to `invocations.jsonl`."""
        with path.open("a") as f:
            for inv in self.invocations[self._written:]:
                f.write(json.dumps(inv.to_json()) + "\n")
        self._written = len(self.invocations)
