"""Tiny Qwen2-style causal LM built from a config, saved and loaded with safetensors (never pickle).

The defaults are the size measured to learn the arithmetic task on a 2-core CPU in minutes (hidden 128, 2
layers, 4 heads, 2 KV heads, 0.53M parameters, tied embeddings). A checkpoint folder (`save_checkpoint`) holds
``config.json``, ``model.safetensors`` (float32, ``lm_head`` omitted as it is tied), ``tokenizer.json`` and
``rlhfless.json``; `load_policy` takes such a folder or any local Hugging Face causal-LM folder (`model.hf`).
The rule it keeps: checkpoints are shared, so `load_checkpoint` checks every file before transformers sees it,
refuses with one line naming the file, and checks that the weight tie survived the load; `check_policy` makes the
same checks without torch where rlhfless wrote the files (`train --dry-run`).
What it refuses: docs/internals.md#modelfactorypy.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rlhfless.core.errors import ConfigError, DataError, one_line, require
from rlhfless.core.jsonl import read_json_file
from rlhfless.model.tokenizer import ByteTokenizer, is_byte_tokenizer

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


@contextmanager
def _no_hf_bars():
    """transformers' one-shard "Writing model shards" / "Loading weights" bars, printed at every checkpoint and
    every arm of a comparison, take milliseconds here and would only bury the run's own progress bars."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@contextmanager
def os_errors(path: Path):
    """safetensors reports a full disk or a read-only folder as its own `SafetensorError` ("... (os error 28)"):
    raise it as the `OSError` it is, naming `path`, so the CLI prints it in one line (`errors.os_error_message`)."""
    import re

    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:
        code = re.search(r"os error (\d+)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def save_checkpoint(model, directory: str | Path, meta: dict | None = None, tokenizer=None) -> Path:
    """Write weights (safetensors), HF config, tokenizer and a small metadata JSON.

    tokenizer: the policy's own (`TextTokenizer`, for a Hugging Face model its `HFTokenizer`); None writes the byte
    tokenizer, which is the tiny model's."""
    from rlhfless.core.devices import as_cpu_float32

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    with _no_hf_bars(), as_cpu_float32(model), os_errors(out / "model.safetensors"):
        model.save_pretrained(out, safe_serialization=True)  # a GPU or bfloat16 policy still writes float32
    (tokenizer or ByteTokenizer()).save(out)
    (out / META_FILE).write_text(json.dumps(meta or {}, indent=1, default=str))
    return out


def load_checkpoint(directory: str | Path):
    """Load a checkpoint written by `save_checkpoint`; anything missing, foreign or inconsistent raises `DataError`."""
    path = Path(directory)
    _require_files(path)
    import torch
    from transformers import Qwen2ForCausalLM

    ByteTokenizer.load(path)
    raw = read_config_json(path)
    _qwen2_config(raw, path / "config.json")  # transformers' checks too, before the weights' (as they run)
    check_weights(path, raw)
    try:
        with _no_hf_bars():
            model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001  (a malformed generation_config.json; an unknown rope_type: KeyError)
        raise DataError(f"{path}: transformers cannot load this checkpoint ({one_line(exc)})") from None
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise DataError(f"{path}: lm_head is not tied to the embeddings after loading")
    return model


def _require_files(path: Path) -> None:
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise DataError(
            f"checkpoint not found at {path} (expected config.json and model.safetensors); "
            "run `rlhfless pretrain --out DIR` to make one, or point policy.checkpoint at an existing one"
        )


def _require_folder(path: Path) -> None:
    if not path.is_dir():
        raise DataError(
            f"policy.checkpoint: no folder at {path}; it expects a rlhfless checkpoint (`rlhfless pretrain --out DIR` "
            "makes one) or a local Hugging Face causal-LM folder with config.json, model.safetensors and tokenizer "
            "files (`rlhfless build-hf-model --out DIR` makes a small one)"
        )


def load_policy(directory: str | Path):
    """The policy model of a checkpoint folder: a rlhfless byte checkpoint (strict `load_checkpoint`) or any local
    Hugging Face causal-LM folder (`rlhfless.model.hf.load_hf_model`, float32)."""
    path = Path(directory)
    _require_folder(path)
    if is_byte_tokenizer(path):
        model = load_checkpoint(path)
    else:
        from rlhfless.model.hf import load_hf_model

        model = load_hf_model(path)
    check_finite(model.named_parameters(), path / "model.safetensors")
    return model


def check_finite(named_tensors, source: Path) -> None:
    """Refuse weights holding a NaN or an infinity, naming the first such tensor and the file (a run started from
    them would fail at its first update and blame the learning rate)."""
    import torch

    with torch.no_grad():
        for name, t in named_tensors:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise nonfinite_error(source, name)


def check_finite_np(named_arrays, source: Path) -> None:
    """`check_finite` over numpy arrays (safetensors' numpy framework): the same refusal, without torch."""
    import numpy as np

    for name, a in named_arrays:
        if np.issubdtype(a.dtype, np.floating) and not bool(np.isfinite(a).all()):
            raise nonfinite_error(source, name)


def nonfinite_error(source: Path, name: str) -> DataError:
    return DataError(f"{source}: tensor '{name}' holds NaN or infinite values; these weights cannot be trained "
                     "from: start from an earlier checkpoint")


# --- checking a byte checkpoint without torch (`train --dry-run`) ---------------------------------------------
# Every key of the config.json `save_checkpoint` writes under transformers 5.19 besides the sizes `read_config_json`
# checks, with the value `hf_config` gives it (layer_types: one "full_attention" per layer; transformers_version:
# any string). A config.json holding only these is one transformers' own checks (`_qwen2_config`, `from_pretrained`)
# accept once rlhfless' have passed; tests/test_dry_run.py holds this table to what `save_checkpoint` writes.
WRITTEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": ByteTokenizer.bos_id,
    "dtype": "float32", "eos_token_id": ByteTokenizer.eos_id, "hidden_act": "silu", "initializer_range": 0.02,
    "max_window_layers": 28, "model_type": "qwen2", "pad_token_id": ByteTokenizer.pad_id, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": None,
    "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
    "vocab_size": ByteTokenizer.vocab_size}
SIZE_KEYS = ("hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads",
             "num_hidden_layers", "num_key_value_heads")
WRITTEN_GENERATION = {"_from_model_config": True, "bos_token_id": ByteTokenizer.bos_id,
                      "eos_token_id": ByteTokenizer.eos_id, "output_attentions": False,
                      "output_hidden_states": False, "pad_token_id": ByteTokenizer.pad_id, "use_cache": True}


def written_by_rlhfless(directory: str | Path, raw: dict) -> bool:
    """Whether a byte checkpoint's files are exactly as `save_checkpoint` writes them, so that transformers' own
    checks can refuse nothing that rlhfless' (`read_config_json`, `check_weights`, `check_finite`) accept: config.json
    (`raw`) holds only `WRITTEN_CONFIG`'s values and the sizes, generation_config.json is absent or holds only
    `WRITTEN_GENERATION`'s, and no adapter_config.json sends transformers to PEFT."""
    path = Path(directory)
    layers = ["full_attention"] * raw["num_hidden_layers"]
    config_ok = all(k in SIZE_KEYS or (k == "transformers_version" and isinstance(v, str)) or
                    (k == "layer_types" and v == layers) or (k in WRITTEN_CONFIG and _same(v, WRITTEN_CONFIG[k]))
                    for k, v in raw.items())
    if not config_ok or (path / "adapter_config.json").exists():
        return False
    gen = path / "generation_config.json"
    if not gen.exists():
        return True
    try:
        doc = json.loads(gen.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and all(
        (k == "transformers_version" and isinstance(v, str)) or (k in WRITTEN_GENERATION and
                                                                 _same(v, WRITTEN_GENERATION[k]))
        for k, v in doc.items())


def _same(a, b) -> bool:
    """Equal and of the same JSON type (JSON's true is not the integer 1 here)."""
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def check_policy(directory: str | Path) -> dict | None:
    """Every check `load_policy` makes of a byte checkpoint (`load_checkpoint`'s), without torch or transformers:
    the same refusals, raised by the same functions in the same order. Returns the checked config.json, or None
    when the folder holds what only transformers can judge (a Hugging Face folder, `written_by_rlhfless` false, or
    safetensors' numpy reader failing where the header read did not): then the caller loads it for real
    (`load_policy`), whose refusal is the run's."""
    path = Path(directory)
    _require_folder(path)
    if not is_byte_tokenizer(path):
        return None  # a Hugging Face folder: transformers 5 imports torch to read even its config and tokenizer
    _require_files(path)
    ByteTokenizer.load(path)
    raw = read_config_json(path)
    if not written_by_rlhfless(path, raw):
        return None
    check_weights(path, raw)
    from safetensors import SafetensorError, safe_open

    p = path / "model.safetensors"
    try:
        with safe_open(p, framework="np") as fh:  # the model's parameter order: the first bad tensor is named
            check_finite_np(((name, fh.get_tensor(name)) for name in expected_tensors(raw)), p)
    except (SafetensorError, OSError, ValueError):
        return None
    return raw


def read_hf_config(directory: str | Path):
    """The checked Qwen2Config of a checkpoint's ``config.json`` (what is refused: docs/internals.md#modelfactorypy)."""
    return _qwen2_config(read_config_json(directory), Path(directory) / "config.json")


def _qwen2_config(raw: dict, p: Path):
    """transformers' own checks of a ``config.json`` that passed rlhfless' (`read_config_json`)."""
    from transformers import Qwen2Config

    try:
        return Qwen2Config.from_dict(raw)
    except Exception as exc:  # noqa: BLE001  (transformers' own checks raise several types, not all ValueError)
        raise DataError(f"{p}: transformers rejects this config ({one_line(exc)})") from None


def read_config_json(directory: str | Path) -> dict:
    """A checkpoint's ``config.json`` with rlhfless' own checks (a qwen2 with tied embeddings, float32, the byte
    vocabulary, integer sizes that `ModelConfig` accepts), read without torch or transformers; transformers' own
    checks of the fields it alone reads are `read_hf_config`'s."""
    p = Path(directory) / "config.json"
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a huge integer, deep nesting
        raise DataError(f"{p}: not valid JSON") from None
    problem = _config_problem(raw)
    if problem:
        raise DataError(f"{p}: {problem}")
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "max_position_embeddings")
    try:
        ModelConfig(*(raw.get(k) for k in keys))
    except (ConfigError, TypeError) as exc:
        raise DataError(f"{p}: {exc} (fields {', '.join(keys)} must be integers)") from None
    head_dim = raw.get("head_dim")
    if head_dim is not None and (type(head_dim) is not int or head_dim < 1):
        raise DataError(f"{p}: head_dim must be a positive integer or null (got {head_dim!r})")
    return raw


def _config_problem(raw: object) -> str | None:
    """What makes a parsed ``config.json`` foreign to rlhfless checkpoints, or None."""
    if not isinstance(raw, dict) or raw.get("model_type") != "qwen2":
        return "not a qwen2 model config (no model_type 'qwen2')"
    arch = raw.get("architectures", ["Qwen2ForCausalLM"])
    if arch != ["Qwen2ForCausalLM"] or raw.get("tie_word_embeddings") is not True:
        return "expected a Qwen2ForCausalLM with tie_word_embeddings true"
    dtype = raw.get("dtype", raw.get("torch_dtype", "float32"))
    if dtype != "float32":
        return f"dtype must be float32 (got {dtype!r})"
    if raw.get("vocab_size") != ByteTokenizer.vocab_size:
        return f"vocab_size {raw.get('vocab_size')!r} is not the byte tokenizer's {ByteTokenizer.vocab_size}"
    return None


def expected_tensors(raw: dict) -> dict[str, list[int]]:
    """Name -> shape of every tensor a tied Qwen2ForCausalLM of the checked ``config.json`` `raw`
    (`read_config_json`) saves, ``lm_head`` omitted as it is tied. Written out rather than read from a meta-device
    model so that checking a checkpoint needs no torch (`--dry-run`); `tests/test_model.py` holds it equal to
    transformers' own model for several shapes. Qwen2: biases on q, k and v only; head_dim defaults to
    hidden_size // num_attention_heads."""
    h, inter, vocab = raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"]
    head = raw.get("head_dim") or h // raw["num_attention_heads"]
    q, kv = raw["num_attention_heads"] * head, raw["num_key_value_heads"] * head
    shapes = {"model.embed_tokens.weight": [vocab, h]}
    for i in range(raw["num_hidden_layers"]):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        shapes.update({
            f"{a}.q_proj.weight": [q, h], f"{a}.q_proj.bias": [q], f"{a}.k_proj.weight": [kv, h],
            f"{a}.k_proj.bias": [kv], f"{a}.v_proj.weight": [kv, h], f"{a}.v_proj.bias": [kv],
            f"{a}.o_proj.weight": [h, q], f"{m}.gate_proj.weight": [inter, h], f"{m}.up_proj.weight": [inter, h],
            f"{m}.down_proj.weight": [h, inter], f"model.layers.{i}.input_layernorm.weight": [h],
            f"model.layers.{i}.post_attention_layernorm.weight": [h]})
    shapes["model.norm.weight"] = [h]
    return shapes


def check_weights(directory: str | Path, raw: dict) -> None:
    """Every tensor ``config.json`` (`raw`, checked by `read_config_json`) implies is in ``model.safetensors`` with
    that shape and dtype F32, and no other. Reads the file's header only, without torch."""
    from safetensors import SafetensorError, safe_open

    p = Path(directory) / "model.safetensors"
    expected = expected_tensors(raw)
    try:
        with safe_open(p, framework="np") as fh:
            found = {k: (fh.get_slice(k).get_shape(), fh.get_slice(k).get_dtype()) for k in fh.keys()}
    except (SafetensorError, OSError) as exc:
        raise DataError(f"{p}: not a readable safetensors file, or truncated ({one_line(exc)})") from None
    for name, shape in expected.items():
        if name not in found:
            raise DataError(f"{p}: tensor '{name}' is missing (config.json implies it)")
        if list(found[name][0]) != shape:
            raise DataError(f"{p}: tensor '{name}' has shape {list(found[name][0])} but config.json implies {shape}")
        if found[name][1] != "F32":
            raise DataError(f"{p}: tensor '{name}' has dtype {found[name][1]}, expected F32")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise DataError(f"{p}: unexpected tensor '{extra[0]}' ({len(extra)} in all); does config.json match?")


def read_meta(directory: str | Path) -> dict:
    """``rlhfless.json`` of a checkpoint ({} when absent); anything but a JSON object raises `DataError`."""
    p = Path(directory) / META_FILE
    meta = read_json_file(p)
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise DataError(f"{p}: expected a JSON object")
    return meta


def model_config_of(model) -> ModelConfig:
    c = model.config
    return ModelConfig(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                       c.intermediate_size, c.max_position_embeddings)


def describe(model) -> dict:
    return {**asdict(model_config_of(model)), "params": sum(p.numel() for p in model.parameters())}
