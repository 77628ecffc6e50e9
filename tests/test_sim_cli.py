"""`rlhfless simulate`: the JSON report's keys, one-line errors naming the field, and --validate on run dirs
(an inline run, and a runtime comparison dir with serverless/ and serverful/ sub-runs) built here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlhfless.cli import main
from rlhfless.core.records import TraceRow
from rlhfless.plan import PlanJob, assign
from rlhfless.sim.validate import (
    StageModel,
    _context,
    decode_features,
    trained_tokens,
    unique_prompt_tokens,
    validate,
)
from rlhfless.sim.workload import replay_trace
from rlhfless.core.traces import TraceWriter

POLICY_KEYS = {"step_time_s", "cost_device_s", "cost_usd"}
TOP_KEYS = {"speedup", "cost_reduction", "gap_to_oracle_time", "gap_to_oracle_cost", "sim_wall_s", "policies"}


def test_simulate_writes_the_json_report_and_figures(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "--scenario", "quick", "--steps", "2", "lam=0.8", "--json", str(out),
                 "--out", str(tmp_path / "fig")]) == 0
    rep = json.loads(out.read_text())
    assert TOP_KEYS <= set(rep)
    for name in ("verl", "rlhfuse", "rlhfless", "oracle"):
        assert POLICY_KEYS <= set(rep["policies"][name])
        assert all(np.isfinite(rep["policies"][name][k]) and rep["policies"][name][k] > 0 for k in POLICY_KEYS)
    assert rep["cases"][0]["steps"] == 2
    pngs = sorted(p.name for p in (tmp_path / "fig").glob("*.png"))
    assert pngs == ["qwen2.5-3b_grpo-small_gantt.png", "qwen2.5-3b_grpo-small_stages.png"]
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize("argv, field", [
    (["--scenario", "nope"], "scenario:"),
    (["--scenario", "quick", "device=TPU"], "device:"),
    (["--scenario", "quick", "model=gpt"], "model:"),
    (["--scenario", "quick", "tp=0", "model=llama-70b", "n_devices=2"], "model:"),
    (["--scenario", "quick", "group_size=4096"], "n_devices:"),  # no replica holds one group's KV
    (["--scenario", "quick", "lam=3"], "lam:"),
    (["--scenario", "quick", "nokey=1"], "unknown config key 'nokey'"),
    ([], "scenario:"),
    (["--validate", "/nonexistent/run"], "validate:"),
])
def test_bad_input_is_one_line_naming_the_field(argv, field, capsys):
    assert main(["simulate", *argv, "--steps", "1"] if argv and argv[0] == "--scenario" else ["simulate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


# ---- --validate on run dirs made here ------------------------------------------------------------------
OV, BW, OVERHEAD = 0.0015, 2e9, 0.4  # the "true" machine the fake runs were measured on


def _write_run(d: Path, mode: str, steps: int = 8, extra: dict | None = None) -> None:
    """A run dir as `rlhfless train` (inline) or the runtime (serverless/serverful) writes it, measured on a
    machine with known constants: decode = OV x iterations + bytes / BW; prefill, update linear in tokens;
    serverless workers billed busy + OVERHEAD each (2 decode actors, 2 learner ranks)."""
    rng = np.random.default_rng(0)
    d.mkdir(parents=True)
    rows = [TraceRow(f"p{p}", "x", s // 4, s, k, 10 + p, int(rng.integers(5, 120)), False, float(rng.integers(0, 2)))
            for s in range(1, steps + 1) for p in range(8) for k in range(4)]
    with TraceWriter(d / "traces" / "rollouts.jsonl") as w:
        w.write(rows)
    cfg = {"algo": {"skip_zero_variance_groups": True}, "train": {"threads": 2},
           "plan": {"capacity": 32, "policy": "contiguous"}}
    if mode != "inline":
        cfg["runtime"] = {"mode": mode, "units": 2}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    work = replay_trace(d / "traces" / "rollouts.jsonl")
    n, policy = (1, "round_robin") if mode == "inline" else (2, "contiguous")
    # inline: one engine batch of all 32 sequences; runtime: plan.capacity 32 per actor
    feats = decode_features(work, [n] * len(work), 32, _context(work), policy)
    invocations = []
    with (d / "metrics.jsonl").open("w") as fh:
        for s, f in zip(work, feats):
            dec = f @ np.array([OV, 1 / BW])
            pre = 0.002 + 1e-5 * unique_prompt_tokens(s)
            upd = 0.05 + 2e-5 * trained_tokens(s, True)
            roll = pre + dec + 0.001
            m = {"step": s.step, "timing_s/decode": dec, "timing_s/prefill": pre, "timing_s/update": upd,
                 "timing_s/rollout": roll, "timing_s/step": roll + upd + 0.01, "scaler/num_actors": n}
            if mode == "serverless":
                tm = StageModel(BW, OV, (0, 0), (0, 0), 0, 0, {}).time_model(32, _context(work))
                busy = sum(assign([PlanJob(g.prompt_id, len(g.lengths), tuple(map(float, g.lengths)))
                                   for g in s.groups], 2, 32, tm, "contiguous")[0].busy_s)
                m["function/decode/billed_s"] = busy + 2 * OVERHEAD
                m["function/learner/billed_s"] = 2 * (upd + OVERHEAD)
                m["cost/device_seconds"] = m["function/decode/billed_s"] + m["function/learner/billed_s"]
                invocations += [{"step": s.step, "kind": k, "worker": f"{k}-{s.step}-{i}", "units": 1.0, "ok": True}
                                for k in ("decode", "learner") for i in range(2)]
            m.update(extra or {})
            fh.write(json.dumps(m) + "\n")
    if invocations:
        (d / "invocations.jsonl").write_text("".join(json.dumps(i) + "\n" for i in invocations))


def test_validate_inline_run_recovers_the_machine(tmp_path, capsys):
    _write_run(tmp_path / "run", "inline")
    out = tmp_path / "v.json"
    assert main(["simulate", "--validate", str(tmp_path / "run"), "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["step_time_error"] < 1e-3 and rep["cost_error"] < 1e-3
    cal = rep["modes"]["inline"]["calibration"]
    assert cal["iter_overhead_s"] == pytest.approx(OV, rel=1e-3) and cal["bytes_per_s"] == pytest.approx(BW, rel=1e-3)
    assert rep["modes"]["inline"]["steps_validated"] == 4  # calibrated on alternate steps, validated on the others


def test_validate_detects_a_wrong_model(tmp_path):
    _write_run(tmp_path / "a", "inline")
    _write_run(tmp_path / "b", "inline")
    # run b measured twice as slow a decode: calibrating on a and validating b must report a large error
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r["timing_s/step"] += r["timing_s/decode"]
        r["timing_s/rollout"] += r["timing_s/decode"]
        r["timing_s/decode"] *= 2
    (tmp_path / "b" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = validate(tmp_path / "b", calibrate_from=tmp_path / "a")
    assert rep["modes"]["inline"]["stages"]["decode"]["rel_error"] == pytest.approx(0.5, rel=1e-3)


def test_validate_runtime_comparison_dir(tmp_path):
    _write_run(tmp_path / "cmp" / "serverful", "serverful")
    _write_run(tmp_path / "cmp" / "serverless", "serverless")
    rep = validate(tmp_path / "cmp")
    assert set(rep["modes"]) == {"serverless", "serverful"}
    sl = rep["modes"]["serverless"]["cost"]
    for kind in ("decode", "learner"):  # busy device-seconds + the per-worker overhead fitted on the calibration steps
        row = sl[f"function/{kind}/billed_s"]
        assert row["rel_error"] < 1e-3 and row["overhead_per_worker_s"] == pytest.approx(OVERHEAD, rel=1e-3)
    assert "missing" in sl["function/prefill/billed_s"]  # not billed by the run: said so, not guessed
    assert rep["modes"]["serverful"]["cost"]["cost_device_s"]["rel_error"] < 1e-3  # units x wall
    assert rep["cost_error"] < 1e-3 and rep["step_time_error"] < 1e-3


def test_simulate_help_names_every_scenario_whole(capsys):
    """`--scenario`'s help is written without importing the registry; it must not drift from it (it once left out
    local-cpu), and a name must not be split across lines where a user would copy it."""
    from rlhfless.sim import SCENARIO_HELP
    from rlhfless.sim.scenario import SCENARIOS

    assert list(SCENARIO_HELP) == list(SCENARIOS)
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    words = set(capsys.readouterr().out.split())
    assert all(any(w.startswith(name) for w in words) for name in SCENARIOS)


def test_a_simulation_imports_neither_torch_nor_scipy_stats():
    """The simulator never imports torch (the layering rule), and its start-up stays free of scipy.stats (1.3 s of
    CPU it once paid for one normal quantile): a fresh interpreter plays a one-step scenario and lists them."""
    import subprocess
    import sys

    code = ("import sys; from rlhfless.sim.scenario import run_scenario; run_scenario('quick', 1); "
            "print([m for m in ('torch', 'scipy.stats') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
