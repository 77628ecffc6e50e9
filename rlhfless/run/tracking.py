"""The only module that talks to Weights & Biases.

Every run also writes `metrics.jsonl` (one line per step) and `tables/<name>.jsonl` in its run directory, so
notebooks and summaries never depend on W&B being installed or online. W&B runs offline by default (files under
`<run_dir>/wandb`, upload later with `wandb sync`); `disabled` skips importing wandb at all (unit tests).
The JSONL mirror is standard JSON like every other report (`rlhfless.core.jsonl.write_json`): NaN and inf become null.

`read_offline_run` reads an offline W&B run back (history rows, summary, config, logged tables) from its
`run-<id>.wandb` file with wandb's own record schema, so tests and users can check what W&B received without a
server or `wandb sync`. wandb 0.31 writes that file from its Go core and ships no Python reader, so the container
format (a LevelDB-style log of 32 KiB blocks, CRC-32 checked) is read here; the records are wandb's protobufs.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfless.config import TrackingConfig
from rlhfless.core.errors import DataError
from rlhfless.core.jsonl import json_safe
from rlhfless.core.rundir import RunDir


def _default(v: Any) -> Any:
    """numpy scalars as Python numbers (NaN -> null), anything else not JSON as its string (as `write_json`)."""
    return json_safe(v.item()) if hasattr(v, "item") else str(v)


def json_line(obj: dict) -> str:
    """One standard-JSON line: NaN/inf -> null (never the bare `NaN` token or the string "nan")."""
    return json.dumps(json_safe(obj), allow_nan=False, default=_default) + "\n"


WANDB_HOST = "https://api.wandb.ai"
"""W&B's service (wandb's own default for WANDB_BASE_URL)."""
REACH_TIMEOUT_S = 3.0
"""How long `check_reachable` waits for a TCP connection (a reachable service answers in well under a second)."""


def check_reachable(cfg: TrackingConfig, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """With mode=online, refuse in one line, before any work, when W&B's service cannot be reached: one TCP
    connection to its host (WANDB_BASE_URL, else api.wandb.ai), name lookup included, bounded by `timeout_s`.
    wandb's own start waits about 100 s without a network and then fails with a traceback."""
    if cfg.mode != "online":
        return
    import socket
    import threading
    from urllib.parse import urlsplit

    from rlhfless.core.errors import ConfigError

    url = os.environ.get("WANDB_BASE_URL") or WANDB_HOST
    parts = urlsplit(url if "//" in url else f"https://{url}")
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
    except ValueError:
        raise ConfigError(f"--wandb online: WANDB_BASE_URL={url!r} is not a URL") from None
    problem: list[str] = ["no answer"]

    def connect() -> None:  # in a thread: the name lookup has no timeout of its own
        try:
            socket.create_connection((parts.hostname or "", port), timeout=timeout_s).close()
            problem.clear()
        except (OSError, UnicodeError) as exc:
            problem[0] = " ".join(str(exc).split()) or type(exc).__name__

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(timeout_s)
    if problem:
        raise ConfigError(f"--wandb online: cannot reach W&B at {parts.hostname}:{port} within {timeout_s:g} s "
                          f"({problem[0][:80]}); run with --wandb offline and upload later with wandb sync "
                          "OUT/wandb/offline-run-*")


class Tracker:
    """Log scalars per step and decision tables; mirror everything to local JSONL files."""

    def __init__(self, cfg: TrackingConfig, run_dir: str | Path, config: dict, job_type: str = "train",
                 resume_id: str | None = None):
        """resume_id: continue that W&B run (a resumed training run); its steps go on from the checkpoint."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = RunDir(self.run_dir).metrics.open("a", encoding="utf-8")
        self._run = None
        if cfg.mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self._wandb = wandb
            self._run = wandb.init(
                project=cfg.project, name=cfg.name or self.run_dir.name, group=cfg.group, job_type=job_type,
                dir=str(self.run_dir), mode=cfg.mode, config=config, reinit="finish_previous",
                id=resume_id, resume="allow" if resume_id else None,
                settings=wandb.Settings(console="off", x_disable_stats=True),
            )

    @property
    def run_id(self) -> str | None:
        return self._run.id if self._run is not None else None

    @property
    def wandb_dir(self) -> str | None:
        return str(Path(self._run.dir).parent) if self._run is not None else None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._metrics.write(json_line({"step": step, **metrics}))
        self._metrics.flush()
        if self._run is not None:
            self._run.log(metrics, step=step)

    def table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A decision table (completions, predicted vs actual lengths, scaler candidates, ...)."""
        path = RunDir(self.run_dir).table(name)
        path.parent.mkdir(exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json_line({"step": step, **dict(zip(columns, r))}))
        if self._run is not None:
            self._run.log({name: self._wandb.Table(columns=columns, data=rows)}, step=step)

    def image(self, name: str, path: str | Path, step: int) -> None:
        """A figure already saved as PNG (the file stays the source of truth; W&B gets a copy)."""
        if self._run is not None:
            self._run.log({name: self._wandb.Image(str(path))}, step=step)

    def artifact(self, name: str, kind: str, paths: list[str | Path], root: str | Path | None = None) -> None:
        """Files (traces, plans, reports) as one W&B artifact of type `kind`; directories go in whole. Entries
        are named by their path under `root` (default: their file name)."""
        if self._run is None or not paths:
            return
        art = self._wandb.Artifact(name, type=kind)
        for p in map(Path, paths):
            entry = str(p.relative_to(root)) if root is not None and p.is_relative_to(root) else p.name
            if p.is_dir():
                art.add_dir(str(p), name=entry)
            elif p.is_file():
                art.add_file(str(p), name=entry)
        self._run.log_artifact(art)

    def summary(self, values: dict[str, Any]) -> None:
        if self._run is not None:
            for k, v in values.items():
                self._run.summary[k] = v

    def finish(self) -> None:
        """Close the run; returns only once W&B's service process has exited, so the run's files are complete.

        `run.finish()` alone returns when wandb-core has handled the exit record, but the service closes the
        run's transaction log (`run-<id>.wandb`) after that, in the background: a reader that came right after
        (`read_offline_run`, `wandb sync`) could see a truncated file on a busy machine. `wandb.teardown()` waits
        for the service process itself to end (an event, no timeout); the next run starts a new service (~1 s).
        """
        self._metrics.close()
        if self._run is not None:
            self._run.finish()
            self._run = None
            self._wandb.teardown()


@dataclass
class OfflineRun:
    """An offline W&B run as W&B recorded it (read back by `read_offline_run`).

    history: one dict per committed step, in order. Scalars under their names (`reward/mean`); a logged table
        as a dict (`_type` "table-file", `path` relative to `files_dir`, `nrows`, `ncols`, `sha256`);
        `_step`, `_runtime`, `_timestamp` as W&B adds them.
    summary: the final run summary; config: the run config; files_dir: the run's `files/` folder.
    """

    run_id: str
    history: list[dict]
    summary: dict
    config: dict
    files_dir: Path
    group: str = ""
    job_type: str = ""
    artifacts: list[dict] = field(default_factory=list)
    """Logged artifacts: name, type, and the paths in their manifest."""

    def table(self, name: str, step: int) -> dict:
        """The table `name` logged at `step`, as W&B stored it: {"columns": [...], "data": [[...], ...]}."""
        for row in self.history:
            ref = row.get(name)
            if row.get("_step") == step and isinstance(ref, dict) and ref.get("_type") == "table-file":
                return json.loads((self.files_dir / ref["path"]).read_text())
        raise KeyError(f"no table {name!r} at step {step} in W&B run {self.run_id}")


_MAGIC = (b":W&B", 0xBEE1, 0)  # file header: ident, magic, version
_BLOCK, _HEADER = 32768, 7     # log blocks; chunk header = crc32 (u32), length (u16), type (u8)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(path: Path) -> Iterator[bytes]:
    """The payloads of a W&B transaction log: 32 KiB blocks of chunks, a record split across blocks as
    FIRST/MIDDLE/LAST chunks; each chunk's CRC-32 is seeded with its type byte; a block tail under 7 bytes is
    zero padding."""
    buf = path.read_bytes()
    if len(buf) < _HEADER or struct.unpack("<4sHB", buf[:_HEADER]) != _MAGIC:
        raise DataError(f"{path}: not a W&B run file (bad header)")
    pos, parts = _HEADER, None
    while len(buf) - pos >= _HEADER:
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        crc, n, kind = struct.unpack("<IHB", buf[pos:pos + _HEADER])
        if (crc, n, kind) == (0, 0, 0):  # zero-filled space past the last chunk
            break
        data = buf[pos + _HEADER:pos + _HEADER + n]
        if len(data) < n or zlib.crc32(data, zlib.crc32(bytes([kind]))) != crc:
            raise DataError(f"{path}: corrupt or truncated record at byte {pos}")
        if kind == _FULL:
            yield data
        elif kind == _FIRST:
            parts = [data]
        elif kind in (_MIDDLE, _LAST) and parts is not None:
            parts.append(data)
            if kind == _LAST:
                yield b"".join(parts)
                parts = None
        else:
            raise DataError(f"{path}: unexpected chunk type {kind} at byte {pos}")
        pos += _HEADER + n


def _put(target: dict, item, value: Any) -> None:
    """Set `item.key`, or the nested path `item.nested_key` (a one-part path is a plain name like `reward/mean`)."""
    keys = list(item.nested_key) or [item.key]
    for k in keys[:-1]:
        target = target.setdefault(k, {})
    target[keys[-1]] = value


def _history_value(item) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    kind = item.WhichOneof("value")
    if kind == "json":
        return json.loads(item.json)
    return None if kind in (None, "none") else getattr(item, kind)


def _apply(target: dict, record) -> None:
    """Apply a summary or config record (its updates, then its removals) to `target`."""
    for item in record.update:
        _put(target, item, json.loads(item.value_json))
    for item in record.remove:
        keys = list(item.nested_key) or [item.key]
        node = target
        for k in keys[:-1]:
            node = node.get(k, {})
        node.pop(keys[-1], None)


def read_offline_run(path: str | Path) -> OfflineRun:
    """Read an offline W&B run back. `path`: its folder (`<run_dir>/wandb/offline-run-*`, a run summary's
    `wandb_dir`) or its `run-<id>.wandb` file. Needs wandb installed (for its protobuf schema)."""
    from wandb.proto import wandb_internal_pb2 as pb

    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("run-*.wandb"))
        if len(found) != 1:
            raise DataError(f"{p}: expected one run-*.wandb file, found {len(found)}")
        p = found[0]
    if not p.is_file():
        raise DataError(f"W&B run file not found: {p}")
    run_id, history, summary, config = p.stem.removeprefix("run-"), [], {}, {}
    meta: dict = {"group": "", "job_type": "", "artifacts": []}
    for data in _log_records(p):
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row: dict = {}
            for item in rec.history.item:
                _put(row, item, _history_value(item))
            row.setdefault("_step", rec.history.step.num)
            history.append(row)
        elif kind == "summary":
            _apply(summary, rec.summary)
        elif kind == "config":
            _apply(config, rec.config)
        elif kind == "run":
            run_id = rec.run.run_id or run_id
            meta["group"], meta["job_type"] = rec.run.run_group or meta["group"], rec.run.job_type or meta["job_type"]
            _apply(config, rec.run.config)
        elif kind == "artifact":
            meta["artifacts"].append({"name": rec.artifact.name, "type": rec.artifact.type,
                                      "paths": [e.path for e in rec.artifact.manifest.contents]})
    return OfflineRun(run_id, history, summary, config, p.parent / "files", **meta)
