"""Simulator workloads: trace replay, the synthetic multi-epoch generator, GSM8K prompt lengths."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.sim.workload import LengthDist, gsm8k_prompt_tokens, replay_trace, synthetic
from rlhfless.core.traces import read_trace

QUICKSTART = Path(__file__).resolve().parents[1] / "data" / "traces" / "quickstart.jsonl.gz"


def test_replay_keeps_every_response_grouped_by_step_and_prompt():
    steps = replay_trace(QUICKSTART)
    rows = list(read_trace(QUICKSTART))
    assert sum(s.n_seqs for s in steps) == len(rows)
    assert sum(sum(g.lengths) for s in steps for g in s.groups) == sum(r.response_len for r in rows)
    assert [s.step for s in steps] == sorted({r.step for r in rows})
    assert len(replay_trace(QUICKSTART, steps=3)) == 3
    assert all(len(g.rewards) == len(g.lengths) for g in steps[0].groups)


@pytest.mark.parametrize("n_prompts, per_step", [(64, 16), (300, 64)])  # the object and the array generator
def test_synthetic_visits_every_prompt_once_per_epoch(n_prompts, per_step, monkeypatch):
    import rlhfless.sim.workload as wl

    monkeypatch.setattr(wl, "SMALL_TRACE", 10_000)
    dist = LengthDist(median=200, max_response=512)
    steps = synthetic(dist, n_prompts, per_step, 4, steps=3 * -(-n_prompts // per_step))
    for epoch in range(3):
        seen = Counter(g.prompt_id for s in steps if s.epoch == epoch for g in s.groups)
        assert len(seen) == n_prompts and set(seen.values()) == {1}
    lens = np.array([x for s in steps for g in s.groups for x in g.lengths])
    assert lens.max() <= 512 and lens.min() >= 1 and 120 < np.median(lens) < 320
    # a prompt keeps its prompt length across epochs
    plen = {}
    for s in steps:
        for g in s.groups:
            assert plen.setdefault(g.prompt_id, g.prompt_len) == g.prompt_len


def test_length_dist_and_synthetic_validate_their_fields():
    with pytest.raises(ConfigError, match="^lengths.median"):
        LengthDist(median=0)
    with pytest.raises(ConfigError, match="^prompts_per_step"):
        synthetic(LengthDist(), 8, 16, 4, 2)


def test_gsm8k_prompt_lengths(gsm8k_file, tmp_path):
    toks = gsm8k_prompt_tokens(gsm8k_file, template_tokens=64)
    assert len(toks) > 7000 and toks.min() > 64 and 80 < np.median(toks) < 200
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": 1}\n')
    with pytest.raises(DataError, match="bad.jsonl:1"):
        gsm8k_prompt_tokens(bad)


def test_published_length_evidence_is_replayed_by_the_fitted_workload():
    """Issue 31 item 9: `lengths.fit_to` replays a cited training log's response lengths: the generator's cap
    share and capped mean land on the log's (verl GRPO on GSM8K: 7.37% at the 1,024 cap, mean 424.5), its
    shortest responses are of the log's order (26 tokens), and the scenarios take it as a key=value override."""
    from rlhfless.sim.scenario import case_configs, workload
    from rlhfless.sim.workload import PUBLISHED_LENGTHS

    ev = PUBLISHED_LENGTHS["verl-gsm8k-grpo"]
    dist = LengthDist(fit_to="verl-gsm8k-grpo")
    assert dist.max_response == ev.cap == 1024 and dist.within_sigma == 0.35
    lens = np.array([x for s in synthetic(dist, 4096, 512, 8, 8, seed=3) for g in s.groups for x in g.lengths])
    assert lens.mean() == pytest.approx(ev.mean, rel=0.05)
    assert abs(float(np.mean(lens >= ev.cap)) - ev.clip_ratio) < 0.015
    assert lens.min() < 4 * ev.minimum
    # the assumed default is a different workload: fewer responses reach its 2,048 cap
    default = np.array([x for s in synthetic(LengthDist(), 4096, 512, 8, 8, seed=3) for g in s.groups
                        for x in g.lengths])
    assert float(np.mean(default >= 2048)) < 0.5 * ev.clip_ratio
    for scen in ("paper-testbed", "paper-sim"):
        cfg = case_configs(scen, 2, ["lengths.fit_to=verl-gsm8k-grpo"])[0]
        assert cfg.lengths.max_response == 1024 and "fitted to verl-gsm8k-grpo" in workload(cfg)[1]
    with pytest.raises(ConfigError, match="^lengths.fit_to: must be '' or one of verl-gsm8k-grpo"):
        LengthDist(fit_to="my-log")


NEW_FITS = tuple(f"verl-qwen2.5-{size}-{data}-grpo" for data in ("gsm8k", "math")
                 for size in ("3b", "7b", "32b", "72b"))


@pytest.mark.parametrize("name", NEW_FITS)
def test_each_verl_data_log_is_replayed_by_its_fit(name):
    """Issue 41 item 5: the Qwen2.5 GSM8K / MATH GRPO logs (64 prompts x 5 a step, as drawn here): the drawn mean
    is the log's; a MATH log's cap share is its clip_ratio; a GSM8K log (none at the 1,024 cap) draws almost none
    at the cap and its steps' longest response is the log's within 15% (the tail the fit keeps)."""
    from rlhfless.sim.workload import PUBLISHED_LENGTHS

    ev, dist = PUBLISHED_LENGTHS[name], LengthDist(fit_to=name)
    steps = synthetic(dist, 4096, 64, 5, 40, seed=3)
    lens = np.array([x for s in steps for g in s.groups for x in g.lengths])
    assert dist.max_response == ev.cap and lens.mean() == pytest.approx(ev.mean, rel=0.05)
    if ev.clip_ratio > 0:
        assert abs(float(np.mean(lens >= ev.cap)) - ev.clip_ratio) < 0.02
    else:
        longest = np.median([max(x for g in s.groups for x in g.lengths) for s in steps])
        assert longest == pytest.approx(ev.maximum, rel=0.15) and float(np.mean(lens >= ev.cap)) < 0.005


def test_spreads_share_the_fitted_total_and_shrink_together_when_it_is_tight():
    """split_spread by hand: a total of 1.0 over within 0.35 and epoch 0.15 leaves sqrt(1 - 0.145) = 0.9247 per
    prompt; a total of 0.3 under them scales (0.5, 0.35, 0.15) by 0.3 / 0.62849 = 0.47733."""
    from rlhfless.sim.workload import split_spread

    assert split_spread(1.0, 0.5, 0.35, 0.15) == pytest.approx((0.92466, 0.35, 0.15), abs=1e-5)
    p, w, e = split_spread(0.3, 0.5, 0.35, 0.15)
    assert (p, w, e) == pytest.approx((0.23866, 0.16706, 0.07160), abs=1e-5)
    assert float(np.sqrt(p * p + w * w + e * e)) == pytest.approx(0.3, abs=1e-12)
    # the published GSM8K steps are tighter than the assumed within-group and epoch spread: all three shrink
    d = LengthDist(fit_to="verl-qwen2.5-3b-gsm8k-grpo")
    assert d.within_sigma < 0.35 and d.prompt_sigma / d.within_sigma == pytest.approx(0.5 / 0.35)


def test_the_tail_fit_solves_its_equation_and_bad_evidence_is_refused():
    from statistics import NormalDist

    from rlhfless.sim.workload import LengthEvidence, PUBLISHED_LENGTHS, tail_spread

    ev = PUBLISHED_LENGTHS["verl-qwen2.5-3b-gsm8k-grpo"]
    median, s = tail_spread(ev)
    z = NormalDist().inv_cdf((320 - 0.375) / 320.25)
    assert np.log(811.0 / 304.462) == pytest.approx(s * z - s * s / 2, abs=1e-12)
    assert median == pytest.approx(304.462 * np.exp(-s * s / 2), abs=1e-9)
    with pytest.raises(ConfigError, match="without responses at the cap"):
        LengthEvidence("x", "y", cap=1024, mean=300.0, clip_ratio=0.0, minimum=100.0)
    with pytest.raises(ConfigError, match="min <= mean <= cap"):
        LengthEvidence("x", "y", cap=256, mean=300.0, clip_ratio=0.1, minimum=100.0)
