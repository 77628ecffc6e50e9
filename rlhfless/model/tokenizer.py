"""Byte-level tokenizer built locally (no hub): 3 special tokens followed by the 256 byte values.

Why bytes: the project must run offline with nothing downloaded, the synthetic task is ASCII, and any text
(GSM8K included) round-trips exactly. A response's length in tokens is its UTF-8 byte count plus one EOS, which
is the "stated tokenizer" for length data made from text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from rlhfless.errors import DataError

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
_OFFSET = 3
SPECIALS = {"<pad>": PAD_ID, "<bos>": BOS_ID, "<eos>": EOS_ID}
TOKENIZER_FILE = "tokenizer.json"


class ByteTokenizer:
    """Encode text to byte ids offset by the specials; decode skips specials."""

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    vocab_size = _OFFSET + 256

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = [b + _OFFSET for b in text.encode("utf-8")]
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

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
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{path}: not valid JSON; expected a rlhfless byte tokenizer") from None
        if not isinstance(meta, dict) or meta.get("type") != "byte" or meta.get("offset") != _OFFSET \
                or meta.get("specials") != SPECIALS:
            raise DataError(f"{path}: not a rlhfless byte tokenizer (got {json.dumps(meta)[:200]})")
        return cls()
