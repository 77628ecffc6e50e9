"""The learner's seconds on one quickstart-size batch: GRPO's update vs PPO's value forward and update.

usage: python benchmarks/bench_ppo_learner.py
Batch: 32 prompts x 8 responses of random tokens (prompt 12 tokens, responses 25-80: the quickstart's lengths),
0/1 rewards, GRPO without group skipping so both train every token; one torch thread. The arms run interleaved,
4 rounds, the first dropped, medians reported, so a contended machine slows them alike. The simulator assumes
PPO's learner costs 2x GRPO's per token plus a value forward at scoring cost (`rlhfless.sim.perf`); this
measures it. Name the CPU beside results.
"""
import random, time, statistics, torch
from pathlib import Path
from rlhfless.config import CriticConfig, OptimConfig
from rlhfless.critic import load_critic
from rlhfless.learner import Learner
from rlhfless.algo.config import GRPOConfig
from rlhfless.model.factory import load_policy
from rlhfless.ppo import ppo_update
torch.set_num_threads(1)
ck = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "sft"
rng = random.Random(0)
P = [[rng.randint(3, 200) for _ in range(12)] for _ in range(32)]
R = [[rng.randint(3, 200) for _ in range(rng.randint(25, 80))] for _ in range(256)]
rw = torch.tensor([float(rng.random() < 0.6) for _ in range(256)])
grpo = Learner(load_policy(ck), OptimConfig(), GRPOConfig(skip_zero_variance_groups=False))
arms = {}
for mb in (1, 2):
    cfg = GRPOConfig(name="ppo", group_size=8, ppo_mini_batches=mb)
    arms[mb] = (Learner(load_policy(ck), OptimConfig(), cfg), load_critic(CriticConfig(), ck))
t = {"grpo_update": [], "ppo_values": [], "ppo_update_mb1": [], "ppo_update_mb2": []}
for rep in range(4):
    t0 = time.perf_counter(); grpo.update(P, R, rw); t["grpo_update"].append(time.perf_counter() - t0)
    for mb, (lrn, cr) in arms.items():
        t0 = time.perf_counter(); v = cr.values(P, R, 8); tv = time.perf_counter() - t0
        if mb == 1:
            t["ppo_values"].append(tv)
        t0 = time.perf_counter(); ppo_update(lrn, cr, P, R, rw, v); t[f"ppo_update_mb{mb}"].append(time.perf_counter() - t0)
med = {k: statistics.median(v[1:]) for k, v in t.items()}
tok = sum(map(len, R))
for k, v in med.items():
    print(f"{k:16s} {v:6.2f} s  {1e6 * v / tok:7.1f} us/response token  {v / med['grpo_update']:.2f}x GRPO's update")
