"""The task interface and stop tokens: the step loop reaches tasks and tokenizers only through `TextEnv`, and the
engines stop at whatever ids the policy's tokenizer names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from rlhfless.config import load_run_config
from rlhfless.core.errors import ConfigError
from rlhfless.model.factory import load_checkpoint
from rlhfless.model.tokenizer import EOS_ID, ByteTokenizer
from rlhfless.rollout.engine import SamplingParams, generate
from rlhfless.tasks.arith import ArithTask
from rlhfless.step.textenv import TextEnv, make_env

REPO = Path(__file__).resolve().parents[1]
# Every module of the step loop and of the runtime that executes it: none may name a task or a tokenizer.
LOOP_MODULES = ["step/loop.py", "run/runner.py", "step/heldout.py", "bench/loop_bench.py", "run/train_cli.py",
                "runtime/devices/decoding.py",
                "runtime/stages.py", "runtime/loop_stages.py", "runtime/executor.py", "runtime/devices/worker.py",
                "run/compare.py"]
FORBIDDEN = ("rlhfless.tasks.arith", "rlhfless.tasks.gsm8k", "rlhfless.tasks.jsonl_task")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


@pytest.mark.parametrize("module", LOOP_MODULES)
def test_the_loop_imports_no_task_and_no_tokenizer(module):
    names = _imports(REPO / "rlhfless" / module)
    assert not {n for n in names if n.startswith(FORBIDDEN)}, module
    assert "rlhfless.model.tokenizer.ByteTokenizer" not in names, module


def test_make_env_gives_the_configured_task_and_the_checkpoints_tokenizer():
    env = make_env(load_run_config(None, []))
    assert isinstance(env.task, ArithTask) and isinstance(env.tok, ByteTokenizer)
    train, _ = env.task.splits()
    assert env.encode(train[0]) == ByteTokenizer().encode(train[0].text, bos=True)
    text, sc = env.score_ids(ByteTokenizer().encode("1+2=3;#3") + [EOS_ID], "3", truncated=False)
    assert text == "1+2=3;#3" and sc.reward == 1.0
    assert env.sampling(8, 0.0).stop_ids == (EOS_ID,)


def test_the_byte_tokenizer_has_no_chat_template_to_force():
    with pytest.raises(Exception, match="chat_template"):
        make_env(load_run_config(None, ["policy.chat_template=on"]))


@pytest.mark.parametrize("override,field", [("task.name=nope", "task.name"), ("policy.chat_template=yes",
                                            "policy.chat_template"), ("policy.build=big", "policy.build")])
def test_bad_task_and_policy_values_name_their_field(override, field):
    with pytest.raises(ConfigError, match=field):
        load_run_config(None, [override])


def test_generation_stops_at_the_tokenizers_stop_ids_whatever_they_are():
    torch.manual_seed(0)
    model = load_checkpoint(REPO / "data/checkpoints/sft").eval()
    prompts = [ByteTokenizer().encode(t, bos=True) for t in ("3+4=", "1+2+3=", "9+9+1+5=")]
    plain = generate(model, prompts, 1, SamplingParams(24, 0.0), seed=0)
    # a stop id that is each response's second token: every row must end right there, and count as finished
    stop = tuple(sorted({r[1] for r in plain.responses}))
    cut = generate(model, prompts, 1, SamplingParams(24, 0.0, stop_ids=stop), seed=0)
    for full, short, trunc in zip(plain.responses, cut.responses, cut.truncated):
        first = next(i for i, t in enumerate(full) if t in stop)
        assert short == full[: first + 1] and not trunc
    assert max(map(len, plain.responses)) > max(map(len, cut.responses))


def test_a_task_env_scores_through_the_task_not_the_tokenizer():
    class Always:
        name = "always"

        def splits(self):
            return [], []

        def score(self, response, answer, finished):
            from rlhfless.tasks.base import Score

            return Score(0.5, False, finished)

    env = TextEnv(Always(), ByteTokenizer())
    assert env.score_ids([10, 11], "x", truncated=True)[1].reward == 0.5
