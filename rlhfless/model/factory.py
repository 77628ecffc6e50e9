"""Tiny Qwen2-style causal LM built from a config, saved and loaded with safetensors (never pickle).

The defaults are the size measured to learn the arithmetic task on a 2-core CPU in minutes
(shared/notes/task-calibration.md): hidden 128, 2 layers, 4 heads, 2 KV heads, 0.53M parameters, tied embeddings.
Tied `lm_head` is kept correct by `save_pretrained`/`from_pretrained` (the weight is stored once and re-tied on
load); `load_checkpoint` checks that the tie survived.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rlhfless.errors import DataError, require
from rlhfless.model.tokenizer import ByteTokenizer

META_FILE = "rlhfless.json"


@dataclass
class ModelConfig:
    """Architecture of the tiny policy model (ignored when a checkpoint is loaded: its own config wins)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide num_heads."""
    intermediate_size: int = 512
    """MLP width."""
    max_positions: int = 512
    """Longest prompt + response the model can see."""

    def __post_init__(self) -> None:
        require(self.hidden_size >= 8, "model.hidden_size", f"must be >= 8 (got {self.hidden_size})")
        require(self.num_layers >= 1, "model.num_layers", f"must be >= 1 (got {self.num_layers})")
        require(self.num_heads >= 1 and self.hidden_size % self.num_heads == 0, "model.num_heads",
                f"must be >= 1 and divide hidden_size={self.hidden_size} (got {self.num_heads})")
        require(self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads",
                f"must be >= 1 and divide num_heads={self.num_heads} (got {self.num_kv_heads})")
        require(self.intermediate_size >= 1, "model.intermediate_size", f"must be >= 1 (got {self.intermediate_size})")
        require(self.max_positions >= 16, "model.max_positions", f"must be >= 16 (got {self.max_positions})")


def hf_config(cfg: ModelConfig):
    from transformers import Qwen2Config

    tok = ByteTokenizer()
    return Qwen2Config(
        vocab_size=tok.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        attn_implementation="sdpa",
    )


def build_model(cfg: ModelConfig, seed: int = 0):
    """A freshly initialised model (deterministic for a seed)."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(hf_config(cfg))
    model.generation_config.pad_token_id = ByteTokenizer.pad_id
    return model


def save_checkpoint(model, directory: str | Path, meta: dict | None = None) -> Path:
    """Write weights (safetensors), HF config, tokenizer and a small metadata JSON."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    ByteTokenizer().save(out)
    (out / META_FILE).write_text(json.dumps(meta or {}, indent=1, default=str))
    return out


def load_checkpoint(directory: str | Path):
    """Load a checkpoint written by `save_checkpoint`; a missing or foreign folder raises `DataError`."""
    import torch
    from transformers import Qwen2ForCausalLM

    path = Path(directory)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise DataError(
            f"checkpoint not found at {path} (expected config.json and model.safetensors); "
            "run `rlhfless pretrain --out DIR` to make one, or point policy.checkpoint at an existing one"
        )
    ByteTokenizer.load(path)
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32)
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise DataError(f"{path}: lm_head is not tied to the embeddings after loading")
    return model


def read_meta(directory: str | Path) -> dict:
    p = Path(directory) / META_FILE
    return json.loads(p.read_text()) if p.is_file() else {}


def model_config_of(model) -> ModelConfig:
    c = model.config
    return ModelConfig(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                       c.intermediate_size, c.max_position_embeddings)


def describe(model) -> dict:
    return {**asdict(model_config_of(model)), "params": sum(p.numel() for p in model.parameters())}
