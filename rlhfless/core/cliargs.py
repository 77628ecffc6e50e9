"""Argument types for command-line counts: an integer within stated bounds, refused in one line otherwise.

`p.add_argument("--steps", type=count(1, 10_000))`: a value outside 1..10,000, not an integer, or with more
digits than any bound has (Python cannot even parse 5,000 digits) is a usage error naming the range, before
any work; the bounds keep an absurd value (`simulate --steps 1000000000000`) from running for days.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rlhfless.core.errors import quote


def count(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse `type` accepting integers in lo..hi."""

    def parse(text: str) -> int:
        digits = text.strip().lstrip("+-")
        if len(digits) > len(str(hi)) + 2 or not digits.isdigit():
            raise argparse.ArgumentTypeError(f"expected an integer in {lo:,}..{hi:,} (got {quote(text, 30)})")
        value = int(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo:,}..{hi:,} (got {value:,})")
        return value

    parse.__name__ = "count"  # argparse names the type in some messages
    return parse
