"""Shared fixtures: one torch thread (tests share 2 cores), W&B disabled, tiny checkpoints made on the fly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GSM8K = SHARED / "data" / "gsm8k" / "train.jsonl"
SFT_CHECKPOINT = REPO / "data" / "checkpoints" / "sft"
REQUIRE_SHARED = "RLHFLESS_REQUIRE_SHARED"  # .ci/run sets it: there a missing ../shared file is a failure


def require_shared_file(path: Path) -> Path:
    """The path when the file exists; otherwise skip with the reason, or fail when RLHFLESS_REQUIRE_SHARED=1."""
    from rlhfless.tasks.gsm8k import missing_message

    why = missing_message(path)
    if why is None:
        return path
    if os.environ.get(REQUIRE_SHARED) == "1":
        pytest.fail(f"{why} ({REQUIRE_SHARED}=1)")
    pytest.skip(why)


@pytest.fixture
def gsm8k_file() -> Path:
    """The GSM8K train split from ../shared (skips with the reason outside CI; fails in CI when missing)."""
    return require_shared_file(GSM8K)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised small model saved as a checkpoint (for plumbing tests, not learning tests)."""
    from rlhfless.model.factory import ModelConfig, build_model, save_checkpoint

    out = tmp_path_factory.mktemp("ckpt")
    model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                    intermediate_size=64, max_positions=256), seed=0)
    return save_checkpoint(model, out)


@pytest.fixture(scope="session")
def sft_checkpoint() -> Path:
    if not (SFT_CHECKPOINT / "model.safetensors").is_file():
        pytest.fail(f"the shipped SFT checkpoint is missing at {SFT_CHECKPOINT}")
    return SFT_CHECKPOINT


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip, saying why, where torch sees no CUDA device (`-m gpu` on a CPU machine)."""
    from rlhfless.core.devices import cuda_visible, no_cuda_message

    if cuda_visible():
        return
    skip = pytest.mark.skip(reason=no_cuda_message())
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
