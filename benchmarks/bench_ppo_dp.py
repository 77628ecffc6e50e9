"""One quickstart-size PPO update (actor + critic): single process (1 and 2 torch threads) vs data-parallel world 2.

usage: python benchmarks/bench_ppo_dp.py [--repeats 3] [--json out.json]
Batch: quickstart_ppo's shape, 64 prompts x G=1 on data/checkpoints/sft, prompt 15-30 tokens, response lengths ~
Gamma(2, mean 50) clipped to [1, 192], 0/1 rewards; algo.ppo_mini_batches 2, ppo_epochs 2 (4 optimiser steps per
model). Each configuration runs `repeats` updates from the same start after one warm-up (median reported); the
DP ranks are separate interpreters joined by `rlhfless.runtime.devices.dist` (gloo on 127.0.0.1), timed from a
barrier to the end of rank 0's update (all-reduces included, process start and group init not). It also reports
the largest difference of rank 0's final policy and critic from the one-process update's (float32: rounding of
the other summation order, amplified by AdamW's first steps; tests/test_ppo_dp.py checks the math in float64).
Name the CPU beside results.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CKPT = REPO / "data" / "checkpoints" / "sft"
B, G = 64, 1


def batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist()
               for n in torch.randint(15, 31, (B,), generator=gen).tolist()]
    torch.manual_seed(seed)
    lengths = torch.distributions.Gamma(2.0, 2.0 / 50).sample((B * G,)).round().clamp(1, 192).long().tolist()
    responses = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]
    return prompts, responses, (torch.rand(B * G, generator=gen) < 0.4).float()


def start():
    from rlhfless.algo import GRPOConfig
    from rlhfless.learn.config import CriticConfig, OptimConfig
    from rlhfless.learn.critic import load_critic
    from rlhfless.learn.learner import Learner
    from rlhfless.model.factory import load_checkpoint

    algo = GRPOConfig(name="ppo", group_size=G, ppo_mini_batches=2, ppo_epochs=2)
    return Learner(load_checkpoint(CKPT), OptimConfig(lr=1e-4), algo), load_critic(CriticConfig(lr=1e-3), CKPT)


def timed_updates(threads: int, repeats: int, shard=None, barrier=None) -> tuple[list[float], dict]:
    """Seconds of each timed update (each from the same start) and the final state of the last one."""
    from rlhfless.learn.ppo_update import ppo_update

    torch.set_num_threads(threads)
    learner0, critic0 = start()
    prompts, responses, rewards = batch()
    values = critic0.values(prompts, responses, G)
    times, state = [], {}
    for i in range(repeats + 1):
        learner, critic = copy.deepcopy(learner0), copy.deepcopy(critic0)
        if barrier:
            barrier()
        t0 = time.perf_counter()
        ppo_update(learner, critic, prompts, responses, rewards, values, seed=0, shard=shard)
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
        state = {**{f"policy/{k}": v for k, v in learner.model.state_dict().items()},
                 **{f"critic/{k}": v for k, v in critic.model.state_dict().items()}}
    return times, state


def rank_main(rank: int, world: int, port: int, repeats: int, out: Path) -> None:
    torch.set_num_threads(1)
    from safetensors.torch import save_file

    from rlhfless.learn.dataparallel import Shard
    from rlhfless.runtime.devices.dist import destroy_group, init_group

    t0 = time.perf_counter()
    all_reduce = init_group(rank, world, port, timeout_s=120)
    init_s = time.perf_counter() - t0
    times, state = timed_updates(1, repeats, Shard(rank, world, all_reduce),
                                 barrier=lambda: all_reduce(torch.zeros(1)))
    destroy_group()
    if rank == 0:
        seen, flat = set(), {}
        for k, v in state.items():  # the tied lm_head / embedding once: safetensors refuses shared storage
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                flat[k] = v.contiguous()
        save_file(flat, str(out.with_suffix(".safetensors")))
        out.write_text(json.dumps({"times": times, "init_s": init_s}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a.rank, 2, a.port, a.repeats, a.out)
    from safetensors.torch import load_file

    from rlhfless.runtime.devices.dist import free_port

    lens = [len(r) for r in batch()[1]]
    print(f"batch: {B}x{G}, response tokens mean {statistics.mean(lens):.1f} max {max(lens)}; "
          "ppo_mini_batches 2 x ppo_epochs 2", flush=True)
    res, single = {}, {}
    for threads in (1, 2):
        times, single[threads] = timed_updates(threads, a.repeats)
        res[f"single_{threads}t"] = statistics.median(times)
        print(f"single process, {threads} thread(s): {res[f'single_{threads}t']:.2f} s/update", flush=True)
    out = Path(f"/tmp/bench_ppo_dp_{os.getpid()}.json")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--repeats",
                               str(a.repeats), "--out", str(out)], env=env) for r in range(2)]
    assert all(p.wait() == 0 for p in procs)
    dp = json.loads(out.read_text())
    got = load_file(str(out.with_suffix(".safetensors")))
    out.unlink()
    out.with_suffix(".safetensors").unlink()
    res["dp_2x1t"], res["dp_init_s"] = statistics.median(dp["times"]), dp["init_s"]
    res["max_abs_diff_vs_single"] = max((got[k] - single[1][k]).abs().max().item() for k in got)
    moved = start()[0].model.state_dict()
    res["max_abs_update"] = max((single[1][f"policy/{k}"] - v).abs().max().item() for k, v in moved.items())
    print(f"data-parallel world 2, 1 thread each: {res['dp_2x1t']:.2f} s/update (group init {dp['init_s']:.2f} s)")
    print(f"speedup vs 1 thread: {res['single_1t'] / res['dp_2x1t']:.2f}x; vs 2 threads: "
          f"{res['single_2t'] / res['dp_2x1t']:.2f}x")
    print(f"rank 0's final policy and critic vs one process: max |diff| {res['max_abs_diff_vs_single']:.2e} "
          f"(the policy's largest move in the update: {res['max_abs_update']:.2e})")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
