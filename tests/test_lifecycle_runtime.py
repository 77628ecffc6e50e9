"""The shared lifecycle (`plan.lifecycle`) in the real runtime on emulated devices: the device budget, reuse of
separate-image functions across steps, and decode functions warm at the next step's start. One small serverless
run of the paper's design (8 emulated L40S units, 4 learner ranks, a keep-alive that covers every gap: about a
minute here), so behind the `slow` marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfless.config import load_run_config
from rlhfless.plan import lifecycle

pytestmark = pytest.mark.slow

PAPER = ["runtime.device=emulated", "runtime.units=8", "runtime.learner_units=4", "runtime.emulated_model=qwen2.5-3b",
         "runtime.time_scale=0.05", "plan.max_actors=4", "train.steps=4", "rollout.prompts_per_step=8",
         "algo.group_size=4", "rollout.max_new_tokens=2048", "train.eval_prompts=0", "train.checkpoint_every=0",
         "tracking.mode=disabled", "runtime.gantt_every=0", "plan.gpu_kind=L40S", "plan.capacity=1024",
         "runtime.progress_every=64", "runtime.migrate=never", "runtime.mode=serverless", "runtime.design=paper",
         "runtime.keep_alive_s=30", "runtime.billing_granularity_s=30"]


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    from rlhfless.run.launch import train

    out = tmp_path_factory.mktemp("lifecycle") / "paper"
    train(load_run_config("experiments/configs/quickstart.yaml", PAPER), out, progress=False)
    return out


def _rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_never_more_units_held_than_exist(paper):
    ws = _rows(paper / "workers.jsonl")
    spans = [(w["spawned_s"], w["released_s"], w["units"]) for w in ws]
    assert lifecycle.peak_devices(spans) > 4 and lifecycle.within_budget(spans, 8)


def test_a_separate_learner_function_is_reused_across_steps(paper):
    """Kept warm by a keep-alive that covers the rollout, the paper design's learner functions are the next
    step's ranks (no new cold start): some learner worker has learner invocations in two steps."""
    steps: dict[str, set[int]] = {}
    for i in _rows(paper / "invocations.jsonl"):
        if i["kind"] == "learner" and i.get("ok", True):
            steps.setdefault(i["worker"], set()).add(i["step"])
    assert any(len(s) > 1 for s in steps.values()), steps


def test_decode_functions_are_warm_at_the_next_steps_start(paper):
    """From step 2 on every decode function is ready when its rollout asks for it: kept warm through the update
    (the keep-alive covers the gap) or pre-warmed to reach the stage."""
    ws = {w["worker"]: w for w in _rows(paper / "workers.jsonl")}
    for i in _rows(paper / "invocations.jsonl"):
        if i["kind"] == "decode" and i["step"] > 1:
            w = ws[i["worker"]]
            assert w["ready_s"] is not None and w["ready_s"] <= i["requested_s"] + 1e-6, (i["step"], w["worker"])


TIGHT = [x for x in PAPER if not x.startswith(("runtime.units=", "runtime.learner_units=", "runtime.keep_alive_s=",
                                               "runtime.billing_granularity_s="))] + ["runtime.units=4"]
"""Four units and four learner ranks (every unit a rank during the update), keep-alive 0: nothing stays warm."""


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    from rlhfless.run.launch import train

    out = tmp_path_factory.mktemp("lifecycle") / "tight"
    train(load_run_config("experiments/configs/quickstart.yaml", TIGHT), out, progress=False)
    return out


def test_the_next_steps_decode_is_prewarmed_into_a_unit_a_rank_frees_at_its_share(tight):
    """Every unit is a learner rank when the update begins, so the next step's decode pre-warm finds none free
    then; it is retried as ranks write their shares and take their units (`plan.lifecycle`): from step 3 on (step
    2's update is the first with a measured one before it) every decode function was started during the update
    before (before: tried once, into free units only, and never started). Units never exceed the budget."""
    ws = {w["worker"]: w for w in _rows(tight / "workers.jsonl")}
    spans = [(w["spawned_s"], w["released_s"], w["units"]) for w in ws.values()]
    assert lifecycle.within_budget(spans, 4)
    invs = _rows(tight / "invocations.jsonl")
    for step in (3, 4):
        t0 = min(i["requested_s"] for i in invs if i["kind"] == "decode" and i["step"] == step)
        learn = [i for i in invs if i["kind"] == "learner" and i["step"] == step - 1]
        dec = [ws[i["worker"]] for i in invs if i["kind"] == "decode" and i["step"] == step]
        assert dec and all(w["prewarmed"] and min(i["started_s"] for i in learn) < w["spawned_s"] < t0 for w in dec)


def test_the_runtime_holds_its_ranks_when_the_shared_rule_says_hold(tight, tmp_path, monkeypatch):
    """Both sides play one rule: the runtime lets a separate-image rank go at its share by `lifecycle.let_go`
    (`LearnerStream._shared`), and so does the simulator (`test_lifecycle.py::test_the_simulators_share_release_is_
    the_shared_rule`). With the rule changed to "hold" (and no pre-warm waiting for the unit) no rank is let go
    at its share; as it is, ranks are."""
    from rlhfless.run.launch import train

    assert any(w.get("release_reason") == "share" for w in _rows(tight / "workers.jsonl"))
    monkeypatch.setattr(lifecycle, "let_go", lambda *a, **k: False)
    out = tmp_path / "hold"
    over = [x for x in TIGHT if not x.startswith("train.steps=")] + ["train.steps=2", "runtime.prewarm=false"]
    train(load_run_config("experiments/configs/quickstart.yaml", over), out, progress=False)
    rows = _rows(out / "workers.jsonl")
    assert any("learner" in w["kinds"] for w in rows)
    assert not any(w.get("release_reason") == "share" for w in rows)
