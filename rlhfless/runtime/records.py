"""Typed records of the runtime: what every worker and every invocation did, in seconds since the run started.

`WorkerRecord` is one worker's lifetime (the billed interval: a worker is billed from the moment it is requested
until it is released, cold start included, whatever it did in between). `InvocationRecord` is one function call on
a worker (busy time). The meter (`rlhfless.runtime.meter`) turns them into billed device-seconds; the Gantt chart
and the simulator's validation read them back from `OUT/workers.jsonl` and `OUT/invocations.jsonl`.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from rlhfless.core.errors import DataError, TrainingError


def now() -> float:
    """The clock of every record, shared by driver and workers (CLOCK_MONOTONIC is system-wide on Linux)."""
    return time.monotonic()


def fail(what: str, attempts: int) -> TrainingError:
    """The error of a function that failed every attempt; its attempts are in invocations.jsonl."""
    return TrainingError(f"runtime: {what} failed {attempts} times (runtime.max_attempts); see invocations.jsonl")


KINDS_ALL = ("decode", "reward", "reference", "learner")
"""The kinds a serverful pool worker runs: all of them."""
HYBRID = ("decode", "learner")
"""The kinds of a serverless function with the hybrid image (runtime.hybrid): decode, then learner rank."""
CRITIC_IMAGE = ("values", "critic")
"""PPO's critic function image: the value forward, then (on the same warm worker) the critic update."""


def role(kinds: tuple[str, ...]) -> str:
    """A worker's label in ids, bills and cold-start means: its kind, "decode+learner" for the hybrid image,
    "pool" for a serverful pool worker."""
    if len(kinds) == 1:
        return kinds[0]
    return "pool" if set(kinds) == set(KINDS_ALL) else "+".join(kinds)


RELEASE_REASONS = ("share", "plan", "lapse", "evicted", "regroup", "end", "stopped", "killed", "left", "other")
"""Why the runtime let a worker go (`WorkerRecord.release_reason`), each stamped where the runtime decides:
* share: a learner rank released at its share, the plan having no work for it inside its keep-alive
  (`plan.ranks.release_after_share`);
* plan: a separate-image function released at once when its invocation ended, the plan's next work for it (the
  next step's stage of its kind) being past its keep-alive (`plan.lifecycle.release_now`): its unit goes to the
  next stage's pre-warm;
* lapse: its keep-alive lapsed idle (`Pool.expire`; with keep-alive 0 at once when it has no work:
  `policy.no_work_now`);
* evicted: released to free units for waiting work (`Pool.make_room`; a held rank given up for a reducer retry);
* regroup: a learner rank kept warm from the last step, released because the step's ranks are not all kept ones
  (a new data-parallel group forms: `policy.learner_ranks`);
* end: the run ended (`Pool.release_all`); stopped: ended at once, its work discarded or the driver interrupted
  (`Pool.stop`, `Pool.stop_all`); killed: it died; left: it left a data-parallel group broken by a peer's death;
* other: any other release the runtime chose (a single-use prefill function, a surplus warm worker, a preempted
  one)."""


@dataclass
class WorkerRecord:
    """One worker process from request to release.

    kinds: function kinds it may run (one for a serverless function; all of them for a serverful pool worker).
    spawned_s: when the runtime asked for it (billing starts); ready_s: when it had loaded its model and could
    take work (ready_s - spawned_s is the measured cold start); released_s: when it stopped (billing ends);
    None while alive. pid, node: its process and, on a cluster, its node (both as reported once it is ready).
    killed: it died (kill -9 or a crash) instead of being released. stopped: the runtime ended it at once (its work
    was being discarded) instead of asking it to shut down. prewarmed: started ahead of need by the pre-warming
    policy. release_reason: why it was released (`RELEASE_REASONS`), None while alive and in records written
    before the field existed (the simulator's validation refuses to guess it: `sim.modelled`).
    """

    worker: str
    kinds: tuple[str, ...]
    units: float
    cores: tuple[int, ...]
    spawned_s: float
    ready_s: float | None = None
    released_s: float | None = None
    killed: bool = False
    stopped: bool = False
    prewarmed: bool = False
    pid: int = 0
    node: str | None = None
    """The node it ran on (Ray backend: the node's IP, as the actor reported it); None on the local backend."""
    release_reason: str | None = None

    def __post_init__(self) -> None:
        if self.release_reason is not None and self.release_reason not in RELEASE_REASONS:
            raise DataError(f"WorkerRecord {self.worker}: release_reason must be one of {RELEASE_REASONS} or None "
                            f"(got {self.release_reason!r})")

    @property
    def cold_start_s(self) -> float:
        return (self.ready_s - self.spawned_s) if self.ready_s is not None else 0.0

    def held(self, t0: float, t1: float, now: float) -> float:
        """Seconds of [t0, t1) during which this worker was held (billed), counting an alive one until `now`."""
        end = self.released_s if self.released_s is not None else now
        return max(0.0, min(end, t1) - max(self.spawned_s, t0))

    def to_json(self) -> dict:
        d = asdict(self)
        d["cold_start_s"] = self.cold_start_s
        return d


@dataclass
class InvocationRecord:
    """One function invocation on one worker.

    requested_s: when the runtime sent the request; started_s: when the worker began it (after any weight load);
    finished_s: when it replied (or died). cold: the worker's first invocation. ok: False when the worker died or
    timed out during it (the work is then re-run as attempt + 1). extra: small numbers worth keeping (rows,
    tokens, migrated rows, weight-sync seconds).
    """

    step: int
    kind: str
    worker: str
    units: float
    requested_s: float
    started_s: float
    finished_s: float
    cold: bool
    attempt: int = 1
    ok: bool = True
    extra: dict[str, float] = field(default_factory=dict)
    groups: list[int] = field(default_factory=list)
    """Decode: the step's group indices whose fresh rows this invocation was sent (the planner's assignment)."""
    engine: str = ""
    """Decode: the rollout engine that ran it (own | vllm, as the worker reported); empty for other kinds."""
    busy: list[list[float]] = field(default_factory=list)
    """[start, end) intervals (run-relative) in which it computed, when not the whole [started_s, finished_s): a
    learner rank waits for groups between them, held but idle (`runtime.meter.usage_window`)."""

    def __post_init__(self) -> None:
        times = (self.requested_s, self.started_s, self.finished_s)
        if not all(math.isfinite(t) for t in times) or self.finished_s < self.started_s:
            raise DataError(f"InvocationRecord {self.kind}/{self.worker}: need finite times with started_s <= "
                            f"finished_s (got {times})")

    def busy_spans(self) -> list[tuple[float, float]]:
        """Its compute intervals: `busy`, or the whole [started_s, finished_s)."""
        return [(a, b) for a, b in self.busy] if self.busy else [(self.started_s, self.finished_s)]

    def busy_in(self, t0: float, t1: float) -> float:
        """Compute seconds inside [t0, t1)."""
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.busy_spans())

    @property
    def busy_s(self) -> float:
        return sum(b - a for a, b in self.busy_spans())

    def to_json(self) -> dict:
        return asdict(self)


def peak_units(workers: list[dict], t_from: float = float("-inf"), t_to: float = float("inf")) -> float:
    """Most device units held at once between t_from and t_to (run-relative seconds), from worker rows
    (`WorkerRecord.to_json()` or workers.jsonl): each holds its `units` from `spawned_s` to `released_s` (still
    held when None). A release and a start at the same instant do not overlap."""
    events = []
    for w in workers:
        end = w.get("released_s")
        end = t_to if end is None else end
        start = max(w["spawned_s"], t_from)
        if end > start and start < t_to:
            events += [(start, 1, w["units"]), (min(end, t_to), 0, -w["units"])]
    held = peak = 0.0
    for _, _, du in sorted(events):
        held += du
        peak = max(peak, held)
    return peak


def zero_held(workers: list[dict], t_from: float, t_to: float, min_s: float = 0.0) -> list[tuple[float, float]]:
    """Intervals inside [t_from, t_to) (run-relative) in which no worker was held at all (every function
    released: scaled to zero), longer than `min_s`; from worker rows as `peak_units` reads them. Pure."""
    spans = sorted((max(w["spawned_s"], t_from), t_to if w.get("released_s") is None else min(w["released_s"], t_to))
                   for w in workers)
    out, covered = [], t_from
    for a, b in spans:
        if b <= a:
            continue
        if a - covered > min_s:
            out.append((covered, a))
        covered = max(covered, b)
    if t_to - covered > min_s:
        out.append((covered, t_to))
    return out
