"""Serverless learner ranks leave at their share (issue 30, item 3), end to end with real worker processes: on the
headline comparison's config at the suite's tiny size, every rank but the last writes its share and its function
is released before the step's update ends (keep-alive 0: the plan has no work for it inside the window). Checked on
the run's records (events), never on timings."""

from __future__ import annotations

import pytest

from rlhfless.config import load_run_config
from rlhfless.core import metrics as M
from rlhfless.core.rundir import RunDir
from rlhfless.run.launch import train
from rlhfless.runtime.config import available_cores

pytestmark = pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")

TINY = ["train.steps=3", "rollout.prompts_per_step=6", "algo.group_size=4", "rollout.max_new_tokens=64",
        "train.eval_prompts=0", "train.checkpoint_every=0", "tracking.mode=disabled", "runtime.gantt_every=0",
        "task.arith.k_max=6", "runtime.units=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = load_run_config("experiments/configs/serverless_vs_serverful.yaml",
                          TINY + ["runtime.mode=serverless", "runtime.keep_alive_s=0"])
    out = tmp_path_factory.mktemp("shares") / "serverless"
    summary = train(cfg, out, progress=False)
    rd = RunDir(out)
    return summary, rd.read_invocations(), rd.read_workers(), rd.read_metrics()


def test_every_rank_but_the_reducer_is_released_before_the_update_ends(run):
    _, invs, workers, _ = run
    released = {w["worker"]: w["released_s"] for w in workers}
    for step in (1, 2, 3):
        ranks = [i for i in invs if i["step"] == step and i["kind"] == "learner" and i["ok"]]
        assert len(ranks) == 2  # the data-parallel degree is the serverful pool's
        end = max(i["finished_s"] for i in ranks)
        early = [i for i in ranks if released[i["worker"]] < end]
        # one rank reduced and stepped; the other wrote its share and was gone before that
        assert len(early) == 1 and early[0]["finished_s"] < end


def test_the_early_releases_are_counted_mid_step(run):
    _, _, _, metrics = run
    steps = [m for m in metrics if M.RUNTIME_RANKS_RELEASED_EARLY in m]
    assert len(steps) == 3 and all(m[M.RUNTIME_RANKS_RELEASED_EARLY] == 1 for m in steps)
    assert all(m[M.RUNTIME_RELEASED_MID_STEP] >= 1 for m in steps)
