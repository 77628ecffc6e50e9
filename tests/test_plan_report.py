"""Trace report and CLI wiring: a small trace written to tmp_path, the planner bench at tiny size."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from rlhfless.core.errors import DataError
from rlhfless.plan import cli as plan_cli
from rlhfless.plan.bench import run_planner_bench
from rlhfless.plan.config import PlanConfig
from rlhfless.plan.report import trace_report, trace_steps
from rlhfless.core.records import TraceRow
from rlhfless.core.traces import TraceWriter


def _write_trace(path, epochs=2, steps=2, groups=12, g=4, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.lognormal(4.0, 1.0, groups * steps)
    rows = []
    for e in range(epochs):
        for s in range(steps):
            for p in range(groups):
                pid = f"p{s * groups + p}"
                for k in range(g):
                    n = int(np.clip(means[s * groups + p] * rng.lognormal(0, 0.3), 1, 512))
                    rows.append(TraceRow(pid, "q", e, e * steps + s, k, 30, n, n == 512, 0.0))
    with TraceWriter(path) as w:
        w.write(rows)
    return rows


def _parser():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    bench = sub.add_parser("bench").add_subparsers(dest="bench_name")
    plan_cli.register(sub, bench)
    return parser


def test_trace_steps_groups_last_epoch(tmp_path):
    rows = _write_trace(tmp_path / "t.jsonl")
    steps = trace_steps(rows)
    assert sorted(steps) == [(1, 2), (1, 3)]
    job = steps[(1, 2)][0]
    assert job.n_seqs == 4 and len(job.predicted_len) == 4 and job.prompt_len == 30
    assert len(trace_steps(rows, "all")) == 4


def test_trace_report_compares_policies_and_fixed_n(tmp_path):
    _write_trace(tmp_path / "t.jsonl")
    cfg = PlanConfig(max_actors=4, capacity=16)
    rep = trace_report(tmp_path / "t.jsonl", cfg)
    assert rep["steps"] == 2 and rep["sequences"] == 2 * 12 * 4
    assert set(rep["policies"]) == {"round_robin", "contiguous", "lpt", "karmarkar_karp"}
    assert rep["idle_reduction_vs_round_robin"]["round_robin"] == pytest.approx(1.0)
    assert [r["n_actors"] for r in rep["fixed_n"]] == [1, 2, 3, 4]
    assert len(rep["scaler"]["chosen"]) == 2
    fixed = {r["n_actors"]: r for r in rep["fixed_n"]}
    for c in rep["scaler"]["chosen"]:
        assert 1 <= c["n_actors"] <= 4
    assert min(r["cost_usd"] for r in fixed.values()) > 0
    json.dumps(rep)  # JSON-ready


def test_cli_plan_trace_and_bench(tmp_path, capsys):
    _write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out" / "rep.json"
    args = _parser().parse_args(["bench", "plan-trace", "--trace", str(tmp_path / "t.jsonl"), "--json", str(out),
                                 "--set", "max_actors=3", "--set", "plan.capacity=16"])
    assert args.func(args) == 0
    assert json.loads(out.read_text())["n_actors"] == 3
    cfg_file = tmp_path / "plan.yaml"
    cfg_file.write_text("plan:\n  policy: lpt\n  max_actors: 2\n")
    assert plan_cli.load_plan_config(str(cfg_file), ["lam=0.25"]) == PlanConfig(policy="lpt", max_actors=2, lam=0.25)
    with pytest.raises(DataError, match="not found"):
        trace_report(tmp_path / "missing.jsonl")


def test_planner_bench_small():
    res = run_planner_bench(n_groups=32, group_size=4, n_actors=4, n_candidates=6, repeats=3)
    for key in ("plan_ms_p50", "plan_ms_p90", "plan_cpu_ms_p50", "assign_ms_p50", "assign_ms_p90", "policy_ms_p50",
                "exact_sweep_ms", "plan_migrate_ms_p50", "migrate_used", "cpu"):
        assert key in res
    assert res["plan_ms_p50"] > 0 and res["sequences"] == 128 and 1 <= res["scaler_choice"] <= 6
    assert res["sweep_vs_exact"]["exact_choice"] in range(1, 7) and "full decision" in res["what"]
