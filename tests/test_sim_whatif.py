"""`rlhfless plan what-if`: its recommendation is the simulator's best point under the constraint, prices files
change dollars and nothing else, and the 160-GPU 70B case answers within 10 s."""

from __future__ import annotations

import json

import pytest

from rlhfless.cli import main
from rlhfless.plan.cost import CATALOG
from rlhfless.sim.scenario import SimConfig, run_case
from rlhfless.sim.whatif import LAMS, what_if

SMALL = dict(model="qwen2.5-3b", devices="L40S:8", steps=3, prompts_per_step=32)


def _simulated(lam: float) -> dict:
    """The same workload through `rlhfless simulate`'s own path (run_case), RLHFless at `lam`."""
    cfg = SimConfig(name="x", device="L40S", n_devices=8, model="qwen2.5-3b", steps=3, prompts_per_step=32,
                    n_prompts=96, lam=lam)
    return run_case(cfg, only=("verl", "verl-paper", "rlhfless"))["policies"]


def test_recommendation_is_the_simulators_cheapest_point_within_the_deadline():
    sims = {lam: _simulated(lam) for lam in LAMS}
    verl = sims[LAMS[0]]["verl"]
    for ratio in (0.9, 1.0, 1.3):
        rep = what_if(**SMALL, deadline_ratio=ratio)
        cands = [("serverful", None, verl)] + [("serverless", lam, p["rlhfless"]) for lam, p in sims.items()]
        ok = [c for c in cands if c[2]["step_time_s"] <= ratio * verl["step_time_s"] * (1 + 1e-9)]
        assert rep["serverful"]["step_s"] == pytest.approx(verl["step_time_s"])
        if ok:
            mode, lam, best = min(ok, key=lambda c: (c[2]["cost_usd"], c[2]["step_time_s"]))
            rec = rep["recommended"]
            assert rep["constraint_met"] and rec["mode"] == mode
            assert rec["usd"] == pytest.approx(best["cost_usd"]) and rec["step_s"] == pytest.approx(best["step_time_s"])
            if mode == "serverless" and rec["objective"] == "score":
                assert rec["lam"] == lam
        lo, hi = rep["recommended"]["step_s_band"]
        assert lo <= rep["recommended"]["step_s"] <= hi or lo == hi


def test_budget_picks_the_fastest_affordable_point_or_says_none_is():
    rep = what_if(**SMALL, budget_usd=1e6)
    assert rep["constraint_met"]
    assert rep["recommended"]["step_s"] == min(p["step_s"] for p in rep["points"])
    poor = what_if(**SMALL, budget_usd=1e-9)
    assert not poor["constraint_met"]
    assert poor["recommended"]["usd"] == min(p["usd"] for p in poor["points"])


def test_a_prices_file_changes_dollars_only_and_the_catalog_is_restored(tmp_path):
    before = dict(CATALOG)
    path = tmp_path / "prices.yaml"
    path.write_text(f"L40S: {{serverless_usd_per_s: {CATALOG['L40S'].serverless_usd_per_s * 10}}}\n")
    base = what_if(**SMALL)
    dear = what_if(**SMALL, prices=str(path))
    assert dict(CATALOG) == before
    assert dear["serverful"] == base["serverful"]  # on-demand price untouched
    sl = [p for p in base["points"] if p["mode"] == "serverless"]
    sd = [p for p in dear["points"] if p["mode"] == "serverless"]
    for a, b in zip(sl, sd):
        assert b["usd"] == pytest.approx(10 * a["usd"]) and b["step_s"] == pytest.approx(a["step_s"])


def test_the_160_gpu_70b_case_answers_with_a_recommendation(tmp_path, capsys):
    """Its answer time is a benchmark figure (docs/simulator.md), not asserted here: CI runs on busy cores."""
    out = tmp_path / "w.json"
    assert main(["plan", "what-if", "--model", "llama-70b", "--devices", "H100:160", "--deadline-ratio", "1.0",
                 "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["wall_s"] > 0
    printed = capsys.readouterr().out
    assert "serverful" in printed and "serverless" in printed and "recommended:" in printed
