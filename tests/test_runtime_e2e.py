"""The runtime end to end with real worker processes, on a tiny config (a few steps, small batches).

One module-scoped set of runs keeps this affordable: the serverful control, the serverless runtime with
migration forced (tau low, two decode functions), and the serverless runtime with a worker killed by SIGKILL
mid-invocation; the serverful control with pool workers killed at three points of the protocol. Every run
must produce the same samples step for step.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rlhfless.config import load_run_config
from rlhfless.run.launch import train
from rlhfless.runtime import executor
from rlhfless.run.compare import read_digests, samples_match
from rlhfless.runtime.config import available_cores
from rlhfless.bench.faults import KillOn, KillRule

pytestmark = pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")

TINY = ["plan.max_actors=2", "train.steps=3", "rollout.prompts_per_step=6", "algo.group_size=4", "rollout.max_new_tokens=64",
        "train.eval_prompts=0", "train.checkpoint_every=0", "train.table_every=1", "tracking.mode=disabled",
        "runtime.gantt_every=0", "task.arith.k_max=6"]
# two decode functions that must both run; cuts at every tau crossing, a low tau, so rows really move
EARLY = "runtime/learner_compute_before_rollout_end"
MIGRATE = ["plan.scale=false", "plan.max_actors=2", "plan.migrate=true", "runtime.migrate=always",
           "plan.tau=0.3", "runtime.progress_every=2"]


def _run(tmp: Path, name: str, extra: list[str]) -> tuple[Path, dict]:
    cfg = load_run_config("experiments/configs/quickstart.yaml", TINY + extra)
    out = tmp / name
    return out, train(cfg, out, progress=False)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runtime")
    out = {"serverful": _run(tmp, "serverful", ["runtime.mode=serverful"]),
           # the prefill function ships the KV to the decode functions, which then migrate rows
           "serverless": _run(tmp, "serverless", ["runtime.mode=serverless", "runtime.ship_prefix_kv=always"]
                              + MIGRATE),
           # separate function images: every learner rank is a new function (pre-warmed where a unit is free)
           "separate": _run(tmp, "separate", ["runtime.mode=serverless", "runtime.ship_prefix_kv=always",
                                              "runtime.hybrid=false"] + MIGRATE)}

    killed = []

    def kill_first_decode(runtime):
        def loop():
            t_end = time.monotonic() + 120
            while not killed and time.monotonic() < t_end:
                for h in list(runtime.workers.pool.handles.values()):
                    stream = runtime.workers.stream  # a hybrid function that went on as a learner rank is not decoding
                    if ("decode" in h.kinds and h.ready_s is not None and h.worker in runtime.workers.pool.working
                            and not (stream is not None and stream.owns(h))):
                        os.kill(h.pid, signal.SIGKILL)
                        killed.append(h.worker)
                        return
                time.sleep(0.01)
        threading.Thread(target=loop, daemon=True).start()

    executor.RUNTIME_HOOKS.append(kill_first_decode)
    try:
        out["killed"] = _run(tmp, "killed", ["runtime.mode=serverless"] + MIGRATE)
    finally:
        executor.RUNTIME_HOOKS.remove(kill_first_decode)
    out["killed_workers"] = killed

    killed_ranks = []

    def kill_a_streaming_learner_rank(runtime):
        """SIGKILL a learner rank that has begun its update (it has groups, the optimiser step not sent)."""
        def loop():
            t_end = time.monotonic() + 120
            while not killed_ranks and time.monotonic() < t_end:
                stream = runtime.workers.stream
                for r in list(stream.ranks) if stream is not None else []:
                    h = r.handle
                    if h is not None and r.begun and r.sent and not r.ended:
                        os.kill(h.pid, signal.SIGKILL)
                        killed_ranks.append((h.worker, stream.rollout_end is None))
                        return
                time.sleep(0.005)
        threading.Thread(target=loop, daemon=True).start()

    executor.RUNTIME_HOOKS.append(kill_a_streaming_learner_rank)
    try:
        # no cuts: contiguous chunks by predicted length, so one decode function ends early and its unit hosts a
        # learner rank that trains the finished groups while the other decodes (the window the hook needs)
        out["killed_learner"] = _run(tmp, "killed_learner", ["runtime.mode=serverless", "runtime.overlap=true",
                                                             "plan.scale=false", "plan.max_actors=2"])
    finally:
        executor.RUNTIME_HOOKS.remove(kill_a_streaming_learner_rank)
    out["killed_ranks"] = killed_ranks

    # the serverful pool under SIGKILL at three protocol events (no clock): a worker idle after its decode
    # (step 1), a worker just sent its decode (step 2), a rank just sent the optimiser step (step 3)
    chaos = KillOn(KillRule("received", "done", 1), KillRule("sent", "decode", 2), KillRule("sent", "learn_end", 3))
    executor.RUNTIME_HOOKS.append(chaos.attach)
    try:
        out["serverful_killed"] = _run(tmp, "serverful_killed", ["runtime.mode=serverful"])
    finally:
        executor.RUNTIME_HOOKS.remove(chaos.attach)
    out["serverful_chaos"] = chaos

    # hybrid functions kept warm between steps (keep-alive): a learner rank decodes the next step, and decode
    # functions are pre-warmed during the update
    warm = ["runtime.mode=serverless", "runtime.keep_alive_s=30", "plan.scale=false", "plan.max_actors=2"]
    out["hybrid_warm"] = _run(tmp, "hybrid_warm", warm)
    # hybrid functions under SIGKILL at protocol events: a decode function the moment its `done` is read (it is
    # then handed on as a learner rank, dead), a rank just handed (its learn_begin sent), and in step 3 a warm
    # hybrid function, a learner rank of step 2, just sent its decode, and a rank just sent the optimiser step
    hybrid = KillOn(KillRule("received", "done", 1), KillRule("sent", "learn_begin", 2),
                    KillRule("sent", "decode", 3), KillRule("sent", "learn_end", 3))
    executor.RUNTIME_HOOKS.append(hybrid.attach)
    try:
        out["hybrid_killed"] = _run(tmp, "hybrid_killed", warm)
    finally:
        executor.RUNTIME_HOOKS.remove(hybrid.attach)
    out["hybrid_chaos"] = hybrid
    return out


def test_serverless_and_serverful_give_the_same_samples_every_step(runs):
    identical, first, n = samples_match(runs["serverful"][0], runs["serverless"][0])
    assert n == 3 and identical, f"samples differ from step {first}"


def test_rewards_and_learning_match_between_modes(runs):
    a = _rows(runs["serverful"][0] / "metrics.jsonl")
    b = _rows(runs["serverless"][0] / "metrics.jsonl")
    for ra, rb in zip(a, b):
        assert ra["reward/mean"] == rb["reward/mean"]
        assert ra["actor/pg_loss"] == pytest.approx(rb["actor/pg_loss"], abs=1e-6)


def test_each_decode_function_ran_exactly_its_assigned_groups(runs):
    out = runs["serverless"][0]
    plan = {}
    for r in _rows(out / "tables" / "assignment.jsonl"):
        plan.setdefault(r["step"], {}).setdefault(r["actor"], set()).add(r["group"])
    for step, actors in plan.items():
        sent = sorted(sorted(i["groups"]) for i in _rows(out / "invocations.jsonl")
                      if i["step"] == step and i["kind"] == "decode" and i["groups"])
        assert sent == sorted(sorted(g) for g in actors.values()), f"step {step}"


def test_migration_really_moved_rows_and_kept_tokens(runs):
    out, summary = runs["serverless"]
    assert summary["runtime"]["migrated_seqs"] > 0
    adopted = [i for i in _rows(out / "invocations.jsonl") if i["kind"] == "decode" and i["extra"].get("adopted")]
    assert adopted, "no decode function adopted migrated rows"
    # tokens identical to the serverful run, which never migrates (checked step by step above)
    assert read_digests(out) == read_digests(runs["serverful"][0])


def test_billing_serverless_releases_and_serverful_holds(runs):
    sf, sl, sep = (runs[k][1]["runtime"] for k in ("serverful", "serverless", "separate"))
    assert sf["workers_started"] == available_cores() and sf["billed_s_by_kind"].keys() == {"pool"}
    # the pool is held for the whole loop (started before its first request, released after its last step) and
    # billed for exactly that: its lifetimes x units, rounded up to the 1 ms granularity (no wall-clock tolerance:
    # the pool's start and release take longer on a loaded machine, and they are billed too)
    pool = _rows(runs["serverful"][0] / "workers.jsonl")
    first = min(i["requested_s"] for i in _rows(runs["serverful"][0] / "invocations.jsonl"))
    assert all(w["spawned_s"] <= first and w["released_s"] >= sf["loop_wall_s"] for w in pool)
    held = sum((w["released_s"] - w["spawned_s"]) * w["units"] for w in pool)
    assert sf["cost_device_s"] == pytest.approx(held, abs=0.002 * len(pool))
    assert sl["workers_started"] > sf["workers_started"]  # functions start per step (scale to zero)
    assert {"decode", "learner"} <= set(sl["billed_s_by_kind"]) and {"decode", "learner"} <= set(sep["billed_s_by_kind"])
    workers = _rows(runs["serverless"][0] / "workers.jsonl")
    assert all(w["released_s"] is not None for w in workers)


def test_a_killed_worker_is_detected_and_its_work_re_run_with_the_same_samples(runs):
    out, summary = runs["killed"]
    assert runs["killed_workers"], "the chaos hook never found a busy decode worker"
    assert summary["runtime"]["workers_killed"] >= 1 and summary["runtime"]["retries"] >= 1
    assert read_digests(out) == read_digests(runs["serverless"][0])
    failed = [i for i in _rows(out / "invocations.jsonl") if not i["ok"]]
    assert failed and all(i["finished_s"] >= i["requested_s"] for i in failed)


def test_the_prefill_function_shipped_kv_that_decoded_to_the_same_tokens(runs):
    out = runs["serverless"][0]
    prefills = [i for i in _rows(out / "invocations.jsonl") if i["kind"] == "prefill"]
    assert len(prefills) == 3 and all(i["ok"] for i in prefills)
    assert all(r["runtime/ship_kv"] == 1.0 for r in _rows(out / "metrics.jsonl") if "runtime/ship_kv" in r)
    assert read_digests(out) == read_digests(runs["serverful"][0])


def test_a_resumed_serverful_run_equals_the_uninterrupted_one(runs, tmp_path):
    cfg = load_run_config("experiments/configs/quickstart.yaml", TINY + ["runtime.mode=serverful",
                                                                         "train.checkpoint_every=1"])
    out = tmp_path / "resumed"
    train(replace(cfg, train=replace(cfg.train, steps=2)), out, progress=False)
    train(cfg, out, progress=False, resume=True)
    assert read_digests(out) == read_digests(runs["serverful"][0])


def test_the_reference_forward_streams_with_overlap_and_gives_the_same_kl_and_weights(tmp_path):
    """kl > 0: the reference function after the rollout (serverful; serverless without overlap) and the learner
    ranks' own per-group reference forward while the rest decodes (serverless, overlap auto) give the same KL term
    to the last bit, so the same samples and the same final weights."""
    from rlhfless.run.compare import weights_digest

    kl = ["algo.kl_coef=0.05", "train.steps=2", "plan.max_actors=2"]
    a, _ = _run(tmp_path, "kl_serverful", ["runtime.mode=serverful"] + kl)
    b, _ = _run(tmp_path, "kl_streamed", ["runtime.mode=serverless"] + kl)
    c, _ = _run(tmp_path, "kl_sequential", ["runtime.mode=serverless", "runtime.overlap=false"] + kl)
    for run in (b, c):
        assert samples_match(a, run)[0]
        assert weights_digest(run) == weights_digest(a) is not None
    kls = [[r["actor/kl"] for r in _rows(run / "metrics.jsonl") if "actor/kl" in r] for run in (a, b, c)]
    assert len(kls[0]) == 2 and kls[0] == kls[1] == kls[2] and any(k != 0 for k in kls[0])
    kinds = {run: {i["kind"] for i in _rows(run / "invocations.jsonl")} for run in (b, c)}
    assert "reference" not in kinds[b] and "reference" in kinds[c]
    assert sum(r["runtime/learner_compute_before_rollout_end"] for r in _rows(b / "metrics.jsonl")) > 0


def test_prewarmed_workers_take_the_next_stage_work(runs):
    out = runs["separate"][0]
    prewarmed = {w["worker"] for w in _rows(out / "workers.jsonl") if w["prewarmed"]}
    used = {i["kind"] for i in _rows(out / "invocations.jsonl") if i["worker"] in prewarmed}
    assert "learner" in used  # started during the rollout, ready when the learner stage began


def test_runtime_metrics_are_logged_every_step(runs):
    for name in ("serverful", "serverless"):
        for r in (x for x in _rows(runs[name][0] / "metrics.jsonl") if "timing_s/step" in x):
            assert r["cost/device_seconds"] > 0 and 0 <= r["runtime/idle_fraction"] <= 1
            # every held device-second is busy, held idle or cold-starting, per role (lifetime billing: the bill)
            usage = {k: v for k, v in r.items() if k.startswith("function/") and k.rsplit("/", 1)[1] in
                     ("busy_s", "idle_s", "cold_s")}
            assert sum(usage.values()) == pytest.approx(r["cost/device_seconds"], rel=1e-6)
            # mid-step: at a keep-alive's lapse, or a learner rank let go at its share
            assert r["runtime/released_mid_step"] <= r["runtime/released_expired"] + \
                r.get("runtime/ranks_released_early", 0.0)
    # a serverless learner rank waits for groups between its compute intervals: held idle, not busy
    learners = [i for i in _rows(runs["serverless"][0] / "invocations.jsonl") if i["kind"] == "learner" and i["ok"]]
    assert all(i["busy"] and sum(b - a for a, b in i["busy"]) <= i["finished_s"] - i["requested_s"] for i in learners)
    steps = [r for r in _rows(runs["serverless"][0] / "metrics.jsonl") if "timing_s/step" in r]
    assert sum(r.get("function/learner/idle_s", 0.0) for r in steps) > 0


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))


def _same_weights(a: Path, b: Path) -> bool:
    import torch

    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_overlap_streams_groups_into_the_learner_and_ends_with_bitwise_equal_weights(runs):
    """Serverless streams finished groups into its learner ranks during decode (with cuts); the serverful control
    learns after the rollout. Same samples every step and the same final weights, bit for bit."""
    out = runs["serverless"][0]
    # the share of the learner's group compute done before the last decode function ended: some, not all
    early = [r[EARLY] for r in _rows(out / "metrics.jsonl") if EARLY in r]
    assert len(early) == 3 and all(0 <= x <= 1 for x in early) and sum(early) > 0
    assert all(r[EARLY] == 0 for r in _rows(runs["serverful"][0] / "metrics.jsonl") if EARLY in r)
    assert _same_weights(out, runs["serverful"][0])
    learners = [i for i in _rows(out / "invocations.jsonl") if i["kind"] == "learner" and i["ok"]]
    assert learners and all(i["extra"]["compute_s"] > 0 for i in learners if i["groups"])


def test_hybrid_functions_go_on_as_warm_learner_ranks_to_the_same_weights(runs):
    """runtime.hybrid (the default): a decode function whose rows are done becomes a learner rank of its step when
    a rank has work for it now (warm: no cold start); one with none (its rows migrated away before any of its groups
    finished) is released at once (keep-alive 0) and that rank starts later, cold. The weights equal the separate
    images' and the serverful control's bit for bit."""
    out, sep = runs["serverless"][0], runs["separate"][0]
    invs = _rows(out / "invocations.jsonl")
    decoded = {(i["step"], i["worker"]) for i in invs if i["kind"] == "decode"}
    learners = [i for i in invs if i["kind"] == "learner" and i["ok"]]
    assert len(learners) == 3 * available_cores()
    warm = [i for i in learners if not i["cold"]]
    assert warm and all((i["step"], i["worker"]) in decoded for i in warm)
    separate_cold = [i for i in _rows(sep / "invocations.jsonl") if i["kind"] == "learner" and i["cold"]]
    assert separate_cold and len(learners) - len(warm) < len(separate_cold)
    assert read_digests(out) == read_digests(sep)
    assert _same_weights(out, sep) and _same_weights(out, runs["serverful"][0])


def test_every_step_bills_hybrid_functions_to_decode_or_learner(runs):
    """A hybrid function's held time in a step is billed by role (`meter.role_split`) from every invocation so
    far: one pre-warmed for the next step, or kept warm from the last, is never billed to a mixed
    "decode+learner" kind, and the steps' decode and learner bills stay within the run's (which also bills the
    time between steps)."""
    out, summary = runs["hybrid_warm"]
    workers = _rows(out / "workers.jsonl")
    assert len(workers) < 3 * 2  # kept warm across steps
    steps = [r for r in _rows(out / "metrics.jsonl") if "timing_s/step" in r]
    assert len(steps) == 3 and not any("decode+learner" in k for r in steps for k in r)
    billed = summary["runtime"]["billed_s_by_kind"]
    assert set(billed) <= {"decode", "learner", "prefill", "reference"}
    for kind in ("decode", "learner"):
        in_steps = sum(r.get(f"function/{kind}/billed_s", 0.0) for r in steps)
        assert 0 < in_steps <= billed[kind] + 0.01, kind


def test_a_learner_rank_killed_while_streaming_recomputes_its_groups_to_the_same_weights(runs):
    out, summary = runs["killed_learner"]
    assert runs["killed_ranks"], "the chaos hook never found a learner rank with groups"
    assert summary["runtime"]["workers_killed"] >= 1 and summary["runtime"]["retries"] >= 1
    assert read_digests(out) == read_digests(runs["serverful"][0])
    assert _same_weights(out, runs["serverful"][0])


def test_a_serverful_pool_killed_at_decode_and_update_restarts_to_the_same_samples_and_weights(runs):
    """Serverful recovery is the serverless one's contract: a pool worker's death (idle, mid-decode, inside the
    optimiser step) restarts the pool from the last state; nothing is lost, samples and final weights are the
    clean run's bit for bit, and each death costs exactly one retry (no replacement worker crashes for want of
    its learn_begin)."""
    out, summary = runs["serverful_killed"]
    fired = [(rule.op, rule.step) for rule, _ in runs["serverful_chaos"].fired]
    assert fired == [("done", 1), ("decode", 2), ("learn_end", 3)]
    rt = summary["runtime"]
    killed = sorted(w["worker"] for w in _rows(out / "workers.jsonl") if w["killed"])
    assert killed == sorted(w for _, w in runs["serverful_chaos"].fired), "a survivor was counted as a death"
    assert rt["workers_killed"] == 3 and rt["retries"] == 3
    assert rt["workers_started"] == 4 * available_cores()  # the first pool + one whole new pool per death
    assert read_digests(out) == read_digests(runs["serverful"][0])
    assert _same_weights(out, runs["serverful"][0])
    failed = {(i["step"], i["kind"]) for i in _rows(out / "invocations.jsonl") if not i["ok"]}
    assert (2, "decode") in failed and (3, "learner") in failed


@pytest.mark.parametrize("name", ["serverful", "serverless", "killed", "killed_learner", "serverful_killed"])
def test_never_more_units_held_than_exist(runs, name):
    """Decode, prefill, learner, pre-warmed and kept workers together never hold more units than the machine
    gives the runtime, over whole runs with migration, shipped KV and killed workers (workers.jsonl)."""
    from rlhfless.runtime.records import peak_units

    out, summary = runs[name]
    units = summary["runtime"]["units"]
    workers = _rows(out / "workers.jsonl")
    assert peak_units(workers) <= units
    per_step = [r["runtime/units_peak"] for r in _rows(out / "metrics.jsonl") if "runtime/units_peak" in r]
    assert len(per_step) == 3 and max(per_step) <= units


def test_peak_units_counts_overlaps_and_not_handovers():
    from rlhfless.runtime.records import peak_units

    rows = [{"spawned_s": 0.0, "released_s": 2.0, "units": 1.0}, {"spawned_s": 1.0, "released_s": 3.0, "units": 1.0},
            {"spawned_s": 2.0, "released_s": None, "units": 1.0}]
    assert peak_units(rows) == 2.0  # the third starts as the first ends: a handover, not a third unit
    assert peak_units(rows + [{"spawned_s": 2.5, "released_s": 2.6, "units": 1.0}]) == 3.0
    assert peak_units(rows, 3.0, 4.0) == 1.0


def test_planner_accuracy_sums_predicted_and_billed_over_the_same_steps():
    """The one definition (`compare` reports it, the benchmark measures it): steps past the calibration that logged
    both numbers, predicted and billed summed over exactly those steps."""
    from rlhfless.run.compare import planner_accuracy

    rows = [{"step": 1, "plan/predicted_device_s": 9.0, "function/decode/billed_s": 1.0, "cost/device_seconds": 3.0},
            {"step": 2, "plan/predicted_device_s": 2.0, "function/decode/billed_s": 4.0, "cost/device_seconds": 6.0},
            {"step": 3, "plan/predicted_device_s": 3.0, "cost/device_seconds": 5.0},  # no decode bill: left out
            {"step": 4, "plan/predicted_device_s": 4.0, "function/decode/billed_s": 1.0, "cost/device_seconds": 2.0}]
    a = planner_accuracy(rows, whole_step=False, skip=1)
    assert a == {"priced": "function/decode/billed_s", "skipped_steps": 1, "steps": 2, "predicted_device_s": 3.0,
                 "billed_device_s": 2.5, "predicted_over_billed": 6.0 / 5.0}
    w = planner_accuracy(rows, whole_step=True, skip=1)
    assert w["priced"] == "cost/device_seconds" and w["steps"] == 3 and w["predicted_over_billed"] == 9.0 / 13.0
    assert planner_accuracy(rows, whole_step=False, skip=4) == {"priced": "function/decode/billed_s",
                                                                 "skipped_steps": 4, "steps": 0}


def test_the_planner_prices_the_decode_functions_every_step_and_follows_the_measured_speed(runs):
    """What the planner's accuracy rests on, checked without a clock (how close it comes is measured by
    benchmarks/bench_planner_accuracy.py, beside the machine's load): the prediction is logged every step next to
    the bill of what it priced; the bill is the workers' lifetimes split by role; and the time-model scale the
    planner prices with is the smoothed ratio of the measured decode busy seconds (the invocations') to what its
    base model predicts for the same placement, replayed here from the log alone."""
    from rlhfless.run.compare import priced_key
    from rlhfless.runtime.clock import smoothed_scale

    out, summary = runs["serverless"]
    rows = _rows(out / "metrics.jsonl")
    invs = [i for i in _rows(out / "invocations.jsonl") if i["kind"] == "decode" and i["ok"]]
    assert priced_key(False) == "function/decode/billed_s"
    scale = None
    for r in rows:
        assert r["plan/predicted_device_s"] > 0 and r["function/decode/billed_s"] > 0
        by_kind = sum(v for k, v in r.items() if k.startswith("function/") and k.endswith("/billed_s"))
        assert by_kind == pytest.approx(r["cost/device_seconds"], rel=1e-9)
        busy = sum(i["finished_s"] - i["started_s"] for i in invs if i["step"] == r["step"])
        assert r["runtime/decode_busy_s"] == pytest.approx(busy, rel=1e-9)
        scale = smoothed_scale(scale, r["runtime/decode_busy_s"] / r["runtime/decode_busy_model_s"])
        assert r["runtime/time_model_scale"] == pytest.approx(scale, rel=1e-12)
    workers = _rows(out / "workers.jsonl")
    lifetimes = sum((w["released_s"] - w["spawned_s"]) * w["units"] for w in workers)
    # billing rounds each lifetime up to its granularity (1 ms here)
    assert summary["runtime"]["cost_device_s"] == pytest.approx(lifetimes, abs=0.001 * len(workers) + 1e-9)


def test_compare_runs_three_arms_with_identical_samples_and_weights_and_explains_the_gap(tmp_path):
    from rlhfless.run.compare import run_planner_accuracy

    cfg = load_run_config("experiments/configs/quickstart.yaml", TINY + ["runtime.mode=compare"])
    c = train(cfg, tmp_path / "cmp", progress=False)
    assert c["arms"] == ["serverful", "serverful-overlap", "serverless"]
    assert c["samples_identical"] and c["steps_compared"] == 3 and c["first_divergent_step"] is None
    assert c["weights_identical"] and len({c[a]["weights_sha256"] for a in c["arms"]}) == 1
    # the middle arm really streamed: groups went to the learner during decode, on the held pool
    streamed = [r[EARLY] for r in _rows(tmp_path / "cmp" / "serverful-overlap" / "metrics.jsonl")]
    assert sum(streamed) > 0
    assert sum(r[EARLY] for r in _rows(tmp_path / "cmp" / "serverful" / "metrics.jsonl")) == 0
    # the whole learned state (policy and optimizer) is byte for byte the same in every arm
    assert c["final_state_identical"] and c["final_state_files"] == ["model.safetensors", "optimizer.safetensors"]
    assert len({json.dumps(c[a]["final_state_sha256"], sort_keys=True) for a in c["arms"]}) == 1
    assert c["released_mid_step"] >= 0 and c["zero_held_intervals"] >= 0
    # the same records billed per invocation (the paper's proxy) bill no idle: never more than the lifetimes
    bills = c["serverless"]["cost_device_s_by_billing"]
    assert set(c["cost_ratio_by_billing"]) == {"invocations", "lifetime"} and bills["invocations"] <= bills["lifetime"]
    assert bills["lifetime"] == pytest.approx(c["serverless"]["cost_device_s"])
    assert c["overlap_only"]["step_time_ratio"] > 0
    sl, sf = c["serverless"]["core_s_per_step"], c["serverful"]["core_s_per_step"]
    # serverless starts functions every step (its decode functions); the control's pool started once
    assert c["serverless"]["workers_started"] > c["serverful"]["workers_started"] and sl["busy"]["learner"] > 0
    assert c["gap_core_s_per_step"]["billed"] == pytest.approx(sl["billed"] - sf["billed"])
    # 3 steps are all calibration: the accuracy leaves them out, and counts them when told to skip none
    assert c["serverless"]["planner"]["steps"] == 0 and c["serverless"]["planner"]["skipped_steps"] == 3
    assert run_planner_accuracy(tmp_path / "cmp" / "serverless", False, skip=0)["steps"] == 3
    # what other processes took while each arm ran (the arms run one after another on shared cores)
    for arm in c["arms"]:
        m = c[arm]["machine"]
        assert m["own_cpu_s"] > 0 and m["wall_s"] >= c[arm]["loop_wall_s"] and 0 <= m["other_cpu_fraction"] <= 1
    assert c["other_cpu_fraction_max"] == max(c[a]["machine"]["other_cpu_fraction"] for a in c["arms"])


@pytest.mark.slow
def test_a_mid_run_evaluation_is_billed_to_neither_mode(tmp_path, monkeypatch):
    """train.eval_every > 0: the held-out evaluation runs on the driver between steps while the serverful pool is
    held and the serverless functions are mostly released. Both bills leave it out: each mode's billed
    device-seconds equal its workers' lifetimes (workers.jsonl, summed plainly) less the time they were held during
    the evaluations, and the loop's wall time excludes them. Billing the held pool would charge the control alone
    for work neither mode's workers do."""
    import rlhfless.run.runner as runner

    evals, runtimes = [], []
    real_eval = runner.run_eval

    def timed_eval(*args, **kw):
        t0 = time.monotonic()
        result = real_eval(*args, **kw)
        evals.append((t0, time.monotonic()))
        return result

    monkeypatch.setattr(runner, "run_eval", timed_eval)
    executor.RUNTIME_HOOKS.append(runtimes.append)
    try:
        for mode in ("serverful", "serverless"):
            evals.clear()
            out, summary = _run(tmp_path, mode, [f"runtime.mode={mode}", "train.eval_every=1", "train.eval_prompts=8"])
            rt, s = runtimes[-1], summary["runtime"]
            # the first and last are the initial and final
            mid = [(a - rt.clock.t0, b - rt.clock.t0) for a, b in evals[1:-1]]
            assert len(mid) == 2 and all(b > a for a, b in mid)
            # the runtime's own off-clock intervals (each evaluation, with the driver's weight sync before it): every
            # evaluation lies inside one, and the bills are checked against exactly those intervals, not against
            # the test's own timing of the evaluation (on a loaded machine the sync alone can take 20 ms)
            paused = list(rt.clock.paused)
            assert len(paused) == 2 and all(any(pa <= a and b <= pb for pa, pb in paused) for a, b in mid)
            off_s = sum(b - a for a, b in paused)
            workers = _rows(out / "workers.jsonl")

            def in_paused(w):
                return sum(max(0.0, min(w["released_s"], b) - max(w["spawned_s"], a)) for a, b in paused) * w["units"]

            held_in_paused = sum(in_paused(w) for w in workers)
            lifetimes = sum((w["released_s"] - w["spawned_s"]) * w["units"] for w in workers)
            if mode == "serverful":  # the premise: the pool is held through every evaluation
                assert held_in_paused == pytest.approx(s["units"] * off_s, rel=1e-6)
            # billing rounds each lifetime up to its granularity (1 ms here)
            assert s["cost_device_s"] == pytest.approx(lifetimes - held_in_paused, abs=0.001 * len(workers) + 1e-9), mode
            assert s["off_clock_s"] == pytest.approx(off_s, rel=1e-9)
            assert s["loop_wall_s"] == pytest.approx(rt.clock.step_t1 - rt.clock.t0 - off_s, rel=1e-9)
    finally:
        executor.RUNTIME_HOOKS.remove(runtimes.append)


def test_hybrid_functions_killed_before_and_after_going_on_as_ranks_lose_nothing(runs):
    """SIGKILL a hybrid function as its decode ends (the driver hands the dead worker on as a rank), a rank just
    handed, a warm former rank as it starts the next decode, and a rank just sent the optimiser step (it alone is
    re-run: shares need no group): each death is one retry, noticed by whoever owns the worker at that moment (decode stage or
    learner stream), and samples and weights are the serverful control's bit for bit."""
    out, summary = runs["hybrid_killed"]
    fired = [(rule.op, rule.step) for rule, _ in runs["hybrid_chaos"].fired]
    assert fired == [("done", 1), ("learn_begin", 2), ("decode", 3), ("learn_end", 3)]
    rt = summary["runtime"]
    killed = sorted(w["worker"] for w in _rows(out / "workers.jsonl") if w["killed"])
    assert killed == sorted(w for _, w in runs["hybrid_chaos"].fired), "a survivor was counted as a death"
    assert rt["workers_killed"] == 4 and rt["retries"] == 4
    # serverless ranks end with shares, not a process group: the death at learn_end re-runs the dead rank alone;
    # the other rank's share stands (it is not stopped, and step 3 still has one good invocation per rank)
    workers = _rows(out / "workers.jsonl")
    assert not any(w["stopped"] for w in workers)
    ok3 = [i for i in _rows(out / "invocations.jsonl") if i["step"] == 3 and i["kind"] == "learner" and i["ok"]]
    assert len(ok3) == 2
    assert read_digests(out) == read_digests(runs["serverful"][0])
    assert _same_weights(out, runs["serverful"][0])


def test_a_warm_hybrid_function_decodes_the_next_step_with_the_weights_it_computed(runs):
    """Kept warm (keep-alive), the learner rank that reduced the shares decodes the next step with the update it
    applied in memory (no state load: sync_s 0); a rank that left at its share loads the new version. Either way
    the samples and final weights are the serverful control's bit for bit."""
    out = runs["hybrid_warm"][0]
    invs = _rows(out / "invocations.jsonl")
    ranks = {(i["step"], i["worker"]) for i in invs if i["kind"] == "learner" and i["ok"]}
    last = {}  # step -> the worker whose learner invocation ended last: the reducer
    for i in invs:
        if i["kind"] == "learner" and i["ok"] and i["finished_s"] >= last.get(i["step"], (-1.0, ""))[0]:
            last[i["step"]] = (i["finished_s"], i["worker"])
    warm = [i for i in invs if i["kind"] == "decode" and (i["step"] - 1, i["worker"]) in ranks]
    assert len({i["worker"] for i in warm}) == 2
    for i in warm:
        reduced = last[i["step"] - 1][1] == i["worker"]
        assert (i["extra"]["sync_s"] == 0) == reduced
    assert read_digests(out) == read_digests(runs["serverful"][0])
    assert _same_weights(out, runs["serverful"][0])
