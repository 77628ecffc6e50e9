"""`rlhfless profile` on the CPU with the tiny shape: real measurements through the engine's own decode step and
prefill, written in the format the planner and the simulator read, with the simulator's prediction beside."""

from __future__ import annotations

import json

import pytest

from rlhfless.bench.device_profile import ProfileConfig, hf_config, run_profile, save
from rlhfless.cli import main
from rlhfless.config import load_run_config
from rlhfless.plan.timemodel import TimeModel
from rlhfless.sim.calibrate import read_tpot
from rlhfless.sim.hardware import model as model_shape

SMALL = dict(model="tiny", device="cpu", batch_sizes=(1, 4), contexts=(16, 48), prefill_tokens=(32, 96),
             prefill_row=32, iters=3, warmup=1, repeats=2, cold_start=False)


def test_a_tiny_cpu_profile_is_read_by_the_planner_and_the_simulator(tmp_path):
    doc = run_profile(ProfileConfig(**SMALL))
    path = save(doc, tmp_path / "tiny.json")
    rows = doc["rows"]
    assert [(r["batch_size"], r["context"]) for r in rows] == [(1, 18), (4, 18), (1, 50), (4, 50)]
    assert all(r["s_per_iter"] > 0 and r["n"] == 3 for r in rows)
    pre = doc["profile"]["prefill"]
    assert [(r["tokens"], r["rows"]) for r in pre] == [(32, 1), (96, 3)] and all(r["seconds"] > 0 for r in pre)
    assert doc["prefill_s_per_token"] == pytest.approx(pre[1]["seconds"] / 96)
    tm = TimeModel.from_json(path, context=50)  # the planner's reader, as plan.time_profile=FILE uses it
    assert tm.batch_sizes == (1, 4) and tm.s_per_iter == (rows[2]["s_per_iter"], rows[3]["s_per_iter"])
    assert tm.prefill_s_per_token == doc["prefill_s_per_token"]
    load_run_config(None, [f"plan.time_profile={path}"]).plan.time_model()
    assert read_tpot(path) == rows  # the simulator's calibration reader
    sim = doc["profile"]["simulator"]
    assert sim["device_kind"] == "cpu-core" and len(sim["decode"]) == 4 and len(sim["prefill"]) == 2
    for r in sim["decode"] + sim["prefill"]:
        assert r["predicted_s"] > 0 and r["ratio"] == pytest.approx(r["measured_s"] / r["predicted_s"])


def test_the_profiled_model_has_the_named_shape():
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"):
        c, s = hf_config(name, 4096), model_shape(name)
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                c.intermediate_size, c.vocab_size) == (s.layers, s.hidden, s.heads, s.kv_heads, s.intermediate, s.vocab)
    # the public Qwen2.5-0.5B: 494 M parameters with its tied embedding (shapes only: nothing is built)
    assert abs(model_shape("qwen2.5-0.5b").params - 494e6) / 494e6 < 0.02


@pytest.mark.slow
def test_the_cli_measures_a_cold_start_in_a_fresh_process(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main(["profile", "--device", "cpu", "--model", "tiny", "--out", str(out), "--batch-sizes", "1",
               "--contexts", "16", "--prefill-tokens", "32", "--iters", "2", "--no-progress"])
    assert rc == 0
    cs = json.loads(out.read_text())["profile"]["cold_start"]
    assert cs["total_s"] > cs["load_s"] > 0 and cs["imports_s"] > 0 and cs["weight_bytes"] > 0
    assert "cold start" in capsys.readouterr().err


def test_the_gpu_check_without_cuda_exits_2_with_one_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from rlhfless.core.devices import cuda_visible

    if cuda_visible():
        pytest.skip("this machine has CUDA: the check would run")
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "check.json"
    proc = subprocess.run([str(repo / "scripts" / "gpu_check.sh"), str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "no CUDA device is visible" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_the_gpu_checks_code_runs_on_the_cpu(tmp_path):
    """The check's own code path at CPU size (the numbers mean nothing here; on a GPU it runs at full size)."""
    from rlhfless.bench.gpucheck import main

    out = tmp_path / "check.json"
    assert main([str(out), "--device", "cpu", "--models", "tiny", "--steps", "2", "--no-tests"]) == 0, out.read_text()
    r = json.loads(out.read_text())
    assert r["profiles"]["tiny"]["profile"]["simulator"]["decode"]
    g = r["inline_grpo"]
    assert len(g["steps"]) == 2 and all(s["tokens_per_s"] > 0 for s in g["steps"])
    c = r["compare"]  # the runtime's three arms (on 2 cores here; 4 functions on one GPU there)
    assert c["samples_identical"] and c["weights_identical"] and c["serverless"]["cost_device_s"] > 0
