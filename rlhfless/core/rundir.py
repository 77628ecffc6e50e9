"""The run folder: every file a run writes, named once, and the one way to read each back.

A run folder (`rlhfless train --out DIR`) is the contract between real runs, the simulator's validation, the
comparison, the fault benchmark, `repro` and the notebooks. Writers take their paths from `RunDir`; readers call its
methods, which parse JSONL through `core.jsonl` (errors name the file and line) and return [] or {} for a file the
run did not write (a mode that has no workers, a run stopped before its first step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.jsonl import iter_jsonl, read_json_file

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
SUMMARY = "summary.json"
COMPARISON = "comparison.json"
INVOCATIONS = "invocations.jsonl"
WORKERS = "workers.jsonl"
TRACES = "traces"
ROLLOUTS = "rollouts.jsonl"
DIGESTS = "samples_digest.jsonl"
TABLES = "tables"
CHECKPOINTS = "checkpoints"
GANTT = "gantt"
TIME_PROFILE = "time_profile.json"
EMULATED_LENGTHS = "emulated-lengths.json"


@dataclass(frozen=True)
class RunDir:
    """One run's folder; `RunDir(out).metrics` is its path, `RunDir(out).read_metrics()` its rows."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    # -- names --------------------------------------------------------------------------------------------------
    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def comparison(self) -> Path:
        return self.root / COMPARISON

    @property
    def invocations(self) -> Path:
        return self.root / INVOCATIONS

    @property
    def workers(self) -> Path:
        return self.root / WORKERS

    @property
    def traces(self) -> Path:
        return self.root / TRACES

    @property
    def digests(self) -> Path:
        return self.traces / DIGESTS

    @property
    def tables(self) -> Path:
        return self.root / TABLES

    def table(self, name: str) -> Path:
        return self.tables / f"{name}.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    def checkpoint(self, name: str) -> Path:
        """One checkpoint folder: `last` (resume from), `last.prev`, `final`."""
        return self.checkpoints / name

    @property
    def final_weights(self) -> Path:
        return self.checkpoint("final") / "model.safetensors"

    def gantt(self, step: int) -> Path:
        """The per-function timeline of one step (`runtime.gantt_every`)."""
        return self.root / GANTT / f"step-{step}.png"

    @property
    def time_profile(self) -> Path:
        """The decode-time profile the run's planner priced with (loadable as `plan.time_profile`)."""
        return self.root / TIME_PROFILE

    @property
    def emulated_lengths(self) -> Path:
        """With emulated devices: the length table the workers replayed (the simulator validates with it)."""
        return self.root / EMULATED_LENGTHS

    @property
    def trace(self) -> Path:
        """Where the run writes its rollout trace (`rollouts` finds it, compressed or not)."""
        return self.traces / ROLLOUTS

    @property
    def rollouts(self) -> Path | None:
        """The rollout trace, plain or gzip-compressed (a trace copied elsewhere may have been compressed)."""
        return next((t for t in (self.traces / ROLLOUTS, self.traces / (ROLLOUTS + ".gz")) if t.is_file()), None)

    def arm(self, name: str) -> RunDir:
        """A comparison's arm (`runtime.mode=compare` writes one run folder per arm)."""
        return RunDir(self.root / name)

    # -- readers ------------------------------------------------------------------------------------------------
    def read_metrics(self) -> list[dict]:
        return _rows(self.metrics, "metrics")

    def read_step_metrics(self) -> dict[int, dict]:
        """step -> its row, for rows of completed steps (they carry timing_s/step)."""
        return {r["step"]: r for r in self.read_metrics() if "timing_s/step" in r}

    def read_invocations(self) -> list[dict]:
        return _rows(self.invocations, "invocations")

    def read_workers(self) -> list[dict]:
        return _rows(self.workers, "workers")

    def read_digests(self) -> dict[int, str]:
        """step -> SHA-256 of that step's responses."""
        return {r["step"]: r["sha256"] for r in _rows(self.digests, "digests")}

    def read_table(self, name: str) -> list[dict]:
        return _rows(self.table(name), name)

    def read_summary(self) -> dict | None:
        return read_json_file(self.summary)

    def read_comparison(self) -> dict | None:
        return read_json_file(self.comparison)

    def next_segment(self) -> Segment:
        """Where the records of the runtime starting now continue the ones already in the folder (`Segment`)."""
        return next_segment(self.read_workers(), self.read_invocations())


@dataclass(frozen=True)
class Segment:
    """One start of a run's runtime: the first, or one `--resume` (the records of every segment stay in
    workers.jsonl and invocations.jsonl, appended, so the Gantt charts and the simulator's validation read them all).

    index: 0 for the first start, k for the k-th resume. prefix: put before this segment's worker names so they
    are unique across segments ("" in the first, "s1." after the first resume). offset_s: added to this segment's
    run-relative times so they follow the earlier segments' records instead of overlapping them (0 in the first)."""

    index: int = 0
    offset_s: float = 0.0

    @property
    def prefix(self) -> str:
        return f"s{self.index}." if self.index else ""


SEGMENT_NAME = re.compile(r"^s(\d+)\.")
TIME_KEYS = ("spawned_s", "ready_s", "released_s", "requested_s", "started_s", "finished_s")


def segment_of(worker: str) -> int:
    """The segment a worker name belongs to (`Segment.prefix`; 0 for an unprefixed name)."""
    m = SEGMENT_NAME.match(worker)
    return int(m.group(1)) if m else 0


def next_segment(workers: list[dict], invocations: list[dict]) -> Segment:
    """The segment after the ones these records hold (pure): index one above the highest seen, times after the
    latest instant recorded. No records: the first segment. Workers are written when a segment ends and
    invocations as they finish, so a segment killed outright (SIGKILL) still counts through its invocations."""
    rows = [*workers, *invocations]
    if not rows:
        return Segment()
    index = 1 + max(segment_of(r["worker"]) for r in rows)
    last = max((r[k] for r in rows for k in TIME_KEYS if isinstance(r.get(k), (int, float))), default=0.0)
    return Segment(index, float(last))


def _rows(path: Path, kind: str) -> list[dict]:
    return [r for _, r in iter_jsonl(path, kind)] if path.is_file() else []
