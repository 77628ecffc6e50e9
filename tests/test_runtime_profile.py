"""The runtime's decode-time profile: measured with the workers' thread count, cached per machine, priced with.

Layers: one real rollout timed at every batch size it passes through; the cache key names the CPU, threads,
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
from rlhfless.rollout.tpot import measure_profile
from rlhfless.runtime.devices import profile as P
from rlhfless.runtime.config import available_cores


def test_one_real_rollout_is_timed_at_every_batch_size_it_passes(tiny_checkpoint):
    from rlhfless.rollout.engine import SamplingParams

    model = load_policy(tiny_checkpoint)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
    seen = []
    rows, prefill_s = measure_profile(model, prompts, 4, SamplingParams(max_new_tokens=20, temperature=1.0),
                                      rollouts=1, slice_iters=5, on_slice=seen.append)
    assert check_profile_rows(rows, "measured") == rows and prefill_s > 0
    sizes = [r["batch_size"] for r in rows]
    assert sizes == sorted(sizes) and 7 <= sizes[-1] <= 12  # the first iterations run all 12 rows (bucket 8-15)
    assert seen == sorted(seen) and seen[-1] <= 20  # progress every 5 iterations, within max_new_tokens
    total = sum(r["n"] for r in rows)  # every iteration of the rollout, once
    assert 5 * (len(seen) - 1) < total <= min(20, 5 * len(seen))
    seen.clear()
    pooled, _ = measure_profile(model, prompts, 4, SamplingParams(max_new_tokens=20, temperature=1.0), rollouts=3,
                                slice_iters=5, on_slice=seen.append)
    assert seen == sorted(seen) and seen[-1] <= 60 and sum(r["n"] for r in pooled) > total  # three rollouts pooled


def _cfg(*overrides: str):
    from rlhfless.config import load_run_config

    return load_run_config("experiments/configs/quickstart.yaml", list(overrides))


def test_the_cache_key_names_the_cpu_threads_model_torch_and_workload(tiny_checkpoint, monkeypatch):
    cfg = _cfg()
    key = P.profile_key(cfg, threads=1)
    assert key["threads"] == 1 and key["cpu"] == P.cpu_name() and key["torch"] == P.torch.__version__
    others = [P.profile_key(cfg, threads=2), P.profile_key(_cfg(f"policy.checkpoint={tiny_checkpoint}"), 1),
              P.profile_key(_cfg("rollout.max_new_tokens=64"), 1), P.profile_key(_cfg("task.arith.k_max=4"), 1)]
    assert P.profile_key(_cfg("train.steps=3", "optim.lr=1e-5"), 1) == key  # nothing timed depends on these
    monkeypatch.setattr(P, "cpu_name", lambda: "another CPU")
    others.append(P.profile_key(cfg, threads=1))
    monkeypatch.setattr(P.torch, "__version__", "0.0.1")
    others.append({**P.profile_key(cfg, threads=1), "cpu": key["cpu"]})
    assert len({P.cache_path(P.Path("c"), k) for k in [key, *others]}) == 7


def test_a_cached_profile_round_trips_and_an_unusable_one_is_measured_again(tmp_path, capsys):
    key = P.profile_key(_cfg(), threads=1)
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
    return {"rows": [{"batch_size": 2 ** k, "context": 100, "s_per_iter": cost(2 ** k), "n": 16} for k in range(9)],
            "prefill_s_per_token": 1e-4}


@pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")
@pytest.mark.parametrize("shape, actors", [("flat", 1), ("steep", 2)])
def test_the_planner_prices_with_the_cached_profile_of_this_machine(tmp_path, shape, actors):
    from rlhfless.run.launch import train

    cache = tmp_path / "cache"
    cfg = _cfg(
        "runtime.mode=serverless", f"runtime.profile_cache={cache}", "plan.scale=true", "plan.min_actors=1",
        "plan.max_actors=2", "train.steps=1", "rollout.prompts_per_step=4", "algo.group_size=4",
        "rollout.max_new_tokens=32", "train.eval_prompts=0", "train.checkpoint_every=0", "tracking.mode=disabled",
        "runtime.gantt_every=0", "task.arith.k_max=4")
    key = P.profile_key(cfg, threads=1)
    P.write_cached(P.cache_path(cache, key), key, _fake_profile(shape), 1.0)
    out = tmp_path / "run"
    summary = train(cfg, out, progress=False)
    assert summary["runtime"]["time_profile"] == str(P.cache_path(cache, key))
    assert summary["runtime"]["time_profile_measured_s"] == 0.0  # found in the cache: nothing measured
    assert json.loads((out / "time_profile.json").read_text())["rows"] == _fake_profile(shape)["rows"]
    step1 = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "scaler/num_actors" in x)
    assert step1["scaler/num_actors"] == actors
