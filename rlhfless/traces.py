"""Length traces: one JSONL line per generated response (`rlhfless.records.TraceRow`).

Written by the training loop into the run directory and read by the predictors and the simulator. JSONL keeps
traces appendable (nothing is lost if a run stops) and readable with `pandas.read_json(lines=True)`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from rlhfless.errors import DataError
from rlhfless.records import TraceRow

TRACE_FIELDS = tuple(f.name for f in dataclasses.fields(TraceRow))


class TraceWriter:
    """Append-only JSONL writer; flushes after each batch so a crash loses at most one step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, rows: Iterable[TraceRow]) -> None:
        if self._fh is None:
            raise RuntimeError("TraceWriter is closed")
        for row in rows:
            self._fh.write(json.dumps(dataclasses.asdict(row), separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trace(path: str | Path) -> Iterator[TraceRow]:
    """Yield rows of a trace file; a missing file or a malformed line raises `DataError` naming the line."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"trace file not found: {p}")
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
            missing = [f for f in TRACE_FIELDS if f not in obj]
            if missing:
                raise DataError(f"{p}:{lineno}: missing trace field(s) {missing}")
            yield TraceRow(**{f: obj[f] for f in TRACE_FIELDS})
