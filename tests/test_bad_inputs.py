"""A corpus of bad input, tried as a new user would: every subcommand and every file loader (configs, overrides,
checkpoints, traces, predictors, time profiles, run folders, output paths, counts). Each case must exit 2 with
one line of at most 300 characters naming the field or the file, print no traceback, finish within 10 s and
change no existing file. Cases run in-process through `rlhfless.cli.main` (a few through a real subprocess), so
the whole corpus takes seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rlhfless.cli import main
from rlhfless.core.devices import cuda_visible

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "experiments" / "configs" / "quickstart.yaml"
HUGE = "9" * 5000
BIG = str(2**64)
LIMIT_S = 10
PROGRESS = re.compile(r"\d+%\||it/s\]|Loading weights|Writing model")  # tqdm / transformers bars, not messages


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    expect: str
    """A substring of the one error line: the field, flag or file at fault ({d} = the fixture folder)."""


def C(id: str, argv: list[str] | str, expect: str) -> Case:
    return Case(id, tuple(argv.split() if isinstance(argv, str) else argv), expect)


# --- the fixture folder: bad files of every kind, made once -----------------------------------------------
BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9 if p else ['x'] * 9)}]\n"
               for p, c in zip([None, "a", "b", "c", "d", "e", "f"], "abcdefg"))
MERGE_BOMB = "a: &a {x: 1, y: 2}\n" + "".join(
    f"{n}: &{n} {{<<: [{', '.join(['*' + q] * 8)}]}}\n" for q, n in zip("abcdefgh", "bcdefghi"))
CONFIG_FILES = {
    "bomb.yaml": BOMB,
    "merge_bomb.yaml": MERGE_BOMB,
    "many_aliases.yaml": "a: &a 1\nb: [" + ", ".join(["*a"] * 200) + "]\n",
    "deep.yaml": "train: " + "[" * 3000 + "]" * 3000 + "\n",
    "deep_map.yaml": "".join("  " * i + f"k{i}:\n" for i in range(60)) + "  " * 60 + "v: 1\n",
    "huge_int.yaml": f"train:\n  steps: {HUGE}\n",
    "big_int.yaml": f"train:\n  steps: {BIG}\n",
    "inf_lr.yaml": "optim:\n  lr: .inf\n",
    "nan_lr.yaml": "optim:\n  lr: .nan\n",
    "overflow_lr.yaml": "optim:\n  lr: 1e999\n",
    "long_string.yaml": "task:\n  name: " + "x" * 100_000 + "\n",
    "list_top.yaml": "- 1\n- 2\n",
    "string_top.yaml": "just a sentence\n",
    "unknown_key.yaml": "bogus: 3\n",
    "unknown_nested.yaml": "train:\n  stepz: 3\n",
    "tabs.yaml": "train:\n\tsteps: 3\n",
    "unclosed.yaml": "plan:\n  policy: [unclosed\n",
    "python_tag.yaml": "plan:\n  policy: !!python/object/apply:os.system ['true']\n",
    "section_scalar.yaml": "train: 3\n",
    "wrong_type.yaml": "rollout:\n  temperature: hot\n",
    "bool_int.yaml": "train:\n  steps: true\n",
    "defaults_missing.yaml": "defaults: nowhere.yaml\n",
    "defaults_cycle.yaml": "defaults: defaults_cycle.yaml\n",
    "defaults_list.yaml": "defaults: [a, b]\n",
    "dup_anchor_key.yaml": "? [1, 2]\n: x\n",
    "cross_field.yaml": "plan:\n  capacity: 1\n",
    # a key twice: YAML's last-one-wins would drop the first silently (issue 32)
    "dup_key.yaml": "train:\n  steps: 3\n  steps: 4\n",
    "dup_section.yaml": "train:\n  steps: 3\noptim:\n  lr: 1.0e-4\ntrain:\n  seed: 2\n",
    "dup_flow.yaml": "optim: {lr: 1.0e-4, lr: 2.0e-4}\n",
}
BINARY_FILES = {
    "latin1.yaml": "train:\n  name: caf\xe9\n".encode("latin-1"),
    "garbage.yaml": bytes(range(256)) * 4,
    "nul.yaml": b"train:\n  steps: 3\x00\n",
    "big.yaml": b"# " + b"x" * (1 << 20) + b"\n",
}


def _trace_row(**kw) -> dict:
    row = {"step": 1, "epoch": 0, "prompt_id": "p0", "prompt": "1+1", "sample_index": 0, "response_length": 5,
           "truncated": False, "reward": 1.0}
    return {**row, **kw}


def _rollout_row(**kw) -> dict:
    """A row of a run's traces/rollouts.jsonl (what `runtime.length_trace` replays)."""
    row = {"prompt_id": "p0", "prompt": "7+3=", "epoch": 0, "step": 1, "sample": 0, "prompt_len": 4,
           "response_len": 5, "truncated": False, "reward": 1.0}
    return {**row, **kw}


def _make(d: Path) -> None:
    for name, text in CONFIG_FILES.items():
        (d / name).write_text(text)
    for name, data in BINARY_FILES.items():
        (d / name).write_bytes(data)
    (d / "adir").mkdir()
    (d / "afile").write_text("not a folder\n")
    (d / "notempty").mkdir()
    (d / "notempty" / "keep.txt").write_text("mine\n")
    run = d / "run"  # an earlier run's folder (its config) with a damaged checkpoint
    (run / "checkpoints" / "last").mkdir(parents=True)
    from dataclasses import asdict

    from rlhfless.config import load_run_config

    (run / "config.yaml").write_text(yaml.safe_dump(asdict(load_run_config(QUICKSTART))))
    (run / "checkpoints" / "last" / "state.json").write_text("{not json")
    for name, state in {"run_fmt": {"format": "other"}, "run_ver": {"format": "rlhfless-run-checkpoint", "version": 9},
                        "run_fields": {"format": "rlhfless-run-checkpoint", "version": 1, "step": 1},
                        "run_types": {"format": "rlhfless-run-checkpoint", "version": 1, "step": -1,
                                      "learner_updates": 0, "last_grad_norm": None, "stream_epoch": 0,
                                      "stream_pos": 0, "rewards": []}}.items():
        (d / name / "checkpoints" / "last").mkdir(parents=True)
        (d / name / "config.yaml").write_text((run / "config.yaml").read_text())
        (d / name / "checkpoints" / "last" / "state.json").write_text(json.dumps(state))
    for name in ("run_dangling", "run_incomplete"):  # a run that had a checkpoint, now a dead link or half gone
        (d / name / "checkpoints").mkdir(parents=True)
        (d / name / "config.yaml").write_text((run / "config.yaml").read_text())
    os.symlink(d / "run_dangling" / "checkpoints" / "gone", d / "run_dangling" / "checkpoints" / "last")
    (d / "run_incomplete" / "checkpoints" / "last").mkdir()
    (d / "run_nockpt").mkdir()
    (d / "run_nockpt" / "config.yaml").write_text((run / "config.yaml").read_text())
    (d / "run_badcfg" / "checkpoints").mkdir(parents=True)
    (d / "run_badcfg" / "config.yaml").write_text("[1, 2")
    # traces and length data
    (d / "empty.jsonl").write_text("")
    # price files of `plan what-if --prices`
    (d / "prices_kind.yaml").write_text("TPU: {serverless_usd_per_s: 0.001}\n")
    (d / "prices_neg.yaml").write_text("H100: {serverless_usd_per_s: -1}\n")
    (d / "prices_key.yaml").write_text("H100: {hourly: 3}\n")
    (d / "prices_str.yaml").write_text("H100: {ondemand_usd_per_h: cheap}\n")
    (d / "prices_nan.yaml").write_text("H100: {ondemand_usd_per_h: .nan}\n")
    (d / "prices_list.yaml").write_text("- H100\n")
    (d / "notjson.jsonl").write_text("{oops\n")
    (d / "random.bin").write_bytes(bytes((i * 7919 + 13) % 256 for i in range(3000)))  # bytes, not text
    (d / "nonint_len.jsonl").write_text(json.dumps(_rollout_row(response_len="long")) + "\n")
    (d / "frac_len.jsonl").write_text(json.dumps(_rollout_row(response_len=2.5)) + "\n")
    # a task whose every prompt is longer than the checkpoint's whole context (512 tokens)
    (d / "longq.jsonl").write_text("".join(json.dumps({"question": f"what is {i}+" + "1+" * 400 + "1",
                                                       "answer": "401"}) + "\n" for i in range(40)))
    (d / "list.jsonl").write_text("[1, 2]\n")
    (d / "missing_field.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    (d / "neg_len.jsonl").write_text(json.dumps(_trace_row(response_length=-3)) + "\n")
    (d / "nan_len.jsonl").write_text(json.dumps(_trace_row(response_length=float("nan"))) + "\n")
    (d / "huge_len.jsonl").write_text('{"prompt_id": "p", "prompt": "q", "response_length": ' + HUGE + "}\n")
    (d / "latin1.jsonl").write_bytes('{"prompt_id": "caf\xe9"}\n'.encode("latin-1"))
    (d / "bad.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with gzip.open(d / "empty.jsonl.gz", "wt") as f:
        f.write("")
    # predictors and time profiles
    for name, text in {"pred_garbage": "{oops", "pred_list": "[]", "pred_fmt": json.dumps({"format": 99}),
                       "pred_name": json.dumps({"format": 2, "name": "oracle", "config": {}, "state": {}})}.items():
        (d / name).mkdir()
        (d / name / "predictor.json").write_text(text)
    (d / "pred_none").mkdir()
    (d / "profile_keys.json").write_text(json.dumps({"x": 1}))
    (d / "profile_bad.json").write_text("{oops")
    (d / "profile_list.json").write_text("[1, 2, 3]")
    (d / "profile_nan.json").write_text('{"rows": [[1, NaN]]}')
    # checkpoints
    (d / "ckpt_empty").mkdir()
    (d / "ckpt_badcfg").mkdir()
    (d / "ckpt_badcfg" / "config.json").write_text("{oops")
    (d / "ckpt_trunc").mkdir()
    (d / "ckpt_trunc" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (d / "ckpt_trunc" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    for name, text in {"run_bomb": BOMB, "run_list": "[1, 2]\n"}.items():  # an earlier run's config.yaml
        (d / name / "checkpoints" / "last").mkdir(parents=True)
        (d / name / "config.yaml").write_text(text)
        (d / name / "checkpoints" / "last" / "state.json").write_text(
            (d / "run_types" / "checkpoints" / "last" / "state.json").read_text().replace('"step": -1', '"step": 0'))
    # JSON files holding an integer of thousands of digits, or nesting thousands deep (Python cannot read either)
    (d / "ckpt_hugeint").mkdir()
    (d / "ckpt_hugeint" / "config.json").write_text('{"hidden_size": ' + HUGE + "}")
    (d / "profile_hugeint.json").write_text('{"rows": [{"batch_size": ' + HUGE + ', "s_per_iter": 1}]}')
    (d / "pred_hugeint").mkdir()
    (d / "pred_hugeint" / "predictor.json").write_text('{"format": ' + HUGE + "}")
    (d / "pred_deep").mkdir()
    (d / "pred_deep" / "predictor.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (d / "run_hugeint" / "checkpoints" / "last").mkdir(parents=True)
    (d / "run_hugeint" / "config.yaml").write_text((run / "config.yaml").read_text())
    (d / "run_hugeint" / "checkpoints" / "last" / "state.json").write_text('{"step": ' + HUGE + "}")
    _make_nan_weights(d, run)
    os.symlink(d / "loop", d / "loop")  # a symlink loop


def _make_nan_weights(d: Path, run: Path) -> None:
    """A checkpoint whose weights are all NaN, one with a single infinity, and a run whose last checkpoint holds
    the NaN weights (state and config otherwise fine): each must be refused where it is loaded, naming the tensor
    and the file."""
    import shutil

    from safetensors.torch import load_file, save_file

    sft = REPO / "data" / "checkpoints" / "sft"
    for name, damage in {"ckpt_nan": "nan", "ckpt_inf": "inf"}.items():
        shutil.copytree(sft, d / name)
        weights = load_file(sft / "model.safetensors")
        if damage == "nan":
            weights = {k: v * float("nan") for k, v in weights.items()}
        else:
            weights[sorted(weights)[-1]].view(-1)[0] = float("inf")
        save_file(weights, str(d / name / "model.safetensors"), metadata={"format": "pt"})
    last = d / "run_nan" / "checkpoints" / "last"
    shutil.copytree(d / "ckpt_nan", last)
    (d / "run_nan" / "config.yaml").write_text((run / "config.yaml").read_text())
    (last / "state.json").write_text(json.dumps({"format": "rlhfless-run-checkpoint", "version": 1, "step": 0,
                                                 "learner_updates": 0, "last_grad_norm": None, "stream_epoch": 0,
                                                 "stream_pos": 0, "rewards": []}))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    _make(d)
    import transformers  # noqa: F401  (imported once here, so no case pays the import against its 10 s)
    from transformers import Qwen2ForCausalLM  # noqa: F401  (its modelling modules: seconds more on a busy machine)

    return d


# --- the cases -------------------------------------------------------------------------------------------
DRY = ["train", "--dry-run", "--no-progress", "--config", str(QUICKSTART)]
INT_FIELDS = ["rollout.prompts_per_step", "rollout.max_new_tokens", "algo.group_size", "train.steps", "train.seed",
              "train.threads", "train.eval_prompts", "train.checkpoint_every", "optim.warmup_steps",
              "plan.max_actors", "plan.capacity", "runtime.units", "plan.min_actors"]
INT_BAD = {"huge": HUGE, "int64": BIG, "neg": "-1", "word": "many", "frac": "1.5", "bool": "true", "list": "[1, 2]"}
FLOAT_FIELDS = ["optim.lr", "optim.weight_decay", "optim.grad_clip", "rollout.temperature", "rollout.top_p",
                "algo.clip_eps_low", "algo.kl_coef", "plan.tau", "plan.lam", "runtime.keep_alive_s"]
FLOAT_BAD = {"inf": "inf", "yinf": ".inf", "ninf": "-.inf", "nan": ".nan", "overflow": "1e999", "word": "hot",
             "map": "{a: 1}"}

CASES: list[Case] = []
CASES += [C(f"override-{f}-{k}", [*DRY, f"{f}={v}"], f) for f in INT_FIELDS for k, v in INT_BAD.items()]
CASES += [C(f"override-{f}-{k}", [*DRY, f"{f}={v}"], f) for f in FLOAT_FIELDS for k, v in FLOAT_BAD.items()]
CASES += [
    C("override-unknown-key", [*DRY, "rollout.group_size=8"], "rollout.group_size"),
    C("override-no-equals", [*DRY, "train.steps"], "train.steps"),
    C("override-empty-key", [*DRY, "=8"], "override"),
    C("override-not-a-section", [*DRY, "train.steps.x=1"], "train.steps"),
    C("override-bad-yaml", [*DRY, "train.steps=[1"], "train.steps"),
    C("override-alias-bomb", [*DRY, "train.steps=" + BOMB.replace("\n", ", ").join("{}")], "train.steps"),
    C("override-deep", [*DRY, "train.steps=" + "[" * 500 + "]" * 500], "train.steps"),
    C("override-long", [*DRY, "task.name=" + "x" * 20_000], "task.name"),
    C("override-control-char", [*DRY, "task.name=\x07"], "task.name"),
    C("override-mixed-stray-word", [*DRY, "train.steps=2", "--out", "{d}/new", "oops"], "unrecognized"),
    C("override-unknown-option", [*DRY, "--bogus"], "--bogus"),
    C("override-runtime-units", [*DRY, "runtime.units=4096"], "runtime.units"),
    C("override-learner-units", [*DRY, "runtime.units=1", "runtime.learner_units=2"], "runtime.learner_units"),
    C("override-mode", [*DRY, "runtime.mode=lambda"], "runtime.mode"),
    C("override-hybrid", [*DRY, "runtime.hybrid=sometimes"], "runtime.hybrid"),
    # issue 30: the serverless design as one switch, emulated devices
    C("override-design", [*DRY, "runtime.design=ours"], "runtime.design"),
    C("override-design-contradiction", [*DRY, "runtime.mode=serverless", "runtime.design=paper",
                                        "runtime.hybrid=true"], "runtime.hybrid"),
    C("override-time-scale", [*DRY, "runtime.time_scale=0"], "runtime.time_scale"),
    C("override-emulated-units", [*DRY, "runtime.device=emulated"], "runtime.units"),
    # the scaler's warm bills and hybrid functions (issue 19; the simulator sets them per step)
    C("override-warm-bill", [*DRY, "plan.warm_bill_s=-1"], "plan.warm_bill_s"),
    C("override-warm-bill-inf", [*DRY, "plan.warm_bill_s=.inf"], "plan.warm_bill_s"),
    C("override-hybrid-warm", [*DRY, "plan.hybrid_warm=-1"], "plan.hybrid_warm"),
    C("override-hybrid-warm-frac", [*DRY, "plan.hybrid_warm=1.5"], "plan.hybrid_warm"),
    C("override-hybrid-sync", [*DRY, "plan.hybrid_sync_s=-0.1"], "plan.hybrid_sync_s"),
    C("override-release-cold", [*DRY, "plan.learner.release_cold_s=-1"], "plan.learner.release_cold_s"),
    C("override-release-cold-nan", [*DRY, "plan.learner.release_cold_s=.nan"], "plan.learner.release_cold_s"),
    C("override-prewarm-bill", [*DRY, "plan.learner.prewarm_bill_s=-2"], "plan.learner.prewarm_bill_s"),
    C("override-policy", [*DRY, "plan.policy=fastest"], "plan.policy"),
    C("override-engine", [*DRY, "rollout.engine=tgi"], "rollout.engine"),
    C("override-task", [*DRY, "task.name=chess"], "task.name"),
    C("override-serverless-noplan", [*DRY, "runtime.mode=serverless", "train.plan=false"], "train.plan"),
    C("override-capacity-group", [*DRY, "plan.capacity=2"], "plan.capacity"),
    C("override-ray-address", [*DRY, "runtime.ray_address=auto"], "runtime.ray_address"),
    C("override-scratch-dir", [*DRY, "runtime.scratch_dir={d}/afile"], "runtime.scratch_dir"),
    C("override-wandb-bad", [*DRY, "--wandb", "cloud"], "--wandb"),
    C("allow-change-without-resume", [*DRY, "--allow-config-change"], "--allow-config-change"),
    C("resume-compare", ["train", "--resume", "--out", "{d}/run", "runtime.mode=compare"], "runtime.mode=compare"),
]
# devices (issue 21): the form anywhere; a CUDA setting where torch sees no CUDA device, before any work
CASES += [
    C("device-form", [*DRY, "train.device=gpu"], "train.device"),
    C("device-dtype", [*DRY, "train.dtype=float16"], "train.dtype"),
    C("device-runtime-form", [*DRY, "runtime.device=tpu"], "runtime.device"),
    C("device-functions-per-gpu-cpu", [*DRY, "runtime.functions_per_gpu=2"], "runtime.functions_per_gpu"),
]
CASES += [
    C("profile-model", ["profile", "--out", "{d}/p.json", "--model", "gpt2"], "--model"),
    C("profile-device-form", ["profile", "--out", "{d}/p.json", "--device", "tpu"], "--device"),
    C("profile-batch-sizes", ["profile", "--out", "{d}/p.json", "--batch-sizes", "4,x"], "--batch-sizes"),
    C("profile-contexts-tiny", ["profile", "--out", "{d}/p.json", "--contexts", "4096", "--no-cold-start"],
      "--contexts"),
    C("profile-out-folder", ["profile", "--out", "{d}/adir"], "--out"),
]
if not cuda_visible():
    CASES += [
        C("nocuda-profile", ["profile", "--out", "{d}/p.json", "--device", "cuda", "--model", "qwen2.5-0.5b"],
          "--device"),
        C("nocuda-train-device", [*DRY, "train.device=cuda"], "train.device"),
        C("nocuda-train-device-k", [*DRY, "train.device=cuda:3"], "train.device"),
        C("nocuda-runtime-device", [*DRY, "runtime.mode=serverless", "runtime.device=cuda"], "runtime.device"),
        C("nocuda-functions-per-gpu", [*DRY, "runtime.mode=serverful", "runtime.device=cuda",
                                       "runtime.functions_per_gpu=2"], "runtime.device"),
        C("nocuda-train-run", ["train", "--no-progress", "--out", "{d}/gpu_run", "train.device=cuda"], "train.device"),
    ]
CASES += [C(f"config-{n}", [*DRY[:3], "--config", f"{{d}}/{n}"], n)
          for n in [*CONFIG_FILES, *BINARY_FILES] if n not in ("defaults_missing.yaml", "cross_field.yaml")]
CASES += [
    C("config-defaults-missing", [*DRY[:3], "--config", "{d}/defaults_missing.yaml"], "nowhere.yaml"),
    C("config-cross-field", [*DRY[:3], "--config", "{d}/cross_field.yaml"], "plan.capacity"),
    C("config-missing", [*DRY[:3], "--config", "{d}/nope.yaml"], "nope.yaml"),
    C("config-is-folder", [*DRY[:3], "--config", "{d}/adir"], "adir"),
    C("config-dev-null-dir", [*DRY[:3], "--config", "/dev"], "/dev"),
]
# output folders and files
CASES += [
    C("train-out-empty", ["train", "--out", "", "train.steps=1"], "--out"),
    C("train-out-dot", ["train", "--out", ".", "train.steps=1"], "current folder"),
    C("train-out-data", ["train", "--out", str(REPO / "data")], "--out"),
    C("train-out-data-sft", ["train", "--out", str(REPO / "data" / "checkpoints" / "sft")], "--out"),
    C("train-out-data-new", ["train", "--out", str(REPO / "data" / "runs-new")], "inside"),
    C("train-out-repo", ["train", "--out", str(REPO)], "--out"),
    C("train-out-root", ["train", "--out", "/"], "--out"),
    C("train-out-file", ["train", "--out", "{d}/afile"], "is a file"),
    C("train-out-under-file", ["train", "--out", "{d}/afile/run"], "afile"),
    C("train-out-not-run", ["train", "--out", "{d}/notempty"], "not a run"),
    C("train-out-earlier-run", ["train", "--out", "{d}/run"], "--resume"),
    C("train-out-nul", ["train", "--out", "{d}/a\x00b"], "NUL"),
    C("train-no-out", ["train", "train.steps=1"], "--out"),
    C("train-resume-not-run", ["train", "--resume", "--out", "{d}/notempty"], "--resume"),
    C("train-resume-new", ["train", "--resume", "--out", "{d}/never"], "--resume"),
    C("pretrain-out-sft", ["pretrain", "--out", str(REPO / "data" / "checkpoints" / "sft"), "steps=1"],
      "never overwrites"),
    C("pretrain-out-notempty", ["pretrain", "--out", "{d}/notempty", "steps=1"], "never overwrites"),
    C("pretrain-out-file", ["pretrain", "--out", "{d}/afile"], "is a file"),
    C("pretrain-out-empty", ["pretrain", "--out", ""], "--out"),
    C("pretrain-out-data", ["pretrain", "--out", str(REPO / "data")], "--out"),
    C("pretrain-bad-override", ["pretrain", "--out", "{d}/p1", "steps=-4"], "steps"),
    C("pretrain-unknown-key", ["pretrain", "--out", "{d}/p2", "stepz=4"], "stepz"),
    C("pretrain-huge", ["pretrain", "--out", "{d}/p3", f"steps={HUGE}"], "steps"),
    C("json-folder-compare", ["predictor", "compare", "--data", "{d}/empty.jsonl", "--json", "{d}/adir"], "--json"),
    C("json-empty-stats", ["data", "trace-stats", "--trace", "{d}/empty.jsonl", "--json", ""], "--json"),
    C("json-folder-planner", ["bench", "planner", "--json", "{d}/adir"], "--json"),
    C("json-under-file", ["bench", "planner", "--json", "{d}/afile/x.json"], "afile"),
    C("json-folder-simulate", ["simulate", "--scenario", "quick", "--json", "{d}/adir"], "--json"),
    C("json-folder-loop", ["bench", "loop", "--json", "{d}/adir"], "--json"),
    C("figure-folder", ["predictor", "compare", "--data", "{d}/empty.jsonl", "--json", "{d}/c.json",
                        "--figure", "{d}/adir"], "--figure"),
    C("data-out-folder", ["data", "synthetic-trace", "--out", "{d}/adir"], "--out"),
    C("gsm8k-out-folder", ["data", "gsm8k-lengths", "--in", "{d}/empty.jsonl", "--out", "{d}/adir"], "--out"),
    C("predictor-out-file", ["predictor", "train", "--data", "{d}/empty.jsonl", "--model", "ewma", "--out",
                             "{d}/afile"], "--out"),
    C("predictor-out-dot", ["predictor", "train", "--data", "{d}/empty.jsonl", "--model", "ewma", "--out", "."],
      "--out"),
    C("simulate-out-file", ["simulate", "--scenario", "quick", "--out", "{d}/afile"], "--out"),
    C("repro-out-file", ["repro", "--out", "{d}/afile"], "--out"),
    C("build-hf-out-data", ["build-hf-model", "--out", str(REPO / "data")], "--out"),
]
# counts of the benchmarks and the simulator
CASES += [C(f"bench-planner-{flag}-{v}", ["bench", "planner", f"--{flag}", v], f"--{flag}")
          for flag in ("groups", "group-size", "n-actors", "candidates", "capacity", "repeats")
          for v in ("0", "-1", HUGE[:40])]
CASES += [
    C("bench-planner-word", ["bench", "planner", "--groups", "many"], "--groups"),
    C("bench-planner-policy", ["bench", "planner", "--policy", "fastest", "--groups", "4", "--repeats", "1"],
      "policy"),
    C("bench-loop-steps-1", ["bench", "loop", "--steps", "1"], "--steps"),
    C("bench-loop-steps-0", ["bench", "loop", "--steps", "0"], "--steps"),
    C("bench-loop-steps-neg", ["bench", "loop", "--steps", "-5"], "--steps"),
    C("bench-loop-threads", ["bench", "loop", "--threads", "0"], "--threads"),
    C("bench-loop-feature", ["bench", "loop", "--feature", "turbo"], "--feature"),
    C("bench-loop-bad-override", ["bench", "loop", "--steps", "2", "optim.lr=inf", "--no-progress"], "optim.lr"),
    C("bench-loop-config", ["bench", "loop", "--steps", "2", "--config", "{d}/bomb.yaml"], "bomb.yaml"),
    C("bench-prefill-prompts", ["bench", "prefill", "--json", "{d}/p.json", "--prompts", "0"], "--prompts"),
    C("bench-prefill-repeats", ["bench", "prefill", "--json", "{d}/p.json", "--repeats", HUGE], "--repeats"),
    C("bench-engine-tokens", ["bench", "engine", "--json", "{d}/e.json", "--max-new-tokens", "0"],
      "--max-new-tokens"),
    C("bench-engine-group", ["bench", "engine", "--json", "{d}/e.json", "--group-size", "-2"], "--group-size"),
    C("bench-faults-kills", ["bench", "faults", "--json", "{d}/f.json", "--kills", "-1"], "--kills"),
    C("bench-faults-repeats-zero", ["bench", "faults", "--json", "{d}/f.json", "--repeats", "0"], "--repeats"),
    C("bench-faults-repeats-huge", ["bench", "faults", "--json", "{d}/f.json", "--repeats", HUGE], "--repeats"),
    C("train-profile-cache-type", [*DRY, "runtime.profile_cache=[1, 2]"], "runtime.profile_cache"),
    C("train-measure-profile-type", [*DRY, "runtime.measure_profile=sometimes"], "runtime.measure_profile"),
    C("bench-faults-config", ["bench", "faults", "--json", "{d}/f.json", "--config", "{d}/inf_lr.yaml"],
      "optim.lr"),
    C("simulate-baseline", ["simulate", "--scenario", "quick", "baseline=verl"], "baseline"),
    C("simulate-net-eff", ["simulate", "--scenario", "quick", "net_eff=2"], "net_eff"),
    C("simulate-kv-rebuild", ["simulate", "--scenario", "quick", "kv_rebuild_s=-1"], "kv_rebuild_s"),
    C("simulate-steps-huge", ["simulate", "--scenario", "quick", "--steps", "1000000000000"], "--steps"),
    C("simulate-steps-zero", ["simulate", "--scenario", "quick", "--steps", "0"], "--steps"),
    C("simulate-steps-digits", ["simulate", "--scenario", "quick", "--steps", HUGE], "--steps"),
    C("simulate-steps-override", ["simulate", "--scenario", "quick", "steps=1000000000000"], "steps"),
    C("simulate-scenario", ["simulate", "--scenario", "mars"], "scenario"),
    C("simulate-no-scenario", ["simulate"], "scenario"),
    C("simulate-bad-key", ["simulate", "--scenario", "quick", "speed=3"], "speed"),
    C("simulate-lam-inf", ["simulate", "--scenario", "quick", "lam=inf"], "lam"),
    C("simulate-huge-override", ["simulate", "--scenario", "quick", f"n_devices={HUGE}"], "n_devices"),
    C("simulate-validate-missing", ["simulate", "--validate", "{d}/nope"], "nope"),
    C("simulate-validate-notrun", ["simulate", "--validate", "{d}/notempty"], "notempty"),
    C("simulate-validate-scenario", ["simulate", "--validate", "{d}/run", "--scenario", "quick"], "validate"),
    C("plan-trace-missing", ["bench", "plan-trace", "--trace", "{d}/nope.jsonl"], "nope.jsonl"),
    C("plan-trace-empty", ["bench", "plan-trace", "--trace", "{d}/empty.jsonl"], "empty.jsonl"),
    C("plan-trace-notjson", ["bench", "plan-trace", "--trace", "{d}/notjson.jsonl"], "notjson.jsonl"),
    C("plan-trace-gz", ["bench", "plan-trace", "--trace", "{d}/bad.jsonl.gz"], "bad.jsonl.gz"),
    C("plan-trace-config", ["bench", "plan-trace", "--trace", "{d}/empty.jsonl", "--config", "{d}/bomb.yaml"],
      "bomb.yaml"),
    C("plan-trace-set", ["bench", "plan-trace", "--trace", "{d}/empty.jsonl", "--set", "tau=.nan"], "tau"),
    C("plan-trace-n-actors", ["bench", "plan-trace", "--trace", "{d}/empty.jsonl", "--n-actors", "0"],
      "--n-actors"),
]
# traces, length data, predictors
for name in ("empty.jsonl", "notjson.jsonl", "list.jsonl", "missing_field.jsonl", "latin1.jsonl", "bad.jsonl.gz",
             "empty.jsonl.gz", "nope.jsonl", "adir", "deep.jsonl", "huge_len.jsonl"):
    CASES.append(C(f"trace-stats-{name}", ["data", "trace-stats", "--trace", f"{{d}}/{name}"], name))
    CASES.append(C(f"predictor-train-{name}", ["predictor", "train", "--data", f"{{d}}/{name}", "--model", "ewma",
                                               "--out", "{d}/pt-" + name, "--no-progress"], name))
for name in ("neg_len.jsonl", "nan_len.jsonl"):
    CASES.append(C(f"predictor-train-{name}", ["predictor", "train", "--data", f"{{d}}/{name}", "--model", "ewma",
                                               "--out", "{d}/pt-" + name, "--no-progress"], name))
CASES += [
    C("predictor-train-model", ["predictor", "train", "--data", "{d}/empty.jsonl", "--model", "oracle", "--out",
                                "{d}/pt"], "oracle"),
    C("predictor-train-set", ["predictor", "train", "--data", "{d}/empty.jsonl", "--model", "ewma", "--out",
                              "{d}/pt", "--set", "alpha=inf"], "alpha"),
    C("predictor-train-set-nested", ["predictor", "train", "--data", "{d}/empty.jsonl", "--model", "ewma", "--out",
                                     "{d}/pt", "--set", "a.b=1"], "--set"),
    C("predictor-train-test-frac", ["predictor", "train", "--data", "{d}/empty.jsonl", "--model", "ewma", "--out",
                                    "{d}/pt", "--test-frac", "nan"], "--test-frac"),
    C("predictor-compare-models", ["predictor", "compare", "--data", "{d}/empty.jsonl", "--json", "{d}/c.json",
                                   "--models", "ewma,psychic"], "--models"),
    C("predictor-compare-actors", ["predictor", "compare", "--data", "{d}/empty.jsonl", "--json", "{d}/c.json",
                                   "--actors", "0"], "--actors"),
    C("predictor-compare-data", ["predictor", "compare", "--data", "{d}/notjson.jsonl", "--json", "{d}/c.json",
                                 "--no-progress"], "notjson.jsonl"),
    C("predictor-eval-actors", ["predictor", "eval", "--model", "{d}/pred_garbage", "--data", "{d}/empty.jsonl",
                                "--actors", "0"], "--actors"),
    C("data-synthetic-set", ["data", "synthetic-trace", "--out", "{d}/s.jsonl", "--set", "n_prompts=-1"],
      "n_prompts"),
    C("data-synthetic-set-inf", ["data", "synthetic-trace", "--out", "{d}/s.jsonl", "--set", "n_prompts=.inf"],
      "n_prompts"),
    C("data-synthetic-fit", ["data", "synthetic-trace", "--out", "{d}/s.jsonl", "--fit-from", "{d}/notjson.jsonl"],
      "notjson.jsonl"),
    C("data-gsm8k-missing", ["data", "gsm8k-lengths", "--in", "{d}/nope.jsonl", "--out", "{d}/g.jsonl"],
      "nope.jsonl"),
    C("data-gsm8k-notjson", ["data", "gsm8k-lengths", "--in", "{d}/notjson.jsonl", "--out", "{d}/g.jsonl"],
      "notjson.jsonl"),
]
for name in ("pred_garbage", "pred_list", "pred_fmt", "pred_name", "pred_none", "nope", "afile", "pred_hugeint",
             "pred_deep"):
    CASES.append(C(f"predictor-eval-{name}", ["predictor", "eval", "--model", f"{{d}}/{name}", "--data",
                                              "{d}/empty.jsonl", "--no-progress"], name))
    CASES.append(C(f"predictor-convert-{name}", ["predictor", "convert", "--model", f"{{d}}/{name}", "--out",
                                                 "{d}/conv-" + name], name))
# time profiles, checkpoints and run folders reached by the dry run
for name in ("profile_keys.json", "profile_bad.json", "profile_list.json", "profile_nan.json", "nope.json",
             "profile_hugeint.json"):
    CASES.append(C(f"profile-{name}", [*DRY, f"plan.time_profile={{d}}/{name}"], name))
CASES.append(C("profile-plan-trace", ["bench", "plan-trace", "--trace", "{d}/empty.jsonl", "--set",
                                      "time_profile={d}/profile_bad.json"], "profile_bad.json"))
for name in ("ckpt_empty", "ckpt_badcfg", "ckpt_trunc", "afile", "nope", "ckpt_hugeint"):
    CASES.append(C(f"checkpoint-{name}", [*DRY, f"policy.checkpoint={{d}}/{name}"], name))
for name in ("run", "run_fmt", "run_ver", "run_fields", "run_types", "run_nockpt", "run_hugeint"):
    CASES.append(C(f"resume-dry-{name}", [*DRY, "--resume", "--out", f"{{d}}/{name}"], name))
CASES += [
    C("resume-bomb-config", [*DRY, "--resume", "--out", "{d}/run_bomb"], "run_bomb"),
    C("resume-list-config", [*DRY, "--resume", "--out", "{d}/run_list"], "run_list"),
    C("validate-bomb-config", ["simulate", "--validate", "{d}/run_bomb"], "run_bomb"),
    C("validate-list-config", ["simulate", "--validate", "{d}/run_list"], "run_list"),
    C("resume-real-run", ["train", "--resume", "--no-progress", "--out", "{d}/run_fmt", "--config",
                          str(QUICKSTART)], "run_fmt"),
    C("resume-bad-config", ["train", "--resume", "--dry-run", "--no-progress", "--out", "{d}/run_badcfg", "--config",
                            str(QUICKSTART)], "run_badcfg"),
    C("repro-unknown", ["repro", "--out", "{d}/r", "nosuchstudy"], "nosuchstudy"),
    C("repro-no-out", ["repro"], "--out"),
    C("build-hf-vocab", ["build-hf-model", "--out", "{d}/hf", "--vocab", "10"], "vocab"),
    C("build-hf-corpus", ["build-hf-model", "--out", "{d}/hf2", "--corpus", "{d}/nope.jsonl"], "nope.jsonl"),
    C("unknown-command", ["fly"], "fly"),
    C("no-command", [], "COMMAND"),
]


# issue 32: refused instead of clamped, non-finite weights, OS errors, output paths, progress bars, W&B
NOPROG = ["train", "--dry-run", "--config", str(QUICKSTART)]  # the progress bars on: they end before the error
CASES += [
    C("eval-prompts-beyond-split", [*DRY, "train.eval_prompts=1000000000000"], "train.eval_prompts"),
    C("eval-prompts-split-plus-one", [*DRY, "train.eval_prompts=1001"], "held-out split has 1000"),
    C("config-dup-key-lines", [*DRY[:3], "--config", "{d}/dup_key.yaml"], "'steps' at lines 2 and 3"),
    C("config-dup-section-lines", [*DRY[:3], "--config", "{d}/dup_section.yaml"], "'train' at lines 1 and 5"),
    C("config-dup-flow", [*DRY[:3], "--config", "{d}/dup_flow.yaml"], "duplicate key 'lr'"),
    C("override-dup-key", [*DRY, "train={steps: 3, steps: 4}"], "duplicate key 'steps'"),
    C("checkpoint-nan", [*DRY, "policy.checkpoint={d}/ckpt_nan"], "ckpt_nan/model.safetensors: tensor"),
    C("checkpoint-inf", [*DRY, "policy.checkpoint={d}/ckpt_inf"], "ckpt_inf/model.safetensors: tensor"),
    C("checkpoint-nan-run", ["train", "--no-progress", "--out", "{d}/nanrun", "policy.checkpoint={d}/ckpt_nan",
                             "train.steps=1"], "NaN or infinite"),
    C("resume-dry-nan-weights", [*DRY, "--resume", "--out", "{d}/run_nan"], "run_nan/checkpoints/last/model"),
    C("out-symlink-loop", ["train", "--out", "{d}/loop", "train.steps=1"], "symlink loop"),
    C("out-under-symlink-loop", ["train", "--out", "{d}/loop/run", "train.steps=1"], "symlink loop"),
    C("json-symlink-loop", ["bench", "planner", "--json", "{d}/loop/x.json"], "symlink loop"),
    C("json-dev-full", ["bench", "planner", "--json", "/dev/full", "--groups", "2", "--repeats", "1",
                        "--n-actors", "2", "--candidates", "2"], "'/dev/full': no space left"),
    C("json-nonexistent-parent", ["bench", "planner", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    C("json-nonexistent-parent-simulate", ["simulate", "--scenario", "quick", "--json", "/nonexistent/d/x.json"],
      "/nonexistent/d"),
    C("data-out-nonexistent-parent", ["data", "synthetic-trace", "--out", "/nonexistent/dir/s.jsonl"],
      "does not exist"),
    C("wandb-online-unreachable", ["train", "--out", "{d}/wb", "--wandb", "online", "--no-progress",
                                   "train.steps=1"], "--wandb offline"),
    C("wandb-online-override", ["train", "--out", "{d}/wb2", "--no-progress", "tracking.mode=online",
                                "train.steps=1"], "--wandb offline"),
    C("wandb-online-dry", [*DRY, "--wandb", "online"], "cannot reach W&B"),
    C("out-stopped-before-checkpoint", ["train", "--out", "{d}/run_nockpt", "train.steps=1"], "rm -r"),
    C("resume-stopped-before-checkpoint", ["train", "--resume", "--no-progress", "--out", "{d}/run_nockpt",
                                           "--config", str(QUICKSTART)], "to start over"),
    # with the progress bars on (not --no-progress)
    C("progress-dry-checkpoint", [*NOPROG, "policy.checkpoint={d}/ckpt_empty"], "ckpt_empty"),
    C("progress-dry-nan", [*NOPROG, "policy.checkpoint={d}/ckpt_nan"], "ckpt_nan"),
    C("progress-dry-profile", [*NOPROG, "plan.time_profile={d}/profile_bad.json"], "profile_bad.json"),
    C("progress-dry-resume", [*NOPROG, "--resume", "--out", "{d}/run_fmt"], "run_fmt"),
    C("progress-dry-context", [*NOPROG, "rollout.max_new_tokens=100000"], "rollout.max_new_tokens"),
    C("progress-predictor-train", ["predictor", "train", "--data", "{d}/notjson.jsonl", "--model", "ewma",
                                   "--out", "{d}/pt-progress"], "notjson.jsonl"),
    C("progress-predictor-eval", ["predictor", "eval", "--model", "{d}/pred_garbage", "--data", "{d}/empty.jsonl"],
      "pred_garbage"),
    C("progress-predictor-compare", ["predictor", "compare", "--data", "{d}/notjson.jsonl", "--json",
                                     "{d}/c.json"], "notjson.jsonl"),
]

# issue 42: every input checked before the run folder exists (dry run and real run alike), nothing silently unused
EMULATED = ["runtime.device=emulated", "runtime.units=4", "plan.max_actors=4", "runtime.mode=serverless"]
BAD_TRACES = {"nope.jsonl": "does not exist", "empty.jsonl": "empty.jsonl", "random.bin": "random.bin",
              "adir": "is a folder", "nonint_len.jsonl": "nonint_len.jsonl", "frac_len.jsonl": "frac_len.jsonl"}
for name, expect in BAD_TRACES.items():
    CASES.append(C(f"length-trace-dry-{name}", [*DRY, *EMULATED, f"runtime.length_trace={{d}}/{name}"], expect))
    CASES.append(C(f"length-trace-run-{name}", ["train", "--no-progress", "--out", "{d}/em-" + name, *EMULATED,
                                                f"runtime.length_trace={{d}}/{name}"], expect))
CASES += [
    C("emulated-inline", [*DRY, "runtime.device=emulated", "runtime.units=4", "runtime.mode=inline"],
      "runtime.mode"),
    C("emulated-inline-run", ["train", "--no-progress", "--out", "{d}/em-inline", "runtime.device=emulated",
                              "runtime.units=4", "runtime.mode=inline"], "runtime.mode"),
    # messages that fit the case: "not found" only of what does not exist, keys as typed, counts never negative
    C("validate-a-file", ["simulate", "--validate", str(REPO / "README.md")], "is a file"),
    C("trace-stats-a-folder", ["data", "trace-stats", "--trace", "{d}/adir"], "is a folder"),
    C("predictor-compare-a-folder", ["predictor", "compare", "--data", "{d}/adir", "--json", "{d}/c.json"],
      "is a folder"),
    C("simulate-billing-unknown", ["simulate", "--scenario", "quick", "billing=aws"], "runpod, modal"),
    C("simulate-lengths-as-typed", ["simulate", "--scenario", "quick", "lengths.median=-5"], "lengths.median"),
    C("prompt-longer-than-context", [*DRY, "task.name=jsonl", "task.jsonl.path={d}/longq.jsonl",
                                     "task.jsonl.num_eval=4", "train.eval_prompts=0"], "no response fits"),
    C("resume-dangling-last", [*DRY, "--resume", "--out", "{d}/run_dangling"], "a link to nothing"),
    C("resume-incomplete-last", [*DRY, "--resume", "--out", "{d}/run_incomplete"], "incomplete (no state.json)"),
    C("bench-engine-checkpoint-missing", ["bench", "engine", "--json", "{d}/e.json", "--checkpoint", "{d}/nope"],
      "--checkpoint"),
    C("bench-engine-checkpoint-empty", ["bench", "engine", "--json", "{d}/e.json", "--checkpoint",
                                        "{d}/ckpt_empty"], "--checkpoint"),
    C("bench-prefill-checkpoint-file", ["bench", "prefill", "--json", "{d}/p.json", "--checkpoint", "{d}/afile"],
      "--checkpoint"),
    C("length-trace-compare", ["train", "--no-progress", "--out", "{d}/em-cmp", *EMULATED[:3], "runtime.mode=compare",
                               "runtime.length_trace={d}/empty.jsonl"], "empty.jsonl"),
]


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for root in roots for p in root.rglob("*") if p.is_file()}


def _alarm(signum, frame):
    raise TimeoutError(f"a case ran past {LIMIT_S} s")


def _run(argv: list[str], capsys) -> tuple[int, str]:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, capsys.readouterr().err


def _check(rc, err: str, expect: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip() and not PROGRESS.search(ln)]
    assert rc == 2, f"exit {rc}: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    assert len(lines) == 1, f"{len(lines)} lines: {err[-2000:]}"
    assert len(lines[0]) <= 300, f"{len(lines[0])} characters: {lines[0][:400]}"
    assert expect in lines[0], f"{expect!r} not in {lines[0]!r}"


# `rlhfless plan what-if`
_WI = ["plan", "what-if", "--model", "qwen2.5-3b", "--steps", "1", "--prompts-per-step", "8"]
CASES += [
    C("whatif-devices-nocount", [*_WI, "--devices", "H100"], "--devices"),
    C("whatif-devices-zero", [*_WI, "--devices", "H100:0"], "--devices"),
    C("whatif-devices-word", [*_WI, "--devices", "H100:many"], "--devices"),
    C("whatif-devices-huge", [*_WI, "--devices", f"H100:{HUGE}"], "--devices"),
    C("whatif-devices-kind", [*_WI, "--devices", "TPU:8"], "--devices"),
    C("whatif-model", ["plan", "what-if", "--model", "gpt-9", "--devices", "L40S:8"], "model"),
    C("whatif-model-fit", ["plan", "what-if", "--model", "llama-70b", "--devices", "L40S:2", "--steps", "1"],
      "model"),
    C("whatif-both", [*_WI, "--devices", "L40S:8", "--deadline-ratio", "1", "--budget-usd", "1"], "--budget-usd"),
    C("whatif-ratio-zero", [*_WI, "--devices", "L40S:8", "--deadline-ratio", "0"], "--deadline-ratio"),
    C("whatif-ratio-nan", [*_WI, "--devices", "L40S:8", "--deadline-ratio", "nan"], "--deadline-ratio"),
    C("whatif-ratio-word", [*_WI, "--devices", "L40S:8", "--deadline-ratio", "fast"], "--deadline-ratio"),
    C("whatif-budget-neg", [*_WI, "--devices", "L40S:8", "--budget-usd", "-1"], "--budget-usd"),
    C("whatif-budget-inf", [*_WI, "--devices", "L40S:8", "--budget-usd", "inf"], "--budget-usd"),
    C("whatif-steps-zero", [*_WI, "--devices", "L40S:8", "--steps", "0"], "--steps"),
    C("whatif-trace-missing", [*_WI, "--devices", "L40S:8", "--trace", "{d}/nope.jsonl"], "--trace"),
    C("whatif-trace-bad", [*_WI, "--devices", "L40S:8", "--trace", "{d}/notjson.jsonl"], "notjson.jsonl"),
    C("whatif-prices-missing", [*_WI, "--devices", "L40S:8", "--prices", "{d}/nope.yaml"], "--prices"),
    C("whatif-no-ondemand", [*_WI, "--devices", "H200:8"], "ondemand_usd_per_h"),
    C("whatif-prices-bomb", [*_WI, "--devices", "L40S:8", "--prices", "{d}/bomb.yaml"], "--prices"),
    C("whatif-prices-list", [*_WI, "--devices", "L40S:8", "--prices", "{d}/prices_list.yaml"], "--prices"),
    C("whatif-prices-folder", [*_WI, "--devices", "L40S:8", "--prices", "{d}/adir"], "--prices"),
] + [C(f"whatif-{n[:-5]}", [*_WI, "--devices", "L40S:8", "--prices", f"{{d}}/{n}"], "--prices")
     for n in ("prices_kind.yaml", "prices_neg.yaml", "prices_key.yaml", "prices_str.yaml", "prices_nan.yaml")]


def test_the_corpus_is_large():
    assert len(CASES) >= 150 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_line_naming_it(case, corpus_dir, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # repo-relative defaults (the shipped checkpoint, configs) resolve as for a user
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # W&B's reach check never leaves this machine
    argv = [a.replace("{d}", str(corpus_dir)) for a in case.argv]
    before = _snapshot(corpus_dir, REPO / "data", REPO / "experiments")
    paths = _paths(corpus_dir)
    rc, err = _run(argv, capsys)
    _check(rc, err, case.expect.replace("{d}", str(corpus_dir)))
    after = _snapshot(corpus_dir, REPO / "data", REPO / "experiments")
    assert {k: v for k, v in after.items() if k in before} == before, "an existing file changed"
    assert not (REPO / "data" / "runs-new").exists() and not Path("/nonexistent").exists()
    if argv[:1] == ["train"]:  # a refused run leaves no folder or file behind
        assert _paths(corpus_dir) == paths, sorted(_paths(corpus_dir) - paths)


def _paths(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


# --- a few through a real process: the entry point, signals and encodings as a user's shell sees them --------
SUBPROCESS = [
    C("sub-bomb", ["train", "--dry-run", "--config", "{d}/bomb.yaml"], "bomb.yaml"),
    C("sub-latin1", ["train", "--dry-run", "--config", "{d}/latin1.yaml"], "latin1.yaml"),
    C("sub-simulate-steps", ["simulate", "--scenario", "quick", "--steps", "1000000000000"], "--steps"),
    C("whatif-no-devices", ["plan", "what-if", "--model", "qwen2.5-3b"], "--devices"),
    C("whatif-no-model", ["plan", "what-if", "--devices", "L40S:8"], "--model"),
    C("whatif-no-sub", ["plan"], "plan"),
    C("sub-out-dot", ["train", "--out", ".", "train.steps=1"], "current folder"),
    C("sub-huge-override", ["train", "--dry-run", f"train.steps={HUGE}"], "train.steps"),
]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_bad_input_through_the_entry_point(case, corpus_dir):
    argv = [a.replace("{d}", str(corpus_dir)) for a in case.argv]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    before = _snapshot(corpus_dir, REPO / "data")
    proc = subprocess.run([sys.executable, "-m", "rlhfless.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=LIMIT_S * 3)  # process start and imports on a busy machine
    _check(proc.returncode, proc.stderr, case.expect)
    assert _snapshot(corpus_dir, REPO / "data") == before


# --- what stays allowed -------------------------------------------------------------------------------------
def test_overrides_may_stand_anywhere_among_the_options():
    from rlhfless.cli import build_parser, parse

    args = parse(build_parser(), ["train", "--config", "C", "train.steps=2", "--out", "D", "train.eval_prompts=0",
                                  "--no-progress", "algo.group_size=4"])
    assert args.overrides == ["train.steps=2", "train.eval_prompts=0", "algo.group_size=4"] and args.out == "D"


def test_a_refused_trace_leaves_nothing_and_the_fixed_command_runs(tmp_path, capsys, monkeypatch):
    """Issue 42: each bad `runtime.length_trace` is refused by the real run before OUT exists, and the very same
    command succeeds once the file is fixed (no "holds an earlier run")."""
    import shutil

    monkeypatch.chdir(REPO)
    trace, out = tmp_path / "lengths.jsonl", tmp_path / "run"
    argv = ["train", "--no-progress", "--out", str(out), *EMULATED, f"runtime.length_trace={trace}",
            "runtime.time_scale=0.05", "train.steps=2", "train.eval_prompts=0", "tracking.mode=disabled",
            "runtime.gantt_every=0", "rollout.prompts_per_step=8", "algo.group_size=4", "runtime.migrate=never"]
    for bad in (None, b"", bytes(range(256)), "folder", json.dumps(_rollout_row(response_len="long")).encode()):
        if bad == "folder":
            trace.mkdir()
        elif bad is not None:
            trace.write_bytes(bad)
        rc, err = _run(argv, capsys)
        assert rc == 2 and "Traceback" not in err and not out.exists(), err[-500:]
        shutil.rmtree(trace) if trace.is_dir() else trace.unlink(missing_ok=True)
    with gzip.open(REPO / "data" / "traces" / "quickstart.jsonl.gz", "rb") as f:
        trace.write_bytes(f.read())
    assert main(argv) == 0 and json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.fixture(scope="module")
def emulated_runs(tmp_path_factory) -> Path:
    """A 2-step emulated run (seconds), and copies of it without workers.jsonl and without invocations.jsonl."""
    import shutil

    d = tmp_path_factory.mktemp("emulated-runs")
    assert main(["train", "--no-progress", "--out", str(d / "run"), *EMULATED, "runtime.time_scale=0.05",
                 "train.steps=2", "train.eval_prompts=0", "tracking.mode=disabled", "runtime.gantt_every=0",
                 "rollout.prompts_per_step=8", "algo.group_size=4", "runtime.migrate=never"]) == 0
    for name in ("workers", "invocations"):
        shutil.copytree(d / "run", d / f"no-{name}")
        (d / f"no-{name}" / f"{name}.jsonl").unlink()
    return d


EMULATED_RUN_CASES = [
    C("validate-emulated-calibrate-missing", ["simulate", "--validate", "{e}/run", "--calibrate-from", "/nonexistent"],
      "--calibrate-from"),
    C("validate-emulated-calibrate-run", ["simulate", "--validate", "{e}/run", "--calibrate-from", "{e}/run"],
      "--calibrate-from"),
    C("validate-emulated-no-workers", ["simulate", "--validate", "{e}/no-workers"], "workers.jsonl not found"),
    C("validate-emulated-no-invocations", ["simulate", "--validate", "{e}/no-invocations"],
      "invocations.jsonl not found"),
]


@pytest.mark.parametrize("case", EMULATED_RUN_CASES, ids=[c.id for c in EMULATED_RUN_CASES])
def test_what_would_be_silently_unused_is_refused(case, emulated_runs, capsys):
    """Issue 42: `--calibrate-from` where the emulated validation does not use it, and a missing record file, were
    accepted with rc 0 (the report's numbers silently changed); now one line, exit 2."""
    argv = [a.replace("{e}", str(emulated_runs)) for a in case.argv]
    before = _snapshot(emulated_runs)
    rc, err = _run(argv, capsys)
    _check(rc, err, case.expect)
    assert _snapshot(emulated_runs) == before


def test_hints_name_the_command_the_user_ran(corpus_dir, capsys, monkeypatch):
    """Issue 42: a plain `rlhfless train` is never told `make demo ARGS=--resume`; a full disk under `simulate` is
    never told `--resume` (only train's runs resume)."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("RLHFLESS_VIA", raising=False)
    rc, err = _run(["train", "--out", str(corpus_dir / "run")], capsys)
    assert rc == 2 and "--resume" in err and "make demo" not in err
    rc, err = _run(["train", "--out", str(corpus_dir / "run_nockpt"), "train.steps=1"], capsys)
    assert rc == 2 and "make" not in err
    monkeypatch.setenv("RLHFLESS_VIA", "make-demo")  # what the Makefile's demo target sets
    rc, err = _run(["train", "--out", str(corpus_dir / "run")], capsys)
    assert rc == 2 and "make demo ARGS=--resume" in err
    rc, err = _run(["simulate", "--scenario", "quick", "--steps", "2", "--json", "/dev/full"], capsys)
    assert rc == 2 and "no space left" in err and "--resume" not in err


def test_run_all_names_the_extra_and_a_failed_notebook_in_one_line(tmp_path, capsys, monkeypatch):
    """Issue 42: notebooks/run_all.py without the notebooks extra says which to install (was a raw
    ModuleNotFoundError); a notebook whose input is missing ends in one line naming the cell and the fix (was a
    53-line coloured cell traceback)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_all", REPO / "notebooks" / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    monkeypatch.setattr(run_all, "EXTRA", ("nbformat", "no_such_module_for_test"))
    assert run_all.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_module_for_test" in err[0] and "'.[notebooks]'" in err[0]
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell(f"open({str(tmp_path / 'nope.jsonl')!r})")])
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    before = path.read_bytes()
    monkeypatch.setattr(run_all, "EXTRA", ())
    assert run_all.main([str(path)]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "broken.ipynb: FAILED in cell 2" in err[0] and "FileNotFoundError" in err[0], err
    assert "Fix: make the input" in err[0] and "\x1b" not in err[0] and path.read_bytes() == before


def test_out_accepts_a_new_path_an_empty_folder_and_a_run_to_resume(corpus_dir, tmp_path):
    from rlhfless.core.outpaths import check_new_checkpoint, check_run_dir

    (tmp_path / "empty").mkdir()
    assert check_run_dir(str(tmp_path / "new" / "run"), resume=False) == tmp_path / "new" / "run"
    assert check_run_dir(str(tmp_path / "empty"), resume=False) == tmp_path / "empty"
    assert check_run_dir(str(corpus_dir / "run"), resume=True) == corpus_dir / "run"
    assert check_new_checkpoint(str(tmp_path / "empty")) == tmp_path / "empty"
    assert not (tmp_path / "new").exists()  # a check creates nothing



# --- OS errors on real file systems: a read-only mount, a full disk (issue 32) ---------------------------------
def _can_mount() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


MOUNTS = pytest.mark.skipif(not _can_mount(), reason="needs `unshare -m` (root or CAP_SYS_ADMIN) to mount a "
                                                     "read-only or a small file system")
TINY_RUN = ["task.arith.num_train=48", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=32",
            "train.steps=3", "train.eval_prompts=4", "train.threads=1", "tracking.mode=disabled",
            "predictor.name=ewma", "train.checkpoint_every=1", "--no-progress"]


def _on_tmpfs(tmp_path: Path, options: str, script: str, timeout: float) -> subprocess.CompletedProcess:
    """`script` (sh; $M is the mount, $CLI the rlhfless command) with a fresh tmpfs mounted at tmp_path/m with
    `options`, in a private mount namespace: nothing outside this process tree sees the mount."""
    m = tmp_path / "m"
    m.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "M": str(m),
           "CLI": f"{sys.executable} -m rlhfless.cli"}
    return subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o {options} tmpfs "$M" && {script}'],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@MOUNTS
@pytest.mark.parametrize("argv", [["train", "--out", "$M/run", "train.steps=1"],
                                  ["bench", "planner", "--json", "$M/x.json", "--groups", "2", "--repeats", "1"],
                                  ["data", "synthetic-trace", "--out", "$M/s.jsonl"]], ids=["out", "json", "data"])
def test_a_read_only_file_system_is_one_line(tmp_path, argv):
    proc = _on_tmpfs(tmp_path, "ro", "$CLI " + " ".join(f'"{a}"' for a in argv), LIMIT_S * 3)
    _check(proc.returncode, proc.stderr, "read-only file system")


@MOUNTS
def test_a_full_disk_while_checkpointing_is_one_line_keeps_the_last_checkpoint_and_resumes(tmp_path):
    """3 MB hold the run and its first checkpoint (2.1 MB of weights), not a second one written beside it: the
    second checkpoint fails, `last` stays whole, and after the disk grows `--resume` finishes the run."""
    args = " ".join(TINY_RUN)
    keep = tmp_path / "kept"
    script = (f'$CLI train --out "$M/run" {args} 2> "$M/../err"; echo $? > "$M/../rc"; cp -r "$M/run" "{keep}"; '
              f'mount -o remount,size=64m "$M" && $CLI train --resume --out "$M/run" {args} && '
              f'cp "$M/run/summary.json" "{tmp_path}/summary.json"')
    proc = _on_tmpfs(tmp_path, "size=3m", script, 600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    err = (tmp_path / "err").read_text()
    _check(int((tmp_path / "rc").read_text()), err, "no space left on the device (ENOSPC)")
    assert "--resume" in err
    ckpts = sorted(p.name for p in (keep / "checkpoints").iterdir())
    assert ckpts == ["last"]  # no half-written last.tmp or final left where a reader might take it
    state = json.loads((keep / "checkpoints" / "last" / "state.json").read_text())
    assert state["step"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through folder permissions")
def test_a_folder_this_user_cannot_write_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        for argv in (["train", "--out", str(locked / "run"), "train.steps=1"],
                     ["bench", "planner", "--json", str(locked / "x.json")]):
            rc, err = _run(argv, capsys)
            _check(rc, err, "permission denied")
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o755)
