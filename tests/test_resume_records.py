"""Run records are append-only across `--resume` (issue 42, item 1): a run resumed twice keeps every worker and
invocation of every segment, worker names stay unique (a resumed segment prefixes its own), its times follow the
earlier records instead of overlapping them, and the Gantt charts and the simulator's validation read them all.

One emulated serverless run (no weights: seconds) and one real serverless run of the tiny model, each 2 steps,
then resumed to 3 and to 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfless.config import load_run_config
from rlhfless.core.rundir import RunDir, Segment, next_segment, segment_of
from rlhfless.runtime.config import available_cores

QUICKSTART = "experiments/configs/quickstart.yaml"
EMULATED = ["runtime.device=emulated", "runtime.units=4", "runtime.emulated_model=qwen2.5-3b",
            "runtime.time_scale=0.05", "plan.max_actors=4", "rollout.prompts_per_step=8", "algo.group_size=4",
            "rollout.max_new_tokens=2048", "plan.gpu_kind=L40S", "plan.capacity=1024", "runtime.progress_every=64",
            "runtime.migrate=never", "runtime.design=extended"]
REAL = ["plan.max_actors=2", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=32",
        "task.arith.k_max=6"]
COMMON = ["runtime.mode=serverless", "train.eval_prompts=0", "train.checkpoint_every=1", "tracking.mode=disabled",
          "runtime.gantt_every=0"]


def test_next_segment_follows_the_records_it_reads():
    assert next_segment([], []) == Segment() and Segment().prefix == ""
    w = [{"worker": "decode-0", "spawned_s": 0.1, "ready_s": 0.4, "released_s": 7.5}]
    inv = [{"worker": "decode-0", "requested_s": 0.5, "started_s": 0.6, "finished_s": 6.0}]
    assert next_segment(w, inv) == Segment(1, 7.5) and Segment(1, 7.5).prefix == "s1."
    # a segment killed outright wrote no workers: its invocations count it
    assert next_segment(w, inv + [{"worker": "s1.pool-3", "requested_s": 9.0, "started_s": 9.0,
                                   "finished_s": 9.25}]) == Segment(2, 9.25)
    assert segment_of("s12.decode+learner-3") == 12 and segment_of("decode+learner-3") == 0


def _segments(out: Path, extra: list[str]) -> list[tuple[str, str]]:
    """The run trained to 2, then resumed to 3 and to 4 steps; (workers.jsonl, invocations.jsonl) after each."""
    from rlhfless.run.launch import train

    texts = []
    for steps, resume in ((2, False), (3, True), (4, True)):
        train(load_run_config(QUICKSTART, extra + COMMON + [f"train.steps={steps}"]), out, progress=False,
              resume=resume)
        texts.append((RunDir(out).workers.read_text(), RunDir(out).invocations.read_text()))
    return texts


def _check_every_segment_kept(out: Path, texts: list[tuple[str, str]]) -> None:
    for (w0, i0), (w1, i1) in zip(texts, texts[1:]):
        assert w1.startswith(w0) and len(w1) > len(w0)  # appended, never rewritten
        assert i1.startswith(i0) and len(i1) > len(i0)
    run = RunDir(out)
    workers, invs = run.read_workers(), run.read_invocations()
    names = [w["worker"] for w in workers]
    assert len(names) == len(set(names))  # unique across segments
    assert {segment_of(n) for n in names} == {0, 1, 2}
    assert {i["worker"] for i in invs} <= set(names)  # every invocation's worker has its lifetime recorded
    assert sorted({i["step"] for i in invs}) == [1, 2, 3, 4]
    for seg in (1, 2):  # each segment's records follow the earlier ones': lanes never overlap in time
        before = max(w["released_s"] for w in workers if segment_of(w["worker"]) < seg)
        assert min(w["spawned_s"] for w in workers if segment_of(w["worker"]) == seg) >= before
    from rlhfless.run.gantt import plot_steps

    for step in (1, 4):
        assert plot_steps({"serverless": out}, step, out / "gantt" / f"step-{step}.png") is not None


@pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")
def test_an_emulated_run_resumed_twice_keeps_every_record_and_validates_every_step(tmp_path):
    from rlhfless.sim.validate import validate

    out = tmp_path / "emulated"
    texts = _segments(out, EMULATED)
    _check_every_segment_kept(out, texts)
    report = validate(out)  # the first step is played for its keep-alive, the rest validated
    assert report["emulated"]["emulated"]["steps"] == [2, 3, 4]


@pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")
def test_a_real_serverless_run_resumed_twice_keeps_every_record(tmp_path):
    out = tmp_path / "real"
    texts = _segments(out, REAL)
    _check_every_segment_kept(out, texts)
    summary = json.loads(RunDir(out).summary.read_text())
    assert summary["steps"] == 4 and summary["runtime"]["workers_started"] >= 1
    from rlhfless.sim.validate import validate

    assert "serverless" in validate(out)["modes"]  # the stage model reads the four steps' records
