"""Data-parallel PPO (issue 40): N ranks of the actor and the critic end with the one-rank update.

Two ranks run as threads of this process, each with its own replica of the policy and the critic, joined by an
in-process all-reduce that gathers every rank's buffer and sums it in rank order (`dist.rank_order_sum`, the
runtime's reduction in both modes). Two updates of ppo_epochs 2 x ppo_mini_batches 3 (12 optimiser steps per
model), KL in the reward (old log-probs recomputed), one empty response. After each update both ranks' weights
and AdamW moments must be bitwise equal to each other and equal to the one-rank update within atol 1e-6; the
metrics within rel 1e-5. The control without the all-reduce shows the tolerance sees a missing exchange.

Float64 models (both paths), as tests/test_learner_dp.py explains: in float32 AdamW's first steps turn
summation-order rounding of near-zero gradients into ~1e-6 weight differences, which is Adam's sensitivity and
not a data-parallel error; float64 removes it, so atol 1e-6 tests the math.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from rlhfless.algo.config import GRPOConfig
from rlhfless.core import metrics as M
from rlhfless.learn.config import CriticConfig, OptimConfig
from rlhfless.learn.critic import Critic, load_critic
from rlhfless.learn.dataparallel import Shard
from rlhfless.learn.learner import Learner
from rlhfless.learn.ppo_update import ppo_schedule, ppo_update, rank_rows
from rlhfless.model.factory import load_policy
from rlhfless.rollout.forward import response_logprobs
from rlhfless.runtime.devices.dist import rank_order_sum

G = 2
ALGO = dict(name="ppo", group_size=G, ppo_epochs=2, ppo_mini_batches=3, kl_coef=0.05)
ATOL = 1e-6


class ThreadGroup:
    """An all-reduce between threads of one process: every rank's buffer gathered, summed in rank order."""

    def __init__(self, world: int):
        self.world, self.parts = world, [None] * world
        self.barrier = threading.Barrier(world, timeout=120)

    def shard(self, rank: int) -> Shard:
        def all_reduce(t: torch.Tensor) -> None:
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = rank_order_sum(self.parts)
            self.barrier.wait()  # nobody overwrites its part before every rank has summed
            t.copy_(total)
        return Shard(rank, self.world, all_reduce)


def _batch(seed: int) -> dict:
    """6 prompts x G=2 rows, varied prompt and response lengths, one empty response, random rewards."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 120, (n,), generator=gen).tolist() for n in (5, 9, 3, 7, 4, 6)]
    lengths = torch.randint(1, 12, (6 * G,), generator=gen).tolist()
    lengths[3] = 0
    responses = [torch.randint(3, 120, (n,), generator=gen).tolist() for n in lengths]
    return {"prompts": prompts, "responses": responses, "rewards": torch.rand(6 * G, generator=gen)}


@pytest.fixture(scope="module")
def start(tiny_checkpoint):
    """(learner, critic, reference, batches): the starting replicas in float64."""
    algo = GRPOConfig(**ALGO)
    learner = Learner(load_policy(tiny_checkpoint).double(), OptimConfig(lr=1e-3), algo)
    critic = Critic(load_critic(CriticConfig(lr=1e-2), tiny_checkpoint).model.double(), CriticConfig(lr=1e-2))
    reference = load_policy(tiny_checkpoint).double().eval()
    return learner, critic, reference, [_batch(1), _batch(2)]


def _updates(start, shard: Shard | None, replicas=None) -> list[tuple[dict, dict]]:
    """(state, metrics) after each update of one rank (fresh replicas unless given)."""
    learner, critic, reference, batches = start
    learner, critic = replicas or (copy.deepcopy(learner), copy.deepcopy(critic))
    out = []
    for b in batches:
        with torch.no_grad():
            ref = response_logprobs(reference, b["prompts"], b["responses"], G).logp
        values = critic.values(b["prompts"], b["responses"], G)
        m = ppo_update(learner, critic, b["prompts"], b["responses"], b["rewards"], values, ref, seed=7,
                       shard=shard)
        state = {f"policy/{k}": v.clone() for k, v in learner.model.state_dict().items()}
        state.update({f"critic/{k}": v.clone() for k, v in critic.model.state_dict().items()})
        for name, opt in (("policy", learner.opt), ("critic", critic.opt)):
            for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
                state.update({f"{name}-adam/{i}/{k}": v.clone() for k, v in opt.state[p].items()})
        out.append((state, {k: v for k, v in m.items() if not k.startswith("timing_s/")}))
    return out


def _ranks(start, world: int) -> list[list[tuple[dict, dict]]]:
    group, results, errors = ThreadGroup(world), [None] * world, []

    def run(rank: int) -> None:
        try:
            results[rank] = _updates(start, group.shard(rank))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def one_rank(start):
    return _updates(start, None)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_two_ranks_equal_one_rank_within_tolerance_and_each_other_bitwise(start, one_rank):
    ranks = _ranks(start, 2)
    for u, (want_state, want_m) in enumerate(one_rank):
        (s0, m0), (s1, m1) = ranks[0][u], ranks[1][u]
        assert all(torch.equal(s0[k], s1[k]) for k in s0), f"update {u}: replicas diverged"
        assert _max_diff(s0, want_state) < ATOL, (u, _max_diff(s0, want_state))
        assert m0 == m1
        assert m0.keys() == want_m.keys()
        for k, v in want_m.items():
            assert m0[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (u, k)
    # the update moved both models: an equality of unchanged weights would test nothing
    assert _max_diff(one_rank[0][0], one_rank[1][0]) > 100 * ATOL
    assert one_rank[-1][1][M.LOSS] != 0 and one_rank[-1][1][M.VF_LOSS] != 0


def test_a_missing_all_reduce_is_beyond_the_tolerance(start, one_rank):
    """Rank 0 alone, its gradients never summed with rank 1's: the weights leave the tolerance."""
    got = _updates(start, Shard(0, 2, lambda t: None))
    assert _max_diff(got[0][0], one_rank[0][0]) > 100 * ATOL


def test_each_global_mini_batch_is_split_across_the_ranks():
    """Every optimiser step's rows are cut into contiguous per-rank slices that cover it exactly."""
    b = _batch(3)
    cfg = GRPOConfig(**ALGO)
    schedule = ppo_schedule(cfg, len(b["responses"]), seed=7, updates=0)
    assert len(schedule) == cfg.ppo_epochs * cfg.ppo_mini_batches
    for rows in schedule:
        parts = [rank_rows(rows, b["responses"], Shard(r, 3, lambda t: None)) for r in range(3)]
        assert [r for p in parts for r in p] == rows
        assert all(parts)  # 4 rows over 3 ranks: nobody idles this step
