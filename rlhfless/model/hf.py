"""Any local Hugging Face causal-LM folder as the policy, and a builder that makes a small one offline.

`HFTokenizer` (the folder's tokenizer: a chat template makes a task prompt one user turn; stop ids from the eos,
the end-of-turn token and ``generation_config.json``), `load_hf_model` (checks the folder, then loads it) and
`build_tiny_hf` / `ensure_tiny_hf` (a BPE tokenizer and a random Qwen2 laid out as a downloaded checkpoint, so
the general path runs without the hub). The rule it keeps: a folder is checked before transformers sees it, and
a refusal is one line naming the file. Details and non-goals: docs/internals.md#modelhfpy.

Deviations: 1. Weights always load as float32 (a bf16 checkpoint is upcast: twice its file size in memory).
2. Only safetensors weights are read (never pickle). 3. The tiny builder's stop id is ``<|im_end|>``=1, not the
byte tokenizer's EOS 2, so code that stopped at EOS 2 would go visibly wrong. 4. Its BPE is saved as a
`Qwen2Tokenizer` (transformers 5 reloads qwen2 folders so). 5. Tensors it would initialise randomly are errors.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from rlhfless.core.errors import ConfigError, DataError, one_line, require
from rlhfless.core.jsonl import read_json_file

CHAT_MODES = ("auto", "on", "off")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
_SENTINEL = "RLHFLESS_TURN_END_PROBE"


def _auto_tokenizer(path: Path):
    """AutoTokenizer of a folder (local files only); missing or unreadable tokenizer files raise `DataError`."""
    if not path.is_dir():
        raise DataError(f"{path}: no such folder; expected a Hugging Face model folder with tokenizer files")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise DataError(f"{path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}); copy the model's tokenizer "
                        "files into the folder (save_pretrained of its tokenizer writes them)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001  (transformers raises OSError, ValueError, KeyError... for bad files)
        raise DataError(f"{path}: transformers cannot load the tokenizer ({one_line(exc, 300)})") from None


def _as_ids(out) -> list[int]:
    """apply_chat_template's result as a plain list (transformers 5 returns a BatchEncoding for tokenize=True)."""
    if hasattr(out, "keys"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):  # a batch of one
        out = out[0]
    return [int(i) for i in out]


def _turn_end_id(tok) -> int | None:
    """The special token the chat template closes an assistant turn with (`<|im_end|>`, `<|eot_id|>`, ...), or None.

    Rendering a conversation with a known assistant text and reading the first special token after it works for
    any template, where a list of known names would not."""
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}],
                                       tokenize=False)
    except Exception:  # noqa: BLE001  (a template may refuse this conversation; then no end-of-turn is known)
        return None
    if not isinstance(text, str) or _SENTINEL not in text:
        return None
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special} | set(tok.all_special_ids)
    after = tok.encode(text.split(_SENTINEL, 1)[1], add_special_tokens=False)
    return next((int(i) for i in after if i in special), None)


def _generation_eos(path: Path) -> list[int]:
    """``eos_token_id`` of the folder's generation_config.json (int or list); [] without the file or the key."""
    p = path / "generation_config.json"
    raw = read_json_file(p, "fix or delete it (it only sets generation defaults)")  # None without the file
    ids = raw.get("eos_token_id") if isinstance(raw, dict) else None
    ids = [] if ids is None else [ids] if isinstance(ids, int) else ids
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DataError(f"{p}: eos_token_id must be an integer or a list of integers (got {ids!r})")
    return ids


class HFTokenizer:
    """`TextTokenizer` of a local Hugging Face folder (prompt and stop ids: docs/internals.md#modelhfpy)."""

    name = "hf"

    def __init__(self, tokenizer, directory: str | Path, chat: bool) -> None:
        path = Path(directory)
        self.tokenizer = tokenizer
        self.directory = path
        self.chat = chat
        """Whether prompts go through the folder's chat template."""
        self.vocab_size = len(tokenizer)  # added tokens included: ids reach len - 1
        limit = getattr(tokenizer, "model_max_length", None)
        self.max_length = int(limit) if isinstance(limit, (int, float)) and limit < 1e9 else None  # 1e30 = unset
        stops = set(_generation_eos(path))
        if tokenizer.eos_token_id is not None:
            stops.add(int(tokenizer.eos_token_id))
        turn_end = _turn_end_id(tokenizer) if chat else None
        if turn_end is not None:
            stops.add(turn_end)
        if not stops:
            turn = "its chat template ends no turn with a special token" if chat else "no chat template is used"
            raise DataError(f"{path}: the tokenizer has no eos token, {turn} and generation_config.json names no "
                            "eos_token_id, so responses could never stop; set eos_token in tokenizer_config.json")
        self.stop_ids = tuple(sorted(stops))

    @classmethod
    def load(cls, directory: str | Path, chat_template: str = "auto") -> HFTokenizer:
        """chat_template: auto (use the folder's template when it has one), on (require one), off (plain text)."""
        if chat_template not in CHAT_MODES:
            raise ConfigError(f"policy.chat_template: must be one of {', '.join(CHAT_MODES)} (got {chat_template!r})")
        path = Path(directory)
        tok = _auto_tokenizer(path)
        has_template = bool(getattr(tok, "chat_template", None))
        if chat_template == "on" and not has_template:
            raise DataError(f"{path}: policy.chat_template=on, but the tokenizer has no chat template; add one "
                            "(chat_template.jinja) or set policy.chat_template=auto or off")
        return cls(tok, path, chat=has_template and chat_template != "off")

    def encode_prompt(self, text: str) -> list[int]:
        tok = self.tokenizer
        if self.chat:
            return _as_ids(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=True))
        ids = list(tok.encode(text, add_special_tokens=False))
        bos = tok.bos_token_id
        return ([bos] if bos is not None and ids[:1] != [bos] else []) + ids

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def save(self, directory: str | Path) -> None:
        self.tokenizer.save_pretrained(str(directory))


def _causal_problem(path: Path, raw: dict) -> str | None:
    """Why config.json is not a causal LM transformers knows, or None."""
    from transformers import AutoConfig, __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:  # custom-code models (trust_remote_code) are not run either
        return f"model_type {model_type!r} is not a model transformers {__version__} knows"
    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001  (unknown model_type is a ValueError, a bad field anything)
        return f"transformers does not know this config ({one_line(exc, 300)})"
    arch = getattr(cfg, "architectures", None) or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.model_type, "")]
    if not any(a.endswith("ForCausalLM") for a in arch):
        return f"not a causal language model (model class {', '.join(arch)}; expected a ...ForCausalLM)"
    return None


def check_hf_folder(directory: str | Path):
    """Everything `load_hf_model` checks before loading; returns the folder's AutoTokenizer."""
    path = Path(directory)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise DataError(f"{cfg_file}: not found; a Hugging Face model folder needs config.json "
                        "(save_pretrained writes it)")
    raw = read_json_file(cfg_file, "expected a Hugging Face model config")
    problem = "expected a JSON object" if not isinstance(raw, dict) else _causal_problem(path, raw)
    if problem:
        raise DataError(f"{cfg_file}: {problem}")
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        raise DataError(f"{path / WEIGHT_FILES[0]}: not found (nor {WEIGHT_FILES[1]}); only safetensors weights are "
                        "loaded (pytorch_model.bin is pickle): convert them with save_pretrained")
    tok = _auto_tokenizer(path)
    text_cfg = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    rows = text_cfg.get("vocab_size")
    if isinstance(rows, int) and len(tok) > rows:
        raise DataError(f"{cfg_file}: vocab_size {rows} (embedding rows) is smaller than the tokenizer's {len(tok)} "
                        "tokens, so its ids would be out of range; use the tokenizer this model was trained with")
    return tok


def load_hf_model(directory: str | Path):
    """A local Hugging Face causal LM in float32 and eval mode (what is refused: docs/internals.md#modelhfpy)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(directory)
    check_hf_folder(path)
    weights = next(path / w for w in WEIGHT_FILES if (path / w).is_file())
    # float32 whatever config.json says (the engines and the learner run fp32; a bf16 checkpoint is upcast);
    # mismatched sizes are reported below with their names, not as transformers' "see the report above"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True,
                                                           output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as exc:  # noqa: BLE001  (a truncated file, a bad header: one line, not a traceback)
        raise DataError(f"{weights}: transformers cannot load this model ({one_line(exc, 300)})") from None
    # transformers initialises missing or mis-shaped tensors randomly and only warns: a silently broken policy
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise DataError(f"{weights}: tensor '{missing[0]}' is missing ({len(missing)} in all); "
                        "does config.json match the weights?")
    wrong = sorted(info.get("mismatched_keys") or [])
    if wrong:
        name, found, expected = wrong[0]
        raise DataError(f"{weights}: tensor '{name}' has shape {list(found)} but config.json implies "
                        f"{list(expected)} ({len(wrong)} in all); does config.json match the weights?")
    return model.float().eval()


# --- a tiny local folder, laid out like a downloaded checkpoint ------------------------------------------------
# ids 0 (pad), 1 (eos and end of turn), 2: the stop id is not the byte tokenizer's EOS 2, so code stopping at 2 shows
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|im_start|>")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('roles must be system, user or assistant') }}{%- endif %}"
    "{%- if message['role'] == 'system' and not loop.first %}"
    "{{- raise_exception('a system message may only come first') }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
BUILD_META = "rlhfless.json"


@dataclass(frozen=True)
class TinyHFConfig:
    """The small Hugging Face folder `build_tiny_hf` makes (a Qwen2 model and a byte-level BPE tokenizer)."""

    vocab_size: int = 2048
    """Largest BPE vocabulary, specials and the 256 byte symbols included (>= 259); a small corpus that runs out
    of pairs to merge gives fewer (the folder's rlhfless.json records the size reached)."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads; must divide num_heads."""
    intermediate_size: int = 512
    """MLP width."""
    max_positions: int = 1024
    """Context length (also the tokenizer's model_max_length)."""
    tied: bool = False
    """Tie lm_head to the embeddings (False by default: untied exercises the general path)."""
    seed: int = 0
    """Seeds the initial weights (the tokenizer depends only on the corpus)."""

    def __post_init__(self) -> None:
        require(self.vocab_size >= 256 + len(SPECIAL_TOKENS), "vocab_size",
                f"must be >= 259: the 256 byte symbols and 3 special tokens (got {self.vocab_size})")
        require(self.hidden_size >= 8, "hidden_size", f"must be >= 8 (got {self.hidden_size})")
        require(self.num_layers >= 1, "num_layers", f"must be >= 1 (got {self.num_layers})")
        require(self.num_heads >= 1 and self.hidden_size % self.num_heads == 0
                and (self.hidden_size // self.num_heads) % 2 == 0, "num_heads",
                f"must divide hidden_size={self.hidden_size} into an even head size (got {self.num_heads})")
        require(self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
                f"must be >= 1 and divide num_heads={self.num_heads} (got {self.num_kv_heads})")
        require(self.intermediate_size >= 1, "intermediate_size", f"must be >= 1 (got {self.intermediate_size})")
        require(self.max_positions >= 16, "max_positions", f"must be >= 16 (got {self.max_positions})")
        require(self.seed >= 0, "seed", f"must be >= 0 (got {self.seed})")


def train_tokenizer(texts: list[str], cfg: TinyHFConfig):
    """A byte-level BPE tokenizer trained on `texts`, as a `Qwen2Tokenizer` with the ChatML template.

    Why Qwen2's pipeline (NFC, its split regex, then ByteLevel without a regex) rather than a plain ByteLevel one:
    transformers 5 loads any folder whose config.json says qwen2 as `Qwen2Tokenizer`, which rebuilds that pipeline
    around the saved vocab and merges; a tokenizer trained with another split would tokenize differently once
    reloaded. Deterministic for a corpus."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # every byte: no unknowns
    bpe.train_from_iterator(texts, trainer)
    trained = json.loads(bpe.to_str())["model"]
    # eos is the end of turn, so plain and chat generation both stop on it; no bos and no unk (as Qwen's tokenizer)
    return Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]], unk_token=None,
                          eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"],
                          chat_template=CHATML_TEMPLATE, model_max_length=cfg.max_positions)


def tiny_model(cfg: TinyHFConfig, tok):
    """A randomly initialised Qwen2ForCausalLM sized for `tok` (seeded; the global torch RNG is left as it was)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    hf_cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tied, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"], dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(hf_cfg)
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = hf_cfg.bos_token_id, hf_cfg.eos_token_id, hf_cfg.pad_token_id
    return model.eval()


def build_tiny_hf(out: str | Path, texts: list[str], cfg: TinyHFConfig, corpus: str | None = None) -> Path:
    """Train the tokenizer on `texts`, initialise the model, and save both into `out` as a Hugging Face folder."""
    import tokenizers
    import transformers

    if not texts:
        raise DataError(f"{corpus or 'corpus'}: no texts to train the tokenizer on")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(texts, cfg)
    model = tiny_model(cfg, tok)
    model.save_pretrained(str(path))  # safetensors; lm_head stored only when untied
    tok.save_pretrained(str(path))
    meta = {"built_by": "rlhfless build-hf-model", "corpus": corpus, "corpus_texts": len(texts),
            "corpus_chars": sum(len(t) for t in texts), "vocab": len(tok), "seed": cfg.seed,
            "params": sum(p.numel() for p in model.parameters()), "tiny_hf_config": asdict(cfg),
            "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}}
    (path / BUILD_META).write_text(json.dumps(meta, indent=1))
    return path


def _built_with(path: Path) -> dict | None:
    p = path / BUILD_META
    raw = read_json_file(p, "delete the folder and build it again")
    return raw.get("tiny_hf_config") if isinstance(raw, dict) else None


def ensure_tiny_hf(out: str | Path, texts: Callable[[], list[str]], cfg: TinyHFConfig, label: str | None = None,
                   after=None) -> Path:
    """`out` when it already holds a model (config.json), else build it there from the corpus: `texts()` gives its
    texts (called only when a build is needed; the task reads them, e.g. `tasks.gsm8k.corpus_texts`), `label` names
    it in the folder's rlhfless.json. `after(folder) -> dict`, when given, runs on the built folder before it is renamed
    into place (a warm start that rewrites the weights); its result is recorded in the folder's rlhfless.json.

    The build goes into a temporary sibling that is renamed into place, so a crash never leaves a half folder.
    A folder this builder made with another `TinyHFConfig` is refused rather than silently reused."""
    path = Path(out)
    if (path / "config.json").is_file():
        built = _built_with(path)
        if built is not None and built != asdict(cfg):
            raise DataError(f"{path / BUILD_META}: this folder was built with {built}, not {asdict(cfg)}; "
                            "delete it or choose another output folder")
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise DataError(f"{path}: exists but holds no model (no config.json); delete it or choose another folder")
    corpus = texts()
    label = label or f"{len(corpus)} task texts"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.building-", dir=path.parent))
    try:
        build_tiny_hf(tmp, corpus, cfg, corpus=label)
        if after is not None:
            meta = json.loads((tmp / BUILD_META).read_text())
            (tmp / BUILD_META).write_text(json.dumps({**meta, **after(tmp)}, indent=1))
        tmp.chmod(0o755)  # mkdtemp makes it private; the model folder is an ordinary one
        os.replace(tmp, path)  # atomic; replaces an empty folder
    except OSError:
        if not (path / "config.json").is_file():  # another process finishing first is fine; anything else is not
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
