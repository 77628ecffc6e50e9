"""The loop on a Hugging Face checkpoint with its own tokenizer: a small Qwen2 model and a BPE tokenizer trained
here (exactly the folder layout a user's checkpoint has), the GSM8K task read from a GSM8K-format file written by
the test, inline and on the serverless runtime, with resume and the build-on-first-use path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlhfless.config import load_run_config
from rlhfless.model.factory import load_policy
from rlhfless.model.hf import HFTokenizer, TinyHFConfig, build_tiny_hf
from rlhfless.model.tokenizer import load_tokenizer
from rlhfless.run.launch import train
from rlhfless.runtime.config import available_cores

REPO = Path(__file__).resolve().parents[1]


def _gsm8k_file(path: Path, n: int = 48) -> Path:
    """A GSM8K-format file of small word problems (the real one lives outside the repository)."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        q = f"Tom has {a} apples and buys {b} more. How many apples does Tom have now? (case {i})"
        rows.append({"question": q, "answer": f"Tom has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    data = _gsm8k_file(root / "gsm8k.jsonl")
    texts = [t for line in data.read_text().splitlines() for t in json.loads(line).values()]
    model_dir = build_tiny_hf(root / "model", texts, TinyHFConfig(vocab_size=400, max_positions=256))
    return root, data, model_dir


def _overrides(data: Path, model_dir: Path, steps: int = 3) -> list[str]:
    return [f"policy.checkpoint={model_dir}", "task.name=gsm8k", f"task.gsm8k.path={data}", "task.gsm8k.num_eval=8",
            "task.gsm8k.format_reward=0.1", f"train.steps={steps}", "rollout.prompts_per_step=4", "algo.group_size=2",
            "rollout.max_new_tokens=16", "train.eval_prompts=4", "train.checkpoint_every=1", "train.table_every=1",
            "tracking.mode=disabled", "train.threads=1"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_grpo_runs_on_an_hf_checkpoint_with_its_own_tokenizer_and_chat_template(setup):
    root, data, model_dir = setup
    cfg = load_run_config(REPO / "experiments/configs/gsm8k_hf.yaml", _overrides(data, model_dir))
    out = root / "inline"
    summary = train(cfg, out, progress=False)
    assert summary["steps"] == 3 and summary["eval_prompts"] == 4
    tok = load_tokenizer(model_dir)
    assert isinstance(tok, HFTokenizer) and tok.chat
    trace = _rows(out / "traces" / "rollouts.jsonl")
    assert len(trace) == 3 * 4 * 2
    # prompt lengths are the BPE tokenizer's, chat turn markers included: not the byte count of the text
    for r in trace[:8]:
        assert r["prompt_len"] == len(tok.encode_prompt(r["prompt"])) != len(r["prompt"].encode()) + 1
        assert "Question: Tom has" in r["prompt"] and r["prompt_id"].startswith("gsm8k-")
    final = out / "checkpoints" / "final"
    assert isinstance(load_tokenizer(final), HFTokenizer)  # the run's checkpoints keep the policy's tokenizer
    assert load_policy(final).config.vocab_size == load_policy(model_dir).config.vocab_size


def test_a_run_on_an_hf_checkpoint_resumes(setup):
    root, data, model_dir = setup
    out = root / "resumed"
    train(load_run_config(None, _overrides(data, model_dir, steps=2)), out, progress=False)
    summary = train(load_run_config(None, _overrides(data, model_dir, steps=3)), out, progress=False, resume=True)
    steps = [r["step"] for r in _rows(out / "metrics.jsonl") if "reward/mean" in r]
    assert summary["steps"] == 3 and steps == [1, 2, 3]


def test_the_prompt_must_fit_the_checkpoints_context_in_its_own_tokens(setup):
    from rlhfless.core.errors import ConfigError

    root, data, model_dir = setup
    with pytest.raises(ConfigError, match=r"the longest prompt \(gsm8k-\d+\) has \d+ tokens.*context of 256"):
        train(load_run_config(None, _overrides(data, model_dir) + ["rollout.max_new_tokens=250"]), root / "ctx",
              progress=False)


def test_policy_build_makes_the_folder_on_first_use_and_reuses_it(setup, tmp_path):
    from rlhfless.cli import main

    _, data, _ = setup
    target = tmp_path / "models" / "tiny"
    args = ["train", "--dry-run", "--out", str(tmp_path / "run"), "--config",
            str(REPO / "experiments/configs/gsm8k_hf.yaml"), "policy.build_sft_steps=2",  # the build, not the SFT
            f"policy.checkpoint={target}", f"task.gsm8k.path={data}", "task.gsm8k.num_eval=8", "train.eval_prompts=4"]
    assert main(args) == 0
    assert (target / "config.json").is_file() and isinstance(load_tokenizer(target), HFTokenizer)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert main(args) == 0 and (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert main(args[:-4] + ["policy.build=none", f"policy.checkpoint={tmp_path / 'absent'}",
                             f"task.gsm8k.path={data}", "task.gsm8k.num_eval=8", "train.eval_prompts=4"]) == 2


@pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")
def test_the_serverless_runtime_decodes_and_scores_with_the_checkpoints_tokenizer(setup):
    """Decode functions stop rows at the tokenizer's stop ids and score them with the task in the worker: their
    samples must equal the inline loop's, token for token, reward for reward."""
    root, data, model_dir = setup
    quiet = ["runtime.gantt_every=0", "train.checkpoint_every=0", "train.eval_prompts=0", "rollout.max_new_tokens=40"]
    runs = {}
    for mode in ("inline", "serverless"):
        extra = quiet + ([f"runtime.mode={mode}", "plan.max_actors=2"] if mode != "inline" else [])
        cfg = load_run_config(REPO / "experiments/configs/gsm8k_hf.yaml", _overrides(data, model_dir, 2) + extra)
        runs[mode] = root / mode / "rt"
        assert train(cfg, runs[mode], progress=False)["steps"] == 2
    decodes = [i for i in _rows(runs["serverless"] / "invocations.jsonl") if i["kind"] == "decode"]
    assert decodes and all(i["ok"] for i in decodes)
    digests = {m: _rows(p / "traces" / "samples_digest.jsonl") for m, p in runs.items()}
    assert digests["inline"] == digests["serverless"]
    trace = {m: [(r["response_len"], r["truncated"], r["reward"]) for r in _rows(p / "traces" / "rollouts.jsonl")]
             for m, p in runs.items()}
    assert trace["inline"] == trace["serverless"]


def test_the_build_can_warm_start_on_the_train_solutions_only(setup, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import rlhfless.run.warmstart as ws
    from rlhfless.core.errors import DataError
    from rlhfless.run.runner import ensure_policy
    from rlhfless.tasks.arith import ArithTask, ArithTaskConfig
    from rlhfless.step.textenv import TextEnv, make_env

    _, data, model_dir = setup
    base = [f"task.gsm8k.path={data}", "task.gsm8k.num_eval=8", "policy.build=tiny-bpe", "train.threads=1"]
    seen: list[str] = []
    real = ws.solution_pairs
    monkeypatch.setattr(ws, "solution_pairs", lambda env, prompts, ctx: (seen.extend(p.prompt_id for p in prompts),
                                                                       real(env, prompts, ctx))[1])
    folders = {}
    for steps in (0, 6):
        folders[steps] = tmp_path / f"sft{steps}"
        extra = [f"policy.checkpoint={folders[steps]}", f"policy.build_sft_steps={steps}"]
        ensure_policy(load_run_config(REPO / "experiments/configs/gsm8k_hf.yaml", base + extra))
    meta = json.loads((folders[6] / "rlhfless.json").read_text())["warm_start"]
    assert meta["steps"] == 6 and meta["loss_last"] < meta["loss_first"]
    assert "warm_start" not in json.loads((folders[0] / "rlhfless.json").read_text())
    a, b = (load_file(str(folders[s] / "model.safetensors")) for s in (0, 6))
    assert any(not (a[k] == b[k]).all() for k in a)
    env = make_env(load_run_config(None, base + [f"policy.checkpoint={model_dir}", "task.name=gsm8k"]))
    train, held = env.task.splits()
    assert seen == [p.prompt_id for p in train] and not set(seen) & {p.prompt_id for p in held}
    with pytest.raises(DataError, match="policy.build_sft_steps=0"):
        real(TextEnv(ArithTask(ArithTaskConfig()), load_tokenizer(model_dir)), ArithTask(ArithTaskConfig()).splits()[0],
             512)
