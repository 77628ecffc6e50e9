"""Devices: the settings and their machine checks, the CPU path through the device plumbing (unchanged, same
objects), bfloat16 on the CPU through the whole loop, and (marker `gpu`) the same loop on a CUDA device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from rlhfless.config import load_run_config
from rlhfless.core.devices import as_cpu_float32, cuda_visible, place, resolve_device
from rlhfless.core.errors import ConfigError
from rlhfless.model.factory import load_policy, save_checkpoint
from rlhfless.rollout.engine import SamplingParams, generate
from rlhfless.run.launch import train

SMALL = ["train.steps=2", "train.eval_prompts=0", "rollout.prompts_per_step=4", "algo.group_size=4",
         "rollout.max_new_tokens=12", "train.threads=1", "tracking.mode=disabled", "train.checkpoint_every=0"]
no_cuda = pytest.mark.skipif(cuda_visible() > 0, reason="checks the machine without CUDA")


@pytest.mark.parametrize("override, field", [
    ("train.device=gpu", "train.device"), ("train.device=cuda:x", "train.device"),
    ("train.dtype=float16", "train.dtype"), ("runtime.device=tpu", "runtime.device"),
    ("runtime.functions_per_gpu=0", "runtime.functions_per_gpu"),
    ("runtime.functions_per_gpu=2", "runtime.functions_per_gpu"),  # only with runtime.device=cuda
])
def test_device_settings_are_refused_by_their_form(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(None, [override])


def test_bfloat16_is_inline_only_for_now():
    with pytest.raises(ConfigError, match=r"train\.dtype: bfloat16 runs inline only"):
        load_run_config(None, ["train.dtype=bfloat16", "runtime.mode=serverful"])


@no_cuda
@pytest.mark.parametrize("overrides, field", [
    (["train.device=cuda"], "train.device"), (["train.device=cuda:1"], "train.device"),
    (["runtime.device=cuda", "runtime.mode=serverful"], "runtime.device"),
    (["runtime.device=cuda", "runtime.functions_per_gpu=2", "runtime.mode=serverless"], "runtime.device"),
])
def test_a_cuda_setting_fails_the_machine_check_without_cuda(overrides, field):
    cfg = load_run_config(None, overrides)  # the form is fine; this machine cannot run it
    with pytest.raises(ConfigError) as exc:
        cfg.check_machine()
    msg = str(exc.value)
    assert msg.startswith(field) and "no CUDA device is visible" in msg and "\n" not in msg


@no_cuda
def test_auto_is_the_cpu_without_cuda():
    cfg = load_run_config(None, ["train.device=auto"])
    cfg.check_machine()
    assert resolve_device(cfg.train.device) == torch.device("cpu")


def test_the_cpu_float32_path_touches_nothing(tiny_checkpoint):
    model = load_policy(tiny_checkpoint)
    before = [p.data_ptr() for p in model.parameters()]
    assert place(model, torch.device("cpu"), torch.float32) is model
    with as_cpu_float32(model) as m:
        assert m is model
    assert [p.data_ptr() for p in model.parameters()] == before  # no copy, no move


def test_a_bfloat16_policy_saves_float32_and_keeps_its_optimizer(tiny_checkpoint, tmp_path):
    model = place(load_policy(tiny_checkpoint), torch.device("cpu"), torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    params = list(model.parameters())
    save_checkpoint(model, tmp_path / "ck")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # back where it was
    assert [id(p) for p in model.parameters()] == [id(p) for p in params] == [id(p) for p in opt.param_groups[0]["params"]]
    with safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    back = load_policy(tmp_path / "ck")  # the strict float32 loader takes it
    for (name, a), b in zip(back.named_parameters(), model.parameters()):
        assert torch.equal(a, b.float()), name


def test_a_bfloat16_run_on_the_cpu_learns_without_nan(sft_checkpoint, tmp_path):
    # the shipped SFT policy earns rewards (a random one earns none: every group would be skipped, no update)
    cfg = load_run_config(None, SMALL + [f"policy.checkpoint={sft_checkpoint}", "train.dtype=bfloat16",
                                         "rollout.max_new_tokens=64", "algo.kl_coef=0.01"])
    train(cfg, tmp_path / "bf16", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "actor/loss" in x]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(x["actor/loss"])) for x in steps)
    start = load_file(Path(sft_checkpoint) / "model.safetensors")
    end = load_file(tmp_path / "bf16" / "checkpoints" / "final" / "model.safetensors")
    assert any(not torch.equal(start[k], end[k]) for k in start)  # it learned
    # every weight came out of a bfloat16 model: float32 words with bfloat16's 8 mantissa bits
    assert all(torch.equal(v, v.bfloat16().float()) for v in end.values())


def _greedy(model, prompts, seed=0, temperature=0.0):
    params = SamplingParams(max_new_tokens=24, temperature=temperature)
    return generate(model, prompts, 2, params, seed=seed).responses


PROMPTS = [[5, 9, 13, 2, 7], [5, 9, 13, 4], [8, 3, 3, 3, 3, 1]]


@pytest.mark.gpu
def test_greedy_on_cuda_is_reproducible_and_matches_the_cpu(sft_checkpoint):
    cpu = load_policy(sft_checkpoint)
    want = _greedy(cpu, PROMPTS)
    gpu = place(load_policy(sft_checkpoint), torch.device("cuda:0"), torch.float32)
    got = _greedy(gpu, PROMPTS)
    assert got == _greedy(gpu, PROMPTS)  # same device: reproducible
    same = sum(a == b for a, b in zip(got, want)) / len(want)
    assert same >= 0.8, f"only {same:.0%} of greedy rows match the CPU (kernels differ; near-ties flip)"


@pytest.mark.gpu
def test_sampling_on_cuda_draws_the_cpu_uniforms(sft_checkpoint):
    gpu = place(load_policy(sft_checkpoint), torch.device("cuda:0"), torch.float32)
    a = _greedy(gpu, PROMPTS, seed=3, temperature=1.0)
    assert a == _greedy(gpu, PROMPTS, seed=3, temperature=1.0)
    assert a != _greedy(gpu, PROMPTS, seed=4, temperature=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_inline_loop_runs_on_cuda(tiny_checkpoint, tmp_path, dtype):
    cfg = load_run_config(None, SMALL + [f"policy.checkpoint={tiny_checkpoint}", "train.device=cuda",
                                         f"train.dtype={dtype}", "algo.kl_coef=0.01", "train.eval_prompts=4"])
    summary = train(cfg, tmp_path / dtype, progress=False)
    assert summary["steps"] == 2
    load_policy(tmp_path / dtype / "checkpoints" / "final")  # a float32 checkpoint the CPU loader takes
