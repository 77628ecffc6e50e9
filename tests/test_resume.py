"""Resume after a crash: a run killed with SIGKILL mid-step and resumed equals an uninterrupted run, exactly.

The kill test starts a real `rlhfless train` subprocess, kills it with `kill -9` while a step after the checkpoint
is running, resumes it, and compares metrics (all but wall-clock timings), traces, tables, the summary and the
final weights with an uninterrupted run of the same seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfless.config import load_run_config
from rlhfless.core.errors import ConfigError, DataError
from rlhfless.model.tokenizer import ByteTokenizer
from rlhfless.run.launch import train
from rlhfless.run.runner import PromptStream
from rlhfless.run.runstate import RESUME_SAFE_KEYS, config_changes
from rlhfless.tasks.arith import ArithTask, ArithTaskConfig, make_splits
from rlhfless.step.textenv import TextEnv

RUN = ["task.arith.num_train=48", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=48",
       "train.steps=6", "train.checkpoint_every=2", "train.eval_prompts=8", "train.table_every=1",
       "train.threads=1", "tracking.mode=disabled", "predictor.name=ewma"]


def _cfg(ckpt: Path, extra=()):
    return load_run_config(None, RUN + [f"policy.checkpoint={ckpt}", *extra])


def _wall_clock(key: str) -> bool:
    return key.startswith("timing_s/") or key.startswith("perf/")


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not _wall_clock(k)} for r in rows]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _same_run(a: Path, b: Path) -> None:
    assert _metrics(a) == _metrics(b)
    assert _digest(a / "traces" / "rollouts.jsonl") == _digest(b / "traces" / "rollouts.jsonl")
    for table in sorted((a / "tables").glob("*.jsonl")):
        assert _digest(table) == _digest(b / "tables" / table.name), table.name
    wa = load_file(a / "checkpoints" / "final" / "model.safetensors")
    wb = load_file(b / "checkpoints" / "final" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for s in (sa, sb):
        s.pop("wall_s"), s.pop("trace_path"), s.pop("wandb_dir")
    assert sa == sb


def _kill_after_step(cmd: list[str], out: Path, step: int, timeout: float = 300) -> None:
    """Start `cmd`, wait until step `step` is in metrics.jsonl (the next step is then running), SIGKILL it."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    metrics = out / "metrics.jsonl"
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if any(json.loads(x).get("step") == step and "reward/mean" in x for x in lines):
                break
            time.sleep(0.02)
        else:
            pytest.fail("the run did not reach the step to kill at in time")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_kill_9_mid_step_then_resume_equals_an_uninterrupted_run(sft_checkpoint, tmp_path):
    cfg = _cfg(sft_checkpoint)
    whole = tmp_path / "whole"
    train(cfg, whole, progress=False)

    crashed = tmp_path / "crashed"
    cmd = [sys.executable, "-m", "rlhfless.cli", "train", "--out", str(crashed), "--no-progress",
           f"policy.checkpoint={sft_checkpoint}", *RUN]
    _kill_after_step(cmd, crashed, step=3)  # checkpoint at step 2; step 4 is running when the kill lands
    assert not (crashed / "summary.json").exists()
    assert json.loads((crashed / "checkpoints" / "last" / "state.json").read_text())["step"] == 2
    train(cfg, crashed, progress=False, resume=True)
    _same_run(whole, crashed)
    # what the resume cut from the crashed run's files (step 3 and the part of step 4) was kept, not lost
    cut = (crashed / "resumed" / "step-2" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in cut][0] == 3


def test_a_kill_between_the_checkpoint_renames_resumes_from_the_previous_one(sft_checkpoint, tmp_path):
    cfg = _cfg(sft_checkpoint)
    whole, run = tmp_path / "whole", tmp_path / "run"
    train(cfg, whole, progress=False)
    train(_cfg(sft_checkpoint, ["train.steps=4"]), run, progress=False)
    ckpts = run / "checkpoints"
    (ckpts / "last").rename(ckpts / "last.prev")  # the moment between `last -> last.prev` and `tmp -> last`
    train(cfg, run, progress=False, resume=True)  # train.steps may grow on resume: the run is extended
    _same_run(whole, run)


def test_resume_refuses_a_config_change_that_changes_results(sft_checkpoint, tmp_path):
    run = tmp_path / "run"
    train(_cfg(sft_checkpoint, ["train.steps=2"]), run, progress=False)
    before = {p: _digest(p) for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"optim\.lr, rollout\.temperature.*--allow-config-change"):
        train(_cfg(sft_checkpoint, ["train.steps=3", "optim.lr=2e-4", "rollout.temperature=0.9"]), run,
              progress=False, resume=True)
    with pytest.raises(ConfigError, match="train.steps: the run .* already has 2 steps"):
        train(_cfg(sft_checkpoint, ["train.steps=2"]), run, progress=False, resume=True)
    assert before == {p: _digest(p) for p in run.rglob("*") if p.is_file()}  # refused before touching anything
    summary = train(_cfg(sft_checkpoint, ["train.steps=3", "optim.lr=2e-4"]), run, progress=False, resume=True,
                    allow_config_change=True)
    assert summary["steps"] == 3
    assert "lr: 0.0001" in (run / "resumed" / "step-2" / "config.yaml").read_text()  # the old config is kept


@pytest.mark.parametrize("damage", ["state_garbage", "state_truncated_rewards", "optimizer_truncated",
                                    "optimizer_wrong_shape", "rng_missing", "trace_truncated", "no_checkpoint"])
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_nothing_is_changed(sft_checkpoint, tmp_path, damage):
    run = tmp_path / "run"
    train(_cfg(sft_checkpoint, ["train.steps=2", "train.checkpoint_every=1"]), run, progress=False)
    last = run / "checkpoints" / "last"
    name = _damage(run, last, damage)
    before = {p: _digest(p) for p in run.rglob("*") if p.is_file()}
    with pytest.raises(DataError) as err:
        train(_cfg(sft_checkpoint, ["train.steps=3", "train.checkpoint_every=1"]), run, progress=False,
              resume=True)
    assert name in str(err.value) and "\n" not in str(err.value)
    assert before == {p: _digest(p) for p in run.rglob("*") if p.is_file()}


def _damage(run: Path, last: Path, how: str) -> str:
    from safetensors.torch import save_file

    if how == "state_garbage":
        (last / "state.json").write_text("{not json")
        return "state.json"
    if how == "state_truncated_rewards":
        doc = json.loads((last / "state.json").read_text())
        doc["rewards"] = doc["rewards"][:-1]
        (last / "state.json").write_text(json.dumps(doc))
        return "state.json"
    if how == "optimizer_truncated":
        data = (last / "optimizer.safetensors").read_bytes()
        (last / "optimizer.safetensors").write_bytes(data[: len(data) // 2])
        return "optimizer.safetensors"
    if how == "optimizer_wrong_shape":
        t = load_file(last / "optimizer.safetensors")
        t["0/exp_avg"] = torch.zeros(3, 3)
        save_file(t, str(last / "optimizer.safetensors"))
        return "optimizer.safetensors"
    if how == "rng_missing":
        (last / "rng.safetensors").unlink()
        return "rng.safetensors"
    if how == "trace_truncated":
        trace = run / "traces" / "rollouts.jsonl"
        trace.write_bytes(trace.read_bytes()[:100])
        return "rollouts.jsonl"
    for state in (run / "checkpoints").glob("*/state.json"):
        state.unlink()
    return "checkpoint is incomplete (no state.json)"  # it had one: not "stopped before its first" (issue 42)


def test_config_changes_ignore_only_the_keys_that_cannot_change_results():
    base = {"train": {"steps": 10, "seed": 0, "table_every": 5}, "optim": {"lr": 1e-4}, "tracking": {"mode": "x"}}
    same = {"train": {"steps": 20, "seed": 0, "table_every": 1}, "optim": {"lr": 1e-4}, "tracking": {"mode": "y"}}
    assert config_changes(base, same) == []
    other = {"train": {"steps": 10, "seed": 1, "table_every": 5}, "optim": {"lr": 2e-4}, "tracking": {"mode": "x"}}
    assert config_changes(base, other) == ["optim.lr", "train.seed"]
    assert "train.threads" not in RESUME_SAFE_KEYS  # float reduction order depends on it


def test_prompt_stream_continues_from_any_position():
    train_prompts, _ = make_splits(ArithTaskConfig(num_train=10, num_eval=1))
    env = TextEnv(ArithTask(ArithTaskConfig()), ByteTokenizer())
    a = PromptStream(train_prompts, 4, seed=3, group_size=2, env=env)
    seen = [a.next() for _ in range(7)]  # crosses several epochs, with batches that straddle them
    b = PromptStream(train_prompts, 4, seed=3, group_size=2, env=env)
    for _ in range(3):
        b.next()
    c = PromptStream(train_prompts, 4, seed=3, group_size=2, env=env, epoch=b.epoch, pos=b.pos)
    rest = [c.next() for _ in range(4)]
    assert [(e, [g.prompt.text for g in gs]) for e, gs in rest] == \
        [(e, [g.prompt.text for g in gs]) for e, gs in seen[3:]]
    assert seen[-1][0] >= 2
