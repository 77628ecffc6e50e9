"""JSON-lines I/O shared by traces, length data and dataset loaders (plain or gzip, by the `.gz` suffix).

One reader so that every data file reports problems the same way: a missing file, a line that is not JSON, a
line that is not an object, and bytes that cannot be read (a truncated or corrupt `.gz`, text that is not UTF-8)
raise a one-line `DataError` naming the file and line. What the fields of an object must be is the caller's check
(`rlhfless.core.traces.read_trace`, `rlhfless.predictor.data.parse_row`).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
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
    from rlhfless.core.errors import DataError

    p = Path(path)
    if not p.is_file():  # "not found" only of what does not exist
        raise DataError(f"{kind} file: {p} is a folder, not a file" if p.is_dir() else
                        f"{kind} file not found: {p}" if not p.exists() else f"{kind} file: {p} is not a regular file")
    with open_text(p) as fh:
        lineno = 0
        while True:
            try:
                line = fh.readline()
            except (EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:  # gzip.BadGzipFile is an OSError
                raise DataError(f"{p}:{lineno + 1}: cannot read the {kind} file past line {lineno}: it is truncated "
                                f"or corrupt ({type(exc).__name__}: {' '.join(str(exc).split())})") from None
            if not line:
                return
            lineno += 1
            if line.strip():
                yield f"{p}:{lineno}", _object(line, f"{p}:{lineno}")


def _object(line: str, where: str) -> dict:
    from rlhfless.core.errors import DataError

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError):  # an integer of thousands of digits; arrays nested thousands deep
        raise DataError(f"{where}: holds a number too long or nesting too deep to read") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object")
    return obj


def json_safe(obj):
    """NaN/inf -> None and keys -> str, recursively, so the output is standard JSON (no bare NaN tokens)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def read_json_file(path: str | Path, hint: str = ""):
    """The JSON value in `path`, or None when the file is absent; bytes that are not JSON raise `DataError`
    (its message ends with `hint`, what to do about it, when given)."""
    from rlhfless.core.errors import DataError

    p = Path(path)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):  # JSONDecodeError, a huge integer, deep nesting
        raise DataError(f"{p}: not valid JSON" + (f"; {hint}" if hint else "")) from None


def write_json(obj, path: str | Path, indent: int = 1) -> Path:
    """Write one JSON report (parents created, atomically: `write_atomic`); NaN becomes null, other non-JSON
    values (paths) strings."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(p, json.dumps(json_safe(obj), indent=indent, allow_nan=False, default=str) + "\n")


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a reader sees the old file or
    the whole new one, never half of it (a full disk fails before the rename). A path that exists and is not a
    regular file (/dev/stdout, a pipe) is written directly: it cannot be replaced, nor must it be."""
    import os
    import tempfile

    p = Path(path)
    try:
        if p.exists() and not p.is_file():
            p.write_text(text, encoding="utf-8")
            return p
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
            os.chmod(tmp, p.stat().st_mode & 0o777 if p.exists() else 0o644)  # mkstemp makes it 0600
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        if exc.filename is None:  # a failed write names no file: the CLI's one line must (errors.os_error_message)
            exc.filename = str(p)
        raise
    return p

