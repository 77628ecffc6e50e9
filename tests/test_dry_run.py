"""`rlhfless train --dry-run` reads checkpoints instead of loading them (issue 42): it imports no torch, and it
refuses what the run refuses, in the same line (`rlhfless.run.preflight`).

The torch-free cases run in a fresh interpreter (this test process has long imported torch); the parity cases
run the dry run and the real run in-process on the same damaged folder and compare their one error line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfless.cli import main

REPO = Path(__file__).resolve().parents[1]
SFT = REPO / "data" / "checkpoints" / "sft"
HEAVY = ("torch", "transformers")

# Runs the CLI's main in-process, then reports its exit status and which heavy modules it had imported.
PROBE = """
import json, sys
from rlhfless.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}), file=sys.__stderr__)
""" % (HEAVY,)

# a PPO run small enough to take seconds: its checkpoint carries the critic state and the predictor
PPO = ["algo.name=ppo", "algo.group_size=2", "task.arith.num_train=48", "rollout.prompts_per_step=2",
       "rollout.max_new_tokens=16", "train.eval_prompts=0", "train.threads=1", "tracking.mode=disabled",
       "predictor.name=ewma", "train.checkpoint_every=1", f"policy.checkpoint={SFT}"]


def _probe(*argv: str) -> dict:
    """`rlhfless ARGV` in a fresh interpreter: exit status, heavy modules imported, stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    lines = done.stderr.strip().splitlines()
    return {**json.loads(lines[-1]), "stderr": "\n".join(lines[:-1])}


@pytest.mark.parametrize("config, extra", [
    ("quickstart.yaml", []),
    ("quickstart_ppo.yaml", ["algo.kl_coef=0.05"]),  # the critic's trunk and the reference too
    ("serverless_vs_serverful.yaml", []),
])
def test_a_shipped_configs_dry_run_imports_no_torch(config, extra):
    found = _probe("train", "--dry-run", "--no-progress", "--config", f"experiments/configs/{config}", *extra)
    assert found["code"] == 0, found["stderr"]
    assert "config OK" in found["stderr"]
    assert found["heavy"] == [], f"the dry run of {config} imported {found['heavy']}"


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> Path:
    """A one-step PPO run with a checkpoint (policy, critic state, predictor)."""
    run = tmp_path_factory.mktemp("ppo") / "run"
    assert main(["train", "--no-progress", "--out", str(run), *PPO, "train.steps=1"]) == 0
    return run


def test_a_resumed_ppo_runs_dry_run_imports_no_torch(ppo_run):
    """--resume reads the run folder, its checkpoint, the critic state and the predictor, torch-free."""
    found = _probe("train", "--dry-run", "--no-progress", "--resume", "--out", str(ppo_run), *PPO, "train.steps=2")
    assert found["code"] == 0, found["stderr"]
    assert "config OK" in found["stderr"] and found["heavy"] == [], found


# --- parity: the dry run refuses what the run refuses, in the same line ---------------------------------------
def _damaged_copy(dst: Path, tensors=None, config=None) -> Path:
    """The shipped SFT checkpoint copied to `dst`, `tensors(weights)` applied to its weights, `config` merged into
    its config.json."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(SFT, dst)
    if tensors is not None:
        weights = load_file(dst / "model.safetensors")
        tensors(weights)
        save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        raw = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**raw, **config}))
    return dst


def _nan_in_two(weights) -> None:
    """NaN in a tensor early in the model's parameter order and in one before it alphabetically (the file's order):
    the message names the parameter-order one, as the run's check over `named_parameters` does."""
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        weights[name].view(-1)[3] = float("nan")


def _wrong_shape(weights) -> None:
    import torch

    weights["model.norm.weight"] = torch.ones(64)


def _truncate(path: Path) -> None:
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _error_line(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert err and err[-1].startswith("rlhfless: error: "), err
    return err[-1]


def _same_refusal(capsys, tmp_path: Path, args: list[str], expect: str) -> None:
    """The dry run's error line equals the real run's, which leaves no run folder."""
    out = tmp_path / "out"
    dry = _error_line(capsys, ["train", "--dry-run", "--no-progress", *args])
    real = _error_line(capsys, ["train", "--no-progress", "--out", str(out), *args])
    assert dry == real
    assert expect in real, real
    assert not out.exists()


POLICY_CASES = {
    "truncated": (dict(), _truncate, "not a readable safetensors file, or truncated"),
    "nan": (dict(tensors=_nan_in_two), None, "tensor 'model.layers.0.self_attn.q_proj.weight' holds NaN"),
    "wrong-shape": (dict(tensors=_wrong_shape), None, "tensor 'model.norm.weight' has shape [64]"),
    # what only transformers judges: the dry run loads such a folder for real
    "layer-types": (dict(config={"layer_types": ["full_attention"] * 3}), None, "transformers rejects this config"),
    "rope-type": (dict(config={"rope_parameters": {"rope_type": "bogus", "rope_theta": 1.0}}), None,
                  "transformers cannot load this checkpoint"),
}


@pytest.mark.parametrize("case", POLICY_CASES)
def test_a_bad_policy_checkpoint_is_refused_by_the_dry_run_as_by_the_run(case, capsys, tmp_path):
    damage, after, expect = POLICY_CASES[case]
    ckpt = _damaged_copy(tmp_path / "ckpt", **damage)
    if after is not None:
        after(ckpt)
    _same_refusal(capsys, tmp_path, [f"policy.checkpoint={ckpt}", "train.steps=1", "tracking.mode=disabled"],
                  expect)


def test_a_critic_with_another_vocabulary_is_refused_by_the_dry_run_as_by_the_run(capsys, tmp_path):
    from rlhfless.model.hf import TinyHFConfig, build_tiny_hf

    hf = build_tiny_hf(tmp_path / "hf", [f"{a} plus {a + 1} is {2 * a + 1}" for a in range(200)],
                       TinyHFConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                    intermediate_size=64, max_positions=256))
    _same_refusal(capsys, tmp_path, [*PPO, f"critic.checkpoint={hf}", "train.steps=1"],
                  "critic.checkpoint: ")


def _edit_critic_state(path: Path, tensors=None, meta=None, drop: bool = False) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    if drop:
        path.unlink()
        return
    with safe_open(str(path), framework="pt") as fh:
        metadata = fh.metadata()
    weights = load_file(path)
    if tensors is not None:
        tensors(weights)
    save_file(weights, str(path), metadata={**metadata, **(meta or {})})


def _critic_nan(w) -> None:
    w["model/trunk.layers.0.mlp.up_proj.weight"].view(-1)[0] = float("nan")


def _critic_optim_shape(w) -> None:
    import torch

    w["optim/2/exp_avg"] = torch.zeros(3, 3)


CRITIC_CASES = {
    "missing": (dict(drop=True), "must carry the critic"),
    "format": (dict(meta={"format": "other"}), "not an rlhfless critic state"),
    "nan": (dict(tensors=_critic_nan), "tensor 'trunk.layers.0.mlp.up_proj.weight' holds NaN"),
    "metadata": (dict(meta={"updates": "many"}), "corrupt critic state metadata"),
    "optimizer-shape": (dict(tensors=_critic_optim_shape), "optimizer state does not match"),
    # AdamW's own check of the param groups: only torch judges it, so the dry run loads the state for real
    "optimizer-groups": (dict(meta={"optimizer_groups": "[]"}), "optimizer state does not load"),
}


@pytest.mark.parametrize("case", CRITIC_CASES)
def test_a_bad_critic_state_is_refused_by_the_dry_run_as_by_the_resumed_run(case, ppo_run, capsys, tmp_path):
    from rlhfless.learn.critic_files import STATE_FILE

    edit, expect = CRITIC_CASES[case]
    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    _edit_critic_state(run / "checkpoints" / "last" / STATE_FILE, **edit)
    args = ["--resume", "--out", str(run), *PPO, "train.steps=2"]
    dry = _error_line(capsys, ["train", "--dry-run", "--no-progress", *args])
    real = _error_line(capsys, ["train", "--no-progress", *args])
    assert dry == real and expect in real, (dry, real)


# --- the tables the torch-free checks rely on -----------------------------------------------------------------
@pytest.mark.parametrize("sizes", [dict(), dict(hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1,
                                                 intermediate_size=64, max_positions=256)])
def test_the_written_files_table_is_what_save_checkpoint_writes(sizes, tmp_path):
    """`written_by_rlhfless` accepts what `save_checkpoint` writes under the installed transformers, every key of
    its tables is written (a stale table would send every checkpoint to the real load), and the parameter orders
    the numpy checks follow are the models' own."""
    from rlhfless.learn.critic import build_value_model
    from rlhfless.learn.critic_files import value_model_shapes
    from rlhfless.model.factory import (
        WRITTEN_CONFIG,
        WRITTEN_GENERATION,
        ModelConfig,
        build_model,
        expected_tensors,
        read_config_json,
        save_checkpoint,
        written_by_rlhfless,
    )

    model = build_model(ModelConfig(**sizes))
    path = save_checkpoint(model, tmp_path / "ckpt")
    raw = read_config_json(path)
    assert written_by_rlhfless(path, raw)
    assert set(WRITTEN_CONFIG) <= set(raw)
    assert set(WRITTEN_GENERATION) <= set(json.loads((path / "generation_config.json").read_text()))
    assert list(expected_tensors(raw)) == [n for n, _ in model.named_parameters()]
    critic = build_value_model(path)
    assert value_model_shapes(raw) == {k: list(v.shape) for k, v in critic.state_dict().items()}
    assert list(value_model_shapes(raw)) == [n for n, _ in critic.named_parameters()]
    assert not written_by_rlhfless(path, {**raw, "rms_norm_eps": 1e-5})
    assert not written_by_rlhfless(path, {**raw, "tie_word_embeddings": 1})  # JSON's 1 is not true


def test_a_run_whose_records_were_cut_after_its_checkpoint_is_refused_by_the_dry_run_as_by_the_run(ppo_run, capsys,
                                                                                                   tmp_path):
    """The resumed run's output files must still hold what the checkpoint recorded (`runfolder.check_outputs`)."""
    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    (run / "metrics.jsonl").write_text("")
    args = ["--resume", "--out", str(run), *PPO, "train.steps=2"]
    dry = _error_line(capsys, ["train", "--dry-run", "--no-progress", *args])
    real = _error_line(capsys, ["train", "--no-progress", *args])
    assert dry == real and "metrics.jsonl: 0 bytes but the checkpoint at step 1 recorded" in real, (dry, real)


def _edit_tensors(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, str(path))


def _edit_state(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _optim_shape(t) -> None:
    import torch

    t["0/exp_avg"] = torch.zeros(2, 2)


def _rng_dtype(t) -> None:
    t["cpu"] = t["cpu"].float()


RESUME_CASES = {
    "optimizer-missing": (lambda last: (last / "optimizer.safetensors").unlink(), "missing from the run checkpoint"),
    "optimizer-truncated": (lambda last: _truncate_file(last / "optimizer.safetensors"), "corrupt or truncated"),
    "optimizer-shape": (lambda last: _edit_tensors(last / "optimizer.safetensors", _optim_shape),
                        "optimizer state does not match the model's parameters (index 0)"),
    # AdamW's own check of the param groups (state.json): only torch judges it, so the dry run loads it for real
    "optimizer-groups": (lambda last: _edit_state(last / "state.json", optimizer_groups=[]),
                         "optimizer state does not load"),
    "rng-dtype": (lambda last: _edit_tensors(last / "rng.safetensors", _rng_dtype), "no 1-D uint8 'cpu'"),
    "rng-missing": (lambda last: (last / "rng.safetensors").unlink(), "rng.safetensors: missing"),
}


def _truncate_file(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size - 10])


@pytest.mark.parametrize("case", RESUME_CASES)
def test_a_bad_optimizer_or_generator_file_is_refused_by_the_dry_run_as_by_the_resumed_run(case, ppo_run, capsys,
                                                                                          tmp_path):
    damage, expect = RESUME_CASES[case]
    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    damage(run / "checkpoints" / "last")
    args = ["--resume", "--out", str(run), *PPO, "train.steps=2"]
    dry = _error_line(capsys, ["train", "--dry-run", "--no-progress", *args])
    real = _error_line(capsys, ["train", "--no-progress", *args])
    assert dry == real and expect in real, (dry, real)
