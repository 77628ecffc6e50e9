"""Execute notebooks at full size and save their outputs in place (`make notebooks`).

    python notebooks/run_all.py [notebooks/01_quickstart.ipynb ...]    # default: every notebooks/*.ipynb

Each notebook runs top to bottom in a fresh kernel with `RLHFLESS_NB_SMALL` and `RLHFLESS_NB_OUT` unset (full
size, figures and provenance under runs/notebooks/<name>/). Only a notebook that ran without an error is written
back, so a failure never leaves half-executed outputs in a committed file; the script then exits 1, after one
line per failed notebook naming the cell, its error and the fix (the full traceback is in the cell, in Jupyter).
Without the notebooks extra it says which to install and exits 2.
The tests run the notebooks at the test size on in-memory copies and never write them (tests/test_notebooks.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 4 * 3600  # generous: a full-size cell may train for many minutes on 2 CPU cores


def run(path: Path) -> bool:
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(HERE)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        print(failure_line(path, nb, exc, time.perf_counter() - t0), file=sys.stderr)
        return False
    nbformat.write(nb, path)
    print(f"{path.name}: {time.perf_counter() - t0:.0f} s, outputs saved", file=sys.stderr)
    return True


ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXTRA = ("nbclient", "nbformat", "ipykernel")
"""The notebooks extra's modules this script needs (pyproject.toml: `notebooks`)."""


def failure_line(path: Path, nb, exc, seconds: float) -> str:
    """One line for a notebook that failed: the cell (1-based, as Jupyter counts code cells), its error, the fix."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    failed = [i for i, c in enumerate(code, 1) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    cell = failed[0] if failed else None
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = " ".join(ANSI.sub("", str(getattr(exc, "evalue", ""))).split())[:200]
    if ename in ("FileNotFoundError", "DataError") or "not found" in evalue:
        fix = "make the input it names first (docs/notebooks.md lists each notebook's inputs and the command for each)"
    else:
        fix = f"open {path.name} in Jupyter and run cell {cell} for the full traceback"
    where = f"cell {cell}" if cell else "a cell"
    return f"{path.name}: FAILED in {where} after {seconds:.0f} s ({ename}: {evalue}); not written. Fix: {fix}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: every notebooks/*.ipynb)")
    args = ap.parse_args(argv)
    missing = [m for m in EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        print(f"run_all.py: the notebooks extra is not installed (no {', '.join(missing)}); install it with "
              "pip install -e '.[notebooks]' (make notebooks does)", file=sys.stderr)
        return 2
    for var in ("RLHFLESS_NB_SMALL", "RLHFLESS_NB_OUT"):
        os.environ.pop(var, None)
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures are shown from their saved PNGs
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    paths = args.notebooks or sorted(HERE.glob("*.ipynb"))
    ok = [run(p.resolve()) for p in paths]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
