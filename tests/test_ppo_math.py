"""PPO math against plain Python-loop references: GAE, whitening, the clipped value loss, per-token rewards,
explained variance, mini-batches; and the `algo.*` PPO config keys."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlhfless.core import metrics as M
from rlhfless.algo.config import GRPOConfig
from rlhfless.algo.gae import gae_advantages
from rlhfless.algo.ppo import (
    explained_variance,
    masked_whiten,
    mini_batches,
    ppo_advantages,
    token_rewards,
    value_loss,
)
from rlhfless.core.errors import ConfigError


def _batch(seed: int, n: int = 5, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    lengths = [random.Random(seed * 31 + i).randint(0, t) for i in range(n)]
    mask = torch.tensor([[j < L for j in range(t)] for L in lengths])
    rewards = torch.randn(n, t, generator=g) * mask
    values = torch.randn(n, t, generator=g)
    return rewards, values, mask, lengths


def _gae_loop(rewards, values, lengths, gamma, lam):
    """Textbook GAE per row, one Python float at a time; the episode ends after the last valid token."""
    adv, ret = [], []
    for i, L in enumerate(lengths):
        a_row, r_row, nxt = [0.0] * rewards.shape[1], [0.0] * rewards.shape[1], 0.0
        for t in reversed(range(L)):
            v_next = float(values[i, t + 1]) if t + 1 < L else 0.0
            delta = float(rewards[i, t]) + gamma * v_next - float(values[i, t])
            nxt = delta + gamma * lam * nxt
            a_row[t], r_row[t] = nxt, nxt + float(values[i, t])
        adv.append(a_row)
        ret.append(r_row)
    return torch.tensor(adv), torch.tensor(ret)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (1.0, 0.0), (0.5, 0.7)])
@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_a_python_loop(seed, gamma, lam):
    rewards, values, mask, lengths = _batch(seed)
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = _gae_loop(rewards, values, lengths, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value():
    """gamma = lam = 1 (verl's default): A_t = sum of rewards from t on - V(s_t), whatever the other values."""
    rewards, values, mask, lengths = _batch(7)
    adv, _ = gae_advantages(rewards, values, mask, 1.0, 1.0)
    for i, L in enumerate(lengths):
        for t in range(L):
            assert adv[i, t].item() == pytest.approx(rewards[i, t:L].sum().item() - values[i, t].item(), abs=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_whitening_matches_a_python_loop(seed):
    _, x, mask, _ = _batch(seed, n=6, t=9)
    valid = [float(x[i, j]) for i in range(6) for j in range(9) if mask[i, j]]
    if len(valid) < 2:
        pytest.skip("needs two valid tokens")
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    out = masked_whiten(x, mask)
    for i in range(6):
        for j in range(9):
            want = (float(x[i, j]) - mean) / math.sqrt(var + 1e-8) if mask[i, j] else 0.0
            assert out[i, j].item() == pytest.approx(want, abs=1e-5)
    assert out[mask].mean().item() == pytest.approx(0.0, abs=1e-5)
    assert out[mask].std().item() == pytest.approx(1.0, abs=1e-4)


def _value_loss_loop(vpred, old, ret, mask, clip):
    """Token-mean of 0.5 * max(unclipped, clipped) squared errors, and the clipped-branch fraction."""
    total, n, clipped_n = 0.0, 0, 0
    for i in range(vpred.shape[0]):
        for j in range(vpred.shape[1]):
            if not mask[i, j]:
                continue
            v, o, r = float(vpred[i, j]), float(old[i, j]), float(ret[i, j])
            vc = min(max(v, o - clip), o + clip)
            a, b = (v - r) ** 2, (vc - r) ** 2
            total += 0.5 * max(a, b)
            clipped_n += b > a
            n += 1
    return total / max(n, 1), clipped_n / max(n, 1)


@pytest.mark.parametrize("clip", [0.05, 0.2, 0.5, 10.0])
@pytest.mark.parametrize("seed", range(4))
def test_value_loss_matches_a_python_loop(seed, clip):
    rewards, old, mask, _ = _batch(seed, n=6, t=8)
    vpred = (old + torch.randn(old.shape, generator=torch.Generator().manual_seed(seed + 99)) * 0.4).requires_grad_()
    loss, m = value_loss(vpred, old, rewards, mask, clip, "token_mean")
    want, frac = _value_loss_loop(vpred.detach(), old, rewards, mask, clip)
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert m[M.VF_CLIPFRAC] == pytest.approx(frac)
    assert m[M.VF_LOSS] == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_value_clip_stops_the_gradient_of_a_prediction_moved_past_the_clip():
    """A prediction already moved past old - clip towards its target gets no more gradient (the clipped branch
    is larger and constant); one inside the clip range gets the plain squared-error gradient."""
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[-1.0, 1.0]])
    vpred = torch.tensor([[-0.5, 0.1]], requires_grad=True)  # token 0: moved 0.5 towards -1, the clip is 0.2
    loss, m = value_loss(vpred, old, ret, torch.ones(1, 2, dtype=torch.bool), 0.2, "token_mean")
    loss.backward()
    assert vpred.grad[0, 0].item() == 0.0 and m[M.VF_CLIPFRAC] == 0.5
    assert vpred.grad[0, 1].item() == pytest.approx(0.5 * (0.1 - 1.0))  # d/dv 0.5*(v-r)^2 / 2 tokens


def test_token_rewards_put_the_outcome_on_the_last_token_and_the_kl_on_every_token():
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [False] * 4])
    out = torch.tensor([1.0, 0.5, 1.0])
    r, m = token_rewards(out, mask)
    assert r.tolist() == [[0, 0, 1, 0], [0.5, 0, 0, 0], [0, 0, 0, 0]] and m == {}
    logp = torch.full((3, 4), -1.0)
    ref = torch.full((3, 4), -1.5)
    r, m = token_rewards(out, mask, 0.1, logp, ref)
    for i in range(3):
        for j in range(4):
            want = (float(out[i]) if mask[i, j] and (j + 1 == 4 or not mask[i, j + 1]) else 0.0) - \
                (0.1 * 0.5 if mask[i, j] else 0.0)
            assert r[i, j].item() == pytest.approx(want)
    assert m[M.KL_PENALTY] == pytest.approx(0.05)


def test_explained_variance_of_perfect_mean_and_bad_critics():
    mask = torch.ones(4, 3, dtype=torch.bool)
    ret = torch.arange(12.0).reshape(4, 3)
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, ret.mean().item()), ret, mask) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(-ret, ret, mask) < 0
    assert explained_variance(ret, torch.ones_like(ret), mask) == 0.0  # nothing to explain


def test_ppo_advantages_whiten_advantages_but_not_returns():
    rewards, values, mask, _ = _batch(3, n=8, t=6)
    adv, ret, m = ppo_advantages(rewards, values, mask, 1.0, 0.95, whiten=True)
    raw, raw_ret = gae_advantages(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(ret, raw_ret)
    torch.testing.assert_close(adv, masked_whiten(raw, mask))
    assert m[M.VF_EXPLAINED_VAR] == pytest.approx(explained_variance(values, raw_ret, mask))


@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (8, 8), (5, 9), (64, 4)])
def test_mini_batches_partition_the_rows(n, k):
    parts = mini_batches(n, k, seed=3)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(n)) and all(parts)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert parts == mini_batches(n, k, seed=3)


def test_mini_batches_shuffle_by_seed():
    assert mini_batches(64, 4, 0) != mini_batches(64, 4, 1)


def test_ppo_config_defaults_and_refusals():
    assert GRPOConfig().group_size == 8 and GRPOConfig(name="ppo").group_size == 1
    ppo = GRPOConfig(name="ppo", kl_coef=0.1)
    assert ppo.kl_in_reward and ppo.kl_loss_coef == 0.0
    grpo = GRPOConfig(kl_coef=0.1)
    assert not grpo.kl_in_reward and grpo.kl_loss_coef == 0.1
    assert GRPOConfig(name="ppo", kl_coef=0.1, kl_in="loss").kl_loss_coef == 0.1
    for kwargs, field in [({"name": "dpo"}, "algo.name"), ({"group_size": 1}, "algo.group_size"),
                          ({"name": "ppo", "group_size": 0}, "algo.group_size"),
                          ({"kl_in": "reward"}, "algo.kl_in"), ({"name": "ppo", "gamma": 1.5}, "algo.gamma"),
                          ({"name": "ppo", "lam": -0.1}, "algo.lam"),
                          ({"name": "ppo", "value_clip": 0}, "algo.value_clip"),
                          ({"name": "ppo", "ppo_epochs": 0}, "algo.ppo_epochs"),
                          ({"name": "ppo", "ppo_mini_batches": 0}, "algo.ppo_mini_batches"),
                          ({"name": "ppo", "inner_epochs": 2}, "algo.inner_epochs")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            GRPOConfig(**kwargs)
