"""`rlhfless build-hf-model`: make a small Hugging Face model folder locally (no hub), laid out like a user's.

Only argparse wiring and printing; the work is `rlhfless.model.hf.ensure_tiny_hf`, which tests call directly.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(sub, bench) -> None:
    from rlhfless.tasks.gsm8k import DEFAULT_PATH

    p = sub.add_parser(
        "build-hf-model",
        help="build a small Hugging Face causal-LM folder (BPE tokenizer + random Qwen2) to use as policy.checkpoint",
        description=(
            "Train a byte-level BPE tokenizer on the questions and answers of a GSM8K-format JSONL (special tokens "
            "<|endoftext|>, <|im_start|>, <|im_end|>, a ChatML chat template) and save it with a randomly "
            "initialised Qwen2 model (hidden 128, 2 layers, context 1024, float32 safetensors) into OUT, exactly as "
            "save_pretrained lays out a downloaded checkpoint. Deterministic for a seed. An OUT that already holds "
            "a model is kept (an OUT this command built with other settings is refused)."
        ),
        epilog="example: rlhfless build-hf-model --out data/checkpoints/tiny-hf --vocab 2048 --seed 0",
    )
    p.add_argument("--out", required=True, help="model folder to write (built in a temporary sibling, then renamed)")
    p.add_argument("--corpus", default=DEFAULT_PATH,
                   help=f"GSM8K-format JSONL the tokenizer is trained on (default {DEFAULT_PATH})")
    p.add_argument("--vocab", type=int, default=2048, help="tokenizer vocabulary, >= 259 (default 2048)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights (default 0)")
    p.add_argument("--tied", action="store_true", help="tie lm_head to the embeddings (default untied)")
    p.set_defaults(func=_build)


def _build(args: argparse.Namespace) -> int:
    from rlhfless.model.hf import BUILD_META, TinyHFConfig, ensure_tiny_hf
    from rlhfless.tasks.gsm8k import corpus_texts

    cfg = TinyHFConfig(vocab_size=args.vocab, seed=args.seed, tied=args.tied)
    t0 = time.perf_counter()
    existed = (Path(args.out) / "config.json").is_file()
    out = ensure_tiny_hf(args.out, lambda: corpus_texts(args.corpus), cfg, label=str(args.corpus))
    meta = json.loads((out / BUILD_META).read_text()) if (out / BUILD_META).is_file() else {}
    print(json.dumps({"out": str(out), "reused": existed, "seconds": round(time.perf_counter() - t0, 2), **meta},
                     indent=1))
    return 0
