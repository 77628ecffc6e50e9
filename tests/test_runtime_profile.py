"""The runtime's decode-time profile: measured with the workers' thread count, cached per machine, priced with.

Layers: the measurement keeps every batch at its size and times each one; the cache key names the CPU, threads,
model config and torch, and a cache entry round-trips (an unusable one is measured again); end to end, the
planner of a serverless run prices with the cached profile's shape: a flat profile (a batch costs what one row
costs) makes one decode function the best plan, a steep one (cost proportional to the batch) two, so the shipped
profile, used for both, could not give both answers.
"""

from __future__ import annotations

import json

import pytest

from rlhfless.model.factory import load_policy
from rlhfless.plan.timemodel import check_profile_rows
from rlhfless.rollout.tpot import PROFILE_BATCHES, measure_profile
from rlhfless.runtime import profile as P
from rlhfless.runtime.config import available_cores


def test_every_batch_size_is_timed_at_its_size(tiny_checkpoint):
    model = load_policy(tiny_checkpoint)
    ticks = []
    rows, prefill_s = measure_profile(model, batch_sizes=(1, 3, 8), prompt_len=16, iters=3, warmup=1,
                                      on_batch=ticks.append)
    assert [r["batch_size"] for r in rows] == [1, 3, 8] and ticks == [0, 1, 2]
    # no row can stop, so every timed iteration ran the whole batch
    assert all(r["n"] == 3 and r["s_per_iter"] > 0 and r["context"] > 16 for r in rows)
    assert prefill_s > 0 and check_profile_rows(rows, "measured") == rows


def test_the_cache_key_names_the_cpu_threads_model_config_and_torch(tiny_checkpoint, sft_checkpoint, monkeypatch):
    key = P.profile_key(sft_checkpoint, threads=1)
    assert key["threads"] == 1 and key["cpu"] == P.cpu_name() and key["batch_sizes"] == list(PROFILE_BATCHES)
    others = [P.profile_key(sft_checkpoint, threads=2), P.profile_key(tiny_checkpoint, threads=1)]
    monkeypatch.setattr(P, "cpu_name", lambda: "another CPU")
    others.append(P.profile_key(sft_checkpoint, threads=1))
    monkeypatch.setattr(P.torch, "__version__", "0.0.1")
    others.append({**P.profile_key(sft_checkpoint, threads=1), "cpu": key["cpu"]})
    paths = {P.cache_path(P.Path("c"), k) for k in [key, *others]}
    assert len(paths) == 5


def test_a_cached_profile_round_trips_and_an_unusable_one_is_measured_again(tmp_path, sft_checkpoint, capsys):
    key = P.profile_key(sft_checkpoint, threads=1)
    path = P.cache_path(tmp_path, key)
    profile = {"rows": [{"batch_size": 1, "context": 9, "s_per_iter": 0.001, "n": 4}], "prefill_s_per_token": 1e-4}
    assert P.read_cached(path, key) is None  # nothing cached yet
    P.write_cached(path, key, profile, 1.5)
    assert P.read_cached(path, key) == profile
    assert P.read_cached(path, {**key, "threads": 2}) is None
    path.write_text("{not json")
    assert P.read_cached(path, key) is None and "measuring the time profile again" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp"))


def _fake_profile(shape: str) -> dict:
    """flat: every batch costs 0.2 s per iteration; steep: 0.05 s per row of the batch (no fixed part)."""
    cost = {"flat": lambda b: 0.2, "steep": lambda b: 0.05 * b}[shape]
    return {"rows": [{"batch_size": b, "context": 100, "s_per_iter": cost(b), "n": 16} for b in PROFILE_BATCHES],
            "prefill_s_per_token": 1e-4}


@pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")
@pytest.mark.parametrize("shape, actors", [("flat", 1), ("steep", 2)])
def test_the_planner_prices_with_the_cached_profile_of_this_machine(tmp_path, sft_checkpoint, shape, actors):
    from rlhfless.config import load_run_config
    from rlhfless.runner import train

    cache = tmp_path / "cache"
    key = P.profile_key(sft_checkpoint, threads=1)
    P.write_cached(P.cache_path(cache, key), key, _fake_profile(shape), 1.0)
    cfg = load_run_config("experiments/configs/quickstart.yaml", [
        "runtime.mode=serverless", f"runtime.profile_cache={cache}", "plan.scale=true", "plan.min_actors=1",
        "plan.max_actors=2", "train.steps=1", "rollout.prompts_per_step=4", "algo.group_size=4",
        "rollout.max_new_tokens=32", "train.eval_prompts=0", "train.checkpoint_every=0", "tracking.mode=disabled",
        "runtime.gantt_every=0", "task.arith.k_max=4"])
    out = tmp_path / "run"
    summary = train(cfg, out, progress=False)
    assert summary["runtime"]["time_profile"] == str(P.cache_path(cache, key))
    assert summary["runtime"]["time_profile_measured_s"] == 0.0  # found in the cache: nothing measured
    assert json.loads((out / "time_profile.json").read_text())["rows"] == _fake_profile(shape)["rows"]
    step1 = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "scaler/num_actors" in x)
    assert step1["scaler/num_actors"] == actors
