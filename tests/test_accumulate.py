"""Accumulated (streamed) learner update: arrival order cannot change the weights; it equals the batched update.

- `microbatches` is a fixed plan by group index (property checks over sizes).
- The same step fed in several finishing orders (and all at once) ends with bitwise equal weights, optimiser state
  and metrics, with and without reference log-probs, per-sequence aggregation and several groups per micro-batch.
- It equals `Learner.update` (one batched forward) up to float rounding (float64), so the math is the same update:
  dropping the final division by the normaliser, or folding in arrival order, is caught (controls below).
- Two ranks (an in-process all-reduce of two accumulators) equal one rank up to rounding.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.learn.accumulate import AccumulatedUpdate, GroupBatch
from rlhfless.plan.schedule import microbatches
from rlhfless.algo import GRPOConfig
from rlhfless.learn.config import OptimConfig
from rlhfless.learn.dataparallel import Shard
from rlhfless.learn.learner import Learner
from rlhfless.model.factory import load_checkpoint

CKPT = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "sft"
G = 4
B = 6


@given(st.integers(0, 40), st.integers(1, 5), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_microbatches_cover_every_group_once_in_index_order(n, m, world):
    plan = microbatches(n, m, world)
    assert len(plan) == world
    flat = [g for rank in plan for chunk in rank for g in chunk]
    assert flat == list(range(n))  # contiguous runs of chunks, in order
    assert all(1 <= len(c) <= m for rank in plan for c in rank)
    counts = [len(rank) for rank in plan]
    assert max(counts) - min(counts) <= 1


def _data(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 250, (int(n),), generator=gen).tolist() for n in torch.randint(3, 10, (B,), generator=gen)]
    lengths = torch.randint(1, 14, (B * G,), generator=gen).tolist()
    lengths[5] = 0
    responses = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]
    rewards = torch.rand(B * G, generator=gen, dtype=torch.float64)
    rewards[2 * G:3 * G] = 1.0  # a zero-variance group: dropped
    ref = -torch.rand(B * G, 14, generator=gen, dtype=torch.float64)
    return {"prompts": prompts, "responses": responses, "rewards": rewards, "ref": ref}


def _learner(algo: dict) -> Learner:
    torch.manual_seed(0)
    model = load_checkpoint(CKPT).double()
    return Learner(model, OptimConfig(lr=1e-3), GRPOConfig(group_size=G, **algo), reuse_prefix=True)


def _batches(d: dict, with_ref: bool) -> list[GroupBatch]:
    return [GroupBatch(g, d["prompts"][g], d["responses"][g * G:(g + 1) * G], d["rewards"][g * G:(g + 1) * G],
                       d["ref"][g * G:(g + 1) * G] if with_ref else None) for g in range(B)]


def _run(learner: Learner, d: dict, order: list[int], m: int, with_ref: bool, exact: bool = True):
    acc = AccumulatedUpdate(learner, microbatches(B, m, 1)[0], with_ref, exact=exact)
    batches = _batches(d, with_ref)
    for g in order:
        acc.add(batches[g])
    metrics = acc.finish(d["rewards"], [len(r) for r in d["responses"]])
    return metrics, acc


def _state(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()] + \
        [v.clone() for s in learner.opt.state.values() for v in s.values() if torch.is_tensor(v)]


ALGOS = [({}, False, 1), ({"kl_coef": 0.1}, True, 1), ({"loss_agg": "seq_mean_token_mean"}, False, 2),
         ({"kl_coef": 0.05, "loss_agg": "token_mean"}, True, 4)]


@pytest.mark.parametrize("algo,with_ref,m", ALGOS)
def test_any_finishing_order_gives_bitwise_equal_weights(algo, with_ref, m):
    d = _data()
    base = _learner(algo)
    orders = [list(range(B)), list(reversed(range(B))), [3, 0, 5, 1, 4, 2]] + \
        [random.Random(s).sample(range(B), B) for s in range(2)]
    results = []
    for order in orders:
        learner = copy.deepcopy(base)
        learner.opt = torch.optim.AdamW(learner.model.parameters(), lr=1e-3, weight_decay=0.01)
        for step in range(2):  # two updates: AdamW's state must match too
            metrics, acc = _run(learner, d, order, m, with_ref)
        results.append((_state(learner), metrics, acc.buffered_peak))
    ref_state, ref_metrics, _ = results[0]
    for state, metrics, _ in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ref_state, state))
        assert metrics == ref_metrics
    assert results[0][2] == 0 and results[1][2] > 0  # in order nothing waits; reversed, gradients were buffered


@pytest.mark.parametrize("algo,with_ref,m", ALGOS)
def test_equals_the_batched_update_up_to_rounding(algo, with_ref, m):
    """Compared through plain SGD (lr 1), so the weight change IS the clipped gradient: AdamW's first step is
    blind to the gradient's scale and amplifies rounding near zero. The float64 model still runs its RMSNorm in
    float32, so other padding widths move gradients by ~1e-7 relative: that is the tolerance."""
    d = _data(1)
    streamed, batched = _learner(algo), _learner(algo)
    for learner in (streamed, batched):
        learner.opt = torch.optim.SGD(learner.model.parameters(), lr=1.0)
    ms, _ = _run(streamed, d, [4, 1, 0, 5, 3, 2], m, with_ref)
    mb = batched.update(d["prompts"], d["responses"], d["rewards"], d["ref"] if with_ref else None)
    for a, b in zip(streamed.model.parameters(), batched.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-5)
    assert set(ms) == set(mb)
    for key, v in mb.items():
        assert ms[key] == pytest.approx(v, rel=1e-6, abs=1e-9), key


def test_control_folding_in_arrival_order_changes_the_bits():
    """The control for exact mode: in float32, gradients summed in arrival order differ in their bits between
    two finishing orders, so the bitwise equality above is the chunk-ordered fold's doing."""
    d = _data(2)
    d = {**d, "rewards": d["rewards"].float(), "ref": d["ref"].float()}
    torch.manual_seed(0)
    base = Learner(load_checkpoint(CKPT), OptimConfig(lr=1e-3), GRPOConfig(group_size=G), reuse_prefix=True)
    finals = []
    for order in ([0, 1, 2, 3, 4, 5], [5, 4, 3, 1, 0, 2]):
        learner = copy.deepcopy(base)
        learner.opt = torch.optim.AdamW(learner.model.parameters(), lr=1e-3, weight_decay=0.01)
        acc = AccumulatedUpdate(learner, microbatches(B, 1, 1)[0], False, exact=False)
        for g in order:
            acc.add(_batches(d, False)[g])
        acc._acc = acc._acc.clone()
        finals.append(acc._acc)
    assert not torch.equal(*finals)  # arrival order changes the sum's bits: exact mode is needed


def test_two_ranks_equal_one_rank_up_to_rounding():
    d = _data(3)
    one = _learner({})
    m1, _ = _run(one, d, list(range(B)), 1, False)
    ranks = [_learner({}) for _ in range(2)]
    plan = microbatches(B, 1, 2)
    accs = [AccumulatedUpdate(r, plan[i], False) for i, r in enumerate(ranks)]
    for g in (5, 0, 3, 1, 4, 2):
        accs[0 if any(g in c for c in plan[0]) else 1].add(_batches(d, False)[g])
    import threading

    barrier, bufs = threading.Barrier(2, timeout=60), [None, None]

    def make(rank):  # a two-rank SUM all-reduce between two threads (both add in the same order)
        def all_reduce(t):
            bufs[rank] = t.clone()
            barrier.wait()
            t.copy_(bufs[0] + bufs[1])
            barrier.wait()
        return all_reduce

    out = [None, None]
    lengths = [len(r) for r in d["responses"]]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, accs[i].finish(
        d["rewards"], lengths, Shard(i, 2, make(i))))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(ranks[0].model.parameters(), ranks[1].model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(ranks[0].model.parameters(), one.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    assert out[0][M_LOSS] == pytest.approx(m1[M_LOSS], rel=1e-9)


M_LOSS = "actor/loss"
