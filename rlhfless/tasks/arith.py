"""Chained addition with written steps: a verifiable task whose response lengths behave like real RLHF.

Prompt ``7+3+1+5=``; a solution writes each partial sum, optionally re-checks the chain, then the answer:
``7+3=10;10+1=11;11+5=16;#16`` or, with a check pass, ``7+3=10;10+1=11;11+5=16;chk:7+3=10;...;#16``.

Why this shape (see shared/notes/task-calibration.md: plain chains gave near-identical lengths within a group):
- length grows with the number of terms k, which is heavy-tailed (P(k) ~ k^-alpha on [k_min, k_max]), so the
  response length depends strongly on the prompt and a few long prompts form a long tail;
- a prompt's length is stable across epochs (it is set by k);
- the optional check pass, written in a fraction `check_prob` of SFT solutions, makes the G samples of one prompt
  differ (a sampled policy sometimes checks, sometimes not), like a reasoning model that sometimes re-verifies;
  RL is free to change how often it checks, which gives the length drift real RL training shows.
Rewards are rule-based: 1 for a well-formed response whose final ``#answer`` is right, else 0.
Non-goals: natural language; GSM8K lives in `rlhfless.tasks.gsm8k`.
"""

from __future__ import annotations

import functools
import itertools
import random
import zlib
from dataclasses import dataclass, field
from typing import Literal

from rlhfless.core.errors import ConfigError, require
from rlhfless.core.records import Prompt
from rlhfless.tasks.base import Score


@dataclass
class ArithTaskConfig:
    """Shape of the synthetic chained-addition task."""

    k_min: int = 2
    """Fewest terms in a prompt."""
    k_max: int = 12
    """Most terms in a prompt (the long tail)."""
    k_alpha: float = 1.2
    """Heavy-tail exponent: P(k) is proportional to k^-k_alpha (0 gives uniform k)."""
    max_term: int = 9
    """Terms are integers 0..max_term (0-9 is learnable by the tiny model in minutes)."""
    check_prob: float = 0.25
    """Fraction of SFT solutions that re-check the chain before answering."""
    num_train: int = 4096
    """Prompts in the train split, revisited every epoch (4096 generalises better than 512 at equal steps)."""
    num_eval: int = 1000
    """Prompts in the held-out eval split (disjoint from train)."""
    seed: int = 1234
    """Seed of the prompt sets (not of training)."""

    def __post_init__(self) -> None:
        require(self.k_min >= 2, "task.arith.k_min", f"must be >= 2 (got {self.k_min})")
        require(self.k_max >= self.k_min, "task.arith.k_max",
                f"must be >= task.arith.k_min={self.k_min} (got {self.k_max})")
        require(self.k_max <= 64, "task.arith.k_max", f"must be <= 64 (got {self.k_max})")
        require(self.k_alpha >= 0, "task.arith.k_alpha", f"must be >= 0 (got {self.k_alpha})")
        require(1 <= self.max_term <= 99, "task.arith.max_term", f"must be in [1, 99] (got {self.max_term})")
        require(0.0 <= self.check_prob <= 1.0, "task.arith.check_prob", f"must be in [0, 1] (got {self.check_prob})")
        require(self.num_train >= 1, "task.arith.num_train", f"must be >= 1 (got {self.num_train})")
        require(self.num_eval >= 1, "task.arith.num_eval", f"must be >= 1 (got {self.num_eval})")


@dataclass(frozen=True)
class Problem:
    terms: tuple[int, ...]

    @property
    def text(self) -> str:
        return "+".join(map(str, self.terms)) + "="

    @property
    def answer(self) -> int:
        return sum(self.terms)


def chain(terms: tuple[int, ...]) -> str:
    """The written steps ``a+b=c;`` for running sums (no answer)."""
    out, acc = [], terms[0]
    for t in terms[1:]:
        out.append(f"{acc}+{t}={acc + t};")
        acc += t
    return "".join(out)


def solution(problem: Problem, check: bool) -> str:
    """A correct written solution; `check` adds the re-check pass."""
    steps = chain(problem.terms)
    body = steps + (f"chk:{steps}" if check else "")
    return f"{body}#{problem.answer}"


@functools.lru_cache(maxsize=64)
def _k_table(k_min: int, k_max: int, alpha: float) -> tuple[list[int], list[float]]:
    ks = list(range(k_min, k_max + 1))
    return ks, list(itertools.accumulate(k ** -alpha for k in ks))


def sample_k(rng: random.Random, cfg: ArithTaskConfig) -> int:
    # cum_weights are what `choices(weights=...)` computes on every call: same draws, computed once
    ks, cum = _k_table(cfg.k_min, cfg.k_max, cfg.k_alpha)
    return rng.choices(ks, cum_weights=cum)[0]


def sample_problem(rng: random.Random, cfg: ArithTaskConfig) -> Problem:
    k = sample_k(rng, cfg)
    return Problem(tuple(rng.randint(0, cfg.max_term) for _ in range(k)))


SPLIT_BUCKETS = 5
"""A hash of a problem's text puts it in one of five buckets: bucket 0 is the held-out eval population, buckets
1-2 the GRPO train population, buckets 3-4 the SFT population. The three are disjoint by construction, whatever
the sizes or seeds drawn from them, so no eval (or RL) prompt is ever an SFT example. (Bucket 0 was eval before
the SFT split existed: the eval set is unchanged, so accuracies before and after stay comparable.)"""
Split = Literal["eval", "train", "sft"]
_BUCKET_SPLIT: tuple[Split, ...] = ("eval", "train", "train", "sft", "sft")


def split_of(terms: tuple[int, ...]) -> Split:
    """Which population a problem belongs to (pure; see SPLIT_BUCKETS)."""
    return _BUCKET_SPLIT[zlib.crc32("+".join(map(str, terms)).encode()) % SPLIT_BUCKETS]


def sample_from(rng: random.Random, cfg: ArithTaskConfig, split: Split) -> Problem:
    """Draw from the task distribution restricted to one population (rejection: the hash is uniform)."""
    for _ in range(100_000):
        p = sample_problem(rng, cfg)
        if split_of(p.terms) == split:
            return p
    raise ConfigError(f"task: cannot draw a {split} problem; widen task.arith.k_max or task.arith.max_term")


def _draw(rng: random.Random, cfg: ArithTaskConfig, n: int, split: Split) -> list[Prompt]:
    seen: set[tuple[int, ...]] = set()
    out: list[Prompt] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        require(attempts < 200 * (n + 10), "task", f"cannot draw {n} distinct {split} prompts; widen k or terms")
        p = sample_from(rng, cfg, split)
        if p.terms in seen:
            continue
        seen.add(p.terms)
        out.append(Prompt(f"{split}-{len(out):05d}", p.text, str(p.answer), meta={"k": len(p.terms)}))
    return out


def make_splits(cfg: ArithTaskConfig) -> tuple[list[Prompt], list[Prompt]]:
    """Disjoint train and eval prompt sets, reproducible from `cfg.seed`.

    A hash of each prompt decides which split it may belong to (`split_of`), and each split is drawn from its own random
    stream, so the eval set does not change when `num_train` does (comparisons across train sizes stay fair).
    """
    train = _draw(random.Random(cfg.seed), cfg, cfg.num_train, "train")
    evals = _draw(random.Random(cfg.seed + 1), cfg, cfg.num_eval, "eval")
    return train, evals


def score(response: str, answer: str, finished: bool) -> Score:
    """Rule-based reward: 1 if the response ended (EOS) with ``#<answer>`` and nothing after it, else 0.

    `response` is the decoded text without EOS; `finished` says whether the model emitted EOS.
    """
    head, sep, tail = response.rpartition("#")
    well_formed = finished and bool(sep) and tail.isdigit() and "#" not in head
    correct = well_formed and tail == answer
    return Score(reward=1.0 if correct else 0.0, correct=correct, well_formed=well_formed)


class ArithTask:
    """The chained-addition task behind the `Task` interface (`tasks.base`)."""

    name = "arith"

    def __init__(self, cfg: ArithTaskConfig):
        self.cfg = cfg

    def splits(self) -> tuple[list[Prompt], list[Prompt]]:
        return make_splits(self.cfg)

    def score(self, response: str, answer: str, finished: bool) -> Score:
        return score(response, answer, finished)


@dataclass
class SFTStream:
    """Endless SFT examples (prompt, solution) from the SFT population only (never a train or eval prompt),
    reproducible from a seed."""

    cfg: ArithTaskConfig
    seed: int
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def next(self) -> tuple[str, str]:
        p = sample_from(self._rng, self.cfg, "sft")
        return p.text, solution(p, check=self._rng.random() < self.cfg.check_prob)

    def permutation(self, n: int) -> list[int]:
        order = list(range(n))
        self._rng.shuffle(order)
        return order
