"""The fault benchmark's report: the extra cost of faults with its spread, so noise cannot pass for a cost.

Layers: the spread and the verdict against plain arithmetic; the report from hand-made pairs (one pair cheaper
under faults, as one run on a shared machine once was); a real `run_fault_bench` with repeats (slow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlhfless.bench.faults import fault_report, resolved, spread


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
    from rlhfless.run.launch import train
    from rlhfless.runtime.config import available_cores
    from rlhfless.bench.faults import run_fault_bench

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


# ---- the bench per mode, recovery read from the records -------------------------------------------------------
TINY = ["plan.max_actors=2", "train.steps=3", "rollout.prompts_per_step=6", "algo.group_size=4",
        "rollout.max_new_tokens=64", "task.arith.k_max=6", "train.eval_prompts=0", "train.checkpoint_every=0",
        "runtime.gantt_every=0", "tracking.mode=disabled"]
# emulated devices at the size of tests/test_emulated.py, in the headline's shape (keep-alive > 0, hybrid)
EMULATED = ["runtime.device=emulated", "runtime.units=4", "runtime.emulated_model=qwen2.5-3b",
            "runtime.time_scale=0.05", "plan.max_actors=4", "train.steps=3", "rollout.prompts_per_step=8",
            "algo.group_size=4", "rollout.max_new_tokens=2048", "train.eval_prompts=0", "train.checkpoint_every=0",
            "tracking.mode=disabled", "runtime.gantt_every=0", "plan.gpu_kind=L40S", "plan.capacity=1024",
            "runtime.progress_every=64", "runtime.migrate=never", "runtime.design=extended",
            "runtime.keep_alive_s=1.25"]
EVENTS = ["sent decode step 2", "sent learn_end step 3"]


def _bench_at_events(tmp_path: Path, mode: str, overrides: list[str], learner_op: str = "learn_end") -> dict:
    """The bench in `mode` on the headline comparison's config (keep-alive 2 s, hybrid), killing a worker just
    sent its decode (step 2) and a rank just sent the optimiser step (step 3): protocol events, no clock."""
    from rlhfless.bench.faults_cli import HEADLINE_CONFIG
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train
    from rlhfless.runtime.config import available_cores
    from rlhfless.bench.faults import KillOn, KillRule, run_fault_bench

    if available_cores() < 2:
        pytest.skip("the runtime needs 2 cores")
    cfg = load_run_config(HEADLINE_CONFIG, overrides)
    chaos = lambda kills, interval_s, seed: KillOn(KillRule("sent", "decode", 2), KillRule("sent", learner_op, 3))
    return run_fault_bench(cfg, tmp_path, train, kills=2, progress=False, mode=mode, chaos=chaos)


def _recovered_by_the_records(run_dir: Path, killed: list[dict], steps: int) -> None:
    """What the records say of each kill: the killed worker is marked killed, its invocation failed, the failed
    work ran again (attempt 2) and succeeded, and every step has its samples' digest."""
    from rlhfless.core.rundir import RunDir

    run = RunDir(run_dir)
    inv, workers = run.read_invocations(), {w["worker"]: w for w in run.read_workers()}
    for k in killed:
        assert workers[k["worker"]]["killed"], k
        assert any(i["worker"] == k["worker"] and not i["ok"] for i in inv), k
    for step, kind in ((2, "decode"), (3, "learner")):
        failed = [i for i in inv if i["step"] == step and i["kind"] == kind and not i["ok"]]
        again = [i for i in inv if i["step"] == step and i["kind"] == kind and i["ok"] and i["attempt"] > 1]
        assert failed and again, (step, kind)
    assert sorted(run.read_digests()) == list(range(1, steps + 1))


@pytest.mark.parametrize("mode", ["serverless", "serverful"])
def test_the_bench_in_each_mode_recovers_the_headline_shape(tmp_path, mode):
    r = _bench_at_events(tmp_path, mode, TINY)
    assert (r["mode"], r["keep_alive_s"], r["hybrid"]) == (mode, 2.0, True)
    killed = r["pairs"][0]["killed"]
    assert [k["event"] for k in killed] == EVENTS
    assert r["kills"] == 2 and r["lost_steps"] == 0 and r["samples_identical"] and r["retries"] >= 2
    _recovered_by_the_records(tmp_path / "faulty-1", killed, 3)
    assert r["lost_device_s"]["min"] > 0  # the killed invocations' time is billed and reported


@pytest.mark.parametrize("mode", ["serverless", "serverful"])
def test_the_bench_in_each_mode_recovers_on_emulated_devices(tmp_path, mode):
    # an emulated serverless rank's share costs no modelled time (`EmulatedWorker._learn_share`): killed just sent
    # learn_end, it may have written its share already, which needs no retry (the share is a file); killed just
    # sent a learner group it is always mid-invocation (the group sleeps its modelled time)
    op = "learn_group" if mode == "serverless" else "learn_end"
    r = _bench_at_events(tmp_path, mode, EMULATED, op)
    assert (r["mode"], r["device"], r["keep_alive_s"]) == (mode, "emulated", 1.25)
    killed = r["pairs"][0]["killed"]
    assert [k["event"] for k in killed] == ["sent decode step 2", f"sent {op} step 3"]
    assert r["lost_steps"] == 0 and r["samples_identical"] and r["retries"] >= 2
    _recovered_by_the_records(tmp_path / "faulty-1", killed, 3)


def test_the_bench_refuses_a_mode_it_does_not_know(tmp_path):
    from rlhfless.bench.faults import run_fault_bench

    with pytest.raises(ValueError, match="mode: one of serverless, serverful"):
        run_fault_bench(None, tmp_path, None, mode="compare")
