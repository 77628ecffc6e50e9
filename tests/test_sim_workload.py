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
