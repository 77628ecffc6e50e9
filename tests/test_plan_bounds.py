"""The makespan lower bound: below every policy, the optimum and migration; equal to the optimum where tight."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core.errors import ConfigError
from rlhfless.plan.balancer import POLICIES, JobArrays, assign, build_plan
from rlhfless.plan.bounds import batch_cost_floors, makespan_lower_bound
from rlhfless.plan.migrate import simulate_with_migration
from rlhfless.plan.records import PlanJob
from rlhfless.plan.timemodel import TimeModel

LIN = TimeModel.per_token(0.01)
TINY = TimeModel.default_tiny_cpu()
ODD = TimeModel(batch_sizes=(2, 3, 7, 20), s_per_iter=(0.02, 0.021, 0.03, 0.031), prefill_s_per_token=0.001,
                actor_fixed_s=0.3)
DIP = TimeModel(batch_sizes=(1, 4, 8), s_per_iter=(0.02, 0.015, 0.03), prefill_s_per_token=0.0005)  # f dips
MODELS = [LIN, TINY, ODD, DIP]

jobs_st = st.lists(
    st.tuples(st.integers(1, 4), st.lists(st.floats(0, 400, allow_nan=False), min_size=4, max_size=4),
              st.integers(0, 50)), min_size=1, max_size=14,
).map(lambda xs: [PlanJob(f"g{i}", n, tuple(float(x) for x in ls[:n]), p) for i, (n, ls, p) in enumerate(xs)])


def brute_force_optimum(jobs: list[PlanJob], n: int, tm: TimeModel) -> float:
    """Exact optimum over every labelling, with capacity for all sequences (nothing queues, so the admission
    order inside an actor does not matter and the labelling is the whole decision)."""
    ja = JobArrays.from_jobs(jobs)
    cap = int(ja.sizes.sum())
    best = np.inf
    for labels in itertools.product(range(n), repeat=len(jobs)):
        plan = build_plan(ja, np.array(labels), np.arange(len(jobs)), n, cap, tm, "brute_force")
        best = min(best, plan.makespan_s)
    return best


@settings(max_examples=80, deadline=None)
@given(jobs_st, st.integers(1, 6), st.integers(4, 16), st.sampled_from(POLICIES), st.sampled_from(MODELS))
def test_bound_is_below_every_policy_even_when_actors_queue(jobs, n, cap, policy, tm):
    plan, _ = assign(jobs, n, cap, tm, policy)
    assert makespan_lower_bound(jobs, n, cap, tm) <= plan.makespan_s * (1 + 1e-9) + 1e-12


@settings(max_examples=30, deadline=None)
@given(jobs_st.filter(lambda js: len(js) <= 6), st.integers(1, 3), st.sampled_from(MODELS))
def test_bound_is_below_the_brute_force_optimum(jobs, n, tm):
    cap = sum(j.n_seqs for j in jobs)
    opt = brute_force_optimum(jobs, n, tm)
    assert makespan_lower_bound(jobs, n, cap, tm) <= opt * (1 + 1e-9) + 1e-12
    for policy in POLICIES:  # and the optimum is below every policy (the brute force is a true optimum)
        assert opt <= assign(jobs, n, cap, tm, policy)[0].makespan_s * (1 + 1e-9) + 1e-12


@settings(max_examples=40, deadline=None)
@given(jobs_st, st.integers(2, 5), st.sampled_from(MODELS), st.sampled_from([0.5, 0.7, 0.9]))
def test_split_bound_holds_under_cut_and_migrate(jobs, n, tm, tau):
    cap = max(4, max(j.n_seqs for j in jobs))
    plan, _ = assign(jobs, n, cap, tm, "contiguous")
    res, _ = simulate_with_migration(plan, tm, tau)
    assert makespan_lower_bound(jobs, n, cap, tm, split_jobs=True) <= res.makespan_s * (1 + 1e-9) + 1e-12


def test_bound_equals_the_optimum_where_it_is_tight():
    # per-token model, six equal jobs on 3 actors: total/N = 2 jobs each, which the optimum achieves
    jobs = [PlanJob(f"g{i}", 2, 100.0) for i in range(6)]
    assert makespan_lower_bound(jobs, 3, 12, LIN) == pytest.approx(brute_force_optimum(jobs, 3, LIN)) == 4.0
    # one job dominates (TINY, with fixed and prefill cost): the optimum gives it an actor of its own
    big = [PlanJob("big", 8, tuple(300.0 - 10 * k for k in range(8)), 40)]
    small = [PlanJob(f"s{i}", 1, 20.0, 5) for i in range(4)]
    opt = brute_force_optimum(big + small, 2, TINY)
    assert makespan_lower_bound(big + small, 2, 12, TINY) == pytest.approx(opt, rel=1e-12)
    # the classic form under the per-token model: max(longest job, total / N)
    mixed = [PlanJob("a", 1, 500.0), PlanJob("b", 2, 50.0), PlanJob("c", 1, 80.0)]
    assert makespan_lower_bound(mixed, 2, 4, LIN) == pytest.approx(0.01 * max(500, 680 / 2))
    assert makespan_lower_bound(mixed, 1, 4, LIN) == pytest.approx(0.01 * 680)


def test_floors_follow_a_dipping_profile_and_errors_name_the_field():
    g, r = batch_cost_floors(DIP, 8)
    f = DIP.iter_seconds(np.arange(1, 9))
    assert g[0] == 0.0 and (np.diff(g[1:]) >= 0).all() and (g[1:] <= f).all()
    assert g[1] == pytest.approx(0.015)  # f(1) = 0.02 but a batch of 4 costs 0.015
    assert r == pytest.approx(min(f / np.arange(1, 9)))
    with pytest.raises(ConfigError, match="n_actors"):
        makespan_lower_bound([PlanJob("a", 1, 5.0)], 0, 4, LIN)
    assert makespan_lower_bound([], 3, 4, LIN) == 0.0
