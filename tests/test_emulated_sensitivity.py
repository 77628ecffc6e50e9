"""`rlhfless repro emulated-sensitivity`: the emulated arms over the cold-start constants and the keep-alive.

The pure parts (the sweep's points, the ratios over both verl readings) in milliseconds; the study end to end at a
tiny size (two points, six emulated runs of 2 steps: about a minute) behind `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlhfless.repro import emulated_sensitivity as S
from rlhfless.repro.studies import STUDIES
from rlhfless.sim.overheads import DEFAULT


def test_the_sweep_moves_each_constant_and_the_keep_alive_in_modelled_units():
    quick = S.points(quick=True, scale=0.05, base_keep_s=5.0)
    assert [p.label for p in quick] == ["base", "engine_init_s x2", "storage_gbps x2", "container_start_s x2",
                                        "keep-alive 0 s", "keep-alive 60 s"]
    by = {p.label: p for p in quick}
    assert by["engine_init_s x2"].overrides == (f"runtime.emulated_engine_init_s={2 * DEFAULT['engine_init_s']:g}",)
    assert by["keep-alive 60 s"].overrides == ("runtime.keep_alive_s=3",)  # real seconds: 60 x the time scale
    full = S.points(quick=False, scale=0.05, base_keep_s=5.0)
    assert len(full) == 1 + 2 * len(S.CONSTANTS) + len(S.KEEP_ALIVE_S)
    assert "emulated-sensitivity" in STUDIES


def test_rows_put_each_serverless_arm_over_both_verl_readings():
    verl = {"serverful": {"step_time_s": 10.0, "billed_device_s": 100.0},
            "serverful-paper-engine": {"step_time_s": 20.0, "billed_device_s": 400.0}}
    m = {"step_time_s": 15.0, "billed_device_s": 200.0, "cold_start_device_s": 5.0, "held_idle_device_s": 7.0}
    [r] = S.rows(verl, {"base": {"serverless": m}})
    assert (r["step_ratio_tuned"], r["cost_ratio_tuned"]) == (1.5, 2.0)
    assert (r["step_ratio_paper"], r["cost_ratio_paper"]) == (0.75, 0.5)


@pytest.mark.slow
def test_the_study_runs_at_a_tiny_size_and_lands_its_figure_and_rows(tmp_path):
    """Two points at the quick size: the figure and one row per serverless arm land, every arm's numbers are there,
    and doubling the engine start reaches the emulated workers (the paper design's cold starts grow)."""
    ctx = SimpleNamespace(out=tmp_path, quick=True, seed=0)
    r = S.emulated_sensitivity(ctx, only=("base", "engine_init_s x2"))
    [fig] = r.figures
    assert fig.is_file() and fig.stat().st_size > 10_000 and tmp_path in fig.parents
    assert [row.metric.split(":")[0] for row in r.rows] == [f"emulated {a}" for a in S.ARMS]
    assert all("x to" in row.ours and "x to" in row.ours_tuned for row in r.rows)
    table = {(x["point"], x["arm"]): x for x in r.numbers["rows"]}
    assert set(table) == {(p, a) for p in ("base", "engine_init_s x2") for a in S.ARMS}
    assert set(r.numbers["verl"]) == set(S.VERL)
    base, slow = table["base", "serverless-paper"], table["engine_init_s x2", "serverless-paper"]
    assert slow["cold_start_device_s"] > base["cold_start_device_s"]
    run = Path(tmp_path / "emulated-sensitivity" / "quick" / "seed0" / "engine_init_s_x2" / "serverless-paper")
    lengths = json.loads((run / "emulated-lengths.json").read_text())
    assert lengths["overheads"] == {"engine_init_s": 2 * DEFAULT["engine_init_s"]}
