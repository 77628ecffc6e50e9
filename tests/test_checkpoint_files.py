"""`load_checkpoint` refuses a shared checkpoint it cannot trust, with one line naming the file and the problem.

Each case corrupts a copy of a tiny checkpoint. Without its check, transformers would load most of them silently
(a missing tensor is randomly initialised, an F16 tensor is cast) or fail with a multi-line traceback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rlhfless.core.errors import DataError
from rlhfless.model.factory import ModelConfig, build_model, load_checkpoint, read_meta, save_checkpoint

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ck") / "tiny"
    model = build_model(ModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                                    max_positions=32), seed=0)
    save_checkpoint(model, out, meta={"kind": "test"})
    return out


def _weights(change):
    def apply(d: Path):
        tensors = load_file(d / WEIGHTS)
        change(tensors)
        save_file(tensors, d / WEIGHTS, metadata={"format": "pt"})
    return apply


def _config(**fields):
    def apply(d: Path):
        cfg = json.loads((d / CONFIG).read_text())
        (d / CONFIG).write_text(json.dumps({**cfg, **fields}))
    return apply


def _write(name: str, text: str):
    return lambda d: (d / name).write_text(text)


def _truncate(d: Path):
    blob = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(blob[: len(blob) // 2])


CASES = {
    "weights missing": (lambda d: (d / WEIGHTS).unlink(), "checkpoint not found at .*rlhfless pretrain"),
    "weights truncated": (_truncate, f"{WEIGHTS}: not a readable safetensors file, or truncated"),
    "tensor missing": (_weights(lambda t: t.pop("model.norm.weight")), "tensor 'model.norm.weight' is missing"),
    "tensor shape": (_weights(lambda t: t.__setitem__("model.norm.weight", np.ones(17, np.float32))),
                     r"'model.norm.weight' has shape \[17\] but config.json implies \[16\]"),
    "tensor dtype": (_weights(lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"].astype(np.float16))),
                     "'model.norm.weight' has dtype F16, expected F32"),
    "tensor extra": (_weights(lambda t: t.__setitem__("backdoor.weight", np.ones(3, np.float32))),
                     "unexpected tensor 'backdoor.weight'"),
    "config not json": (_write(CONFIG, "{hidden_size: 16"), f"{CONFIG}: not valid JSON"),
    "config wider than weights": (_config(hidden_size=32), r"has shape \[259, 16\] but config.json implies \[259, 32\]"),
    "config deeper than weights": (_config(num_hidden_layers=2, layer_types=["full_attention"] * 2),
                                   "tensor 'model.layers.1.* is missing"),
    "config inconsistent": (_config(num_hidden_layers=2), "transformers rejects this config .*layer_types"),
    "config bad heads": (_config(num_attention_heads=3), "model.num_heads: must be >= 1 and divide hidden_size"),
    "config wrong type": (_config(intermediate_size="32"), "must be integers"),
    "config vocab": (_config(vocab_size=300), "vocab_size 300 is not the byte tokenizer's 259"),
    "config not qwen2": (_config(model_type="llama"), "not a qwen2 model config"),
    "config untied": (_config(tie_word_embeddings=False), "tie_word_embeddings true"),
    "config float16": (_config(dtype="float16"), "dtype must be float32"),
    "tokenizer unknown": (_write(TOKENIZER, json.dumps({"type": "bpe", "merges": []})),
                          f"{TOKENIZER}: not a rlhfless byte tokenizer"),
    "tokenizer not json": (_write(TOKENIZER, "<xml/>"), f"{TOKENIZER}: not valid JSON"),
    "tokenizer missing": (lambda d: (d / TOKENIZER).unlink(), "tokenizer file not found"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_checkpoint_is_refused_in_one_line(tmp_path, checkpoint, case):
    corrupt, message = CASES[case]
    d = tmp_path / "copy"
    shutil.copytree(checkpoint, d)
    load_checkpoint(d)  # the untouched copy loads
    corrupt(d)
    with pytest.raises(DataError, match=message) as err:
        load_checkpoint(d)
    assert str(d) in str(err.value) and "\n" not in str(err.value)


def test_checkpoint_metadata_must_be_a_json_object(tmp_path, checkpoint):
    d = tmp_path / "copy"
    shutil.copytree(checkpoint, d)
    assert read_meta(d) == {"kind": "test"}
    (d / "rlhfless.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="rlhfless.json: expected a JSON object"):
        read_meta(d)
    (d / "rlhfless.json").write_text("{")
    with pytest.raises(DataError, match="rlhfless.json: not valid JSON"):
        read_meta(d)


@pytest.mark.parametrize("sizes, head_dim", [
    (ModelConfig(), None),  # the tiny model's defaults
    (ModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32), None),
    (ModelConfig(hidden_size=64, num_layers=3, num_heads=8, num_kv_heads=8), None),
    (ModelConfig(hidden_size=64, num_heads=4, num_kv_heads=2), 8),  # head_dim != 64 // 4
])
def test_the_written_out_shapes_are_transformers_own(sizes, head_dim):
    """`expected_tensors` (torch-free, so a checkpoint is checked without torch) names every tensor of
    transformers' Qwen2ForCausalLM with its shape, lm_head left out as it is tied."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhfless.model.factory import expected_tensors, hf_config

    raw = {**hf_config(sizes).to_dict(), **({"head_dim": head_dim} if head_dim else {})}
    with torch.device("meta"):
        ref = Qwen2ForCausalLM(Qwen2Config.from_dict(raw))
    assert expected_tensors(raw) == {k: list(v.shape) for k, v in ref.state_dict().items() if k != "lm_head.weight"}


def test_the_weights_check_needs_no_torch(checkpoint):
    """The config and weights checks read config.json and the safetensors header only: in a fresh interpreter
    they pass on a good checkpoint and refuse a bad one, importing neither torch nor transformers."""
    import subprocess
    import sys

    probe = ("import sys; from rlhfless.model.factory import check_weights, read_config_json as r\n"
             f"p = {str(checkpoint)!r}; check_weights(p, r(p))\n"
             "bad = {**r(p), 'intermediate_size': 64}\n"
             "try:\n    check_weights(p, bad)\nexcept Exception as e:\n    print(e)\n"
             "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    refusal, heavy = done.stdout.strip().splitlines()
    assert "gate_proj.weight' has shape [32, 16] but config.json implies [64, 16]" in refusal and heavy == "[]"
