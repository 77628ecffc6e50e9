"""Execute notebooks at full size and save their outputs in place (`make notebooks`).

    python notebooks/run_all.py [notebooks/01_quickstart.ipynb ...]    # default: every notebooks/*.ipynb

Each notebook runs top to bottom in a fresh kernel with `RLHFLESS_NB_SMALL` and `RLHFLESS_NB_OUT` unset (full
size, figures and provenance under runs/notebooks/<name>/). Only a notebook that ran without an error is written
back, so a failure never leaves half-executed outputs in a committed file; the script then exits 1.
The tests run the notebooks at the test size on in-memory copies and never write them (tests/test_notebooks.py).
"""

from __future__ import annotations

import argparse
import os
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
        print(f"{path.name}: FAILED after {time.perf_counter() - t0:.0f} s; not written\n{exc}", file=sys.stderr)
        return False
    nbformat.write(nb, path)
    print(f"{path.name}: {time.perf_counter() - t0:.0f} s, outputs saved", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: every notebooks/*.ipynb)")
    args = ap.parse_args(argv)
    for var in ("RLHFLESS_NB_SMALL", "RLHFLESS_NB_OUT"):
        os.environ.pop(var, None)
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures are shown from their saved PNGs
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    paths = args.notebooks or sorted(HERE.glob("*.ipynb"))
    ok = [run(p.resolve()) for p in paths]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
