"""Event core: a discrete-event loop with deterministic ties, and the observer that records what ran when.

`EventLoop` pops (time, priority, seq, handler) in that order, so runs are reproducible bit for bit; `Span` /
`Timeline` record every occupied device interval, with hooks (`Timeline.on_span`) and `invocations()` for the one
cost model (`plan.cost`). The rule it keeps: mechanism and observer only, no policy; decode actors are advanced
analytically by the planner's time model, not token by token. Details: docs/internals.md#simeventspy.

Deviations from the paper: none (the paper's simulator is Vidur plus its own scheduler, not published).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from rlhfless.core.errors import DataError
from rlhfless.plan.records import Invocation

# priorities at equal times: releases first (free devices before anyone asks), then stage starts, then the rest
PRIO_RELEASE, PRIO_START, PRIO_OTHER = 0, 1, 2


class EventLoop:
    """Deterministic discrete-event loop (docs/internals.md#simeventspy)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Callable[[EventLoop], None]]] = []
        self._seq = 0
        self.handled = 0

    def at(self, t: float, prio: int, fn: Callable[[EventLoop], None]) -> None:
        """Schedule fn(loop) at time t (>= now) with priority prio (lower runs first at equal times)."""
        if t < self.now - 1e-12:
            raise DataError(f"event scheduled in the past: t={t} < now={self.now}")
        # seq breaks ties in scheduling order: equal (t, prio) events replay identically and fn is never compared
        heapq.heappush(self._heap, (t, prio, self._seq, fn))
        self._seq += 1

    def after(self, dt: float, prio: int, fn: Callable[[EventLoop], None]) -> None:
        self.at(self.now + dt, prio, fn)

    def run(self, until: float = float("inf")) -> float:
        """Handle events in (time, priority, seq) order until none is left or the next is after `until`."""
        while self._heap and self._heap[0][0] <= until:
            t, _, _, fn = heapq.heappop(self._heap)
            self.now = max(self.now, t)
            self.handled += 1
            fn(self)
        return self.now


@dataclass(frozen=True)
class Span:
    """One occupied interval of `devices` devices: a function invocation or a held serverful pool.

    kind: decode, prefill, reward, reference, value, learner, sync, or pool (serverful hold).
    stage: the step stage it belongs to (rollout, score, update, ...); cold_s: seconds of cold start at its start.
    """

    kind: str
    instance: int
    start_s: float
    end_s: float
    devices: float
    stage: str
    cold: bool = False
    cold_s: float = 0.0
    step: int = 0
    billed: bool = True  # False: drawn only (a function inside a serverful pool, which is billed as a whole)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class Timeline:
    """The observer: spans in the order they closed, stage boundaries, and hooks."""

    spans: list[Span] = field(default_factory=list)
    stages: list[tuple[int, str, float, float]] = field(default_factory=list)  # (step, stage, start, end)
    hooks: list[Callable[[Span], None]] = field(default_factory=list)
    _by_step: dict[int, list[Span]] = field(default_factory=dict, init=False, repr=False, compare=False)
    """The billed spans of `spans[:_indexed]` by step, in the order they closed (`invocations` reads a step's
    without scanning every step's: a 100-step run scanned its spans 100 times). `spans` only grows."""
    _indexed: int = field(default=0, init=False, repr=False, compare=False)

    def on_span(self, hook: Callable[[Span], None]) -> None:
        self.hooks.append(hook)

    def add(self, span: Span) -> None:
        if span.end_s < span.start_s:
            raise DataError(f"span {span.kind}/{span.instance} ends before it starts")
        self.spans.append(span)
        for h in self.hooks:
            h(span)

    def stage(self, step: int, name: str, start: float, end: float) -> None:
        self.stages.append((step, name, start, end))

    def invocations(self, step: int | None = None) -> list[Invocation]:
        """The billed spans (of one step, or all) as `Invocation`s for `plan.cost`."""
        if step is None:
            spans = [s for s in self.spans if s.billed]
        else:
            for s in self.spans[self._indexed:]:  # those closed since the last call
                if s.billed:
                    self._by_step.setdefault(s.step, []).append(s)
            self._indexed = len(self.spans)
            spans = self._by_step.get(step, [])
        return [Invocation(s.kind, s.instance, s.start_s, s.end_s, s.cold, s.devices, s.cold_s) for s in spans]
