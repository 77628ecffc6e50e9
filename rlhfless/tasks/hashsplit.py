"""Train / held-out split of a question file by a stable hash of each question, shared by the file-backed tasks.

Why a hash and not a shuffle: the decision is a function of the question text (and `seed`) alone, so
- the two splits are disjoint by construction, duplicates included (equal normalised questions hash equally and
  are decided together);
- the held-out set does not depend on `num_train` (the train set is drawn after it, from what is left), and a
  larger `num_eval` only adds questions to it;
- it is reproducible across machines and Python runs (sha1, not the salted built-in `hash`).

Distinct questions are ranked by sha1(seed, normalised question); the first ones form the held-out set until it
holds exactly `num_eval` rows, the next ones the train set (`num_train` rows, or all the rest). When the question
at a boundary has duplicate rows, the rows past the boundary are dropped rather than moved to the other split.
Both lists come back in file order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from rlhfless.core.errors import DataError, require

T = TypeVar("T")


def check_split_fields(section: str, num_eval: int, num_train: int | None, format_reward: float) -> None:
    """The split sizes and the format reward every file-backed task config has; errors name `section`.<field>."""
    require(num_eval >= 1, f"{section}.num_eval", f"must be >= 1 (got {num_eval})")
    require(num_train is None or num_train >= 1, f"{section}.num_train",
            f"must be >= 1 or null for all the rest (got {num_train})")
    require(0.0 <= format_reward <= 1.0, f"{section}.format_reward", f"must be in [0, 1] (got {format_reward})")


def normalize_question(text: str) -> str:
    """What makes two questions the same: case and runs of whitespace do not count."""
    return " ".join(text.split()).casefold()


def question_key(text: str, seed: int) -> bytes:
    return hashlib.sha1(f"{seed}\0{normalize_question(text)}".encode()).digest()


def hash_split(rows: Sequence[T], question: Callable[[T], str], num_eval: int, num_train: int | None, seed: int,
               where: str, section: str) -> tuple[list[T], list[T]]:
    """(train, held-out) rows. Errors name the file `where` and the config keys under `section` (``task.gsm8k``)."""
    sizes = f"{section}.num_eval={num_eval} and {section}.num_train={num_train}"
    if len(rows) < num_eval + (num_train or 1):
        raise DataError(f"{where}: {len(rows)} usable rows, too few for {sizes} (at least one train row): "
                        f"lower {section}.num_eval (or num_train) or use a larger file")
    keys = [question_key(question(r), seed) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: (keys[i], i))  # duplicates end up adjacent
    held = _take(order, keys, num_eval, set())
    train = _take(order, keys, num_train, {keys[i] for i in held})
    if len(train) < (num_train or 1):
        raise DataError(f"{where}: only {len(train)} rows left for train after the held-out split (duplicate "
                        f"questions are never split), too few for {sizes}: lower {section}.num_eval or num_train")
    return [rows[i] for i in sorted(train)], [rows[i] for i in sorted(held)]


def _take(order: list[int], keys: list[bytes], n: int | None, exclude: set[bytes]) -> list[int]:
    """The first `n` (None = all) indices in hash order whose question is not in `exclude`."""
    out = [i for i in order if keys[i] not in exclude]
    return out if n is None else out[:n]
