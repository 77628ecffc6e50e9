"""The repro's outputs: `report.md` (every figure, the command and config hash behind it, and the table of the
paper's numbers beside ours), `results.json` (everything as JSON), and one W&B run per study (group = the study,
job_type = "repro"), with its figures, its table and its inputs/outputs as artifacts.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from rlhfless.core.jsonl import write_json
from rlhfless.repro.records import StudyResult
from rlhfless.repro.studies import STUDIES

COLUMNS = ["study", "metric", "paper", "ours", "ours, tuned verl", "kind", "why"]
"""`ours` compares with verl as the paper ran it (baseline=paper) where a row compares with verl; `ours, tuned
verl` gives the same row against the tuned verl (baseline=tuned), empty where a row does not compare with verl."""


def machine() -> str:
    """CPU model and core count (absolute times in the report name their machine)."""
    from rlhfless.plan.bench import cpu_name
    from rlhfless.runtime.config import available_cores

    return f"{cpu_name()}, {available_cores()} cores available"


def git_commit(repo: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def command_for(study: str, out: Path, quick: bool, seed: int) -> str:
    return f"rlhfless repro {study} --out {out}" + (" --quick" if quick else "") + (f" --seed {seed}" if seed else "")


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def study_json(r: StudyResult, out: Path) -> dict:
    return {"title": r.title, "config": r.config, "config_hash": r.config_hash, "seconds": r.seconds,
            "figures": [str(p.relative_to(out)) for p in r.figures], "rows": [asdict(x) for x in r.rows],
            "numbers": r.numbers, "notes": r.notes}


def write_results(results: list[StudyResult], ctx) -> dict:
    """DIR/results.json: this run's studies merged over those already there at the same size (so running one
    study again updates its part of the report and keeps the rest); returns the merged data."""
    path = ctx.out / "results.json"
    studies = {}
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("quick") == ctx.quick and old.get("seed") == ctx.seed:
            studies = old.get("studies", {})
    studies.update({r.name: study_json(r, ctx.out) for r in results})
    data = {"quick": ctx.quick, "seed": ctx.seed, "machine": machine(),
            "studies": {n: studies[n] for n in STUDIES if n in studies}}
    write_json(data, path, indent=1)
    return data


def write_report(data: dict, ctx, repo: Path) -> Path:
    """DIR/report.md from the merged results (`write_results`)."""
    out, studies = ctx.out, data["studies"]
    lines = [f"# rlhfless repro{' (quick)' if ctx.quick else ''}", "",
             f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} at commit {git_commit(repo)} on "
             f"{data['machine']}; seed {ctx.seed}. `measured`: real processes on this machine; `simulated`: the "
             "simulator's time-model seconds and billed device-seconds (it runs the real planner). Where a row "
             "compares with verl, `ours` is against verl as the paper ran it (verl 0.3.x settings, "
             "docs/overheads.md) and `ours, tuned verl` against the tuned verl.", "",
             "## The paper beside ours", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, st in studies.items():
        for row in st["rows"]:
            lines.append("| " + " | ".join(_md_cell(x) for x in (name, row["metric"], row["paper"], row["ours"],
                                                                   row.get("ours_tuned", ""), row["kind"],
                                                                   row["why"])) + " |")
    for name, st in studies.items():
        lines += ["", f"## {name}: {st['title']}", "",
                  f"- command: `{command_for(name, out, ctx.quick, ctx.seed)}`",
                  f"- config hash `{st['config_hash']}`: `{json.dumps(st['config'], sort_keys=True, default=str)}`",
                  f"- took {st['seconds']:.1f} s"]
        lines += [f"- {n}" for n in st["notes"]]
        lines += [""] + [f"![{name}]({p})" for p in st["figures"]]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def track(result: StudyResult, ctx) -> str | None:
    """One W&B run for the study (offline by default): its table, figures, numbers and artifacts. Returns the
    run's folder, or None when tracking is disabled."""
    from rlhfless.config import TrackingConfig
    from rlhfless.run.tracking import Tracker

    cfg = TrackingConfig(mode=ctx.tracking, name=f"repro-{result.name}", group=result.name)
    tr = Tracker(cfg, ctx.out / result.name, {"study": result.name, "quick": ctx.quick, "seed": ctx.seed,
                                             **result.config}, job_type="repro")
    try:
        tr.table("paper_vs_ours", COLUMNS, [[result.name, x.metric, x.paper, x.ours, x.ours_tuned, x.kind, x.why]
                                            for x in result.rows], step=0)
        for p in result.figures:
            tr.image(f"figure/{p.stem}", p, step=0)
        tr.summary({"seconds": result.seconds, "config_hash": result.config_hash})
        tr.artifact(f"repro-{result.name}", "repro-study", [*result.figures, *result.artifacts], root=ctx.out)
        return tr.wandb_dir
    finally:
        tr.finish()
