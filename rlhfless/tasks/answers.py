"""Final answers of math word problems: where a response states its answer, and when two answers are equal.

Pure functions shared by the GSM8K and JSONL tasks (no I/O, no config): `extract_final(response)` (after the
LAST ``####``, else the last number of the last non-empty line), `normalize_number(s)` (the one number in `s`
as an exact rational in canonical form: ``-3``, ``0.5``, ``1/3``; so ``3/4`` becomes ``0.75``) and
`answers_match(pred, gold)` (both normalise and are equal). The rule it keeps: a string with no number or with
two or more gives None, so a response cannot hedge. Only ASCII digits count; not handled: scientific notation,
decimal commas, mixed numbers, spelled-out numbers. What is ignored around a number:
docs/internals.md#tasksanswerspy.
"""

from __future__ import annotations

import re
from fractions import Fraction

FINAL_MARK = "####"

# One number: an optional sign (a '-' right after a digit is subtraction, not a sign), an integer part with or
# without well-formed thousands groups, an optional decimal part, an optional '/denominator'. Groups must be of
# three digits so that "1,2,3" reads as three numbers, not as 123.
_NUMBER = re.compile(
    r"(?<![0-9])(?P<sign>[-+]?)"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)?"
    r"(?P<frac>\.[0-9]+)?"
    r"(?:/(?P<den>[0-9]+))?"
)


def _numbers(s: str) -> list[re.Match]:
    # '$' sits between a sign and the digits ("-$5"), so it goes before matching
    return [m for m in _NUMBER.finditer(s.replace("$", "")) if m["int"] or m["frac"]]


def marked_final(response: str) -> str | None:
    """The first non-empty line after the last ``####`` (stripped), or None (no ``####``, or nothing after it)."""
    _, sep, tail = response.rpartition(FINAL_MARK)
    if not sep:
        return None
    return next((line.strip() for line in tail.splitlines() if line.strip()), None)


def extract_final(response: str) -> str | None:
    """The response's stated final answer as written (not normalised), or None; see the module docstring."""
    if FINAL_MARK in response:
        return marked_final(response)
    lines = [line for line in response.splitlines() if line.strip()]
    if not lines:
        return None
    found = _numbers(lines[-1])
    return found[-1].group(0).strip() if found else None


def _value(m: re.Match) -> Fraction | None:
    num = Fraction((m["int"] or "0").replace(",", "") + (m["frac"] or ""))
    if m["den"] is not None:
        if m["frac"] or int(m["den"]) == 0:  # "1.5/2" and "3/0" are not answers anyone means
            return None
        num /= int(m["den"])
    return -num if m["sign"] == "-" else num


def _decimal_places(den: int) -> int | None:
    """Digits after the point that 1/den needs, or None when den has a prime factor other than 2 and 5."""
    twos = fives = 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    return max(twos, fives) if den == 1 else None


def _canonical(x: Fraction) -> str:
    k = _decimal_places(x.denominator)
    if k is None:
        return f"{x.numerator}/{x.denominator}"  # a repeating decimal: the reduced fraction is the exact form
    if k == 0:
        return str(x.numerator)
    digits = str(abs(x.numerator) * 10**k // x.denominator).rjust(k + 1, "0")
    return ("-" if x < 0 else "") + digits[:-k] + "." + digits[-k:]  # Fraction is reduced: no trailing zero


def normalize_number(s: str) -> str | None:
    """The single number in `s` in canonical form, or None when `s` has none or several (what is ignored around a
    number: docs/internals.md#tasksanswerspy)."""
    found = _numbers(s)
    if len(found) != 1:
        return None
    value = _value(found[0])
    return None if value is None else _canonical(value)


def answers_match(pred: str | None, gold: str | None) -> bool:
    """True when both are numbers of equal value; False when either is None or not a single number."""
    if pred is None or gold is None:
        return False
    a, b = normalize_number(pred), normalize_number(gold)
    return a is not None and a == b
