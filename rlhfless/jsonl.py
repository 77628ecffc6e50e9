"""JSON-lines I/O shared by traces, length data and dataset loaders (plain or gzip, by the `.gz` suffix).

One reader so that every data file reports problems the same way: a missing file, a line that is not JSON, or a
line that is not an object raises `DataError` naming the file and line.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def open_text(path: str | Path, mode: str = "r") -> IO[str]:
    """Open a text file, transparently gzip-compressed when the name ends in `.gz`."""
    p = Path(path)
    if p.suffix == ".gz":
        return gzip.open(p, mode + "t", encoding="utf-8")
    return p.open(mode, encoding="utf-8")


def iter_jsonl(path: str | Path, kind: str = "data") -> Iterator[tuple[str, dict]]:
    """Yield (where, object) for each non-blank line; `where` is ``file:line`` for error messages."""
    from rlhfless.errors import DataError

    p = Path(path)
    if not p.is_file():
        raise DataError(f"{kind} file not found: {p}")
    with open_text(p) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object")
            yield where, obj
