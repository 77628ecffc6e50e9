"""What a notebook used and what it produced, in a file tests and readers can check.

Each notebook makes one `Provenance(name)` and
  - `use(role, path, rows_read=...)` for every data file it reads: the path (relative to the repo), the sha256 of
    its bytes and its number of JSONL rows, counted here from the file itself, next to the rows the notebook says
    it read; a stated input that is missing raises `FileNotFoundError` saying what to run (never a silent fallback);
  - `made(role, **facts)` for data generated in the notebook (the task's prompts, from a seed);
  - `skip(role, path, reason)` for an optional input it did not use, printed so the reader sees it;
  - `figure(fig, stem)` for every figure: saved as `<out>/<stem>.png`, shown inline from that same file (so the
    committed notebook displays exactly the listed PNG), then closed; `image(path)` for a PNG a library
    function saved;
  - `result(**numbers)` for headline numbers, and `write()` at the end: `<out>/provenance.json`, also printed as
    one JSON line.

`<out>` is `$RLHFLESS_NB_OUT` when set (the tests point it at a temporary folder), else `runs/notebooks/<name>`.
`RLHFLESS_NB_SMALL=1` selects the test size; `size` records which one ran.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL = os.environ.get("RLHFLESS_NB_SMALL") == "1"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def count_rows(path: Path) -> int:
    """Non-blank lines of a JSONL file (gzip when the name ends in .gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def rel(path: Path) -> str:
    """`path` relative to the repo when inside it or beside it (`../shared/...`): stable across checkouts and
    free of machine paths in committed outputs; else absolute."""
    p = Path(path).resolve()
    if p.is_relative_to(REPO):
        return str(p.relative_to(REPO))
    return os.path.join("..", p.relative_to(REPO.parent)) if p.is_relative_to(REPO.parent) else str(p)


def cpu_name() -> str:
    """The CPU model (absolute times mean little without it): the runtime's own reading of it."""
    from rlhfless.runtime.devices.profile import cpu_name as runtime_cpu_name

    return runtime_cpu_name()


def _plain(v):
    """Numbers as JSON allows them (NaN -> None), numpy scalars as Python numbers."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


class Provenance:
    """Collects inputs, figures and results of one notebook run; `write()` saves them (see module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self.out = Path(os.environ.get("RLHFLESS_NB_OUT") or REPO / "runs" / "notebooks" / name)
        self.out.mkdir(parents=True, exist_ok=True)
        for old in self.out.glob("*.png"):  # figures of an earlier run must not pass for this run's
            old.unlink()
        self.inputs: list[dict] = []
        self.figures: list[str] = []
        self.results: dict = {}
        self._t0 = time.perf_counter()

    def require(self, path: Path, how: str) -> Path:
        """`path` if it exists, else FileNotFoundError saying how to make it."""
        if not Path(path).exists():
            raise FileNotFoundError(f"{self.name} needs {rel(path)}, which is missing: {how}")
        return Path(path)

    def use(self, role: str, path: Path, *, rows_read: int | None = None, how: str = "", **facts) -> Path:
        """Record a data file the notebook read (hash and row count computed here, from the file)."""
        p = self.require(path, how or "restore it from git")
        entry = {"role": role, "path": rel(p), "sha256": sha256(p)}
        if p.name.endswith((".jsonl", ".jsonl.gz")):
            entry["rows"] = count_rows(p)
        if rows_read is not None:
            entry["rows_read"] = rows_read
        entry.update(_plain(facts))
        self.inputs.append(entry)
        print(f"[{self.name}] {role}: {entry['path']} (sha256 {entry['sha256'][:12]}"
              + (f", {entry['rows']} rows" if "rows" in entry else "") + ")")
        return p

    def made(self, role: str, **facts) -> None:
        """Record data the notebook generated itself (no file), with what reproduces it."""
        self.inputs.append({"role": role, "generated": True, **_plain(facts)})

    def skip(self, role: str, path: Path, reason: str) -> None:
        """Record (and print) an optional input this run did not use."""
        self.inputs.append({"role": role, "path": rel(path), "used": False, "reason": reason})
        print(f"[{self.name}] SKIPPED {role}: {rel(path)}: {reason}")

    def figure(self, fig, stem: str) -> None:
        """Save `fig` as `<out>/<stem>.png`, display that file inline, close the figure."""
        import matplotlib.pyplot as plt

        path = self.out / f"{stem}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        self.image(path)

    def image(self, path: Path) -> None:
        """Display a saved PNG inline and list it as one of this run's figures."""
        from IPython.display import Image, display

        display(Image(filename=str(path)))
        self.figures.append(rel(path))

    def result(self, **values) -> None:
        self.results.update(_plain(values))

    def write(self) -> None:
        record = {"notebook": self.name, "size": "small" if SMALL else "full", "inputs": self.inputs,
                  "figures": self.figures, "results": self.results,
                  "wall_s": round(time.perf_counter() - self._t0, 1), "cpu": cpu_name(),
                  "cpus": os.cpu_count()}
        path = self.out / "provenance.json"
        path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
        print(json.dumps(record, allow_nan=False))
