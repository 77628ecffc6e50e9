"""Two runs never mix: a run folder is claimed under a lock at the moment it is checked (`outpaths.claim_run_dir`).

The main test starts two real `rlhfless train` processes at the same moment into the same new folder; exactly
one runs, the other is refused in one line, and the folder holds one run's files. The others hold a folder with a
real second process (a live claim) and leave a lock behind with `kill -9` (a dead claim, which never blocks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlhfless.cli import main
from rlhfless.core.errors import ConfigError
from rlhfless.core.outpaths import LOCK_NAME, check_run_dir, claim_run_dir

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.arith.num_train=48", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=32",
        "train.steps=3", "train.eval_prompts=4", "train.threads=1", "tracking.mode=disabled", "predictor.name=ewma",
        "train.checkpoint_every=1"]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_two_runs_started_at_once_into_one_new_folder_cannot_mix(tmp_path):
    out = tmp_path / "new" / "run"
    procs = [subprocess.Popen([sys.executable, "-m", "rlhfless.cli", "train", "--no-progress", "--out", str(out),
                               f"train.seed={seed}", *TINY], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    winner = 1 + [rc for rc, _ in results].index(0)
    refused = [err for rc, err in results if rc == 2][0].strip().splitlines()
    assert len(refused) == 1 and str(out) in refused[0] and "Traceback" not in refused[0]
    # refused while the other ran (its pid), or after it ended (the folder then holds an earlier run)
    assert "another run (pid " in refused[0] or "earlier run" in refused[0], refused[0]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert cfg["train"]["seed"] == summary["seed"] == winner
    assert len(_lines(out / "traces" / "rollouts.jsonl")) == 3 * 4 * 4  # one run's rows: steps x B x G
    assert [json.loads(x)["step"] for x in _lines(out / "traces" / "samples_digest.jsonl")] == [1, 2, 3]
    assert [json.loads(x)["step"] for x in _lines(out / "metrics.jsonl") if "reward/mean" in x] == [1, 2, 3]
    assert not (out / LOCK_NAME).exists() and sorted(p.name for p in out.parent.iterdir()) == ["run"]


def _holder(path: Path) -> subprocess.Popen:
    """A second, live process holding the claim on `path` until its stdin closes (it says when it holds it)."""
    code = ("import sys; from rlhfless.core.outpaths import claim_run_dir; c = claim_run_dir(sys.argv[1], False); "
            "print('held', flush=True); sys.stdin.read(); c.release()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO, env=ENV, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"  # an event, not a wait
    return proc


def test_a_folder_a_live_run_holds_is_refused_naming_its_pid_and_left_alone(tmp_path, capsys):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        (out / "config.yaml").write_text("train: {seed: 7}\n")  # what the live run has written so far
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        for argv in (["train", "--no-progress", "--out", str(out), *TINY],
                     ["train", "--no-progress", "--resume", "--out", str(out), *TINY],
                     ["simulate", "--scenario", "quick", "--out", str(out)]):  # no other command writes there
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"another run (pid {holder.pid})" in err and str(out) in err
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            claim_run_dir(str(out), resume=False, earlier_run_ok=True)  # a library caller never moves it aside
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not list(tmp_path.glob("run.*"))
    finally:
        holder.stdin.close()
        holder.wait()
    assert not (out / LOCK_NAME).exists()  # released: the folder is the first run's again


def test_a_lock_left_by_a_killed_run_does_not_block_and_a_refused_claim_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "run"
    holder = _holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (out / LOCK_NAME).read_text().strip() == str(holder.pid)  # the dead run's lock file is still there
    assert check_run_dir(str(out), resume=False) == out  # a folder with only a stale lock counts as empty
    with claim_run_dir(str(out), resume=False) as claim:
        assert (out / LOCK_NAME).read_text().strip() == str(os.getpid()) and claim.path == out
    assert out.is_dir() and not any(out.iterdir())  # it existed before this claim: kept, emptied of the lock
    fresh = tmp_path / "b" / "c"
    with claim_run_dir(str(fresh), resume=False):
        assert fresh.is_dir()
    assert not (tmp_path / "b").exists()  # nothing written: the folders the claim made are gone again
