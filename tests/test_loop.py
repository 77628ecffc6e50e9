"""The GRPO loop end to end: CLI outputs, determinism, NaN handling, and that learning actually happens."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhfless.cli import main
from rlhfless.config import load_run_config
from rlhfless.core.errors import DataError, TrainingError
from rlhfless.run.launch import train
from rlhfless.core.traces import read_trace

SMALL = ["train.steps=2", "train.eval_prompts=6", "rollout.prompts_per_step=4", "algo.group_size=2",
         "rollout.max_new_tokens=12", "train.threads=1", "tracking.mode=disabled", "train.checkpoint_every=1",
         "train.table_every=2"]


def _run(tmp_path: Path, ckpt: Path, name: str, extra=()):
    cfg = load_run_config(None, SMALL + [f"policy.checkpoint={ckpt}", *extra])
    return train(cfg, tmp_path / name, progress=False)


def test_cli_writes_summary_traces_and_metrics(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--out", str(out), "--wandb", "disabled", "--no-progress",
               f"policy.checkpoint={tiny_checkpoint}", *SMALL])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("steps", "eval_accuracy_initial", "eval_accuracy_final", "reward_mean_first", "reward_mean_last",
                "wall_s", "trace_path", "wandb_dir", "eval_greedy_accuracy_final"):
        assert key in summary
    assert summary["steps"] == 2
    rows = list(read_trace(summary["trace_path"]))
    assert len(rows) == 2 * 4 * 2
    assert {r.step for r in rows} == {1, 2} and all(1 <= r.response_len <= 12 for r in rows)
    assert all(r.response_len == 12 for r in rows if r.truncated)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step_lines = [x for x in lines if "timing_s/rollout" in x]
    assert len(step_lines) == 2
    for key in ("reward/mean", "response_length/clip_ratio", "timing_s/update", "perf/throughput",
                "prefill/dedup_ratio"):
        assert key in step_lines[0]
    assert step_lines[0]["prefill/dedup_ratio"] == pytest.approx(2.0)  # G = 2 copies share one prefill
    for key in ("scaler/num_actors", "balancer/imbalance", "predictor/mae", "plan/makespan_vs_hindsight",
                "timing_s/plan"):
        assert key in step_lines[1], key
    assert (out / "tables" / "scaler_candidates.jsonl").is_file()
    assert (out / "tables" / "predicted_vs_actual.jsonl").is_file()
    assert "held-out accuracy" in capsys.readouterr().err


def test_planning_can_be_switched_off(tiny_checkpoint, tmp_path):
    _run(tmp_path, tiny_checkpoint, "noplan", ["train.plan=false", "train.eval_prompts=0"])
    lines = [json.loads(x) for x in (tmp_path / "noplan" / "metrics.jsonl").read_text().splitlines()]
    assert lines and not any("scaler/num_actors" in x for x in lines)


def test_same_seed_gives_the_same_run(tiny_checkpoint, tmp_path):
    a = _run(tmp_path, tiny_checkpoint, "a")
    b = _run(tmp_path, tiny_checkpoint, "b")
    drop = {"wall_s", "trace_path", "wandb_dir"}
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}
    assert [r.response_len for r in read_trace(a["trace_path"])] == [r.response_len for r in read_trace(b["trace_path"])]
    wa = load_file(tmp_path / "a" / "checkpoints" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "checkpoints" / "final" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _damaged(tiny_checkpoint: Path, tmp_path: Path) -> tuple[Path, str]:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_checkpoint.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = load_file(bad / "model.safetensors")
    name = next(k for k in weights if "mlp" in k)
    weights[name][0, 0] = float("nan")
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    return bad, name


def test_nan_loss_stops_with_a_clear_message(tiny_checkpoint, tmp_path, monkeypatch):
    """A NaN weight that reaches the learner (loading refuses one in a file, so it is set after the load)."""
    import rlhfless.run.runner as runner

    load = runner.load_policy

    def with_nan(path):
        model = load(path)
        with torch.no_grad():
            next(p for n, p in model.named_parameters() if "mlp" in n)[0, 0] = float("nan")
        return model

    monkeypatch.setattr(runner, "load_policy", with_nan)
    with pytest.raises(TrainingError, match="non-finite.*Last good checkpoint"):
        _run(tmp_path, tiny_checkpoint, "nan", ["algo.skip_zero_variance_groups=false", "train.eval_prompts=0"])


def test_a_checkpoint_holding_nan_weights_is_refused_at_load_naming_the_tensor_and_file(tiny_checkpoint,
                                                                                        tmp_path):
    bad, name = _damaged(tiny_checkpoint, tmp_path)
    with pytest.raises(DataError, match=f"model.safetensors: tensor '{name}' holds NaN"):
        _run(tmp_path, bad, "nan", ["train.eval_prompts=0"])
    assert not (tmp_path / "nan").exists()  # refused before the run wrote anything


def test_an_earlier_run_in_the_same_folder_is_moved_aside_by_the_library_and_refused_by_the_cli(
        tiny_checkpoint, tmp_path, capsys):
    """`runner.train` (compare, bench faults and repro re-run into their own sub-folders) moves an earlier run
    aside, twice within one second too; `rlhfless train --out` refuses it and names --resume, changing nothing."""
    for _ in range(3):
        _run(tmp_path, tiny_checkpoint, "same", ["train.eval_prompts=0"])
    lines = (tmp_path / "same" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # only the last run's two steps
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("same.")]
    assert len(aside) == 2 and all((p / "summary.json").is_file() for p in aside)
    before = {p: p.read_bytes() for p in (tmp_path / "same").rglob("*") if p.is_file()}
    assert main(["train", "--out", str(tmp_path / "same"), f"policy.checkpoint={tiny_checkpoint}", *SMALL]) == 2
    assert "holds an earlier run; continue it with the same command and --resume" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (tmp_path / "same").rglob("*") if p.is_file()} == before


def test_weights_made_non_finite_by_an_update_stop_the_run_and_are_never_saved(tiny_checkpoint, tmp_path,
                                                                               monkeypatch):
    """The learner's guard watches loss and gradient norm; an update can still leave a weight infinite (an
    absurd learning rate did): the run stops after that step, `last` keeps step 1, and no `final` is written."""
    from rlhfless.step.loop import Stages

    learn = Stages.learn

    def poisoned(self, *args, **kwargs):
        metrics = learn(self, *args, **kwargs)
        if self.learner.updates >= 2:
            with torch.no_grad():
                next(self.learner.model.parameters()).view(-1)[0] = float("inf")
        return metrics

    monkeypatch.setattr(Stages, "learn", poisoned)
    with pytest.raises(TrainingError, match=r"step 2: weight .* is not finite after the update.*Last good "
                                            r"checkpoint: .*checkpoints/last"):
        _run(tmp_path, tiny_checkpoint, "inf", ["train.eval_prompts=0", "algo.skip_zero_variance_groups=false"])
    ckpt = tmp_path / "inf" / "checkpoints"
    assert not (ckpt / "final").exists()
    assert json.loads((ckpt / "last" / "state.json").read_text())["step"] == 1
    assert all(torch.isfinite(t).all() for t in load_file(ckpt / "last" / "model.safetensors").values())


def test_prompt_plus_max_new_tokens_must_fit_the_context(tiny_checkpoint, tmp_path):
    from rlhfless.core.errors import ConfigError

    # the tiny checkpoint's context is 256 tokens
    with pytest.raises(ConfigError, match="rollout.max_new_tokens: the longest prompt .* has"):
        _run(tmp_path, tiny_checkpoint, "ctx", ["rollout.max_new_tokens=250"])


def test_warmup_advances_on_a_batch_without_reward_variance(tiny_checkpoint):
    from rlhfless.learn.config import OptimConfig
    from rlhfless.learn.learner import Learner
    from rlhfless.model.factory import load_checkpoint

    cfg = load_run_config(None, ["algo.group_size=2", "optim.warmup_steps=4", "optim.lr=1e-3"])
    learner = Learner(load_checkpoint(tiny_checkpoint), cfg.optim, cfg.algo)
    assert isinstance(cfg.optim, OptimConfig)
    flat = learner.update([[1, 5, 6]], [[7, 2], [8, 2]], torch.tensor([1.0, 1.0]))  # no variance: no step
    assert flat["actor/lr"] == pytest.approx(0.25e-3)
    varied = learner.update([[1, 5, 6]], [[7, 2], [8, 2]], torch.tensor([1.0, 0.0]))
    assert varied["actor/lr"] == pytest.approx(0.5e-3)  # the skipped batch counted as a warm-up step
    assert learner.updates == 2


def test_the_held_out_bar_counts_prompts_once_per_pass(tiny_checkpoint, capsys):
    """500 prompts evaluated sampled and greedy show two bars to 500, not one bar to 1,000 "prompts"."""
    from rlhfless.model.factory import load_policy
    from rlhfless.run.runner import run_eval
    from rlhfless.step.textenv import make_env

    cfg = load_run_config(None, SMALL + [f"policy.checkpoint={tiny_checkpoint}"])
    env = make_env(cfg)
    prompts = env.task.splits()[1][:3]
    res = run_eval(load_policy(tiny_checkpoint), prompts, cfg, env, progress=True)
    err = capsys.readouterr().err
    assert set(res) == {"sampled", "greedy"} and all(r.num_prompts == 3 for r in res.values())
    assert "held-out eval, sampled" in err and "held-out eval, greedy" in err
    assert err.count("0/3 [") == 2 and "/6" not in err  # each bar starts at 0 of the 3 prompts
