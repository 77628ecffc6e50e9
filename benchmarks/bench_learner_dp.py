"""One quickstart-size GRPO update: single process (1 and 2 torch threads) vs data-parallel world 2 (1 thread each).

usage: python benchmarks/bench_learner_dp.py [--repeats 3] [--json out.json]
Batch: 32 prompts x G=8 on data/checkpoints/sft, prompt 15-30 tokens, response lengths ~ Gamma(2, mean 50)
clipped to [1, 192], 0/1 rewards (most groups have variance). Each configuration runs one warm-up update, then
`repeats` timed updates (median reported); the DP ranks are separate interpreters joined by
`rlhfless.runtime.devices.dist` (gloo on 127.0.0.1), timed from a barrier to the end of rank 0's update, so the time
includes the all-reduce but not process start or group init (reported separately). Name the CPU beside results.
"""

from __future__ import annotations

import argparse
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
B, G = 32, 8


def batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(15, 31, (B,), generator=gen).tolist()
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in p_lens]
    torch.manual_seed(seed)
    lengths = torch.distributions.Gamma(2.0, 2.0 / 50).sample((B * G,)).round().clamp(1, 192).long().tolist()
    responses = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]
    rewards = (torch.rand(B * G, generator=gen) < 0.4).float()
    return prompts, responses, rewards


def timed_updates(threads: int, repeats: int, shard=None, barrier=None) -> list[float]:
    from rlhfless.algo import GRPOConfig
    from rlhfless.learn.config import OptimConfig
    from rlhfless.learn.learner import Learner
    from rlhfless.model.factory import load_checkpoint

    torch.set_num_threads(threads)
    learner = Learner(load_checkpoint(CKPT), OptimConfig(lr=1e-4), GRPOConfig(group_size=G))
    prompts, responses, rewards = batch()
    times = []
    for i in range(repeats + 1):
        if barrier:
            barrier()
        t0 = time.perf_counter()
        learner.update(prompts, responses, rewards, shard=shard)
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return times


def rank_main(rank: int, world: int, port: int, repeats: int, out: Path) -> None:
    torch.set_num_threads(1)
    from rlhfless.learn.dataparallel import Shard
    from rlhfless.runtime.devices.dist import destroy_group, init_group

    t0 = time.perf_counter()
    all_reduce = init_group(rank, world, port, timeout_s=120)
    init_s = time.perf_counter() - t0
    times = timed_updates(1, repeats, Shard(rank, world, all_reduce), barrier=lambda: all_reduce(torch.zeros(1)))
    destroy_group()
    if rank == 0:
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
    from rlhfless.runtime.devices.dist import free_port

    _, responses, rewards = batch()
    lens = [len(r) for r in responses]
    print(f"batch: {B}x{G}, response tokens mean {statistics.mean(lens):.1f} max {max(lens)}, "
          f"groups with variance {int((rewards.view(B, G).std(1) > 0).sum())}/{B}")
    res = {}
    for threads in (1, 2):
        res[f"single_{threads}t"] = statistics.median(timed_updates(threads, a.repeats))
        print(f"single process, {threads} thread(s): {res[f'single_{threads}t']:.2f} s/update", flush=True)
    out = Path(f"/tmp/bench_learner_dp_{os.getpid()}.json")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--repeats",
                               str(a.repeats), "--out", str(out)], env=env) for r in range(2)]
    assert all(p.wait() == 0 for p in procs)
    dp = json.loads(out.read_text())
    out.unlink()
    res["dp_2x1t"] = statistics.median(dp["times"])
    res["dp_init_s"] = dp["init_s"]
    res["dp_total_wall_s"] = time.perf_counter() - t0
    print(f"data-parallel world 2, 1 thread each: {res['dp_2x1t']:.2f} s/update "
          f"(group init {dp['init_s']:.2f} s, whole run incl. process start {res['dp_total_wall_s']:.1f} s)")
    print(f"speedup vs 1 thread: {res['single_1t'] / res['dp_2x1t']:.2f}x; vs 2 threads: "
          f"{res['single_2t'] / res['dp_2x1t']:.2f}x; 2 threads vs 1: {res['single_1t'] / res['single_2t']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
