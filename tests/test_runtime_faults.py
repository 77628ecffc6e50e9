"""The fault benchmark's report: the extra cost of faults with its spread, so noise cannot pass for a cost.

Layers: the spread and the verdict against plain arithmetic; the report from hand-made pairs (one pair cheaper
under faults, as one run on a shared machine once was); a real `run_fault_bench` with repeats (slow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlhfless.runtime.faults import fault_report, resolved, spread


def test_spread_is_the_plain_mean_sample_std_and_range():
    s = spread([0.10, -0.06, 0.16])
    mean = (0.10 - 0.06 + 0.16) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in (0.10, -0.06, 0.16)) / 2)
    assert s == {"mean": pytest.approx(mean), "std": pytest.approx(std), "min": -0.06, "max": 0.16, "n": 3}
    assert spread([0.2]) == {"mean": 0.2, "std": None, "min": 0.2, "max": 0.2, "n": 1}
    assert spread([])["n"] == 0


def test_a_mean_within_two_standard_errors_of_zero_is_not_resolved():
    assert resolved(spread([0.10, -0.06, 0.16])) is False  # 2 x 0.113 / sqrt(3) = 0.131 > 0.067
    assert resolved(spread([0.12, 0.13, 0.14])) is True
    assert resolved(spread([0.12])) is None  # one pair: no spread, no verdict


def _pair(clean: float, faulty: float | None, failed: float = 1.0, kills: int = 2) -> dict:
    return {"undisturbed": {"cost_device_s": clean, "loop_wall_s": clean / 2},
            "faulty": {"cost_device_s": faulty, "loop_wall_s": faulty / 2, "retries": kills} if faulty else {},
            "lost_steps": 0 if faulty else 3, "samples_identical": faulty is not None, "lost_device_s": failed,
            "killed": [{}] * kills}


def test_the_report_shows_a_noisy_negative_pair_inside_the_spread():
    pairs = [_pair(100.0, 110.0), _pair(104.0, 97.76), _pair(98.0, 113.68)]  # +10%, -6%, +16%
    r = fault_report(pairs, kills=2)
    assert r["extra_cost_fraction"]["n"] == 3 and r["extra_cost_fraction"]["min"] == pytest.approx(-0.06)
    assert r["extra_cost_fraction"]["mean"] == pytest.approx((0.10 - 0.06 + 0.16) / 3)
    assert r["extra_cost_resolved"] is False
    assert r["undisturbed_noise_fraction"] == pytest.approx(6.0 / (302.0 / 3))
    assert r["kills"] == 6 and r["kills_requested"] == 6 and r["retries"] == 6 and r["lost_steps"] == 0
    assert r["samples_identical"] and r["lost_device_s"]["mean"] == 1.0


def test_a_stopped_faulty_run_counts_as_lost_steps_not_as_a_cost():
    r = fault_report([_pair(100.0, 120.0), _pair(100.0, None)], kills=2)
    assert r["lost_steps"] == 3 and not r["samples_identical"]
    assert r["extra_cost_fraction"]["n"] == 1 and r["extra_cost_resolved"] is None


@pytest.mark.slow
def test_the_bench_repeats_pairs_and_loses_nothing(tmp_path):
    from rlhfless.config import load_run_config
    from rlhfless.run.runner import train
    from rlhfless.runtime.config import available_cores
    from rlhfless.runtime.faults import run_fault_bench

    if available_cores() < 2:
        pytest.skip("the runtime needs 2 cores")
    cfg = load_run_config("experiments/configs/faults.yaml",
                          ["train.steps=3", "rollout.prompts_per_step=6", "algo.group_size=4",
                           "rollout.max_new_tokens=64", "task.arith.k_max=6", "tracking.mode=disabled"])
    r = run_fault_bench(cfg, tmp_path, train, kills=2, seed=0, progress=False, repeats=2)
    assert r["repeats"] == 2 and r["lost_steps"] == 0 and r["samples_identical"]
    assert r["kills"] >= 1 and r["extra_cost_fraction"]["n"] == 2 and r["undisturbed_cost_device_s"]["n"] == 2
    assert r["lost_device_s"]["min"] >= 0
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["faulty-1", "faulty-2", "undisturbed-1",
                                                                "undisturbed-2"]
    json.dumps(r)  # the report is plain JSON
