"""Plain-array codecs for the learned predictor's ``model.npz``: strings, training examples, per-prompt history.

The rule it keeps: everything is a numeric array (no object arrays), so the file loads with
``np.load(..., allow_pickle=False)`` and nothing in it can run. Strings are tables of UTF-8 bytes plus offsets
(``<table>.bytes``, ``<table>.start``); examples and history are arrays of fixed dtypes. Refused with a
`DataError` naming the file: anything but an .npz of plain arrays, a wrong dtype or dimension count, offsets
that do not run from 0 to the end, an index out of range, a negative length, a non-finite number, non-UTF-8 text.
The array layout: docs/internals.md#predictornpziopy. Non-goals: compression choices (callers use
`np.savez_compressed`). Deviation from the paper: none.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError

HISTORY_FIELDS = ("count", "last", "sum", "ewma", "n", "total", "total_sq")
N_HISTORY_FEATURES = 5
Example = tuple[str, list[float], tuple[int, ...]]  # (prompt text, history features, observed lengths)
ARRAY_DTYPES = {
    "examples.prompts.bytes": np.uint8, "examples.prompts.start": np.int64, "examples.prompt_index": np.int64,
    "examples.history": np.float64, "examples.lengths": np.int64, "examples.length_start": np.int64,
    "history.ids.bytes": np.uint8, "history.ids.start": np.int64, "history.values": np.float64,
}
_MATRICES = ("examples.history", "history.values")


MAX_NPZ_BYTES = 1 << 30
"""Refuse archives whose members claim more than this uncompressed (a shipped model is well under 1 MB): a small,
highly compressed file must not be able to exhaust memory. zipfile never yields more than a member's claimed size."""


def _check_uncompressed_size(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            total = sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError):
        return  # not a zip: np.load below says what it is
    if total > MAX_NPZ_BYTES:
        raise DataError(f"{path}: its arrays would take {total:,} bytes uncompressed, over the "
                        f"{MAX_NPZ_BYTES:,}-byte limit for a learned predictor; refused")


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, never unpickling: a pickle or an object array raises `DataError`, and so
    does an archive larger than MAX_NPZ_BYTES uncompressed."""
    if not path.is_file():
        raise DataError(f"learned predictor model file not found: {path}")
    _check_uncompressed_size(path)
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise DataError(f"{path}: not an .npz archive of arrays")
        with z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz of plain arrays ({' '.join(str(exc).split())})") from None


def check_dtypes(arrays: Mapping[str, np.ndarray], where: Path) -> None:
    """The arrays of ARRAY_DTYPES have their dtype, and are matrices or vectors as the layout says."""
    for key, dtype in ARRAY_DTYPES.items():
        a = arrays[key]
        if a.dtype != dtype or a.ndim != (2 if key in _MATRICES else 1):
            raise DataError(f"{where}: array '{key}' has dtype {a.dtype} and shape {a.shape}")


def strings_to_arrays(strings: Sequence[str], prefix: str) -> dict[str, np.ndarray]:
    encoded = [s.encode("utf-8") for s in strings]
    return {f"{prefix}.bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8),
            f"{prefix}.start": np.concatenate([[0], np.cumsum([len(b) for b in encoded])]).astype(np.int64)}


def _offsets_ok(start: np.ndarray, total: int, min_step: int) -> bool:
    return len(start) >= 1 and start[0] == 0 and start[-1] == total and bool(np.all(np.diff(start) >= min_step))


def strings_from_arrays(arrays: Mapping[str, np.ndarray], prefix: str, where: Path) -> list[str]:
    blob, start = arrays[f"{prefix}.bytes"].tobytes(), arrays[f"{prefix}.start"]
    if not _offsets_ok(start, len(blob), 0):
        raise DataError(f"{where}: {prefix}.start are not offsets from 0 to the end of {prefix}.bytes")
    try:
        return [blob[a:b].decode("utf-8") for a, b in zip(start[:-1].tolist(), start[1:].tolist())]
    except UnicodeDecodeError:
        raise DataError(f"{where}: {prefix}.bytes is not UTF-8 text") from None


def examples_to_arrays(examples: Sequence[Example]) -> dict[str, np.ndarray]:
    table: dict[str, int] = {}
    index = [table.setdefault(e[0], len(table)) for e in examples]
    return {
        **strings_to_arrays(list(table), "examples.prompts"),
        "examples.prompt_index": np.array(index, dtype=np.int64),
        "examples.history": np.array([e[1] for e in examples], dtype=np.float64).reshape(-1, N_HISTORY_FEATURES),
        "examples.lengths": np.array([x for e in examples for x in e[2]], dtype=np.int64),
        "examples.length_start": np.concatenate([[0], np.cumsum([len(e[2]) for e in examples])]).astype(np.int64),
    }


def examples_from_arrays(arrays: Mapping[str, np.ndarray], where: Path) -> list[Example]:
    prompts = strings_from_arrays(arrays, "examples.prompts", where)
    hist, index = arrays["examples.history"], arrays["examples.prompt_index"]
    lengths, start = arrays["examples.lengths"], arrays["examples.length_start"]
    n = len(index)
    if hist.shape != (n, N_HISTORY_FEATURES) or not np.isfinite(hist).all():
        raise DataError(f"{where}: examples.history must be ({n}, {N_HISTORY_FEATURES}) finite numbers")
    if len(start) != n + 1 or not _offsets_ok(start, len(lengths), 1):
        raise DataError(f"{where}: examples.length_start must run from 0 to {len(lengths)}, one or more per example")
    if np.any((index < 0) | (index >= len(prompts))) or np.any(lengths < 0):
        raise DataError(f"{where}: a prompt index is out of range or a length is negative")
    ls, flat, rows = start.tolist(), lengths.tolist(), hist.tolist()
    return [(prompts[i], rows[k], tuple(flat[ls[k]:ls[k + 1]])) for k, i in enumerate(index.tolist())]


def history_to_arrays(history: Mapping[str, Mapping[str, float]]) -> dict[str, np.ndarray]:
    values = [[h[f] for f in HISTORY_FIELDS] for h in history.values()]
    return {**strings_to_arrays(list(history), "history.ids"),
            "history.values": np.array(values, dtype=np.float64).reshape(-1, len(HISTORY_FIELDS))}


def history_from_arrays(arrays: Mapping[str, np.ndarray], where: Path) -> dict[str, dict[str, float]]:
    ids = strings_from_arrays(arrays, "history.ids", where)
    values = arrays["history.values"]
    if values.shape != (len(ids), len(HISTORY_FIELDS)) or not np.isfinite(values).all() or len(set(ids)) != len(ids):
        raise DataError(f"{where}: history.values must be ({len(ids)}, {len(HISTORY_FIELDS)}) finite numbers, "
                        "one row per distinct prompt id")
    return {pid: dict(zip(HISTORY_FIELDS, row)) for pid, row in zip(ids, values.tolist())}
