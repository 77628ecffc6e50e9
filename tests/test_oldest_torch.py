"""The package on the oldest torch that pyproject.toml allows: every module imports and the quickstart's first steps
run through the CLI at tiny sizes. They run in the default suite too (on the Makefile's torch); `make
test-oldest-torch` runs them (`-m oldest_torch`) in .venv-oldest-torch, on the range's lower bound, and sets
RLHFLESS_EXPECT_TORCH so that a wrong install fails instead of passing on another torch."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil

import pytest
import torch

import rlhfless
from rlhfless.cli import main
from rlhfless.runtime.config import available_cores

pytestmark = pytest.mark.oldest_torch
OPTIONAL = {"ray", "vllm"}  # extras: a module that needs one may fail to import without it


def test_torch_is_the_expected_version():
    want = os.environ.get("RLHFLESS_EXPECT_TORCH")
    if not want:
        pytest.skip("RLHFLESS_EXPECT_TORCH unset (make test-oldest-torch sets it to pyproject.toml's lower bound)")
    assert torch.__version__.split("+")[0].startswith(want), f"torch {torch.__version__}, expected {want}.*"


def test_every_module_imports():
    for mod in pkgutil.walk_packages(rlhfless.__path__, "rlhfless."):
        try:
            importlib.import_module(mod.name)
        except ImportError as err:
            if (err.name or "").split(".")[0] not in OPTIONAL:
                raise


@pytest.mark.parametrize("mode", ["inline", "serverless"])
def test_quickstart_first_steps(tmp_path, mode):
    if mode == "serverless" and available_cores() < 2:
        pytest.skip("serverless mode with 2 decode functions needs 2 cores")
    out = tmp_path / mode
    rc = main(["train", "--config", "experiments/configs/quickstart.yaml", "--out", str(out), "--no-progress",
               "--wandb", "disabled", "train.steps=2", "rollout.prompts_per_step=4", "algo.group_size=2",
               "rollout.max_new_tokens=16", "train.eval_prompts=4", f"runtime.mode={mode}", "train.threads=1",
               *(["plan.max_actors=2"] if mode == "serverless" else [])])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum("timing_s/rollout" in x for x in steps) == 2
