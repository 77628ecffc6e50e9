"""Hybrid functions (runtime.hybrid) handed on as learner ranks, with real worker processes and no full run:
a function pre-warmed for decode and taken as a rank before any decode (`LearnerStream.take` from
`DecodeStage._handles`, a warm function beyond the step's decode need) runs its first invocation as that rank."""

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
    h = runtime.start_decoders(1, prewarmed=True)[0]
    runtime.pool.await_ready([h])  # ready and idle: what `_handles` finds beyond the decode need
    stream = LearnerStream(runtime, 1, [[1, 2, 3], [4, 5]], seed=0, overlap=False)
    assert stream.take(h)
    rank = next(r for r in stream.ranks if r.handle is h)
    assert rank.cold, "the rank is the function's first invocation: it carries the cold start"
    assert not runtime.first_use(h), "a decode on it later is not its first invocation"
