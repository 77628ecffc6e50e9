"""Decode engine: greedy identity with/without dedup and vs HF generate, sampled identity across dedup and
compaction settings (by construction of the per-row random stream), distribution match vs HF sampling, the TPOT
profile, and sampling math."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy import stats

from rlhfless.model.factory import ModelConfig, build_model
from rlhfless.model.tokenizer import EOS_ID
from rlhfless.bench.engine_bench import hf_generate
from rlhfless.rollout.engine import (
    SamplingParams,
    decode,
    generate,
    prefill,
    sample_tokens,
)
from rlhfless.rollout.prefix import PrefixCost
from rlhfless.rollout.tpot import profile_rows

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                    max_positions=128)
FREE_PASS = PrefixCost(pass_overhead=0)
ALPHA = 1e-3  # generous significance level for the distribution tests (they are seeded, hence deterministic)


def eos_biased_model(eos_scale: float = 6.0, sharpness: float = 5.0):
    """A fresh small model with peaked next-token distributions and a raised EOS logit, so that lengths vary
    (1 to ~40 tokens), rows finish early, and a few hundred samples suffice for distribution tests.

    The final norm's weight is multiplied by `sharpness` (all logits sharpen, like a trained model's); EOS's
    (tied) embedding is set along the mean final hidden state, so its logit is high on average but varies with
    the context, like a trained model's stopping decision.
    """
    model = build_model(SMALL, seed=0).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpness)
        ids = torch.randint(3, 259, (8, 32), generator=torch.Generator().manual_seed(0))
        h = model.model(input_ids=ids).last_hidden_state.mean((0, 1))
        model.model.embed_tokens.weight[EOS_ID] = eos_scale * h / h.norm() / sharpness
    return model


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return eos_biased_model()


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    template = [1] + [rng.randrange(3, 259) for _ in range(30)]
    shared = [template + [rng.randrange(3, 259) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    loners = [[1] + [rng.randrange(3, 259) for _ in range(rng.randrange(2, 9))] for _ in range(3)]
    return shared + loners


DEDUP_MODES = {"naive": dict(dedup=False), "group": dict(dedup=True, share_prefixes=False),
               "prefix": dict(dedup=True, share_prefixes=True)}


def _run(model, prompts, G, params, seed=0, impl="auto", **kw):
    return decode(model, prefill(model, prompts, G, prefix_cost=FREE_PASS, **kw), params, seed=seed, impl=impl)


def test_greedy_is_identical_with_and_without_dedup_and_to_hf_generate(model, prompts):
    G, params = 3, SamplingParams(32, temperature=0.0)
    assert prefill(model, prompts, G, prefix_cost=FREE_PASS).stats.plan.mode == "prefix"
    hf = hf_generate(model, prompts, G, 32, 0.0, seed=0)
    lengths = {len(r) for r in hf}
    assert min(lengths) < 32 and 32 in lengths  # some rows stop early: compaction is exercised
    for name, kw in DEDUP_MODES.items():
        for impl in ("fast", "hf"):
            assert _run(model, prompts, G, params, impl=impl, **kw).responses == hf, (name, impl)


def test_sampled_tokens_do_not_depend_on_dedup_compaction_or_actor_split(model, prompts):
    G = 4
    ref = _run(model, prompts, G, SamplingParams(40, 1.0, 1.0, compact_fraction=1.0), seed=7, dedup=False,
               impl="hf")
    assert len(set(map(len, ref.responses))) > 5
    for name, kw in DEDUP_MODES.items():
        for frac in (0.0, 0.3, 1.0):
            out = _run(model, prompts, G, SamplingParams(40, 1.0, 1.0, compact_fraction=frac), seed=7, **kw)
            assert out.responses == ref.responses, (name, frac)
            assert out.truncated == ref.truncated
    # two decode actors, each holding half the rows, reproduce the single-actor run (row_ids keep the streams)
    half = len(prompts) // 2
    parts = []
    for lo, hi in ((0, half), (half, len(prompts))):
        state = prefill(model, prompts[lo:hi], G)
        parts += decode(model, state, SamplingParams(40, 1.0), seed=7,
                        row_ids=torch.arange(lo * G, hi * G)).responses
    assert parts == ref.responses
    assert _run(model, prompts, G, SamplingParams(40, 1.0), seed=8).responses != ref.responses


def test_compaction_shrinks_the_batch_and_is_recorded(model, prompts):
    out = _run(model, prompts, 4, SamplingParams(40, 1.0, compact_fraction=0.0), seed=1)
    sizes = [it.batch_size for it in out.iterations]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] == 4 * len(prompts)
    assert all(it.seconds > 0 for it in out.iterations)
    assert [it.context for it in out.iterations] == list(range(out.iterations[0].context,
                                                               out.iterations[0].context + len(sizes)))
    kept = _run(model, prompts, 4, SamplingParams(40, 1.0, compact_fraction=1.0), seed=1)
    assert {it.batch_size for it in kept.iterations} == {4 * len(prompts)}
    rows = profile_rows(out.iterations)
    assert rows and all(set(r) == {"batch_size", "context", "s_per_iter", "n"} for r in rows)
    assert sum(r["n"] for r in rows) == len(out.iterations)


def test_truncation_flags_and_eos(model, prompts):
    out = _run(model, prompts, 2, SamplingParams(5, 1.0), seed=3)
    for resp, trunc in zip(out.responses, out.truncated):
        assert 1 <= len(resp) <= 5 and EOS_ID not in resp[:-1]
        assert trunc == (resp[-1] != EOS_ID) and (not trunc or len(resp) == 5)


def _samples(model, prompts, G, temperature, ours: bool, seed: int):
    if ours:
        return generate(model, prompts, G, SamplingParams(24, temperature), seed=seed).responses
    return hf_generate(model, prompts, G, 24, temperature, seed=seed)


def _chi2_p(a: list[int], b: list[int], min_count: int = 10) -> float:
    """Chi-square test of homogeneity of two categorical samples; rare categories are merged into one bin."""
    cats = sorted(set(a) | set(b))
    ca, cb = np.array([a.count(c) for c in cats]), np.array([b.count(c) for c in cats])
    keep = (ca + cb) >= min_count
    table = np.stack([np.append(ca[keep], ca[~keep].sum()), np.append(cb[keep], cb[~keep].sum())])
    table = table[:, table.sum(0) > 0]
    return stats.chi2_contingency(table)[1]


def test_sampling_matches_hf_generate_in_distribution(model, prompts):
    """Different random streams, same distribution: first-token chi-square and length KS at alpha = 1e-3.

    Power check: the same tests reject a sampler at a different temperature.
    """
    G = 128
    ours = _samples(model, prompts[:2], G, 1.0, True, seed=11)
    hf = _samples(model, prompts[:2], G, 1.0, False, seed=12)
    colder = _samples(model, prompts[:2], G, 0.6, True, seed=13)
    for g in range(2):
        rows = slice(g * G, (g + 1) * G)
        first = lambda rs: [r[0] for r in rs[rows]]  # noqa: E731
        lens = lambda rs: [len(r) for r in rs[rows]]  # noqa: E731
        assert _chi2_p(first(ours), first(hf)) > ALPHA
        assert stats.ks_2samp(lens(ours), lens(hf)).pvalue > ALPHA
        assert min(_chi2_p(first(colder), first(hf)), stats.ks_2samp(lens(colder), lens(hf)).pvalue) < ALPHA


def test_sample_tokens_inverse_cdf_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(1000, 1)
    u = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000
    counts = torch.bincount(sample_tokens(logits, u, 1.0, 1.0), minlength=4).tolist()
    assert counts == [500, 300, 150, 50]
    nucleus = torch.bincount(sample_tokens(logits, u, 1.0, 0.75), minlength=4).tolist()
    assert nucleus[2:] == [0, 0] and abs(nucleus[0] / 1000 - 0.5 / 0.8) < 2e-3
    assert sample_tokens(logits[:1], None, 0.0, 1.0).tolist() == [0]
