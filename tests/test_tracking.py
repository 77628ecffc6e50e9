"""Tracker: the metrics/tables mirror is standard JSON (NaN as null); a real run logged to W&B offline reads
back from W&B's own files with the step metrics and the decision tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlhfless.core import metrics as M
from rlhfless.config import TrackingConfig, load_run_config
from rlhfless.run.tracking import Tracker, read_offline_run

TABLES = ("scaler_candidates", "completions", "predicted_vs_actual", "assignment")


def _strict(line: str) -> dict:
    """Parse one line as standard JSON: a bare NaN/Infinity token is an error, not a float."""
    def reject(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(line, parse_constant=reject)


def test_metrics_and_tables_write_nan_and_inf_as_null(tmp_path):
    tracker = Tracker(TrackingConfig(mode="disabled"), tmp_path, config={})
    tracker.log({"a": 1.5, "b": float("nan"), "c": float("inf"), "d": np.float64("nan")}, step=3)
    tracker.table("scaler_candidates", ["n", "score"], [[1, float("nan")], [2, 0.25], [3, -math.inf]], step=3)
    tracker.finish()

    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert _strict(line) == {"step": 3, "a": 1.5, "b": None, "c": None, "d": None}
    rows = [_strict(x) for x in (tmp_path / "tables" / "scaler_candidates.jsonl").read_text().splitlines()]
    assert rows == [{"step": 3, "n": 1, "score": None}, {"step": 3, "n": 2, "score": 0.25},
                    {"step": 3, "n": 3, "score": None}]


def test_numpy_scalars_are_written_as_numbers(tmp_path):
    tracker = Tracker(TrackingConfig(mode="disabled"), tmp_path, config={})
    tracker.log({"n": np.int64(7), "x": np.float32(0.5), "y": np.float32("nan")}, step=1)
    tracker.finish()
    assert _strict((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "n": 7, "x": 0.5, "y": None}


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B in offline mode, every file it writes under tmp_path; nothing can leave the machine."""
    wandb = pytest.importorskip("wandb")
    for var, sub in (("WANDB_DIR", "wandb"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield tmp_path
    wandb.teardown()  # stop the wandb-core service this test started


def test_a_run_logged_offline_reads_back_from_wandb(offline_wandb, sft_checkpoint):
    from rlhfless.run.launch import train

    cfg = load_run_config(None, [
        f"policy.checkpoint={sft_checkpoint}", "train.steps=3", "rollout.prompts_per_step=4", "algo.group_size=4",
        "train.eval_prompts=8", "train.eval_greedy=false", "train.table_every=1", "rollout.max_new_tokens=48",
        "train.threads=1", "tracking.mode=offline"])
    out = offline_wandb / "run"
    summary = train(cfg, out, progress=False)

    assert summary["wandb_dir"] and summary["wandb_dir"].startswith(str(out / "wandb" / "offline-run-"))
    run = read_offline_run(summary["wandb_dir"])
    history = {row["_step"]: row for row in run.history}
    assert sorted(history) == [0, 1, 2, 3]
    mirrored = {row["step"]: row for row in _jsonl(out / "metrics.jsonl") if M.REWARD_MEAN in row}
    for step in (1, 2, 3):
        row = history[step]
        for key in (M.REWARD_MEAN, "timing_s/step", "timing_s/rollout", M.RESP_LEN_MEAN, "scaler/num_actors",
                    "predictor/mae", "prefill/dedup_ratio"):
            assert key in row, (step, key)
        assert row[M.REWARD_MEAN] == pytest.approx(mirrored[step][M.REWARD_MEAN])
        assert row["timing_s/step"] > 0
    assert history[0][M.EVAL_ACC] == pytest.approx(summary["eval_accuracy_initial"])
    assert history[3][M.EVAL_ACC] == pytest.approx(summary["eval_accuracy_final"])

    for name in TABLES:
        mirror = _jsonl(out / "tables" / f"{name}.jsonl")
        for step in (1, 2, 3):
            table = run.table(name, step)
            rows = [r for r in mirror if r["step"] == step]
            assert table["data"] and len(table["data"]) == len(rows), (name, step)
            assert table["columns"] == [k for k in rows[0] if k != "step"], name
    assert run.summary["steps"] == 3 and run.summary[M.REWARD_MEAN] == pytest.approx(history[3][M.REWARD_MEAN])
    assert run.config["algo"]["group_size"] == 4 and run.config["tracking"]["mode"] == "offline"


def _wandb_services() -> set[int]:
    """Pids of this process's live wandb-core children (the service that writes offline run files)."""
    import os
    from pathlib import Path

    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if ppid == os.getpid() and b"wandb-core" in cmd and state != "Z":
            pids.add(int(proc.name))
    return pids


def test_finish_returns_only_after_the_wandb_service_has_exited(offline_wandb):
    """The root cause of a flake: `run.finish()` returned while wandb-core still wrote the run file, so a reader
    right after saw a truncated record under load. `Tracker.finish` now waits for the service process to end (an
    event), so the file is complete whatever the load; with the wait removed the service outlives finish."""
    tracker = Tracker(TrackingConfig(mode="offline"), offline_wandb / "run", config={"x": 1})
    services = _wandb_services()
    assert services, "the offline run should have started a wandb-core service"
    for step in range(1, 4):
        tracker.log({M.REWARD_MEAN: 0.1 * step}, step=step)
    wandb_dir = tracker.wandb_dir
    tracker.finish()
    assert not services & _wandb_services()
    run = read_offline_run(wandb_dir)
    assert [row["_step"] for row in run.history] == [1, 2, 3]
