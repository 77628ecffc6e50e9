"""The only module that talks to Weights & Biases.

Every run also writes `metrics.jsonl` (one line per step) and `tables/<name>.jsonl` in its run directory, so
notebooks and summaries never depend on W&B being installed or online. W&B runs offline by default (files under
`<run_dir>/wandb`, upload later with `wandb sync`); `disabled` skips importing wandb at all (unit tests).
The JSONL mirror is standard JSON like every other report (`rlhfless.jsonl.write_json`): NaN and inf become null.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlhfless.config import TrackingConfig
from rlhfless.jsonl import json_safe


def _default(v: Any) -> Any:
    """numpy scalars as Python numbers (NaN -> null), anything else not JSON as its string (as `write_json`)."""
    return json_safe(v.item()) if hasattr(v, "item") else str(v)


def json_line(obj: dict) -> str:
    """One standard-JSON line: NaN/inf -> null (never the bare `NaN` token or the string "nan")."""
    return json.dumps(json_safe(obj), allow_nan=False, default=_default) + "\n"


class Tracker:
    """Log scalars per step and decision tables; mirror everything to local JSONL files."""

    def __init__(self, cfg: TrackingConfig, run_dir: str | Path, config: dict, job_type: str = "train"):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8")
        self._run = None
        if cfg.mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self._wandb = wandb
            self._run = wandb.init(
                project=cfg.project, name=cfg.name or self.run_dir.name, group=cfg.group, job_type=job_type,
                dir=str(self.run_dir), mode=cfg.mode, config=config, reinit="finish_previous",
                settings=wandb.Settings(console="off", x_disable_stats=True),
            )

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
        tdir = self.run_dir / "tables"
        tdir.mkdir(exist_ok=True)
        with (tdir / f"{name}.jsonl").open("a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json_line({"step": step, **dict(zip(columns, r))}))
        if self._run is not None:
            self._run.log({name: self._wandb.Table(columns=columns, data=rows)}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        if self._run is not None:
            for k, v in values.items():
                self._run.summary[k] = v

    def finish(self) -> None:
        self._metrics.close()
        if self._run is not None:
            self._run.finish()
            self._run = None
