"""The simulator plays a case's policies in forked processes (`scenario.play_policies`): the report must be the
sequential one bit for bit (the policies share no state), timelines included when asked."""

from __future__ import annotations

import json

import pytest

from rlhfless.sim import scenario
from rlhfless.sim.scenario import case_configs, run_case


@pytest.fixture(scope="module")
def cfg():
    return case_configs("quick", 6, [])[0]


def _canon(report: dict) -> str:
    return json.dumps({k: v for k, v in report.items() if k != "_timelines"}, sort_keys=True, default=str)


def test_forked_policies_give_the_sequential_report_bit_for_bit(cfg):
    seq = run_case(cfg, jobs=1)
    par = run_case(cfg, jobs=2)
    assert len(par["policies"]) >= 4 and list(par["policies"]) == list(seq["policies"])
    assert _canon(par) == _canon(seq)


def test_forked_policies_return_their_timelines_in_policy_order(cfg):
    seq = run_case(cfg, keep_timelines=True, jobs=1)["_timelines"]
    par = run_case(cfg, keep_timelines=True, jobs=2)["_timelines"]
    assert list(par) == list(seq)
    for name in seq:
        (tl_s, rows_s), (tl_p, rows_p) = seq[name], par[name]
        assert rows_p == rows_s and tl_p.spans == tl_s.spans and tl_p.stages == tl_s.stages, name


def test_short_cases_stay_in_this_process(cfg, monkeypatch):
    """Below PARALLEL_MIN_STEPS a fork costs more than the case: no pool is made."""
    import multiprocessing as mp

    def refuse(*_a, **_k):
        raise AssertionError("a short case forked")

    monkeypatch.setattr(mp, "get_context", refuse)
    assert cfg.steps < scenario.PARALLEL_MIN_STEPS
    run_case(cfg)
