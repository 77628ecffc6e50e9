"""Where commands may write: checks on `--out` and `--json` made before any work, so no command can replace,
move or mix into something it does not own.

Rules (each refusal is a one-line `ConfigError` naming the flag and what to do instead):
- every output: not an empty string; no part of its parent path is a file;
- an output file (`--json`, a data file's `--out`): not an existing folder;
- an output folder: not the current folder, the repository, a folder above it, or the repository's `data/`
  (the shipped checkpoint, profiles and traces); not an existing file;
- a run folder (`train --out`): a new path or an empty folder; an existing run only with `--resume`; nothing
  under `data/` (`runner.train` called as a library, by compare, bench faults and repro, moves an earlier run in
  its own sub-folder aside instead, so those commands can run again);
- a checkpoint folder (`pretrain --out`): a new path or an empty folder; a checkpoint is never overwritten.
Non-goals: permissions (the OS reports them when the command writes).
"""

from __future__ import annotations

from pathlib import Path

from rlhfless.core.errors import ConfigError, quote

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
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {quote(path)}: {parent} is a file, not a folder")
            break
    return p


def check_output_file(path: str, flag: str = "--json") -> Path:
    """`path` may be written as a file (created or replaced)."""
    p = _named(path, flag)
    if p.is_dir():
        raise ConfigError(f"{flag} {quote(path)}: is a folder; name a file to write (for example "
                          f"{Path(path) / 'report.json'})")
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
    return p


def is_run_dir(p: Path) -> bool:
    """A folder `rlhfless train` wrote (one run, or a compare run's two)."""
    return any((p / name).is_file() for name in ("config.yaml", "comparison.json", "serverful/config.yaml"))


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
    if p.is_dir() and any(p.iterdir()):
        if is_run_dir(p) and earlier_run_ok:
            return p
        if is_run_dir(p):
            raise ConfigError(f"--out {quote(path)}: holds an earlier run; continue it with --resume (a larger "
                              "train.steps extends a finished run), or name a new folder")
        raise ConfigError(f"--out {quote(path)}: is a folder with other files, not a run; name a new or empty folder")
    return p


def check_new_checkpoint(path: str) -> Path:
    """`pretrain --out`: a new path or an empty folder; a checkpoint is never overwritten."""
    p = check_output_dir(path)
    if p.is_dir() and any(p.iterdir()):
        raise ConfigError(f"--out {quote(path)}: already holds files (a checkpoint?) and pretrain never overwrites; "
                          "name a new folder, or delete this one first")
    return p
