"""A local Hugging Face folder as the policy (`rlhfless.model.hf`): the tiny builder makes a normal HF folder that
transformers, `load_policy`/`load_tokenizer` and the project's own engine all accept; every refusal names its file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.model import hf
from rlhfless.model.factory import ModelConfig, build_model, load_policy, save_checkpoint
from rlhfless.model.hf import HFTokenizer, TinyHFConfig, build_tiny_hf, ensure_tiny_hf, load_hf_model
from rlhfless.tasks.gsm8k import corpus_texts
from rlhfless.model.tokenizer import ByteTokenizer, is_byte_tokenizer, load_tokenizer

CFG = TinyHFConfig(vocab_size=300, max_positions=256)
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


def _write_corpus(path: Path, n: int = 40) -> Path:
    rows = [{"question": f"Ann has {i} pens and gets {i + 7} more from Bob. How many pens does Ann have now?",
             "answer": f"Ann has {i} + {i + 7} = <<{i}+{i + 7}={2 * i + 7}>>{2 * i + 7} pens.\n#### {2 * i + 7}"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("corpus") / "train.jsonl")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, corpus) -> Path:
    return build_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny", corpus_texts(corpus), CFG, corpus=str(corpus))


@pytest.fixture(scope="module")
def tok(folder) -> HFTokenizer:
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def model(folder):
    return load_policy(folder)


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def _logits(model, ids: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def test_built_folder_is_a_normal_hf_folder(folder, tok, model, corpus):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto_tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    auto_model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    assert isinstance(tok, HFTokenizer) and tok.chat and tok.name == "hf"
    assert not is_byte_tokenizer(folder) and len(auto_tok) == tok.vocab_size == CFG.vocab_size
    assert tok.max_length == CFG.max_positions and model.config.vocab_size == tok.vocab_size
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert not model.config.tie_word_embeddings  # untied: lm_head is its own tensor
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    # the reloaded model is the one built: same seed, same weights, same logits
    built = hf.tiny_model(CFG, hf.train_tokenizer(corpus_texts(corpus), CFG))
    batch = [tok.encode_prompt(QUESTION)[:12], tok.encode_prompt("2+2")[:12]]
    assert torch.equal(_logits(built, batch), _logits(model, batch))
    assert torch.equal(_logits(auto_model.float(), batch), _logits(model, batch))
    meta = json.loads((folder / "rlhfless.json").read_text())
    assert meta["seed"] == CFG.seed and meta["vocab"] == CFG.vocab_size and meta["corpus_texts"] == 80


def test_tied_variant_shares_the_embedding(tmp_path, corpus):
    out = build_tiny_hf(tmp_path / "tied", corpus_texts(corpus), TinyHFConfig(vocab_size=300, tied=True))
    m = load_hf_model(out)
    assert m.config.tie_word_embeddings and m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()


def test_reloaded_tokenizer_tokenizes_like_the_trained_one(folder, tok, corpus):
    """transformers 5 reloads a qwen2 folder as Qwen2Tokenizer, rebuilding its pipeline: it must match training."""
    from tokenizers import Tokenizer

    trained = hf.train_tokenizer(corpus_texts(corpus), CFG)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in (QUESTION, "Hello  world\n\n 12345 ünï!!\t'll x", "<|im_start|>user\nhi<|im_end|>\n", "Ω≈ 🙂"):
        ids = tok.tokenizer.encode(text, add_special_tokens=False)
        assert ids == trained.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert type(tok.tokenizer).__name__ == "Qwen2Tokenizer"


def test_encode_prompt_with_and_without_the_chat_template(folder, tok):
    raw = tok.tokenizer
    ids = tok.encode_prompt(QUESTION)
    start = raw.encode("<|im_start|>user\n", add_special_tokens=False)
    gen = raw.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[: len(start)] == start and ids[-len(gen):] == gen and all(isinstance(i, int) for i in ids)
    plain = load_tokenizer(folder, chat_template="off")
    assert not plain.chat and plain.encode_prompt(QUESTION) == raw.encode(QUESTION, add_special_tokens=False)
    assert tok.decode(raw.encode(QUESTION, add_special_tokens=False)) == QUESTION
    assert tok.decode(ids) == f"user\n{QUESTION}\nassistant\n"  # specials skipped
    assert tok.vocab_size == len(raw)


def test_stop_ids_hold_the_end_of_turn(folder, tok):
    im_end = tok.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tok.stop_ids == (im_end,) == (1,)  # eos is the end of turn; see the hf module header for why not 2
    gen = folder / "generation_config.json"
    saved = gen.read_text()
    try:  # generation_config's eos ids are stop ids too (int or list)
        gen.write_text(json.dumps({**json.loads(saved), "eos_token_id": [3, 0]}))
        assert load_tokenizer(folder).stop_ids == (0, 1, 3)
    finally:
        gen.write_text(saved)


def test_chat_on_without_a_template_names_the_folder(folder, tmp_path):
    d = _copy(folder, tmp_path)
    (d / "chat_template.jinja").unlink()
    assert not load_tokenizer(d).chat  # auto: plain text
    with pytest.raises(DataError, match=f"{d}: policy.chat_template=on"):
        load_tokenizer(d, chat_template="on")
    with pytest.raises(ConfigError, match="policy.chat_template"):
        HFTokenizer.load(d, chat_template="yes")


def test_no_stop_token_and_no_tokenizer_files_are_refused(folder, tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    d = tmp_path / "no-eos"  # a tokenizer-only folder: with a qwen2 config.json, eos would default to <|endoftext|>
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(folder / "tokenizer.json"))).save_pretrained(d)
    with pytest.raises(DataError, match=f"{d}: the tokenizer has no eos token.*could never stop"):
        load_tokenizer(d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert load_tokenizer(d).stop_ids == (2,)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    with pytest.raises(DataError, match="no tokenizer files"):
        load_tokenizer(d)


BERT = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 300, "hidden_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.mark.parametrize("case,file", [("no config", "config.json"), ("bad json", "config.json"),
                                       ("bert", "config.json"), ("unknown type", "config.json"),
                                       ("no weights", "model.safetensors"), ("small vocab", "config.json"),
                                       ("missing tensor", "model.safetensors"), ("wrong shape", "model.safetensors"),
                                       ("truncated", "model.safetensors")])
def test_load_hf_model_errors_name_the_file(folder, tmp_path, case, file):
    d = _copy(folder, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    if case == "no config":
        (d / "config.json").unlink()
    elif case == "bad json":
        (d / "config.json").write_text("{not json")
    elif case == "bert":
        (d / "config.json").write_text(json.dumps(BERT))
    elif case == "unknown type":
        (d / "config.json").write_text(json.dumps({**cfg, "model_type": "no-such-model"}))
    elif case == "no weights":
        (d / "model.safetensors").unlink()
    elif case == "small vocab":
        (d / "config.json").write_text(json.dumps({**cfg, "vocab_size": 290}))
    elif case == "truncated":
        (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:1000])
    else:  # transformers would initialise these randomly and only warn
        weights = load_file(d / "model.safetensors")
        if case == "missing tensor":
            weights.pop("model.norm.weight")
        else:
            weights["model.norm.weight"] = torch.ones(3)
        save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(DataError) as err:
        load_hf_model(d)
    assert str(d / file) in str(err.value) and "\n" not in str(err.value)


def test_builds_are_deterministic_for_a_seed(folder, corpus, tmp_path):
    texts = corpus_texts(corpus)
    again = build_tiny_hf(tmp_path / "a", texts, CFG)
    other = build_tiny_hf(tmp_path / "b", texts, TinyHFConfig(vocab_size=CFG.vocab_size, max_positions=256, seed=1))
    assert (again / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    w0, w1, w2 = (load_file(p / "model.safetensors") for p in (folder, again, other))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not torch.equal(w0["model.embed_tokens.weight"], w2["model.embed_tokens.weight"])
    assert (other / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()  # corpus only


def test_save_checkpoint_round_trips_the_hf_tokenizer(model, tok, tmp_path):
    out = save_checkpoint(model, tmp_path / "ck", meta={"step": 3}, tokenizer=tok)
    tok2, model2 = load_tokenizer(out), load_policy(out)
    assert isinstance(tok2, HFTokenizer) and tok2.stop_ids == tok.stop_ids and tok2.chat
    assert tok2.encode_prompt(QUESTION) == tok.encode_prompt(QUESTION)
    batch = [tok.encode_prompt(QUESTION)]
    assert torch.equal(_logits(model2, batch), _logits(model, batch))


def test_byte_checkpoints_still_go_through_the_strict_loader(tmp_path):
    m = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                                max_positions=64))
    out = save_checkpoint(m, tmp_path / "byte")
    assert is_byte_tokenizer(out) and isinstance(load_tokenizer(out), ByteTokenizer)
    assert load_policy(out).config.vocab_size == ByteTokenizer.vocab_size
    with pytest.raises(DataError, match="policy.checkpoint: no folder at .*rlhfless build-hf-model"):
        load_policy(tmp_path / "nothing")


@pytest.mark.parametrize("impl", ["auto", "hf"])  # auto: the fast Qwen2 stepper (untied lm_head); hf: HF forward
def test_own_engine_greedy_matches_hf_generate(model, tok, impl):
    from rlhfless.rollout.engine import SamplingParams, generate

    prompts = [tok.encode_prompt(QUESTION), tok.encode_prompt("How many pens?")]  # unequal: left padding in play
    out = generate(model, prompts, 2, SamplingParams(16, 0.0), seed=0, impl=impl)
    for g, p in enumerate(prompts):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=False, max_new_tokens=16)[0, len(p):].tolist()
        for s in range(2):
            got = out.responses[2 * g + s]
            n = min(len(got), len(ref))  # either may stop at the eos earlier than max_new_tokens
            assert n >= 1 and got[:n] == ref[:n]


def test_ensure_builds_once_atomically_and_refuses_other_settings(tmp_path, corpus, monkeypatch):
    out = tmp_path / "m"

    def crash(*a, **k):
        (Path(a[0]) / "config.json").write_text("{}")  # a half-written folder...
        raise RuntimeError("killed")

    with monkeypatch.context() as mp:
        mp.setattr(hf, "build_tiny_hf", crash)
        with pytest.raises(RuntimeError):
            ensure_tiny_hf(out, lambda: corpus_texts(corpus), TinyHFConfig(vocab_size=300))
    assert list(tmp_path.iterdir()) == []  # ...never becomes `out`, and the temporary sibling is gone
    cfg = TinyHFConfig(vocab_size=300)
    assert ensure_tiny_hf(out, lambda: corpus_texts(corpus), cfg) == out and (out / "config.json").is_file()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_hf(out, lambda: corpus_texts(corpus), cfg) == out and (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="rlhfless.json: this folder was built with"):
        ensure_tiny_hf(out, lambda: corpus_texts(corpus), TinyHFConfig(vocab_size=300, seed=5))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(DataError, match="no config.json"):
        ensure_tiny_hf(tmp_path / "junk", lambda: corpus_texts(corpus), cfg)
    with pytest.raises(DataError, match="GSM8K file not found"):
        ensure_tiny_hf(tmp_path / "n", lambda: corpus_texts(tmp_path / "missing.jsonl"), cfg)


def test_config_validation_names_the_field():
    for kwargs, field in (({"vocab_size": 100}, "vocab_size"), ({"num_heads": 3}, "num_heads"),
                          ({"num_kv_heads": 3}, "num_kv_heads"), ({"max_positions": 8}, "max_positions")):
        with pytest.raises(ConfigError, match=f"^{field}: "):
            TinyHFConfig(**kwargs)


def test_cli_builds_and_reuses(tmp_path, corpus, capsys):
    from rlhfless.cli import main

    out = tmp_path / "cli"
    assert main(["build-hf-model", "--out", str(out), "--corpus", str(corpus), "--vocab", "300", "--tied"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert not first["reused"] and first["vocab"] == 300 and first["tiny_hf_config"]["tied"]
    assert main(["build-hf-model", "--out", str(out), "--corpus", str(corpus), "--vocab", "300", "--tied"]) == 0
    assert json.loads(capsys.readouterr().out)["reused"]
    assert main(["build-hf-model", "--out", str(tmp_path / "x"), "--corpus", str(corpus), "--vocab", "10"]) == 2
    assert "vocab_size: must be >= 259" in capsys.readouterr().err
