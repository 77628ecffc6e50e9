"""Emulated lengths replayed by prompt id across epochs (`sim.devicemodel`): the run's prompt i replays the trace's
prompt i, its epoch-e visit the trace's epoch e, whatever order the run draws it in; the real predictor then sees
each prompt's history, and `predictor/kendall_tau` is a number from the second epoch on. The run here is one
serverless arm, 32 prompts of 4 on 4 emulated L40S, each step one epoch (about 20 s on 2 loaded cores)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlhfless.config import load_run_config
from rlhfless.sim.devicemodel import LengthTable, build_table, prompt_index

RUN = ["runtime.device=emulated", "runtime.mode=serverless", "runtime.units=4", "runtime.emulated_model=qwen2.5-3b",
       "runtime.time_scale=0.02", "plan.max_actors=4", "train.steps=3", "rollout.prompts_per_step=32",
       "task.arith.num_train=32", "algo.group_size=4", "rollout.max_new_tokens=2048", "train.eval_prompts=0",
       "train.checkpoint_every=0", "tracking.mode=disabled", "runtime.gantt_every=0", "plan.gpu_kind=L40S",
       "plan.capacity=1024", "runtime.progress_every=64", "runtime.migrate=plan"]


def _trace(tmp: Path, epochs: int = 3) -> Path:
    from rlhfless.predictor.commands import synthetic_trace_file

    out = tmp / "syn.jsonl"
    # prompts differ a lot (sigma 0.8), a prompt moves little from epoch to epoch (0.05): a learnable history
    synthetic_trace_file(out, seed=4, n_prompts=8, n_epochs=epochs, group_size=4, prompts_per_step=8,
                         log_base_sigma=0.8, epoch_sigma=0.05, within_sigma=0.1, max_length=2048)
    return out


def _rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_a_prompt_replays_its_own_history_whatever_the_order(tmp_path):
    trace = _trace(tmp_path)
    cfg = load_run_config("experiments/configs/quickstart.yaml", RUN + [
        f"runtime.length_trace={trace}", "rollout.prompts_per_step=8"])
    t = build_table(cfg, steps=3, n_train=8)
    mine: dict[tuple[str, int], list] = {}
    for r in _rows(trace):
        mine.setdefault((r["prompt_id"], r["epoch"]), []).append((r["response_len"], r["reward"]))
    G = 4
    for step in (1, 2, 3):  # each step is one epoch of the 8 prompts; draw them in two different orders
        for order in (range(8), reversed(range(8))):
            for g, p in enumerate(order):
                got = [(t.length(step, g * G + s, G, 10_000, f"train-{p:05d}"),
                        t.reward(step, g * G + s, G, 0, f"train-{p:05d}")) for s in range(G)]
                assert got == mine[(f"syn-{p}", step - 1)]
    # epoch 2 follows epoch 1: a prompt's mean length in one epoch ranks it in the next
    m = np.array([[np.mean(t.prompts[i][e]) for e in range(3)] for i in range(8)])
    assert np.corrcoef(np.log(m[:, 1]), np.log(m[:, 2]))[0, 1] > 0.9
    # a run longer than the trace cycles each prompt's epochs; a prompt id without a number is hashed, stably
    assert t.length(4, 0, G, 10_000, "train-00003") == mine[("syn-3", 0)][0][0]
    assert prompt_index("gsm8k-00017") == 17 and prompt_index("abc") == prompt_index("abc")


def test_a_table_written_before_replays_by_step_and_row(tmp_path):
    old = LengthTable([[[30, 300, 5, 1200], [64, 64, 64, 64]]], None, "L40S", "qwen2.5-3b", 512, 400.0, "test")
    old.save(tmp_path / "t.json")
    t = LengthTable.load(tmp_path / "t.json")
    assert t.prompts is None and t.length(1, 1, 4, 2048, "train-00009") == 300


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from rlhfless.run.launch import train

    out = tmp_path_factory.mktemp("replay") / "run"
    train(load_run_config("experiments/configs/quickstart.yaml", RUN), out, progress=False)
    return out


def test_an_emulated_run_replays_each_prompt_by_id_and_epoch(run):
    t = LengthTable.load(run / "emulated-lengths.json")
    rows = _rows(run / "traces" / "rollouts.jsonl")
    assert {r["epoch"] for r in rows} == {0, 1, 2}  # three steps, three epochs of the 32 prompts
    got: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        got.setdefault((r["prompt_id"], r["epoch"]), []).append(r["response_len"])
    assert len(got) == 32 * 3
    for (pid, epoch), lens in got.items():
        assert lens == t.prompts[prompt_index(pid) % len(t.prompts)][epoch]


def test_kendall_tau_is_a_number_from_the_second_epoch(run):
    """Step 1 has no history (every prompt predicted alike: tau undefined); from step 2 the EWMA predictor ranks
    the prompts by their last epoch, and the replayed lengths follow that history (a (step, row) replay, which
    gives a prompt unrelated lengths each epoch, ranks them at about 0)."""
    m = _rows(run / "metrics.jsonl")
    tau = {x["step"]: x.get("predictor/kendall_tau") for x in m}
    assert tau[1] is None
    assert all(tau[s] is not None and tau[s] > 0.4 for s in (2, 3)), tau


def test_the_run_report_says_how_many_cuts_were_kept_and_why_not(run):
    """summary.json: cuts weighed and kept per step, with the scaler's recorded reason for the steps that kept
    none, the rows the runtime moved, and the predictor's tau per step."""
    s = json.loads((run / "summary.json").read_text())
    cuts = s["cuts"]
    assert cuts["steps_weighed"] == 3 and cuts["steps_kept"] + sum(cuts["why_not"].values()) == 3
    assert set(cuts["why_not"]) <= {"nothing_to_move", "no_gain", "misses_deadline", "dearer", "slower"}
    assert cuts["rows_moved"] == s["runtime"]["migrated_seqs"]
    assert cuts["steps_kept"] > 0 or cuts["rows_moved"] == 0  # runtime.migrate=plan moves rows only where kept
    assert list(s["predictor_kendall_tau"]) == ["1", "2", "3"] and s["predictor_kendall_tau"]["1"] is None


def test_the_studys_extra_traces_are_what_they_say(tmp_path):
    """`rlhfless repro emulated` also replays a published-fit and a heavy-tail trace: each a file over the run's
    train prompts with one epoch per step and one more, rewards included; the fit lands on the published log's cap
    share (7.4% at 1,024), the heavy tail's 99th percentile sits further above its median than the testbed's."""
    from types import SimpleNamespace

    from rlhfless.repro.emulated_study import CONFIG, TRACES, write_trace
    from rlhfless.sim.workload import replay_trace

    cfg = load_run_config(str(CONFIG), [])  # the full size: 128 prompts (16 at the quick size sample the tail thinly)
    ctx = SimpleNamespace(out=tmp_path, seed=0, quick=False)
    spread = {}
    for name in TRACES:
        work = replay_trace(write_trace(ctx, cfg, name))
        assert len(work) == cfg.train.steps + 1 and {s.epoch for s in work} == set(range(cfg.train.steps + 1))
        assert {len(s.groups) for s in work} == {cfg.task.arith.num_train}
        lens = np.array([x for s in work for g in s.groups for x in g.lengths])
        assert {x for s in work for g in s.groups for x in g.rewards} == {0.0, 1.0}
        spread[name] = np.percentile(lens, 99) / np.median(lens)
        if name == "published-fit":
            assert lens.max() == 1024 and abs(float(np.mean(lens == 1024)) - 0.0737) < 0.02
    assert spread["heavy-tail"] > 2 * spread["published-fit"]
