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


def _bench_at_events(tmp_path: Path, mode: str, overrides: list[str], learner_op: str = "learn_end",
                     rules: tuple | None = None) -> dict:
    """The bench in `mode` on the headline comparison's config (keep-alive 2 s, hybrid), killing a worker just
    sent its decode (step 2) and a rank just sent the optimiser step (step 3), or at `rules` (`KillRule` fields):
    protocol events, no clock."""
    from rlhfless.bench.faults_cli import HEADLINE_CONFIG
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train
    from rlhfless.runtime.config import available_cores
    from rlhfless.bench.faults import KillOn, KillRule, run_fault_bench

    if available_cores() < 2:
        pytest.skip("the runtime needs 2 cores")
    cfg = load_run_config(HEADLINE_CONFIG, overrides)
    rules = rules or (("sent", "decode", 2), ("sent", learner_op, 3))
    chaos = lambda kills, step_s, seed: KillOn(*(KillRule(*r) for r in rules))
    return run_fault_bench(cfg, tmp_path, train, kills=len(rules), progress=False, mode=mode, chaos=chaos)


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
    # an emulated serverless rank's share costs only its part of the gradient exchange (`EmulatedWorker._learn_share`:
    # 0.37 modelled s at 4 x 3B, 19 ms real at time scale 0.05): killed just sent learn_end, it may have written its
    # share already, which needs no retry (the share is a file); killed just
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


# ---- what a death costs: the rule of attempts, the pool killed while it restarts, the bench's verdict -----------
def test_only_consecutive_failures_of_running_work_use_its_attempts():
    from rlhfless.core.errors import TrainingError
    from rlhfless.runtime.attempts import Attempts, running

    assert running(sent=True, ready_s=1.0) and not running(sent=True, ready_s=None)
    assert not running(sent=False, ready_s=1.0)
    tries = Attempts("decode function 0 of step 5", limit=3)
    assert tries.failed(was_running=True) and tries.number == 2
    for _ in range(2):  # its worker died twice while starting: a restart is not a failed attempt
        assert not tries.failed(was_running=False)
    assert tries.number == 2
    tries.succeeded()  # done: a later failure (the step restarted from its start) starts a new count
    assert tries.failed(True) and tries.failed(True) and tries.number == 3
    with pytest.raises(TrainingError, match="decode function 0 of step 5 failed 3 times"):
        tries.failed(True)
    starts = Attempts("learner rank 1 of step 2", limit=2)
    starts.failed(False)
    with pytest.raises(TrainingError, match="died before it could start"):  # a worker that never starts stops
        starts.failed(False)


def test_the_kill_schedule_is_step_relative_and_spread_over_the_run():
    from rlhfless.bench.faults import kill_schedule

    s = kill_schedule(20, 20, seed=0)
    assert [step for step, _ in s] == list(range(1, 21))  # one kill per step when kills == steps
    assert all(0 <= f < 1 for _, f in s) and s == kill_schedule(20, 20, seed=0) != kill_schedule(20, 20, seed=1)
    assert sorted(kill_schedule(60, 20, seed=3)) == kill_schedule(60, 20, seed=3)
    assert [step for step, _ in kill_schedule(60, 20, seed=3)] == [k // 3 + 1 for k in range(60)]


def test_a_serverful_worker_killed_while_the_pool_restarts_still_finishes_the_step(tmp_path):
    """A pool worker killed just sent its decode (step 2) restarts the pool; a worker of the new pool killed as it
    says ready fails that start, not the step's work. With runtime.max_attempts=2 the code before issue 43
    charged the second death to the decode function too and stopped the run ("decode function 1 of step 2
    failed 2 times"); now the pool starts again and the step finishes with the undisturbed run's samples."""
    from rlhfless.core.rundir import RunDir

    rules = (("sent", "decode", 2), ("received", "ready", None))
    r = _bench_at_events(tmp_path, "serverful", TINY + ["runtime.max_attempts=2"], rules=rules)
    killed = r["pairs"][0]["killed"]
    assert [k["event"] for k in killed] == ["sent decode step 2", "received ready step None"]
    assert r["runs_stopped"] == 0 and r["lost_steps"] == 0 and r["samples_identical"]
    run = RunDir(tmp_path / "faulty-1")
    workers = {w["worker"]: w for w in run.read_workers()}
    assert all(workers[k["worker"]]["killed"] for k in killed)
    # a peer whose rendezvous broke with the killed worker left (or was stopped): it is not a second death, and
    # whichever of the two the driver notices first, the killed one is recorded killed (a race before this fix)
    assert sum(w["killed"] for w in workers.values()) == len(killed)
    decode2 = [i for i in run.read_invocations() if i["step"] == 2 and i["kind"] == "decode"]
    # the first kill used one attempt of its function's work; the restart's death none
    assert max(i["attempt"] for i in decode2) == 2 and all(i["ok"] for i in decode2 if i["attempt"] == 2)
    # the step restarted from its start: every function's rows decoded again on the last pool
    assert len([i for i in decode2 if i["ok"]]) >= 2


def test_a_rank_found_dead_on_sending_a_group_gets_every_group_on_its_new_worker(tmp_path):
    """A pool worker killed as it is sent learn_begin (step 1) is found dead on the next send, a learn_group: the
    pool restarts inside that send. The group must go to the rank's new worker too: before this was fixed the
    rank marked it sent after the restart, its new worker's update lacked it ("finish before every group
    arrived"), and that worker crashed: a second death nobody caused (a CI flake of test_runtime_e2e)."""
    from rlhfless.core.rundir import RunDir

    rules = (("sent", "learn_begin", 1, 1, True),)
    r = _bench_at_events(tmp_path, "serverful", TINY, rules=rules)
    killed = r["pairs"][0]["killed"]
    assert [k["event"] for k in killed] == ["sent learn_begin step 1"]
    assert r["runs_stopped"] == 0 and r["lost_steps"] == 0 and r["samples_identical"]
    workers = RunDir(tmp_path / "faulty-1").read_workers()
    assert sorted(w["worker"] for w in workers if w["killed"]) == [killed[0]["worker"]]


def test_a_serverful_restart_charges_no_attempt_to_the_functions_that_did_not_fail(tmp_path):
    """Decode function 0's worker killed just sent its work (step 2, the 1st decode sent), then, on the restarted
    pool, function 1's (the 4th: 0 and 1 before the restart, 0 and 1 after). Each failed once while it ran. With
    runtime.max_attempts=2 the code before issue 43 had charged function 1 for function 0's death (every function
    still owed was at attempt 2 after the restart) and stopped the run."""
    from rlhfless.core.rundir import RunDir

    rules = (("sent", "decode", 2), ("sent", "decode", 2, 4))
    r = _bench_at_events(tmp_path, "serverful", TINY + ["runtime.max_attempts=2"], rules=rules)
    assert r["kills"] == 2 and r["runs_stopped"] == 0 and r["lost_steps"] == 0 and r["samples_identical"]
    inv = [i for i in RunDir(tmp_path / "faulty-1").read_invocations() if i["step"] == 2 and i["kind"] == "decode"]
    assert sorted(i["attempt"] for i in inv if i["ok"]) == [2, 2]  # both failed once; neither was charged twice


def test_the_bench_fails_when_a_faulty_run_stops(tmp_path, capsys):
    """runtime.max_attempts=1: the decode function killed just sent its work (step 2) has no attempt left, so the
    faulty run stops. The report counts the stopped run and the bench's exit status is 1, with one line naming
    the mode and the run."""
    from rlhfless.bench.faults_cli import verdict

    r = _bench_at_events(tmp_path, "serverless", TINY + ["runtime.max_attempts=1"], rules=(("sent", "decode", 2),))
    assert r["runs_stopped"] == 1 and r["lost_steps"] == 2 and not r["samples_identical"]
    assert verdict({"serverless": r}) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("rlhfless: bench faults: 1 of 1 faulty runs failed: serverless faulty-1: stopped, 2 of 3")
    assert "decode function" in line and "failed 1 times" in line


def test_the_verdict_names_every_failed_run_and_passes_identical_ones(capsys):
    from rlhfless.bench.faults_cli import verdict

    ok = {"pairs": [_pair(100.0, 110.0)]}
    assert verdict({"serverless": ok, "serverful": ok}) == 0 and capsys.readouterr().err == ""
    diverged = {**_pair(100.0, 110.0), "samples_identical": False, "first_divergent_step": 4}
    stopped = {**_pair(100.0, None), "stopped": "runtime: x failed 3 times", "steps_compared": 20}
    assert verdict({"serverless": ok, "serverful": {"pairs": [diverged, stopped]}}) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 of 3 faulty runs failed" in err
    assert "serverful faulty-1: samples differ from its undisturbed run's from step 4" in err
    assert "serverful faulty-2: stopped, 3 of 20 steps lost: runtime: x failed 3 times" in err
