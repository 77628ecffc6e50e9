"""The simulator plays a case's policies in forked processes (`scenario.play_policies`): the report must be the
sequential one bit for bit (the policies share no state), timelines included when asked."""

from __future__ import annotations

import json
import os

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


def _die(group):
    """A forked player that exits without a result (module level: the executor sends it by name)."""
    os._exit(3)


def test_a_forked_process_that_dies_fails_the_case_instead_of_hanging(cfg, monkeypatch):
    """A worker killed mid-play (here it exits at once) must fail every pending result with a message; the
    multiprocessing.Pool this replaced waited for the lost result forever. The wait is on the executor's
    event (the child's exit), not on a clock."""
    monkeypatch.setattr(scenario, "_play_forked_at", _die)
    with pytest.raises(RuntimeError, match="died before it finished"):
        run_case(cfg, jobs=2)


class _Record:
    """A `scenario.Progress` that keeps what it was told."""

    def __init__(self):
        self.cases, self.finished = [], []

    def case(self, name, policies):
        self.cases.append((name, list(policies)))

    def played(self, policy):
        self.finished.append(policy)


@pytest.mark.parametrize("jobs", [1, 2])
def test_progress_hears_each_policy_once_and_changes_nothing(cfg, jobs):
    rec = _Record()
    watched = run_case(cfg, jobs=jobs, progress=rec)
    assert rec.cases == [(cfg.name, list(watched["policies"]))]
    assert sorted(rec.finished) == sorted(watched["policies"])  # forked: in the order they finish
    assert _canon(watched) == _canon(run_case(cfg, jobs=jobs))


def test_simulate_shows_a_bar_on_stderr_unless_told_not_to(capsys):
    from rlhfless.cli import main

    args = ["simulate", "--scenario", "quick", "--steps", "4"]
    assert main(args) == 0
    shown = capsys.readouterr()
    assert "simulate:" in shown.err and "policy" in shown.err and "simulate:" not in shown.out
    assert main([*args, "--no-progress"]) == 0
    hidden = capsys.readouterr()
    assert hidden.err == "" and [ln for ln in hidden.out.splitlines() if "sim_wall_s" not in ln] == \
        [ln for ln in shown.out.splitlines() if "sim_wall_s" not in ln]


def _fresh_policies(cfg):
    work, _ = scenario.workload(cfg)
    cb, cs, cp = scenario.clusters(cfg, work)
    return work, scenario.policies(cfg, cb, cs, cp, scenario.wide_cluster(cfg, cs, work))


def test_twins_are_rlhfless_on_one_cluster_with_equal_switches():
    cfg = case_configs("quick", 2, ["design=extended"])[0]
    _, pols = _fresh_policies(cfg)
    names = [[pols[i].name for i in g] for g in scenario.twins(pols)]
    assert ["rlhfless", "rlhfless-lam1"] in names  # lam differs only
    assert ["oracle"] in names and ["verl"] in names  # other switches; not RLHFless


def test_twins_in_lock_step_give_each_ones_own_results_and_share_the_plays(monkeypatch):
    """rlhfless and rlhfless-lam1 played together (`play_twins`) give each one's results alone bit for bit,
    and the second plays no placement on a draw that the first already played (the feature: without the
    shared step memo both would play every one)."""
    from rlhfless.plan import scaler

    cfg = case_configs("quick", 4, ["design=extended"])[0]
    plays, real = [], scaler._play

    def counted(*a, **k):
        plays.append(1)
        return real(*a, **k)

    monkeypatch.setattr(scaler, "_play", counted)
    work, pols = _fresh_policies(cfg)
    alone = [scenario.simulate_policy(p, work, p.c) for p in pols if p.name in ("rlhfless", "rlhfless-lam1")]
    n_alone = len(plays)
    work, pols = _fresh_policies(cfg)
    pair = [p for p in pols if p.name in ("rlhfless", "rlhfless-lam1")]
    plays.clear()
    together = scenario.play_twins(pair, work)
    assert n_alone > 0 and len(plays) <= n_alone // 2 + 1
    for (s_a, tl_a, rows_a), (s_t, tl_t, rows_t) in zip(alone, together):
        assert s_t == s_a and rows_t == rows_a and tl_t.spans == tl_a.spans
    assert all(p.share is None for p in pair)  # nothing shared outlives the play


def test_twins_with_equal_predictors_learn_and_predict_each_step_once(monkeypatch):
    """Twins with equal predictors (`policies.TwinPredictor`) update and ask one predictor once a step, not once
    a step each, give each one's results alone bit for bit, and end holding the state each would have learnt
    (the feature: without the shared predictor each twin updates and asks its own)."""
    from rlhfless.predictor.ewma import EWMAPredictor

    cfg = case_configs("quick", 4, [])[0]
    calls = {"update": 0, "predict": 0}
    for name in calls:
        real = getattr(EWMAPredictor, name)

        def counted(self, *a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(EWMAPredictor, name, counted)
    work, pols = _fresh_policies(cfg)
    alone_pols = [p for p in pols if p.name in ("rlhfless", "rlhfless-lam1")]
    alone = [scenario.simulate_policy(p, work, p.c) for p in alone_pols]
    assert calls == {"update": 2 * len(work), "predict": 2 * len(work)}
    calls.update(update=0, predict=0)
    work, pols = _fresh_policies(cfg)
    pair = [p for p in pols if p.name in ("rlhfless", "rlhfless-lam1")]
    together = scenario.play_twins(pair, work)
    assert calls == {"update": len(work), "predict": len(work)}
    for (s_a, tl_a, rows_a), (s_t, tl_t, rows_t) in zip(alone, together):
        assert s_t == s_a and rows_t == rows_a and tl_t.spans == tl_a.spans
    for a, t in zip(alone_pols, pair):
        assert t.twin is None and t.predictor.state() == a.predictor.state()


def test_alike_verl_policies_play_once_and_report_as_if_each_had(cfg, monkeypatch):
    """Verl policies of the same kind on equal clusters (`scenario.alike`: here verl-paper-fastest is
    verl-paper-tp8's cluster, built again) play once (`play_alike_once`); each still reports, equal to its own
    play (the feature: without it every one plays)."""
    work, pols = _fresh_policies(cfg)
    cb, cs, cp = scenario.clusters(cfg, work)
    pols += [scenario.Verl(c, name=f"verl-paper-{k}") for k, c in scenario.paper_range(cfg, work).items()]
    first = scenario.alike(pols)
    twins = [(pols[i].name, pols[f].name) for i, f in enumerate(first) if f != i]
    assert twins and all(pols[i].c == pols[f].c and pols[i].c is not pols[f].c for i, f in enumerate(first) if f != i)
    played = []
    real = scenario.play_policies
    monkeypatch.setattr(scenario, "play_policies", lambda ps, *a, **k: played.extend(p.name for p in ps) or
                        real(ps, *a, **k))
    rec = _Record()
    once = scenario.play_alike_once(pols, work, jobs=1, on_done=rec.played)
    assert len(played) == len(pols) - len(twins) and sorted(rec.finished) == sorted(p.name for p in pols)
    for i, f in enumerate(first):
        if f != i:  # its own play, by a fresh verl on its own cluster
            alone = scenario.simulate_policy(scenario.Verl(pols[i].c, name=pols[i].name), work, pols[i].c)
            assert once[i][0] == alone[0] and once[i][2] == alone[2], pols[i].name
            assert once[i][0] is not once[f][0]  # a copy: the report may change one without the other


def test_a_case_plays_with_fewer_collections_and_restores_the_threshold(cfg):
    """`run_case` plays under `GC_THRESHOLD` (the feature: Python's default collects 60 times as often) and
    leaves the caller's thresholds as they were."""
    import gc

    seen = []

    class Watch(_Record):
        def played(self, policy):
            seen.append(gc.get_threshold())

    before = gc.get_threshold()
    run_case(cfg, jobs=1, progress=Watch())
    assert seen and set(seen) == {scenario.GC_THRESHOLD} and gc.get_threshold() == before != scenario.GC_THRESHOLD


def test_verl_policies_share_each_steps_true_arrays(cfg, monkeypatch):
    """The verl policies of a case assign the same step's true jobs, each on its own cluster: the jobs' arrays
    are built once per step (`policies.true_arrays`; the feature: without it once per policy and step), and
    the report is the one built anew each time (tests/test_sim_exact.py holds that for paper-sim too)."""
    from rlhfless.plan.balancer import JobArrays
    from rlhfless.sim import policies

    shipped = _canon(run_case(cfg, jobs=1))
    built = []
    real = JobArrays.from_jobs.__func__
    monkeypatch.setattr(JobArrays, "from_jobs", classmethod(lambda cls, jobs: built.append(id(jobs)) or
                                                            real(cls, jobs)))
    policies._ARRAYS_CACHE.clear()
    work, pols = _fresh_policies(cfg)
    pols = [p for p in pols if type(p) is policies.Verl and not p.overlap]
    assert len(pols) >= 2
    for pol in pols:
        scenario.simulate_policy(pol, work, pol.c)
    assert len(built) == len(work)
    monkeypatch.setattr(policies, "true_arrays", real.__get__(JobArrays))
    policies._TRUE_CACHE.clear()
    assert _canon(run_case(cfg, jobs=1)) == shipped
