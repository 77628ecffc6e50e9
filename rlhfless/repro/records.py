"""Typed records a study returns to the report: its figures, numbers, and rows of the paper-vs-ours table."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class PaperRow:
    """One claim of the paper beside what this code measured or simulated for it.

    ours: the number (or verdict) from this run, against verl as the paper ran it where the row compares with
    verl; ours_tuned: the same row against the tuned verl ("" when the row does not compare with verl);
    kind: "measured" (this machine, real processes) or "simulated" (time model / simulator seconds); why: what
    explains the gap, in a sentence.
    """

    metric: str
    paper: str
    ours: str
    kind: str
    why: str
    ours_tuned: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("measured", "simulated"):
            raise ValueError(f"PaperRow.kind must be 'measured' or 'simulated' (got {self.kind!r})")


@dataclass
class StudyResult:
    """What one study produced (figures under the run folder; numbers as plain JSON)."""

    name: str
    title: str
    config: dict
    """Every parameter the study ran with (its hash names the figures' provenance in the report)."""
    figures: list[Path] = field(default_factory=list)
    rows: list[PaperRow] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)
    """Input/output files worth keeping beside the figures (traces, plans, run folders' JSON)."""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)


def config_hash(config: dict) -> str:
    """First 12 hex digits of the sha256 of the config as sorted JSON (stable across runs and machines)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
