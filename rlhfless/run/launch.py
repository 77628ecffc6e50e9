"""`train(cfg, out)`: one run, or with `runtime.mode=compare` every arm of a comparison (`run.compare`).

The one entry point the CLI, `repro`, the benchmarks and the notebooks call. It sits above both the single run
(`run.runner`) and the comparison, so the comparison calls the runner directly (no callback) and neither imports
the other's caller.
"""

from __future__ import annotations

from pathlib import Path

from rlhfless.config import RunConfig
from rlhfless.run import compare, runner


def train(cfg: RunConfig, out_dir: str | Path, progress: bool = True, resume: bool = False,
          allow_config_change: bool = False) -> dict:
    """`runner.train` for one run; for `runtime.mode=compare` the comparison's summary (OUT/comparison.json)."""
    if cfg.runtime.mode != "compare":
        return runner.train(cfg, out_dir, progress, resume, allow_config_change)
    from rlhfless.core.outpaths import claim_run_dir

    cfg.check_machine()
    # the folder is the comparison's alone from here on (as runner.train claims a single run's)
    with claim_run_dir(str(out_dir), resume, earlier_run_ok=True):
        return compare.compare(cfg, Path(out_dir), progress)
