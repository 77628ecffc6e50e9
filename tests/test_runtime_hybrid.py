"""Hybrid functions (runtime.hybrid) handed on as learner ranks, with real worker processes and no full run:
a warm function goes on as a rank only when a rank has work that can start now (`LearnerStream.take`); one
pre-warmed and taken before any decode runs its first invocation as that rank. Keep-alive is an event: an idle
function is released at the instant its keep-alive lapses, inside a stage's wait (`Runtime.poll`)."""

from __future__ import annotations

import pytest

from rlhfless.config import load_run_config
from rlhfless.learn.learner import Learner
from rlhfless.model.factory import load_policy
from rlhfless.run.runner import ensure_policy
from rlhfless.runtime.config import available_cores
from rlhfless.runtime.executor import Runtime
from rlhfless.runtime.streaming import LearnerStream

pytestmark = pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")

TINY = ["train.steps=1", "rollout.prompts_per_step=2", "algo.group_size=2", "tracking.mode=disabled",
        "runtime.mode=serverless", "runtime.prewarm=false"]


@pytest.fixture
def runtime(tmp_path):
    cfg = load_run_config("experiments/configs/quickstart.yaml", TINY)
    ensure_policy(cfg, progress=False)
    rt = Runtime(cfg, "serverless", Learner(load_policy(cfg.policy.resolved()), cfg.optim, cfg.algo), tmp_path)
    try:
        yield rt
    finally:
        rt.cleanup()


def test_a_prewarmed_hybrid_function_taken_as_a_rank_before_any_decode_is_a_cold_invocation(runtime):
    """Its cold start belongs to its first invocation, the learner rank's, and a later decode on it is warm."""
    h = runtime.workers.start_decoders(1, prewarmed=True)[0]
    runtime.workers.pool.await_ready([h])  # ready and idle: what `_handles` finds beyond the decode need
    stream = LearnerStream(runtime.context(1), [[1, 2, 3], [4, 5]], seed=0, overlap=False)
    assert not stream.take(h), "no rank has work now: the function is not bound to one (its keep-alive runs)"
    stream.group_done(0, [[7], [8]], [0.0, 1.0])  # a finished group waits for its rank: work that starts now
    assert stream.take(h)
    rank = next(r for r in stream.ranks if r.handle is h)
    assert rank.cold, "the rank is the function's first invocation: it carries the cold start"
    assert not runtime.ledger.first_use(h), "a decode on it later is not its first invocation"


@pytest.fixture
def kept(tmp_path):
    cfg = load_run_config("experiments/configs/quickstart.yaml", TINY + ["runtime.keep_alive_s=0.5"])
    ensure_policy(cfg, progress=False)
    rt = Runtime(cfg, "serverless", Learner(load_policy(cfg.policy.resolved()), cfg.optim, cfg.algo), tmp_path)
    try:
        yield rt
    finally:
        rt.cleanup()


def test_an_idle_function_is_released_at_the_instant_its_keep_alive_lapses_inside_a_wait(kept):
    """A stage waiting on another worker (a poll that would block far longer) wakes at the idle function's lapse
    and releases it, recorded at that instant: not at the next step's start."""
    idle, busy = kept.workers.start_decoders(2, prewarmed=False)
    kept.workers.pool.await_ready([idle, busy])
    kept.workers.pool.busy(idle)
    kept.workers.pool.idle(idle)  # its invocation ended: keep-alive starts now
    kept.workers.pool.busy(busy)
    since = kept.workers.pool.idle_since[idle.worker]
    for _ in range(20):  # the wait of a stage: `busy` never answers; each poll would wait 5 s without the event
        if idle.worker not in kept.workers.pool.handles:
            break
        assert kept.workers.poll([busy], 5.0) == []
    assert idle.worker not in kept.workers.pool.handles
    rec = kept.workers.pool.records[idle.worker]
    assert rec.released_s == pytest.approx(kept.clock.rel(since + 0.5), abs=1e-9) and not rec.killed
    assert kept.workers.pool.expired == [(rec.released_s, idle.worker)]
    assert busy.worker in kept.workers.pool.handles, "a busy function is never released by keep-alive"
