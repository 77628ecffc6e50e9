"""GRPO/PPO math against plain Python-loop references, hand-worked cases, properties and config errors."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfless.core import metrics as M
from rlhfless.algo import (
    GRPOConfig,
    aggregate,
    apply_group_skip,
    clipped_surrogate,
    entropy_from_logits,
    gae_advantages,
    group_advantages,
    grpo_loss,
    kl_k3,
    loss_denominator,
    token_logprobs,
)
from rlhfless.core.configbase import from_dict
from rlhfless.core.errors import ConfigError

TOL = 1e-10
D = torch.float64


def _close(a, b, tol=TOL):
    a = torch.as_tensor(a, dtype=D)
    b = torch.as_tensor(b, dtype=D)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=tol, rtol=0), (a, b)


def _rand_mask(n, t, gen):
    """Right-padded bool mask with lengths 1..t (unequal lengths)."""
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    return torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)


# ---------------------------------------------------------------- loop references


def ref_group_adv(rewards, g, scale, eps):
    out, zero = [], []
    for start in range(0, len(rewards), g):
        grp = rewards[start : start + g]
        mean = sum(grp) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (g - 1))
        flat = all(x == grp[0] for x in grp)
        zero.append(flat)
        for x in grp:
            out.append(0.0 if flat else ((x - mean) / (std + eps) if scale else x - mean))
    return out, zero


def ref_logprob_entropy(logits, tokens):
    lp, ent = [], []
    for row_l, row_t in zip(logits, tokens):
        lp_row, ent_row = [], []
        for scores, tok in zip(row_l, row_t):
            mx = max(scores)
            lse = mx + math.log(sum(math.exp(s - mx) for s in scores))
            lp_row.append(scores[tok] - lse)
            ent_row.append(-sum(math.exp(s - lse) * (s - lse) for s in scores))
        lp.append(lp_row)
        ent.append(ent_row)
    return lp, ent


def ref_surrogate(logp, old, adv, mask, lo, hi):
    loss, clipped_n, valid_n = [], 0, 0
    for i in range(len(logp)):
        row = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                row.append(0.0)
                continue
            r = math.exp(logp[i][t] - old[i][t])
            a = adv[i]
            u, c = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
            row.append(max(u, c))
            valid_n += 1
            clipped_n += c > u
        loss.append(row)
    return loss, clipped_n / valid_n


def ref_aggregate(loss, mask, mode, max_len=None):
    if mode == "token_mean":
        num = sum(loss[i][t] for i in range(len(loss)) for t in range(len(loss[i])) if mask[i][t])
        return num / sum(sum(row) for row in mask)
    per_seq = []
    for i in range(len(loss)):
        vals = [loss[i][t] for t in range(len(loss[i])) if mask[i][t]]
        if vals:
            per_seq.append(sum(vals) / (len(vals) if mode == "seq_mean_token_mean" else max_len))
    return sum(per_seq) / len(per_seq)


def ref_gae(rewards, values, mask, gamma, lam):
    adv = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        length = sum(mask[i])
        last = 0.0
        for t in reversed(range(length)):
            next_v = values[i][t + 1] if t + 1 < length else 0.0
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            last = delta + gamma * lam * last
            adv[i][t] = last
    ret = [[adv[i][t] + (values[i][t] if mask[i][t] else 0.0) for t in range(len(adv[i]))] for i in range(len(adv))]
    return adv, ret


# ---------------------------------------------------------------- advantages


@pytest.mark.parametrize("scale", [True, False])
def test_group_advantages_match_loop_reference(scale):
    gen = torch.Generator().manual_seed(0)
    g = 4
    binary = torch.randint(0, 2, (6 * g,), generator=gen).to(D)  # some groups will be all-equal
    cont = torch.rand(6 * g, generator=gen, dtype=D)
    rewards = torch.cat([binary, cont])
    res, metrics = group_advantages(rewards, g, scale_by_std=scale, eps=1e-6)
    want, zero = ref_group_adv(rewards.tolist(), g, scale, 1e-6)
    _close(res.advantages, want)
    assert res.zero_variance.tolist() == zero
    assert any(zero), "test data should contain a zero-variance group"
    assert metrics[M.GROUPS_SKIPPED] == pytest.approx(sum(zero) / len(zero))
    # the [B, G] layout gives the same result
    res2, _ = group_advantages(rewards.reshape(-1, g), g, scale_by_std=scale, eps=1e-6)
    _close(res2.advantages, res.advantages)


def test_group_advantages_hand_worked():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=D)
    eps = 1e-6
    a2, _ = group_advantages(r, 2, scale_by_std=True, eps=eps)  # each group std = sqrt(0.5)
    s2 = 0.5 / (math.sqrt(0.5) + eps)
    _close(a2.advantages, [s2, -s2, -s2, s2])
    a4, _ = group_advantages(r, 4, scale_by_std=True, eps=eps)  # std = sqrt(1/3), unbiased
    s4 = 0.5 / (math.sqrt(1 / 3) + eps)
    _close(a4.advantages, [s4, -s4, -s4, s4])
    raw, _ = group_advantages(r, 2, scale_by_std=False)
    _close(raw.advantages, [0.5, -0.5, -0.5, 0.5])
    assert abs(s2 - 0.5) > 0.1 and abs(s4 - s2) > 0.1  # std scaling and group size both matter


def test_group_advantages_sum_to_zero_per_group():
    torch.manual_seed(1)
    rewards = torch.randn(10, 8, dtype=D) * 3 + 2
    for scale in (True, False):
        res, _ = group_advantages(rewards, 8, scale_by_std=scale)
        sums = res.advantages.reshape(10, 8).sum(dim=1)
        _close(sums, torch.zeros(10, dtype=D))
        assert res.advantages.abs().min() > 0


def test_zero_variance_groups_flagged_and_skipped():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0, 2.0 + 1e-9], dtype=D)
    res, metrics = group_advantages(r, 2)
    assert res.zero_variance.tolist() == [True, False, True, False]  # a 1e-9 difference is a real signal
    assert res.keep.tolist() == [False, False, True, True, False, False, True, True]
    _close(res.advantages[:2], [0.0, 0.0])
    assert metrics[M.GROUPS_SKIPPED] == 0.5
    mask = torch.ones(8, 3, dtype=torch.bool)
    skipped = apply_group_skip(mask, res, GRPOConfig(group_size=2))
    assert skipped.sum(dim=1).tolist() == [0, 0, 3, 3, 0, 0, 3, 3]
    kept = apply_group_skip(mask, res, GRPOConfig(group_size=2, skip_zero_variance_groups=False))
    assert kept.all()


def test_zero_variance_advantage_is_exactly_zero_even_with_tiny_eps():
    """mean([0.1] * 3) != 0.1 in floating point; without the explicit zeroing, a tiny eps turns the
    rounding residue into advantages of order 1."""
    r = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, 0.0], dtype=D)
    res, _ = group_advantages(r, 3, scale_by_std=True, eps=1e-30)
    assert res.advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert res.zero_variance.tolist() == [True, False]


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2, 3), 2)


# ---------------------------------------------------------------- log-probs, entropy, KL


def test_token_logprobs_and_entropy_match_loop_reference():
    torch.manual_seed(2)
    logits = torch.randn(3, 5, 11, dtype=D) * 4
    tokens = torch.randint(0, 11, (3, 5))
    want_lp, want_ent = ref_logprob_entropy(logits.tolist(), tokens.tolist())
    _close(token_logprobs(logits, tokens), want_lp)
    _close(entropy_from_logits(logits), want_ent)


def test_token_logprobs_low_precision_is_upcast():
    torch.manual_seed(3)
    logits = (torch.randn(2, 4, 50) * 5).to(torch.bfloat16)
    tokens = torch.randint(0, 50, (2, 4))
    out = token_logprobs(logits, tokens)
    assert out.dtype == torch.float32
    assert torch.equal(out, token_logprobs(logits.float(), tokens))
    assert entropy_from_logits(logits).dtype == torch.float32


def test_kl_k3_matches_reference_and_properties():
    torch.manual_seed(4)
    logp = -torch.rand(4, 6, dtype=D) * 3
    ref = -torch.rand(4, 6, dtype=D) * 3
    want = [[math.exp(r - p) - (r - p) - 1 for p, r in zip(pr, rr)] for pr, rr in zip(logp.tolist(), ref.tolist())]
    k = kl_k3(logp, ref)
    _close(k, want)
    assert (k > 0).all()
    assert torch.equal(kl_k3(logp, logp), torch.zeros_like(logp))


def test_kl_k3_expectation_is_forward_kl():
    """Under samples from pi, E[k3] = KL(pi || ref) exactly (not KL(ref || pi))."""
    torch.manual_seed(5)
    log_pi = torch.log_softmax(torch.randn(7, dtype=D), 0)
    log_ref = torch.log_softmax(torch.randn(7, dtype=D), 0)
    expect_k3 = (log_pi.exp() * kl_k3(log_pi, log_ref)).sum()
    forward = (log_pi.exp() * (log_pi - log_ref)).sum()
    reverse = (log_ref.exp() * (log_ref - log_pi)).sum()
    _close(expect_k3, forward)
    assert abs(forward - reverse) > 1e-3


# ---------------------------------------------------------------- clipped surrogate


def _surrogate_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 6, 7
    old = -torch.rand(n, t, generator=gen, dtype=D) * 3
    logp = old + torch.randn(n, t, generator=gen, dtype=D) * 0.4  # ratios well outside [0.8, 1.2]
    adv = torch.randn(n, generator=gen, dtype=D)
    return logp, old, adv, _rand_mask(n, t, gen)


def test_clipped_surrogate_matches_loop_reference_asymmetric():
    logp, old, adv, mask = _surrogate_inputs(6)
    lo, hi = 0.1, 0.3
    loss, metrics = clipped_surrogate(logp, old, adv, mask, lo, hi)
    want, frac = ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), lo, hi)
    _close(loss, want)
    assert metrics[M.CLIP_FRAC] == pytest.approx(frac, abs=1e-12)
    assert 0 < frac < 1
    # swapping the asymmetric range changes the result, so each bound is really used
    swapped, _ = clipped_surrogate(logp, old, adv, mask, hi, lo)
    assert not torch.allclose(swapped, loss)


def test_identical_policies_ratio_one_and_vanilla_gradient():
    torch.manual_seed(7)
    logits = torch.randn(4, 5, 9, dtype=D, requires_grad=True)
    tokens = torch.randint(0, 9, (4, 5))
    mask = _rand_mask(4, 5, torch.Generator().manual_seed(7))
    adv = torch.randn(4, dtype=D)
    logp = token_logprobs(logits, tokens)
    loss_tok, metrics = clipped_surrogate(logp, logp.detach(), adv, mask, 0.2, 0.2)
    assert metrics[M.CLIP_FRAC] == 0.0
    assert metrics[M.RATIO_MIN] == metrics[M.RATIO_MAX] == 1.0
    (grad,) = torch.autograd.grad(loss_tok.sum(), logits, retain_graph=True)
    vanilla = (-(adv.unsqueeze(1) * logp) * mask).sum()
    (want,) = torch.autograd.grad(vanilla, logits)
    _close(grad, want)
    assert grad.abs().sum() > 0


def test_clipped_tokens_have_no_gradient():
    logp = torch.tensor([[0.0, 0.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[-1.0, -0.05]], dtype=D)  # ratios e^1 (clipped) and e^0.05 (inside)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = clipped_surrogate(logp, old, torch.tensor([1.0], dtype=D), mask, 0.2, 0.2)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert grad[0, 0] == 0 and grad[0, 1] < 0
    assert metrics[M.CLIP_FRAC] == 0.5


def test_padding_garbage_does_not_poison_gradient():
    logp = torch.tensor([[-1.0, 800.0]], dtype=D, requires_grad=True)  # padding would overflow exp()
    old = torch.tensor([[-1.0, -800.0]], dtype=D)
    mask = torch.tensor([[True, False]])
    cfg = GRPOConfig(group_size=2, kl_coef=0.1)
    loss, _ = grpo_loss(logp, old, old, torch.tensor([1.0], dtype=D), mask, cfg)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


# ---------------------------------------------------------------- aggregation


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregate_matches_loop_reference(mode):
    gen = torch.Generator().manual_seed(8)
    loss = torch.randn(5, 9, generator=gen, dtype=D)
    mask = _rand_mask(5, 9, gen)
    got = aggregate(loss, mask, mode, max_len_norm=12)
    _close(got, ref_aggregate(loss.tolist(), mask.tolist(), mode, 12))


def test_aggregation_modes_differ_on_unequal_lengths():
    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[True, True, True, True], [True, False, False, False]])
    tm = aggregate(loss, mask, "token_mean").item()  # 7 / 5
    sm = aggregate(loss, mask, "seq_mean_token_mean").item()  # (1 + 3) / 2
    dr = aggregate(loss, mask, "seq_mean_token_sum_norm", max_len_norm=8).item()  # (4/8 + 3/8) / 2
    assert (tm, sm, dr) == pytest.approx((1.4, 2.0, 0.4375), abs=1e-12)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_masking_a_row_equals_dropping_it(mode):
    gen = torch.Generator().manual_seed(9)
    loss = torch.randn(4, 6, generator=gen, dtype=D)
    mask = _rand_mask(4, 6, gen)
    masked = mask.clone()
    masked[1] = False
    _close(aggregate(loss, masked, mode, 6), aggregate(loss[[0, 2, 3]], mask[[0, 2, 3]], mode, 6))
    assert aggregate(loss, torch.zeros_like(mask), mode, 6).item() == 0.0


def test_aggregate_bad_mode_and_missing_norm():
    loss, mask = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        aggregate(loss, mask, "seq_sum")
    with pytest.raises(ValueError, match="max_len_norm"):
        aggregate(loss, mask, "seq_mean_token_sum_norm")


# ---------------------------------------------------------------- combined loss


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_grpo_loss_matches_loop_reference(mode):
    logp, old, adv, mask = _surrogate_inputs(10)
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(11), dtype=D) * 0.3
    cfg = GRPOConfig(group_size=2, kl_coef=0.05, clip_eps_low=0.2, clip_eps_high=0.28, loss_agg=mode,
                     max_seq_len_norm=10)
    loss, metrics = grpo_loss(logp, old, ref, adv, mask, cfg)
    pg, frac = ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28)
    kl = [[math.exp(r - p) - (r - p) - 1 for p, r in zip(pr, rr)] for pr, rr in zip(logp.tolist(), ref.tolist())]
    total = [[pg[i][t] + 0.05 * kl[i][t] for t in range(len(pg[i]))] for i in range(len(pg))]
    m = mask.tolist()
    _close(loss, ref_aggregate(total, m, mode, 10))
    assert metrics[M.LOSS] == pytest.approx(ref_aggregate(total, m, mode, 10), abs=1e-12)
    assert metrics[M.PG_LOSS] == pytest.approx(ref_aggregate(pg, m, mode, 10), abs=1e-12)
    assert metrics[M.KL] == pytest.approx(ref_aggregate(kl, m, "token_mean"), abs=1e-12)
    assert metrics[M.CLIP_FRAC] == pytest.approx(frac, abs=1e-12)
    assert metrics[M.LOSS] != pytest.approx(metrics[M.PG_LOSS])  # the KL term is really added


def test_grpo_loss_without_reference():
    logp, old, adv, mask = _surrogate_inputs(12)
    cfg = GRPOConfig(group_size=2)
    loss, metrics = grpo_loss(logp, old, None, adv, mask, cfg, entropy=torch.ones_like(logp))
    assert M.KL not in metrics and metrics[M.ENTROPY] == pytest.approx(1.0)
    assert loss.item() == pytest.approx(metrics[M.PG_LOSS])
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, None, adv, mask, GRPOConfig(group_size=2, kl_coef=0.1))


# ---------------------------------------------------------------- global denominator (data parallelism)

_SHARDS = [[0, 1], [2], [3, 4, 5]]  # unequal row shards of the 6 rows; row 2's mask is emptied below


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_shard_losses_with_global_denominator_sum_to_the_full_loss(mode):
    logp, old, adv, mask = _surrogate_inputs(10)
    logp.requires_grad_(True)
    mask[2] = False  # an empty row: left out of the sequence count on its shard and in the full batch alike
    ref = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(13), dtype=D) * 0.3
    cfg = GRPOConfig(group_size=2, kl_coef=0.05, clip_eps_high=0.28, loss_agg=mode, max_seq_len_norm=10)
    pg, _ = ref_surrogate(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28)
    kl = [[math.exp(r - p) - (r - p) - 1 for p, r in zip(pr, rr)] for pr, rr in zip(logp.tolist(), ref.tolist())]
    total = [[pg[i][t] + 0.05 * kl[i][t] for t in range(len(pg[i]))] for i in range(len(pg))]
    want = ref_aggregate(total, mask.tolist(), mode, 10)
    denom = loss_denominator(mask, mode)
    assert denom == (mask.sum().item() if mode == "token_mean" else 5)
    full_grad = torch.autograd.grad(grpo_loss(logp, old, ref, adv, mask, cfg)[0], logp)[0]
    parts, grads, pg_parts = [], torch.zeros_like(logp), []
    for rows in _SHARDS:
        loss, m = grpo_loss(logp[rows], old[rows], ref[rows], adv[rows], mask[rows], cfg, denom=denom)
        grads[rows] = torch.autograd.grad(loss, logp)[0][rows]
        parts.append(loss.item())
        pg_parts.append(m[M.PG_LOSS])
    assert sum(parts) == pytest.approx(want, abs=1e-12)
    assert sum(pg_parts) == pytest.approx(ref_aggregate(pg, mask.tolist(), mode, 10), abs=1e-12)
    _close(grads, full_grad)
    # the shard's own normaliser does not give shares of the full loss: the global one is what makes it exact
    local = sum(grpo_loss(logp[r], old[r], ref[r], adv[r], mask[r], cfg)[0].item() for r in _SHARDS)
    assert local != pytest.approx(want, abs=1e-6)


def test_global_denominator_rejects_nonpositive_and_bad_mode():
    loss, mask = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="denom"):
        aggregate(loss, mask, "token_mean", denom=0.0)
    with pytest.raises(ValueError, match="token_mean"):
        loss_denominator(mask, "seq_sum")
    assert loss_denominator(torch.zeros_like(mask), "token_mean") == 1.0


# ---------------------------------------------------------------- GAE


def test_gae_matches_loop_reference():
    gen = torch.Generator().manual_seed(13)
    rewards = torch.randn(4, 6, generator=gen, dtype=D)
    values = torch.randn(4, 6, generator=gen, dtype=D)
    mask = _rand_mask(4, 6, gen)
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.97, lam=0.9)
    want_adv, want_ret = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.97, 0.9)
    _close(adv, want_adv)
    _close(ret, want_ret)


def test_gae_hand_worked_monte_carlo_and_td():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]], dtype=D)  # last token is padding
    values = torch.tensor([[0.5, 0.25, 0.75, 9.0]], dtype=D)
    mask = torch.tensor([[True, True, True, False]])
    mc, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)  # return-to-go minus V
    _close(mc, [[0.5, 0.75, 0.25, 0.0]])
    _close(ret, [[1.0, 1.0, 1.0, 0.0]])
    td, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.0)  # one-step TD errors
    _close(td, [[-0.25, 0.5, 0.25, 0.0]])


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"group_size": 1}, "algo.group_size"),
        ({"kl_coef": -0.1}, "algo.kl_coef"),
        ({"loss_agg": "sequence_mean"}, "algo.loss_agg"),
        ({"clip_eps_low": 0.0}, "algo.clip_eps_low"),
        ({"clip_eps_high": -0.1}, "algo.clip_eps_high"),
        ({"inner_epochs": 0}, "algo.inner_epochs"),
        ({"adv_eps": 0.0}, "algo.adv_eps"),
        ({"loss_agg": "seq_mean_token_sum_norm"}, "algo.max_seq_len_norm"),
        ({"max_seq_len_norm": 0}, "algo.max_seq_len_norm"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        GRPOConfig(**kwargs)


def test_config_defaults_and_from_dict():
    cfg = GRPOConfig()
    assert (cfg.scale_adv_by_std, cfg.kl_coef, cfg.loss_agg, cfg.inner_epochs) == (True, 0.0, "token_mean", 1)
    assert "must be >= 2 with algo.name=grpo" in _message(lambda: GRPOConfig(group_size=1))
    built = from_dict(GRPOConfig, {"group_size": 4, "loss_agg": "seq_mean_token_sum_norm", "max_seq_len_norm": 256},
                      prefix="algo")
    assert built.group_size == 4 and built.max_seq_len_norm == 256
    with pytest.raises(ConfigError, match="algo.loss_agg"):
        from_dict(GRPOConfig, {"loss_agg": "bogus"}, prefix="algo")


def _message(fn):
    try:
        fn()
    except ConfigError as exc:
        return str(exc)
    raise AssertionError("no ConfigError")
