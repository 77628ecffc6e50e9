"""Every file a run's config names, opened and checked before the run folder exists (issue 42).

`rlhfless train` and `--dry-run` call `check_inputs` first, so a bad input is refused in one line and leaves no
`OUT` behind (a folder holding a config would make the same command, once the input is fixed, refuse it as an
earlier run). What `train` would otherwise open only later, inside the runtime or the planner:
* `runtime.length_trace` (emulated devices): the length table the emulated workers replay, built as the runtime
  builds it (missing, empty, unreadable, a folder, a row without integer lengths: refused naming the file);
* `plan.time_profile` and the predictor: the planner as the run makes it.
The policy and critic checkpoints are loaded by `runner.build_parts` before the folder is written (seconds of loading;
`--dry-run` reads them without torch: `preflight.dry_run`). A resumed run's own folder: `runfolder.check_resume`.
"""

from __future__ import annotations

from rlhfless.config import RunConfig


def check_inputs(cfg: RunConfig) -> None:
    """Raise `ConfigError`/`DataError` naming the field or file of the first bad input; writes nothing."""
    if cfg.runtime.device == "emulated" and cfg.runtime.executes:
        from rlhfless.sim.devicemodel import build_table

        build_table(cfg, cfg.train.steps)
    if cfg.train.plan:
        from rlhfless.step.planner import Planner

        Planner(cfg.predictor, cfg.plan)


__all__ = ["check_inputs"]
