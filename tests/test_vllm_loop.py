"""`rollout.engine=vllm` in the training loop: the engine gets the learner's weights every step, and GRPO runs.

Marked `vllm`: run with `make test-vllm` (its own venv). Skips, saying why, where vLLM cannot be imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlhfless.config import load_run_config
from rlhfless.rollout.engine import generate

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
TINY = ["train.steps=3", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=48",
        "train.eval_prompts=0", "train.checkpoint_every=0", "tracking.mode=disabled", "rollout.engine=vllm",
        "train.threads=1"]


@pytest.fixture(autouse=True)
def _vllm():
    from rlhfless.rollout.vllm_engine import vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)


def test_each_rollout_runs_the_learners_current_weights():
    from rlhfless.learn.learner import Learner
    from rlhfless.step.loop import Stages
    from rlhfless.model.factory import load_checkpoint
    from rlhfless.core.records import PromptGroup

    cfg = load_run_config(REPO / "experiments/configs/quickstart.yaml", TINY)
    learner = Learner(load_checkpoint(cfg.policy.resolved()), cfg.optim, cfg.algo)
    stages = Stages(cfg, learner)
    stages.sampling = stages.env.sampling(48, temperature=0.0)  # greedy: the two engines must agree token for token
    groups = [PromptGroup(p, stages.env.encode(p), 4) for p in stages.env.task.splits()[0][:4]]
    try:
        before = stages.rollout(groups, seed=0).responses
        with torch.no_grad():  # what an update does, made large enough to change greedy tokens
            for p in learner.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        after = stages.rollout(groups, seed=0).responses
        own = generate(learner.model, [g.token_ids for g in groups], 4, stages.sampling, seed=0).responses
    finally:
        stages.close()
    assert after == own and after != before


def test_grpo_steps_run_on_the_vllm_engine(tmp_path):
    from rlhfless.run.launch import train

    summary = train(load_run_config(REPO / "experiments/configs/quickstart.yaml", TINY), tmp_path / "run",
                    progress=False)
    assert summary["steps"] == 3
    rows = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 3 and all('"reward/mean"' in r for r in rows)


def test_bench_loop_times_whole_grpo_steps_with_each_engine(tmp_path, capsys):
    import json

    from rlhfless.cli import main

    out = tmp_path / "loop.json"
    rc = main(["bench", "loop", "--feature", "engine", "--steps", "2", "--threads", "1", "--no-progress", "--json",
               str(out), "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=24",
               "train.eval_prompts=0", "tracking.mode=disabled"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert len(r["reward_curve_on"]) == len(r["reward_curve_off"]) == 2
    assert r["median_s_on"]["rollout"] > 0 and r["median_s_off"]["rollout"] > 0
    assert "s own vs" in capsys.readouterr().out
