"""Workloads: the per-step prompt groups (prompt tokens, true response lengths) every policy replays alike.

Three sources, one record (`StepWork` of `GroupWork`s): `replay_trace(path)` (a recorded trace), `synthetic(cfg)`
(`rlhfless.predictor.synthetic`'s multi-epoch generator, GSM8K prompt lengths when given) and `LengthDist` (the
paper settings' length distributions, or `fit_to` a published training log). The rule it keeps: every policy sees
the same lengths, as the paper's replayed baseline does. Details: docs/internals.md#simworkloadpy.

Deviations from the paper:
1. The paper's response lengths (its GSM8K / GPQA / LiveCodeBench runs) are not public; the defaults below are
   assumptions, stated per field (`fit_to` replays a published log's step instead: `PUBLISHED_LENGTHS`).
2. GSM8K prompts are tokenised as characters / 4 (a common rule of thumb for English BPE vocabularies; assumed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError, require
from rlhfless.predictor.synthetic import SyntheticParams, generate_trace


@dataclass(frozen=True)
class GroupWork:
    """One prompt's G samples in one step. lengths: true response tokens per sample; rewards: per sample or ()."""

    prompt_id: str
    prompt_len: int
    lengths: tuple[int, ...]
    rewards: tuple[float, ...] = ()

    @cached_property  # read per group by every policy at every step; a frozen group's never changes
    def tokens(self) -> int:
        """Prompt + response tokens of all samples (what scoring and training process)."""
        return self.prompt_len * len(self.lengths) + sum(self.lengths)


@dataclass(frozen=True)
class StepWork:
    step: int
    epoch: int
    groups: tuple[GroupWork, ...]

    @property
    def n_seqs(self) -> int:
        return sum(len(g.lengths) for g in self.groups)

    @cached_property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.groups)

    # read per group by every policy at every step (the learner's plan, the actors' prefill): built once
    @cached_property
    def prompt_ids(self) -> tuple[str, ...]:
        return tuple([g.prompt_id for g in self.groups])

    @cached_property
    def prompt_lens(self) -> tuple[int, ...]:
        return tuple([g.prompt_len for g in self.groups])

    @cached_property
    def group_sizes(self) -> tuple[int, ...]:
        """Each group's sample count, in group order."""
        return tuple([len(g.lengths) for g in self.groups])

    @cached_property
    def group_tokens(self) -> tuple[int, ...]:
        """Each group's `GroupWork.tokens`, in group order."""
        return tuple([g.tokens for g in self.groups])


@dataclass(frozen=True)
class LengthEvidence:
    """Response-length statistics of one step of a published RL training log (tokens): the generation cap, the
    mean response, the share of responses at the cap (verl's `response_length/clip_ratio`), the shortest and the
    longest one (0 = the cap) and how many responses the step drew (0 = not stated; needed when none hit the cap)."""

    name: str
    source: str
    cap: int
    mean: float
    clip_ratio: float
    minimum: float
    maximum: float = 0.0
    responses: int = 0

    def __post_init__(self) -> None:
        require(0 < self.minimum <= self.mean <= self.cap, f"evidence {self.name}", "needs 0 < min <= mean <= cap")
        require(0 <= self.clip_ratio < 1, f"evidence {self.name}", "needs a cap share in [0, 1)")
        require(self.clip_ratio > 0 or (self.minimum < self.maximum < self.cap and self.responses >= 2),
                f"evidence {self.name}", "without responses at the cap, needs min < max < cap and the count")


# The verl-data logs: github.com/eric-haibin-lin/verl-data, the training logs verl's "Algorithm Baselines"
# docs page links (verl GRPO, LoRA rank 32 on all linear layers, lr 3e-5, 64 prompts x 5 samples a step, vLLM
# rollouts at temperature 1, one epoch); each entry is the last step's console line (`step:116` / `step:117`,
# 320 responses: perf/total_num_tokens / (prompt + response mean)), the policy as its config dump names it.
_VERL_DATA = "github.com/eric-haibin-lin/verl-data"
PUBLISHED_LENGTHS = {
    # llm-d-incubation/py-inference-scheduler, integration/verl/README.md ("Verifying Results"): a verl 0.7.1 GRPO
    # run on GSM8K with vLLM rollouts, step 1 of its console log: response_length/mean 424.5, max 1024 (= the
    # cap), min 26, clip_ratio 0.0737; the slowest request took 20.6 s of generation against a mean of 8.7 s.
    # The log does not name the policy model (the README's walkthrough scripts run Qwen2.5-32B on math).
    "verl-gsm8k-grpo": LengthEvidence(
        "verl-gsm8k-grpo", "llm-d-incubation/py-inference-scheduler integration/verl/README.md (verl 0.7.1, GRPO, "
        "GSM8K, step 1)", cap=1024, mean=424.5, clip_ratio=0.0737, minimum=26.0),
    # gsm8k/Qwen2.5-3B-bsz64_2-prompt512-resp1024-lorarank32-score0.861.log (commit bf76ddd): Qwen2.5-3B-Instruct
    # on GSM8K, step 116: response_length/mean 304.462, max 811, min 138, clip_ratio 0.000 (cap 1024)
    "verl-qwen2.5-3b-gsm8k-grpo": LengthEvidence(
        "verl-qwen2.5-3b-gsm8k-grpo", f"{_VERL_DATA} gsm8k/Qwen2.5-3B-bsz64_2-prompt512-resp1024-lorarank32-"
        "score0.861.log (Qwen2.5-3B-Instruct, GRPO, GSM8K, step 116)", cap=1024, mean=304.462, clip_ratio=0.0,
        minimum=138.0, maximum=811.0, responses=320),
    # gsm8k/Qwen2.5-7B-bsz64_8-prompt512-resp1024-lorarank32-score0.934.log (commit cc49946): Qwen2.5-7B-Instruct
    # on GSM8K, step 116: response_length/mean 268.550, max 749, min 130, clip_ratio 0.000 (cap 1024)
    "verl-qwen2.5-7b-gsm8k-grpo": LengthEvidence(
        "verl-qwen2.5-7b-gsm8k-grpo", f"{_VERL_DATA} gsm8k/Qwen2.5-7B-bsz64_8-prompt512-resp1024-lorarank32-"
        "score0.934.log (Qwen2.5-7B-Instruct, GRPO, GSM8K, step 116)", cap=1024, mean=268.55, clip_ratio=0.0,
        minimum=130.0, maximum=749.0, responses=320),
    # math/Qwen2.5-3B-bsz64_2-prompt1024-resp512-score0.5702.log (commit cc49946): Qwen2.5-3B-Instruct on MATH
    # (DigitalLearningGmbH/MATH-lighteval), step 117: response_length/mean 379.694, max 512 (= the cap), min 65,
    # clip_ratio 0.319 (the W&B summary below it: 0.31875)
    "verl-qwen2.5-3b-math-grpo": LengthEvidence(
        "verl-qwen2.5-3b-math-grpo", f"{_VERL_DATA} math/Qwen2.5-3B-bsz64_2-prompt1024-resp512-score0.5702.log "
        "(Qwen2.5-3B-Instruct, GRPO, MATH, step 117)", cap=512, mean=379.694, clip_ratio=0.31875, minimum=65.0,
        maximum=512.0, responses=320),
    # math/Qwen2.5-7B-bsz64_8-prompt1024-resp512-score0.6513.log (commit bcff590): Qwen2.5-7B-Instruct on MATH,
    # step 117: response_length/mean 314.091, max 512 (= the cap), min 76, clip_ratio 0.191 (W&B: 0.19062)
    "verl-qwen2.5-7b-math-grpo": LengthEvidence(
        "verl-qwen2.5-7b-math-grpo", f"{_VERL_DATA} math/Qwen2.5-7B-bsz64_8-prompt1024-resp512-score0.6513.log "
        "(Qwen2.5-7B-Instruct, GRPO, MATH, step 117)", cap=512, mean=314.091, clip_ratio=0.19062, minimum=76.0,
        maximum=512.0, responses=320),
    # gsm8k/Qwen2.5-32B-bsz64_8-prompt512-resp1024-lorarank32-score0.958.log (commit cc49946): Qwen2.5-32B-Instruct
    # (its config's tokenizer path) on GSM8K, rollout TP 8, step 116: mean 267.388, max 689, min 48, clip_ratio 0.000
    "verl-qwen2.5-32b-gsm8k-grpo": LengthEvidence(
        "verl-qwen2.5-32b-gsm8k-grpo", f"{_VERL_DATA} gsm8k/Qwen2.5-32B-bsz64_8-prompt512-resp1024-lorarank32-"
        "score0.958.log (Qwen2.5-32B-Instruct, GRPO, GSM8K, step 116)", cap=1024, mean=267.388, clip_ratio=0.0,
        minimum=48.0, maximum=689.0, responses=320),
    # gsm8k/Qwen2.5-72B-bs64_8-prompt512-resp1024-lorarank32-score0.960.log (commit bf76ddd): Qwen2.5-72B-Instruct
    # on GSM8K, rollout TP 8, step 116: mean 264.587, max 639, min 108, clip_ratio 0.000
    "verl-qwen2.5-72b-gsm8k-grpo": LengthEvidence(
        "verl-qwen2.5-72b-gsm8k-grpo", f"{_VERL_DATA} gsm8k/Qwen2.5-72B-bs64_8-prompt512-resp1024-lorarank32-"
        "score0.960.log (Qwen2.5-72B-Instruct, GRPO, GSM8K, step 116)", cap=1024, mean=264.587, clip_ratio=0.0,
        minimum=108.0, maximum=639.0, responses=320),
    # math/Qwen2.5-32B-bsz64_8-prompt1024-resp512-score0.6985.log (commit cc49946): Qwen2.5-32B-Instruct (tokenizer
    # path) on MATH, rollout TP 8, the W&B run summary (step 117): mean 253.35001, max 512, min 77, clip 0.0125
    "verl-qwen2.5-32b-math-grpo": LengthEvidence(
        "verl-qwen2.5-32b-math-grpo", f"{_VERL_DATA} math/Qwen2.5-32B-bsz64_8-prompt1024-resp512-score0.6985.log "
        "(Qwen2.5-32B-Instruct, GRPO, MATH, step 117)", cap=512, mean=253.35001, clip_ratio=0.0125, minimum=77.0,
        maximum=512.0, responses=320),
    # math/Qwen2.5-72B-bsz64_8-prompt1024-resp512-score0.7319.log (commit bcff590): Qwen2.5-72B-Instruct on MATH,
    # rollout TP 8, step 117: mean 288.072, max 512, min 93, clip_ratio 0.019 (W&B: 0.01875)
    "verl-qwen2.5-72b-math-grpo": LengthEvidence(
        "verl-qwen2.5-72b-math-grpo", f"{_VERL_DATA} math/Qwen2.5-72B-bsz64_8-prompt1024-resp512-score0.7319.log "
        "(Qwen2.5-72B-Instruct, GRPO, MATH, step 117)", cap=512, mean=288.07187, clip_ratio=0.01875, minimum=93.0,
        maximum=512.0, responses=320),
}
"""Published response-length evidence the workload can be fitted to (`LengthDist.fit_to`); how each was found,
and what was found but not fitted: docs/reproduction.md ("The workload")."""


def capped_spread(ev: LengthEvidence) -> tuple[float, float]:
    """(median, total log-spread s) of the capped lognormal whose cap share and capped mean are `ev`'s: s solves
    E[min(X, cap)] = mean with ln(cap) = mu + s z, z the (1 - clip_ratio) normal quantile. Needs clip_ratio > 0."""
    from statistics import NormalDist

    nd = NormalDist()
    z = nd.inv_cdf(1.0 - ev.clip_ratio)

    def capped_mean(s: float) -> float:
        mu = np.log(ev.cap) - s * z
        return float(np.exp(mu + s * s / 2) * nd.cdf(z - s) + ev.cap * ev.clip_ratio)

    lo, hi = 1e-3, 4.0  # the capped mean falls as s grows at a fixed cap share: bisect
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_mean(mid) > ev.mean else (lo, mid)
    s = (lo + hi) / 2
    return float(ev.cap * np.exp(-s * z)), s


def tail_spread(ev: LengthEvidence) -> tuple[float, float]:
    """(median, s) of the lognormal whose mean is `ev`'s and whose expected longest of `responses` draws is its
    longest response (the tail the simulator's stragglers come from): ln(max / mean) = s z_n - s^2 / 2, z_n the
    normal quantile at (n - 0.375) / (n + 0.25) (Blom's plotting position for the largest of n), the smaller root;
    median = mean exp(-s^2 / 2). For steps where no response reached the cap (the mean is then uncapped). One
    step's longest response is a noisy statistic; the shortest is not used (docs/reproduction.md compares it)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf((ev.responses - 0.375) / (ev.responses + 0.25))
    gap = float(np.log(ev.maximum / ev.mean))
    require(z * z > 2 * gap, f"evidence {ev.name}", "its longest response is too far above its mean for a lognormal")
    s = float(z - np.sqrt(z * z - 2 * gap))
    return float(ev.mean * np.exp(-s * s / 2)), s


def fit_spread(ev: LengthEvidence) -> tuple[float, float]:
    """(median, total log-spread) of `ev`: from its cap share when some responses hit the cap, else from its
    longest response (`tail_spread`)."""
    return capped_spread(ev) if ev.clip_ratio > 0 else tail_spread(ev)


def split_spread(s: float, prompt: float, within: float, epoch: float) -> tuple[float, float, float]:
    """(prompt, within, epoch) log-spreads whose total is `s`: the within-group and epoch parts kept and the
    per-prompt part what s leaves over them; where s does not exceed them (a tight published step), all three
    shrink by one factor, keeping their configured proportions."""
    fixed = float(np.hypot(within, epoch))
    if s > fixed:
        return float(np.sqrt(s * s - fixed ** 2)), within, epoch
    k = s / float(np.sqrt(prompt ** 2 + within ** 2 + epoch ** 2))
    return prompt * k, within * k, epoch * k


def fit_lognormal(ev: LengthEvidence, fixed_sigma: float) -> tuple[float, float]:
    """(median, per-prompt sigma) of a capped lognormal whose cap share and capped mean match `ev`
    (`capped_spread`); the per-prompt part is what the total leaves over `fixed_sigma` (within-group and epoch
    spread, kept). Raises when the total is below `fixed_sigma` (`split_spread` shrinks all three instead)."""
    median, s = capped_spread(ev)
    require(s > fixed_sigma, "lengths.fit_to", f"{ev.name}: the evidence's spread {s:.2f} is below the fixed "
            f"within-group and epoch spread {fixed_sigma:.2f}")
    return median, float(np.sqrt(s * s - fixed_sigma ** 2))


@dataclass(frozen=True)
class LengthDist:
    """Response-length distribution of a setting (the synthetic generator's parameters, tokens).

    Defaults (assumed; GSM8K chain-of-thought answers of Qwen2.5-3B/7B run a few hundred tokens with a long tail
    to the 2,048 cap the paper uses): median 280 tokens, per-prompt spread 0.5 and within-group spread 0.35 in log
    space, 0.15 of epoch-to-epoch jitter, the paper's caps (prompt 1,024, response 2,048 tokens).
    fit_to: a key of `PUBLISHED_LENGTHS` replays that log's step instead: median and max_response become the
    lognormal fitted to its cap, mean and cap share (or, when none hit the cap, its longest response;
    `fit_spread`), and the spreads share its total (`split_spread`: within_sigma and epoch_sigma kept where the
    total exceeds them); "" keeps the fields as given.
    """

    median: float = 280.0
    prompt_sigma: float = 0.5
    within_sigma: float = 0.35
    epoch_sigma: float = 0.15
    drift_per_epoch: float = 0.0
    max_response: int = 2048
    max_prompt: int = 1024
    fit_to: str = ""

    def __post_init__(self) -> None:
        require(self.median >= 1, "lengths.median", f"must be >= 1 token (got {self.median})")
        for f in ("prompt_sigma", "within_sigma", "epoch_sigma"):
            require(getattr(self, f) >= 0, f"lengths.{f}", f"must be >= 0 (got {getattr(self, f)})")
        require(self.max_response >= 1, "lengths.max_response", f"must be >= 1 (got {self.max_response})")
        require(self.max_prompt >= 1, "lengths.max_prompt", f"must be >= 1 (got {self.max_prompt})")
        require(self.fit_to in ("", *PUBLISHED_LENGTHS), "lengths.fit_to",
                f"must be '' or one of {', '.join(PUBLISHED_LENGTHS)} (got {self.fit_to!r})")
        if self.fit_to:  # frozen: the fitted fields replace the given ones once, here, so every reader agrees
            ev = PUBLISHED_LENGTHS[self.fit_to]
            median, s = fit_spread(ev)
            spreads = split_spread(s, self.prompt_sigma, self.within_sigma, self.epoch_sigma)
            for f, v in zip(("median", "prompt_sigma", "within_sigma", "epoch_sigma", "max_response"),
                            (median, *spreads, ev.cap)):
                object.__setattr__(self, f, v)

    def params(self, n_prompts: int, epochs: int, group_size: int, prompts_per_step: int) -> SyntheticParams:
        """The synthetic generator's parameters for this distribution (prompt lengths are drawn apart)."""
        return SyntheticParams(n_prompts=n_prompts, n_epochs=epochs, group_size=group_size,
                               prompts_per_step=prompts_per_step, log_base_mu=float(np.log(self.median)),
                               log_base_sigma=self.prompt_sigma, epoch_sigma=self.epoch_sigma,
                               within_sigma=self.within_sigma, drift_per_epoch=self.drift_per_epoch,
                               max_length=self.max_response)


def trace_rows(dist: LengthDist, n_prompts: int, epochs: int, group_size: int, prompts_per_step: int,
               seed: int = 0) -> list:
    """`epochs` epochs of `dist` over `n_prompts` prompts as `TraceRow`s (the synthetic generator: per-prompt
    history across epochs, 0/1 rewards), for a trace file an emulated run replays (`runtime.length_trace`)."""
    return generate_trace(dist.params(n_prompts, epochs, group_size, prompts_per_step), seed=seed)


def gsm8k_prompt_tokens(path: str | Path, template_tokens: int = 0, chars_per_token: float = 4.0) -> np.ndarray:
    """Prompt tokens of every GSM8K question (characters / chars_per_token, plus a shared template)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"GSM8K file not found: {p}")
    out = []
    with p.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)["question"]
            except (ValueError, KeyError, TypeError):
                raise DataError(f"{p}:{i}: expected a JSON object with a 'question'") from None
            out.append(template_tokens + max(1, round(len(q) / chars_per_token)))
    if not out:
        raise DataError(f"{p}: no questions")
    return np.asarray(out, dtype=np.int64)


def synthetic(dist: LengthDist, n_prompts: int, prompts_per_step: int, group_size: int, steps: int,
              seed: int = 0, prompt_tokens: np.ndarray | None = None,
              template_tokens: int = 0) -> list[StepWork]:
    """`steps` steps of the synthetic generator: each epoch visits every prompt once, prompts_per_step per step.

    prompt_tokens: a pool of prompt lengths (e.g. GSM8K's) to draw each prompt's length from; None = lognormal
    around 120 tokens (assumed) plus the template.
    """
    require(n_prompts >= prompts_per_step >= 1, "prompts_per_step",
            f"must lie in 1..n_prompts={n_prompts} (got {prompts_per_step})")
    epochs = -(-steps * prompts_per_step // n_prompts) + 1
    params = dist.params(n_prompts, epochs, group_size, prompts_per_step)
    rng = np.random.default_rng(seed + 1)
    if prompt_tokens is not None:
        plen = rng.choice(np.asarray(prompt_tokens), size=n_prompts)
    else:
        plen = template_tokens + np.round(np.exp(rng.normal(np.log(120.0), 0.4, n_prompts))).astype(int)
    plen = np.clip(plen, 1, dist.max_prompt)
    if n_prompts * epochs * group_size <= SMALL_TRACE:
        return _group_rows(generate_trace(params, seed=seed), plen, steps)
    return _synthetic_arrays(params, plen, steps, seed)


SMALL_TRACE = 5_000  # rows: above this the vectorised generator avoids a Python object per sample


def _group_rows(rows, plen: np.ndarray, steps: int) -> list[StepWork]:
    by_step: dict[int, dict[str, list]] = defaultdict(dict)
    epoch_of: dict[int, int] = {}
    for r in rows:
        by_step[r.step].setdefault(r.prompt_id, []).append(r.response_len)
        epoch_of[r.step] = r.epoch
    out = []
    for s in sorted(by_step)[:steps]:
        groups = tuple(GroupWork(pid, int(plen[int(pid.split("-")[1])]), tuple(v)) for pid, v in by_step[s].items())
        out.append(StepWork(s, epoch_of[s], groups))
    return out


def _synthetic_arrays(p: SyntheticParams, plen: np.ndarray, steps: int, seed: int) -> list[StepWork]:
    """The model of `predictor.synthetic.generate_trace` (same parameters, same per-epoch structure), drawn with
    arrays instead of one TraceRow per sample: paper-scale traces have millions of samples. Other random draws
    than generate_trace for the same seed; only the steps asked for are built."""
    rng = np.random.default_rng(seed)
    P, G = p.n_prompts, p.group_size
    base = rng.normal(p.log_base_mu, p.log_base_sigma, P)
    out, step = [], 0
    for epoch in range(p.n_epochs):
        u = rng.normal(0.0, p.epoch_sigma, P)
        order = rng.permutation(P)
        logs = base[order, None] + p.drift_per_epoch * epoch + u[order, None] + rng.normal(0, p.within_sigma, (P, G))
        lens = np.minimum(np.maximum(1, np.round(np.exp(logs))), p.max_length).astype(int).tolist()
        ids, lens_of = order.tolist(), plen[order].tolist()  # Python ints, as int(...) and .tolist() per group
        for start in range(0, P, p.prompts_per_step):
            idx = range(start, min(start + p.prompts_per_step, P))
            out.append(StepWork(step, epoch, tuple([GroupWork(f"syn-{ids[i]}", int(lens_of[i]), tuple(lens[i]))
                                                    for i in idx])))
            step += 1
            if step >= steps:
                return out
    return out


def replay_trace(path: str | Path, steps: int | None = None) -> list[StepWork]:
    """Steps of a recorded trace (rows grouped by step, then prompt, in file order); rewards kept."""
    from rlhfless.core.traces import read_trace

    by_step: dict[int, dict[str, list]] = defaultdict(dict)
    epoch_of: dict[int, int] = {}
    for r in read_trace(path):
        g = by_step[r.step].setdefault(r.prompt_id, [r.prompt_len, [], []])
        g[1].append(r.response_len)
        g[2].append(r.reward)
        epoch_of[r.step] = r.epoch
    if not by_step:
        raise DataError(f"{path}: the trace has no rows")
    out = [StepWork(s, epoch_of[s], tuple(GroupWork(pid, pl, tuple(ls), tuple(rw))
                                          for pid, (pl, ls, rw) in by_step[s].items()))
           for s in sorted(by_step)]
    return out[:steps] if steps else out
