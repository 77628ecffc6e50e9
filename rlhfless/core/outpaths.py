"""Where commands may write: checks on `--out` and `--json` made before any work, so no command can replace,
move or mix into something it does not own.

Each refusal is a one-line `ConfigError` naming the flag and what to do instead: an output folder is never the
current folder, the repository, a folder above it or its `data/`; a run or checkpoint folder is new or empty (an
existing run only with `--resume`); an output file is not a folder, and its folder exists or lies under the
current folder. The rule it keeps: a run folder is claimed (`claim_run_dir`) before a run writes anything, with
an exclusive `flock` on `OUT/.rlhfless-run.lock` under which the checks repeat, so two runs started at once
cannot both pass; the OS drops the lock when its process dies, so a dead run's lock never blocks.
Every rule, and what releasing a claim deletes: docs/internals.md#coreoutpathspy.
Non-goals: locks across machines sharing a network file system (flock there is only as good as the server's).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

from rlhfless.core.errors import ConfigError, quote
from rlhfless.core.rundir import COMPARISON, CONFIG, RunDir

LOCK_NAME = ".rlhfless-run.lock"
"""The lock file in a claimed run folder (`claim_run_dir`)."""

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"


def repo_path(path: str | Path) -> Path:
    """A configured path: absolute or existing as given, else relative to the repository root."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p


def _named(path: str, flag: str) -> Path:
    if not path or not path.strip():
        raise ConfigError(f"{flag}: empty path; name the {'file' if flag == '--json' else 'folder'} to write")
    if "\0" in path:
        raise ConfigError(f"{flag} {quote(path)}: a path cannot contain a NUL character")
    p = Path(path)
    try:
        os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{flag} {quote(path)}: a symlink loop (a link on this path points back to itself); "
                              "name a real folder") from None
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {quote(path)}: {parent} is a file, not a folder")
            _writable(parent, path, flag)
            break
    return p


def _writable(folder: Path, path: str, flag: str) -> None:
    """Refuse, before any work, an output whose nearest existing folder cannot be written."""
    if os.access(folder, os.W_OK | os.X_OK):
        return
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        why = f"{folder} is on a read-only file system"
    else:
        why = f"permission denied: this user cannot write in {folder}"
    raise ConfigError(f"{flag} {quote(path)}: {why}; name a path you can write, e.g. under runs/ or /tmp")


def check_output_file(path: str, flag: str = "--json") -> Path:
    """`path` may be written as a file (created or replaced)."""
    p = _named(path, flag)
    if p.is_dir():
        raise ConfigError(f"{flag} {quote(path)}: is a folder; name a file to write (for example "
                          f"{Path(path) / 'report.json'})")
    parent = p.absolute().parent
    if not parent.is_dir() and Path.cwd().resolve() not in parent.resolve().parents:
        raise ConfigError(f"{flag} {quote(path)}: the folder {parent} does not exist, and a report creates "
                          "folders only under the current one (e.g. runs/x.json); create it first, or name a file "
                          "in an existing folder")
    if p.exists() and not os.access(p, os.W_OK):
        _writable(p.absolute().parent, path, flag)
        raise ConfigError(f"{flag} {quote(path)}: the file is read-only (permission denied); name another file")
    return p


def check_output_dir(path: str, flag: str = "--out") -> Path:
    """`path` may be used as an output folder: never the current folder, the repository or its `data/`."""
    p = _named(path, flag)
    r = p.resolve()
    if r == Path.cwd().resolve():
        raise ConfigError(f"{flag} {quote(path)}: is the current folder; name a new subfolder, e.g. runs/demo")
    if r == REPO_ROOT or r in REPO_ROOT.parents or r == DATA_DIR or r in Path.cwd().resolve().parents:
        raise ConfigError(f"{flag} {quote(path)}: would write into {r}, which holds the project or its shipped "
                          "data; name a new folder, e.g. runs/demo")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {quote(path)}: is a file, not a folder; name a new folder")
    _refuse_live_run(p, path, flag)  # no command writes into the folder of a live run
    return p


def _has_files(p: Path) -> bool:
    """`p` is a folder holding anything but a run's lock file (a lock left by a dead run counts as nothing)."""
    return p.is_dir() and any(child.name != LOCK_NAME for child in p.iterdir())


def is_run_dir(p: Path) -> bool:
    """A folder `rlhfless train` wrote (one run, or a compare run's two)."""
    return any((p / name).is_file() for name in (CONFIG, COMPARISON, f"serverful/{CONFIG}"))


def _inside_data(p: Path) -> bool:
    r = p.resolve()
    return r == DATA_DIR or DATA_DIR in r.parents


def check_run_dir(path: str, resume: bool, earlier_run_ok: bool = False) -> Path:
    """`train --out`: a new path or an empty folder; an existing run only with --resume; never under data/.

    earlier_run_ok: accept a folder holding an earlier run (library callers that re-run into their own
    sub-folders, such as compare, bench faults and repro, move it aside; the CLI never passes it)."""
    p = check_output_dir(path)
    if _inside_data(p):
        raise ConfigError(f"--out {quote(path)}: is inside {DATA_DIR}, which holds the shipped checkpoint, "
                          "profiles and traces; write runs elsewhere, e.g. --out runs/demo")
    if resume:
        if not is_run_dir(p):
            raise ConfigError(f"--out {quote(path)}: --resume needs the folder of an earlier run "
                              "(with its config.yaml and checkpoints/last)")
        return p
    if _has_files(p):
        if is_run_dir(p) and earlier_run_ok:
            return p
        if is_run_dir(p) and not _has_checkpoint(p):
            raise ConfigError(f"--out {quote(path)}: holds a run that stopped before its first checkpoint, so it "
                              f"cannot be resumed; {start_over(path)}")
        if is_run_dir(p) and via_make_demo():
            raise ConfigError(f"--out {quote(path)}: holds an earlier run; continue it with --resume (make demo "
                              "ARGS=--resume; a larger train.steps extends it), or start over: name a new folder "
                              f"(OUT=runs/other) or rm -r {quote(path)} (make clean-runs removes runs/)")
        if is_run_dir(p):
            raise ConfigError(f"--out {quote(path)}: holds an earlier run; continue it with the same command and "
                              "--resume (a larger train.steps extends it), or start over: name a new --out or rm -r "
                              f"{quote(path)}")
        raise ConfigError(f"--out {quote(path)}: is a folder with other files, not a run; name a new or empty folder")
    return p


VIA = "RLHFLESS_VIA"
"""Set by the Makefile's targets (`make demo`: make-demo), so a hint names the command the user ran."""


def via_make_demo() -> bool:
    return os.environ.get(VIA) == "make-demo"


def start_over(out) -> str:
    """How to start over, in every message about a run folder that cannot continue (no circular advice), in the
    words of the command the user ran (`make demo` or `rlhfless train`)."""
    if via_make_demo():
        return f"to start over, name a new folder (make demo OUT=runs/other) or remove this one (rm -r {out}; " \
               "make clean-runs removes runs/)"
    return f"to start over, name a new folder (--out runs/other) or remove this one (rm -r {out})"


def _has_checkpoint(p: Path) -> bool:
    """A run folder with a run checkpoint `--resume` can start from (`runstate.find_checkpoint`), or a compare
    run (which is never resumed as one)."""
    if RunDir(p).comparison.is_file() or RunDir(p).arm("serverful").config.is_file():
        return True
    return any((RunDir(p).checkpoint(name) / "state.json").is_file() for name in ("last", "last.prev"))


def check_new_checkpoint(path: str) -> Path:
    """`pretrain --out`: a new path or an empty folder; a checkpoint is never overwritten."""
    p = check_output_dir(path)
    if p.is_dir() and any(p.iterdir()):
        raise ConfigError(f"--out {quote(path)}: already holds files (a checkpoint?) and pretrain never overwrites; "
                          "name a new folder, or delete this one first")
    return p


# --- claiming a run folder ------------------------------------------------------------------------------
_HELD: dict[str, "RunClaim"] = {}
"""Folders this process has claimed (a library `train` inside a CLI run re-enters its own claim)."""


class RunClaim:
    """An exclusive claim on a run folder; `release()` (or leaving a `with` block) ends it."""

    def __init__(self, path: Path, fd: int | None, created: list[Path]):
        self.path, self.fd, self.created = path, fd, created

    def __enter__(self) -> "RunClaim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Delete the lock file, then the folders the claim created if nothing else was written into them."""
        if self.fd is None:
            return
        _HELD.pop(str(self.path.absolute()), None)
        try:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            for d in self.created:  # deepest first
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
        finally:
            os.close(self.fd)  # after the unlink: a waiting claimant then finds the file gone and starts over
            self.fd = None


def claim_run_dir(path: str, resume: bool, earlier_run_ok: bool = False) -> RunClaim:
    """Claim `path` for one run: create it, take its lock, repeat `check_run_dir` under the lock.

    A folder another live process holds is refused naming its pid. earlier_run_ok (library callers, see
    `check_run_dir`): an earlier, finished run there is moved aside to `path.<timestamp>` under its lock, so a
    live run is never moved."""
    p = check_run_dir(path, resume, earlier_run_ok)
    if str(p.absolute()) in _HELD:
        return RunClaim(p, None, [])  # this process holds it already: the outer claim releases it
    created = _make_dirs(p)
    try:
        fd = _lock(p, path)
    except BaseException:
        _remove_empty(created)
        raise
    claim = RunClaim(p, fd, created)
    _HELD[str(p.absolute())] = claim
    try:
        check_run_dir(path, resume, earlier_run_ok)  # again, now that no other run can be between check and write
        if not resume and _has_files(p):  # an earlier run (earlier_run_ok): move it aside while holding its lock
            (_move_aside(p) / LOCK_NAME).unlink()  # our lock file moved with the folder
            claim.release()
            return claim_run_dir(path, resume, earlier_run_ok)
    except BaseException:
        claim.release()
        raise
    return claim


def _refuse_live_run(p: Path, path: str, flag: str = "--out") -> None:
    """Refuse a folder whose lock another live process holds (probed with a shared lock, released at once)."""
    import fcntl

    if str(p.absolute()) in _HELD or not (p / LOCK_NAME).is_file():
        return
    try:
        fd = os.open(p / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return  # gone in between (the run ended) or unreadable: the claim itself decides
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(fd, path, flag) from None
    finally:
        os.close(fd)  # also drops the probe's lock


def _busy(fd: int, path: str, flag: str = "--out") -> ConfigError:
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return ConfigError(f"{flag} {quote(path, 160)}: another run (pid {pid}) is writing to this folder; wait for it to "
                       "end, or name another folder")


def _make_dirs(p: Path) -> list[Path]:
    """Create `p` and its missing parents; the folders created, deepest first."""
    missing = [d for d in (p, *p.absolute().parents) if not d.exists()][::-1]
    created = []
    for d in missing:
        try:
            d.mkdir()
            created.append(d)
        except FileExistsError:  # another process made it in between: fine, it is not ours to remove
            pass
    return created[::-1]


def _remove_empty(created: list[Path]) -> None:
    for d in created:
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()


def _lock(p: Path, path: str) -> int:
    """An fd holding the exclusive flock of `p`'s lock file (the file that is at that path now, not one another
    process deleted between our open and our lock)."""
    import fcntl

    lock = p / LOCK_NAME
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # a refused run removed the folder it had made between our mkdir and open
            p.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err = _busy(fd, path)
            os.close(fd)
            raise err from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)  # a lock file left by a killed run still holds its pid
            os.write(fd, f"{os.getpid()}\n".encode())  # at once: a run refused next names this one
            return fd
        os.close(fd)  # the run that held it released it (and deleted the file) between our open and lock


def _move_aside(out: Path) -> Path:
    """Rename an earlier run's folder to `out.<timestamp>` (library callers re-running into their sub-folders)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = out.with_name(f"{out.name}.{stamp}"), 1
    while aside.exists():  # two runs within one second
        n += 1
        aside = out.with_name(f"{out.name}.{stamp}-{n}")
    out.rename(aside)
    print(f"rlhfless: {out} held an earlier run; moved it to {aside}", file=sys.stderr)
    return aside
