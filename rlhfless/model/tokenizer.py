"""Tokenizers behind one interface (`TextTokenizer`), and the byte-level one built locally (no hub).

The loop never names a tokenizer: `load_tokenizer(checkpoint)` returns the checkpoint's own, which is either this
module's `ByteTokenizer` (the tiny model's: 3 special tokens followed by the 256 byte values) or, for any other
Hugging Face model folder, `rlhfless.model.hf.HFTokenizer` (AutoTokenizer, with the chat template when the
checkpoint has one). Both turn a task prompt into ids (`encode_prompt`), give the ids that end a response
(`stop_ids`) and decode a response. Padding is the engines' own: they left-pad with `PAD_ID` (0, a valid id in
every vocabulary) under an attention mask, so the tokenizer's pad token and padding side never reach the model.

Why bytes: the project must run offline with nothing downloaded, the synthetic task is ASCII, and any text
(GSM8K included) round-trips exactly. A response's length in tokens is its UTF-8 byte count plus one EOS, which
is the "stated tokenizer" for length data made from text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from rlhfless.core.errors import DataError

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
_OFFSET = 3
SPECIALS = {"<pad>": PAD_ID, "<bos>": BOS_ID, "<eos>": EOS_ID}
TOKENIZER_FILE = "tokenizer.json"


class TextTokenizer(Protocol):
    """What the loop, the evaluation and the runtime need of a tokenizer."""

    vocab_size: int
    stop_ids: tuple[int, ...]
    """Token ids that end a response (the engines stop a row at the first one; it is kept in the response)."""
    max_length: int | None
    """Longest sequence the tokenizer declares (None: no limit of its own; the model's context still applies)."""

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a task prompt as the model sees it (BOS, or the chat template's turn markers, included)."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text, no special tokens (a response written for supervised warm-starts)."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a response, special tokens (the stop token among them) left out."""
        ...

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer's files into a checkpoint folder."""
        ...


class ByteTokenizer:
    """Encode text to byte ids offset by the specials; decode skips specials."""

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    vocab_size = _OFFSET + 256
    stop_ids = (EOS_ID,)
    max_length = None
    name = "byte"

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = [b + _OFFSET for b in text.encode("utf-8")]
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text, bos=True)

    def encode_text(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(i - _OFFSET for i in ids if i >= _OFFSET)
        return data.decode("utf-8", errors="replace")

    def response_length(self, text: str) -> int:
        """Tokens a response of this text takes when generated: its bytes plus EOS."""
        return len(text.encode("utf-8")) + 1

    def save(self, directory: str | Path) -> None:
        path = Path(directory) / TOKENIZER_FILE
        path.write_text(json.dumps({"type": "byte", "specials": SPECIALS, "offset": _OFFSET}, indent=1))

    @classmethod
    def load(cls, directory: str | Path) -> ByteTokenizer:
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise DataError(f"tokenizer file not found: {path}")
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a huge integer, deep nesting
            raise DataError(f"{path}: not valid JSON; expected a rlhfless byte tokenizer") from None
        if not isinstance(meta, dict) or meta.get("type") != "byte" or meta.get("offset") != _OFFSET \
                or meta.get("specials") != SPECIALS:
            raise DataError(f"{path}: not a rlhfless byte tokenizer (got {json.dumps(meta)[:200]})")
        return cls()


def is_byte_tokenizer(directory: str | Path) -> bool:
    """True when the folder holds a rlhfless byte tokenizer (a Hugging Face `tokenizer.json` is a different JSON)."""
    path = Path(directory) / TOKENIZER_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and meta.get("type") == "byte"


def load_tokenizer(directory: str | Path, chat_template: str = "auto") -> TextTokenizer:
    """The checkpoint's own tokenizer: the byte tokenizer, or the folder's Hugging Face tokenizer.

    chat_template: auto (use the checkpoint's chat template when it has one), on (require one), off (plain text).
    """
    if is_byte_tokenizer(directory):
        if chat_template == "on":
            raise DataError(f"{directory}: policy.chat_template=on, but the byte tokenizer has no chat template")
        return ByteTokenizer.load(directory)
    from rlhfless.model.hf import HFTokenizer

    return HFTokenizer.load(directory, chat_template=chat_template)
