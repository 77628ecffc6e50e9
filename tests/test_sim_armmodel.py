"""The arm model's validation (rlhfless.sim.armmodel): the record's split of a step's bill by hand, constants
recovered from arms recorded on a machine with known constants, and per-arm, per-component errors that point at
the component that was changed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlhfless.plan import PlanJob, TimeModel, assign
from rlhfless.core.errors import DataError
from rlhfless.core.records import TraceRow
from rlhfless.sim.armmodel import (
    Constants,
    learner_ranks,
    measure,
    predict,
    read_arm,
    split_steps,
    validate_arms,
)
from rlhfless.sim.calibrate import cpu_decode_model
from rlhfless.sim.hardware import tiny_model
from rlhfless.sim.validate import validate
from rlhfless.sim.workload import replay_trace
from rlhfless.core.traces import TraceWriter

# the "true" machine the fake arms were recorded on
D0, OV, PB = 0.02, 0.0015, 2e-9  # decode: fixed s, s per iteration, s per byte
LG, LT = 0.01, 2e-5  # learner: s per kept group, s per kept token
GAP, OPT, DRV, COLD = 0.003, 0.05, 0.04, 0.3
G, B, CAP = 4, 8, 32


def _trace(d: Path, steps: int) -> list:
    rng = np.random.default_rng(1)
    rows = [TraceRow(f"p{p}", "x", 0, s, k, 10 + p, int(rng.integers(5, 120)), False, float(rng.integers(0, 2)))
            for s in range(1, steps + 1) for p in range(B) for k in range(G)]
    with TraceWriter(d / "traces" / "rollouts.jsonl") as w:
        w.write(rows)
    return replay_trace(d / "traces" / "rollouts.jsonl")


def _decode_s(groups, per_byte: TimeModel) -> float:
    """The true decode span of a worker's groups: the planner's time model at unit costs (iterations) and at one
    byte per second (bytes), then the constants."""
    jobs = [PlanJob(str(i), G, tuple(float(x) for x in g.lengths), 0) for i, g in enumerate(groups)]
    ones = TimeModel((1, CAP), (1.0, 1.0), 0.0, 0.0, source="unit")
    return (D0 + OV * assign(jobs, 1, CAP, ones, "contiguous")[0].makespan_s
            + PB * assign(jobs, 1, CAP, per_byte, "contiguous")[0].makespan_s)


def _compute_s(groups) -> float:
    k = [g for g in groups if len(set(g.rewards)) > 1]
    return LG * len(k) + LT * sum(g.tokens for g in k)


def _write_serverful(d: Path, steps: int = 8, overlap: bool = False, extra_idle: float = 0.0,
                     slow: float = 1.0) -> None:
    """A serverful arm (2 pool workers) played by the runtime's rules on the machine above; `extra_idle` adds
    that many seconds of driver time (held, billed idle) to every even step; `slow` runs every even step that
    many times slower throughout (the neighbours' load on shared cores)."""
    d.mkdir(parents=True)
    work = _trace(d, steps)
    gctx = float(np.mean([g.prompt_len for s in work for g in s.groups]) +
                 np.mean([x for s in work for g in s.groups for x in g.lengths]) / 2)
    per_byte = cpu_decode_model(tiny_model(), 1e30, 1.0, 0.0).time_model(CAP, gctx)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "algo": {"skip_zero_variance_groups": True}, "plan": {"capacity": CAP},
        "runtime": {"mode": "serverful", "units": 2, "overlap": overlap}}))
    invs, metrics, t = [], [], 0.0
    for s in work:
        k = slow if s.step % 2 == 0 else 1.0
        halves = [list(range(0, B // 2)), list(range(B // 2, B))]
        ends = []
        for w, gs in enumerate(halves):
            dec = k * _decode_s([s.groups[g] for g in gs], per_byte)
            ends.append(t + dec)
            invs.append({"step": s.step, "kind": "decode", "worker": f"pool-{w}", "units": 1.0, "requested_s": t,
                         "started_s": t, "finished_s": t + dec, "groups": gs, "extra": {}})
        comp = [k * _compute_s([s.groups[g] for g in gs]) for gs in halves]
        starts = [e + k * GAP for e in ends] if overlap else [max(ends) + k * GAP] * 2
        end = max(st + c for st, c in zip(starts, comp)) + k * OPT
        for w, gs in enumerate(halves):
            invs.append({"step": s.step, "kind": "learner", "worker": f"pool-{w}", "units": 1.0,
                         "requested_s": starts[w], "started_s": starts[w], "finished_s": end, "groups": gs,
                         "extra": {"compute_s": comp[w]},  # busy: its compute, then the optimiser step
                         "busy": [[starts[w], starts[w] + comp[w]], [end - k * OPT, end]]})
        period = end - t + k * DRV + (extra_idle if s.step % 2 == 0 else 0.0)
        metrics.append({"step": s.step, "timing_s/step": period, "cost/device_seconds": 2 * period,
                        "balancer/makespan_s": 0.0})
        t += period
    workers = [{"worker": f"pool-{w}", "kinds": ["decode", "learner"], "units": 1.0, "cores": [w],
                "spawned_s": -COLD, "ready_s": 0.0, "released_s": t, "cold_start_s": COLD, "prewarmed": False}
               for w in range(2)]
    for name, rows in (("invocations", invs), ("metrics", metrics), ("workers", workers)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("overlap", [False, True])
def test_serverful_arm_recovers_the_machine(tmp_path, overlap):
    name = "serverful-overlap" if overlap else "serverful"
    _write_serverful(tmp_path / name, overlap=overlap)
    rep = validate_arms(tmp_path)[name]
    c = rep["constants"]
    assert c["decode_s_per_iter"] == pytest.approx(OV, rel=1e-6)
    assert c["decode_s_per_byte"] == pytest.approx(PB, rel=1e-6)
    assert c["learn_s_per_token"] == pytest.approx(LT, rel=1e-6) and c["opt_s"] == pytest.approx(OPT, abs=1e-9)
    assert c["gap_s"] == pytest.approx(GAP) and c["driver_s"] == pytest.approx(DRV)
    assert rep["steps_calibrated"] == 4 and rep["steps_validated"] == 3  # alternate steps; the last has no period
    cal, val = split_steps(list(read_arm(tmp_path / name).steps))
    assert [r.step for r in cal] == [1, 3, 5, 7] and [r.step for r in val] == [2, 4, 6]  # the same load in both
    assert rep["step_time_s"]["rel_error"] < 1e-9 and rep["cost_device_s"]["rel_error"] < 1e-9
    assert rep["core_s_per_step"]["held_idle"]["rel_error"] < 1e-6


def test_overlap_is_modelled_not_fitted(tmp_path):
    """Constants from the sequential arm predict the overlap arm's shorter step: the model plays overlap."""
    _write_serverful(tmp_path / "a" / "serverful-overlap", overlap=False)
    _write_serverful(tmp_path / "b" / "serverful-overlap", overlap=True)
    seq = read_arm(tmp_path / "a" / "serverful-overlap")
    ov = read_arm(tmp_path / "b" / "serverful-overlap")
    assert ov.overlap and not seq.overlap
    rep = validate_arms(tmp_path / "b", calibrate_from=tmp_path / "a")["serverful-overlap"]
    meas = np.mean([measure(ov, r).period for r in ov.steps if r.period is not None])
    meas_seq = np.mean([measure(seq, r).period for r in seq.steps if r.period is not None])
    assert meas < meas_seq  # overlap shortens this run's steps ...
    assert rep["step_time_s"]["rel_error"] < 1e-9  # ... and the model, calibrated without overlap, says by how much


def test_a_changed_component_shows_in_its_row(tmp_path):
    """Driver time held (billed idle) on validated steps only: the cost error is that idle, and the split puts it
    in held_idle, not in cold starts or busy time."""
    _write_serverful(tmp_path / "serverful", extra_idle=0.5)
    rep = validate(tmp_path)
    assert rep["errors_from"] == "arms"
    a = rep["arms"]["serverful"]
    meas_billed = a["cost_device_s"]["measured"]
    assert a["core_s_per_step"]["held_idle"]["of_billed"] == pytest.approx(-2 * 0.5 / meas_billed, rel=1e-6)
    for k in ("decode", "learner"):
        assert abs(a["core_s_per_step"]["busy"][k]["of_billed"]) < 1e-9
    assert rep["cost_error"] == pytest.approx(2 * 0.5 / meas_billed, rel=1e-6)
    assert rep["step_time_error"] == pytest.approx(0.5 / a["step_time_s"]["measured"], rel=1e-6)
    # not load: decode ran as fast as calibrated, so the load term leaves the error where it was
    assert a["at_measured_load"]["decode_load_factor"] == pytest.approx([1.0, 1.0, 1.0])
    assert rep["step_time_error_at_measured_load"] == pytest.approx(rep["step_time_error"])


@pytest.mark.parametrize("overlap", [False, True])
def test_load_on_the_validated_steps_is_the_load_term(tmp_path, overlap):
    """Every validated step run 1.3x slower (neighbours on the shared cores), calibration steps at full speed: the
    model misses by 1 - 1/1.3 on step time and cost; its decode says each step ran 1.3x slower, and the step
    scaled by that factor is exact. So an error of this kind is load, not the model (what sim-vs-real reports)."""
    name = "serverful-overlap" if overlap else "serverful"
    _write_serverful(tmp_path / name, overlap=overlap, slow=1.3)
    rep = validate(tmp_path)
    a = rep["arms"][name]
    assert a["step_time_s"]["rel_error"] == pytest.approx(1 - 1 / 1.3, rel=1e-6)
    assert a["cost_device_s"]["rel_error"] == pytest.approx(1 - 1 / 1.3, rel=1e-6)
    assert a["at_measured_load"]["decode_load_factor"] == pytest.approx([1.3] * 3, rel=1e-6)
    assert rep["step_time_error_at_measured_load"] < 1e-6 and rep["cost_error_at_measured_load"] < 1e-6


def _serverless_records(d: Path) -> None:
    """One serverless step by hand: a decode function (cold 0.3, decode 1.0, released 0.02 later) and two
    learner ranks (cold 0.4 each; busy 0.5 and 0.2), billed 3.0; a second step so the first has a period."""
    d.mkdir()
    _trace(d, 2)
    (d / "config.yaml").write_text(yaml.safe_dump({"runtime": {"mode": "serverless", "units": 2}}))
    inv = [{"step": 1, "kind": "decode", "worker": "decode-0", "requested_s": 0.0, "started_s": 0.3,
            "finished_s": 1.3, "groups": list(range(B)), "extra": {}},
           {"step": 1, "kind": "learner", "worker": "learner-1", "requested_s": 0.5, "started_s": 0.9,
            "finished_s": 1.4, "groups": [0], "extra": {"compute_s": 0.1}},
           {"step": 1, "kind": "learner", "worker": "learner-2", "requested_s": 1.3, "started_s": 1.2,
            "finished_s": 1.4, "groups": [1], "extra": {"compute_s": 0.1}},
           {"step": 2, "kind": "decode", "worker": "decode-3", "requested_s": 2.0, "started_s": 2.3,
            "finished_s": 3.0, "groups": list(range(B)), "extra": {}}]
    workers = [{"worker": "decode-0", "kinds": ["decode"], "units": 1.0, "cores": [0], "spawned_s": 0.0,
                "ready_s": 0.3, "released_s": 1.32, "cold_start_s": 0.3},
               {"worker": "learner-1", "kinds": ["learner"], "units": 1.0, "cores": [1], "spawned_s": 0.5,
                "ready_s": 0.9, "released_s": 1.45, "cold_start_s": 0.4},
               {"worker": "learner-2", "kinds": ["learner"], "units": 1.0, "cores": [0], "spawned_s": 0.8,
                "ready_s": 1.2, "released_s": 1.45, "cold_start_s": 0.4}]
    metrics = [{"step": 1, "timing_s/step": 1.9, "cost/device_seconds": 3.0, "balancer/makespan_s": 1.0},
               {"step": 2, "timing_s/step": 1.1, "cost/device_seconds": 1.0, "balancer/makespan_s": 1.0}]
    for name, rows in (("invocations", inv), ("metrics", metrics), ("workers", workers)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_serverless_step_played_by_hand(tmp_path):
    """The runtime's rules on one step, checked by hand. Constants: cold 0.3 (decode) / 0.4 (learner), decode
    1.0 s fixed (so every group finishes at 1.3), release lag 0.02 / 0.03, 0.1 s per group, opt 0.05, driver 0.1.
    One decode function on 2 units leaves one free: rank 0 is pre-warmed at 1.0 (planned makespan) - 0.4 - 0.05
    = 0.55, ready 0.95, computes its 4 groups from 1.3 to 1.7; rank 1 starts on the unit decode releases at 1.32,
    ready 1.72, computes to 2.12. Learner ends 2.17, the step 2.27. Separate images: rank 0's share is in one end
    interval (opt 0.05) after its compute, at 1.75, and it is let go then (`LearnerStream._shared`), released
    0.03 later; rank 1, the last share in (2.17), reduces and is held to the learner's end: billed 1.32 +
    (1.78 - 0.55) + (2.2 - 1.32) = 3.43 (before the share release: rank 0 held to 2.2 too, 3.85). Busy as the meter counts it: the decode span, and each rank's compute (0.4)
    and optimiser step (0.05), not its wait for groups. (With makespan 1.0 the pre-warm comes first; see the
    second case for a rank started by its first group.)"""
    _serverless_records(tmp_path / "serverless")
    arm = read_arm(tmp_path / "serverless")
    c = Constants({"decode": 0.3, "learner": 0.4}, {"decode": 0.02, "learner": 0.03}, (1.0, 0.0, 0.0), (0.1, 0.0),
                  ctx=40.0, opt_s=0.05, driver_s=0.1)
    s = predict(arm, [arm.steps[0]], c)[0]
    assert s.rollout == pytest.approx(1.3) and s.learn_end == pytest.approx(2.17) and s.period == pytest.approx(2.27)
    assert s.billed == pytest.approx(1.32 + 1.23 + 0.88) and s.cold == pytest.approx(1.1)
    assert s.busy == pytest.approx({"decode": 1.0, "learner": 2 * (0.4 + 0.05)})
    # planned makespan 3.0: the pre-warm would come at 2.55, but rank 0's first group is in at 1.3 and a unit is
    # free, so it starts then (LearnerStream.pump), not at the pre-warm time: ready 1.7, computes to 2.1, share in
    # at 2.15, let go at 2.18 (rank 1 still the reducer, its share in at 2.17)
    late = predict(arm, [replace(arm.steps[0], predicted_makespan_s=3.0)], c)[0]
    assert late.learn_end == pytest.approx(2.17) and late.billed == pytest.approx(1.32 + 0.88 + 0.88)


def test_measure_splits_a_serverless_step_by_hand(tmp_path):
    """The record's split of the step above: held idle = billed 3.0 - cold 1.1 - busy 1.7 = 0.2."""
    d = tmp_path / "serverless"
    _serverless_records(d)
    arm = read_arm(d)
    s = measure(arm, arm.steps[0])
    assert s.period == pytest.approx(2.0) and s.billed == 3.0 and s.cold == pytest.approx(1.1)
    assert s.busy == pytest.approx({"decode": 1.0, "learner": 0.7})
    assert s.held_idle == pytest.approx(3.0 - 1.1 - 1.7) and s.learn_end == pytest.approx(1.4)
    assert measure(arm, arm.steps[1]).cold == 0.0  # no worker started in step 2 but decode-3 (no workers row)


def test_an_arm_the_model_cannot_play_is_skipped_not_fatal(tmp_path):
    """A reference function (kl_coef > 0 without overlap) is not modelled: that arm says so, the others count."""
    _write_serverful(tmp_path / "serverful")
    _serverless_records(tmp_path / "serverless")
    (tmp_path / "serverless" / "config.yaml").write_text(yaml.safe_dump(
        {"algo": {"kl_coef": 0.1}, "runtime": {"mode": "serverless", "units": 2, "overlap": False}}))
    rep = validate(tmp_path)
    assert "reference function" in rep["arms"]["serverless"]["skipped"]
    assert rep["errors_from"] == "arms" and rep["step_time_error"] < 1e-9  # from the serverful arm alone


def test_learner_ranks_take_units_as_the_runtime_gives_them(tmp_path):
    """`learner_ranks`, separate images (runtime.hybrid=false, keep-alive 0): a rank wants a unit at its first
    finished group, the pre-warm time or the rollout's end; it gets the earliest free one. Two decode functions on
    two units (ending at 1.0 and 1.2): no rank starts before a release. One decode function: rank 0 takes the
    free unit at its first group (0.2, before the pre-warm at 0.3), rank 1 the released one. No pre-warm and no
    streamed group: both at the rollout's end. Every rank cold, no decode function taken."""
    _serverless_records(tmp_path / "serverless")
    arm = read_arm(tmp_path / "serverless")
    assert not arm.hybrid and arm.keep_alive_s == 0.0  # a config without the key predates the hybrid image
    ranks, finish = [[0, 1], [2, 3]], {0: 0.5, 1: 0.2, 2: 0.9, 3: 0.7}
    new = [("new", 0), ("new", 1)]
    assert learner_ranks(arm, ranks, finish, [1.0, 1.2], 0.3) == ([1.0, 1.2], [True, True], new)
    assert learner_ranks(arm, ranks, finish, [1.0], 0.3)[0] == pytest.approx([0.2, 1.0])
    assert learner_ranks(arm, ranks, {}, [1.0], float("inf"))[0] == pytest.approx([1.0, 1.0])


def test_hybrid_ranks_are_the_finished_decode_functions(tmp_path):
    """Hybrid image: a decode function whose rows are done goes on as the free rank with the most finished groups
    (`LearnerStream.take`), warm, at its decode end. Function 0 (ends 1.0) finds rank 1's groups 2, 3 in (0.9,
    0.7) and rank 0's only one (0.5): it takes rank 1; function 1 (1.2) takes rank 0. A warm worker kept beyond
    the decode need idles (its keep-alive running) until a rank has groups: rank 0 takes it at its first group
    (0.5), and the one decode function takes rank 1 at its end."""
    _serverless_records(tmp_path / "serverless")
    arm = replace(read_arm(tmp_path / "serverless"), hybrid=True, keep_alive_s=2.0)
    ranks, finish = [[0, 1], [2, 3]], {0: 0.5, 1: 1.1, 2: 0.9, 3: 0.7}
    assert learner_ranks(arm, ranks, finish, [1.0, 1.2], 0.3) == ([1.2, 1.0], [False, False],
                                                                  [("decode", 1), ("decode", 0)])
    assert learner_ranks(arm, ranks, finish, [1.2], float("inf"), [-0.1]) == ([0.5, 1.2], [False, False],
                                                                              [("kept", 0), ("decode", 0)])


def test_a_decode_function_without_rank_work_idles_and_lapses_mid_step(tmp_path):
    """The runtime's release rule: a decode function that ends (0.2) while no rank has groups waiting is not a
    rank; it idles. Keep-alive 2 s: rank 0 takes it warm at its first group (0.8). Keep-alive 0.3 s: it is
    released at its lapse (0.5), mid-step, and rank 0 starts cold on the unit it freed at its first group, or at
    the pre-warm (0.6) when that comes first. Rank 1 takes the other function at its end (1.0) throughout."""
    _serverless_records(tmp_path / "serverless")
    arm = replace(read_arm(tmp_path / "serverless"), hybrid=True, keep_alive_s=2.0)
    ranks, finish, ends, inf = [[0], [1]], {0: 0.8, 1: 1.0}, [0.2, 1.0], float("inf")
    assert learner_ranks(arm, ranks, finish, ends, inf) == ([0.8, 1.0], [False, False],
                                                            [("decode", 0), ("decode", 1)])
    short = replace(arm, keep_alive_s=0.3)
    assert learner_ranks(short, ranks, finish, ends, inf) == ([0.8, 1.0], [True, False], [("new", 0), ("decode", 1)])
    assert learner_ranks(short, ranks, finish, ends, 0.6)[0] == [0.6, 1.0]


def test_a_kept_worker_lapses_mid_step_and_is_billed_to_its_lapse(tmp_path):
    """Keep-alive 0.5 s, hybrid, one decode function a step on 2 units (constants as above, makespan 1.0). Step 1
    ends its learner at 1.75 (period 1.85): both workers are kept (idle 0.1 < 0.5). Step 2: one decodes warm (ends
    1.0); the other, idle since -0.1, lapses at 0.4, mid-step: billed 0.4, its unit freed. The pre-warm (1.3 x
    1.0 - 0.4 - 0.05 = 0.85) starts rank 0 cold there (ready 1.25, computes to 1.65); rank 1 takes the decode
    function at 1.0. Learner ends 1.7, the step 1.8; billed 1.8 + (1.8 - 0.85) + 0.4; one cold start (0.4)."""
    _serverless_records(tmp_path / "serverless")
    arm = replace(read_arm(tmp_path / "serverless"), hybrid=True, keep_alive_s=0.5)
    c = Constants({"decode": 0.3, "learner": 0.4}, {"decode": 0.0, "learner": 0.0}, (1.0, 0.0, 0.0), (0.1, 0.0),
                  ctx=40.0, opt_s=0.05, driver_s=0.1)
    one, two = predict(arm, list(arm.steps), c)
    assert one.learn_end == pytest.approx(1.75) and one.period == pytest.approx(1.85)
    assert two.rollout == pytest.approx(1.0) and two.learn_end == pytest.approx(1.7)
    assert two.period == pytest.approx(1.8) and two.cold == pytest.approx(0.4)
    assert two.billed == pytest.approx(1.8 + 0.95 + 0.4)
    # held-idle: the lapsed worker's 0.4 s and the ranks' waits, never busy
    assert two.busy == pytest.approx({"decode": 1.0, "learner": 2 * 0.45})


def test_kept_hybrid_workers_are_warm_and_billed_through(tmp_path):
    """Keep-alive 2 s with the hybrid image: step 1's decode function is cold, the workers kept into step 2 are
    warm (no cold start; one decode function, the other worker idle until a rank's first group, then that rank)
    and every worker is billed to the step's end: 2 units x the period."""
    _serverless_records(tmp_path / "serverless")
    arm = replace(read_arm(tmp_path / "serverless"), hybrid=True, keep_alive_s=2.0)
    c = Constants({"decode": 0.3, "learner": 0.4}, {"decode": 0.0, "learner": 0.0}, (1.0, 0.0, 0.0), (0.1, 0.0),
                  ctx=40.0, opt_s=0.05, driver_s=0.1)
    one, two = predict(arm, list(arm.steps), c)
    assert one.cold == pytest.approx(0.3 + 0.4)  # the decode function, then a cold rank on the free unit
    assert two.cold == 0.0 and two.rollout == pytest.approx(1.0)
    assert two.billed == pytest.approx(2 * two.period) and one.billed < 2 * one.period
    # keep-alive shorter than the driver's time between steps: released at the next step's start, step 2 cold
    short = predict(replace(arm, keep_alive_s=0.05), list(arm.steps), c)[1]
    assert short.cold > 0 and short.rollout == pytest.approx(1.3)


def test_separate_images_kept_alive_are_refused_by_name(tmp_path):
    """runtime.hybrid=false with keep-alive > 0 (kept learner ranks preempted by the next decode) is not played:
    the arm is skipped saying why; the same arm with the hybrid image or keep-alive 0 is played."""
    _serverless_records(tmp_path / "serverless")
    cfg = {"runtime": {"mode": "serverless", "units": 2, "hybrid": False, "keep_alive_s": 2.0}}
    (tmp_path / "serverless" / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(DataError, match="runtime.hybrid=false with runtime.keep_alive_s > 0"):
        read_arm(tmp_path / "serverless")
    cfg["runtime"]["hybrid"] = True
    (tmp_path / "serverless" / "config.yaml").write_text(yaml.safe_dump(cfg))
    arm = read_arm(tmp_path / "serverless")
    assert arm.hybrid and arm.keep_alive_s == 2.0


def test_simulate_validate_prints_the_load_term(tmp_path, capsys):
    """`rlhfless simulate --validate` prints each arm's load factors and the errors at that load."""
    from rlhfless.cli import main

    _write_serverful(tmp_path / "serverful", slow=1.3)
    assert main(["simulate", "--validate", str(tmp_path), "--json", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    assert "load factor per step 1.30, 1.30, 1.30: at that load step 0.0%, billed 0.0%" in out
    assert "at each step's measured load: step_time_error 0.0%, cost_error 0.0%" in out
