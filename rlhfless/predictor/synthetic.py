"""Synthetic multi-epoch length traces, and fitting their parameters to a real trace.

Model (all in log tokens; p = prompt, e = epoch, s = sample):
``log L[p,e,s] = b[p] + drift * e + u[p,e] + eps[p,e,s]`` with the per-prompt base ``b ~ N(log_base_mu,
log_base_sigma^2)`` (lognormal, i.e. heavy-tailed lengths), per-epoch jitter ``u ~ N(0, epoch_sigma^2)``
(how much a prompt's typical length moves between epochs; what an EWMA must track), within-group noise
``eps ~ N(0, within_sigma^2)`` (GRPO siblings), then rounding, a floor of 1 and truncation at `max_length`.
Each epoch visits every prompt once in a shuffled order, `prompts_per_step` prompts per step.
Rewards (0/1, what a verifier gives): ``r[p,e,s] ~ Bernoulli(sigmoid(a[p] + solve_drift * e))`` with a per-prompt
difficulty ``a ~ N(solve_logit_mu, solve_logit_sigma^2)`` (assumed: some prompts always solved, some never, most
in between, so GRPO groups have reward variance); a truncated response has no final answer and scores 0. They are
drawn from their own random stream, so a trace's lengths are the same with or without them.

`fit_params` inverts this with moment estimators on the same log scale (method of moments, not MLE).
Deviations / limits: truncated lengths enter the fit as if exact (a small bias when few are truncated);
with no truncated row the fitted `max_length` is the largest observed length (a lower bound of the real cap);
the fit reads lengths only (`LengthRow`s carry no reward), so the reward parameters keep their defaults.
Non-goal: modelling prompt text; prompts are filler of a lognormal length.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlhfless.core.errors import DataError, require
from rlhfless.core.records import TraceRow


@dataclass(frozen=True)
class SyntheticParams:
    """Parameters of the synthetic length-trace generator (lengths in tokens, spreads in log tokens).

    n_prompts: distinct prompts, >= 1.   n_epochs: passes over them, >= 1.   group_size: samples per prompt, >= 1.
    prompts_per_step: prompts per training step, >= 1 (the last step of an epoch may hold fewer).
    log_base_mu: mean over prompts of log base length.   log_base_sigma: its sd over prompts, >= 0.
    epoch_sigma: sd of a prompt's log length from epoch to epoch, >= 0.
    within_sigma: sd of log length within a group, >= 0.
    drift_per_epoch: change of every log length per epoch (e.g. -0.05: 5% shorter each epoch).
    max_length: generation cap; longer responses are truncated to it, >= 1.
    prompt_log_mu, prompt_log_sigma: lognormal prompt length (bytes) parameters; sigma >= 0.
    solve_logit_mu, solve_logit_sigma: a prompt's log-odds of a correct response, mean and sd over prompts (>= 0).
    solve_drift_per_epoch: change of every prompt's log-odds per epoch (training that helps: > 0).
    """

    n_prompts: int = 64
    n_epochs: int = 5
    group_size: int = 8
    prompts_per_step: int = 16
    log_base_mu: float = 5.0
    log_base_sigma: float = 0.6
    epoch_sigma: float = 0.1
    within_sigma: float = 0.25
    drift_per_epoch: float = 0.0
    max_length: int = 1024
    prompt_log_mu: float = 4.0
    prompt_log_sigma: float = 0.3
    solve_logit_mu: float = 0.0
    solve_logit_sigma: float = 1.5
    solve_drift_per_epoch: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_prompts", "n_epochs", "group_size", "prompts_per_step", "max_length"):
            require(getattr(self, name) >= 1, f"synthetic.{name}", f"must be >= 1 (got {getattr(self, name)})")
        for name in ("log_base_sigma", "epoch_sigma", "within_sigma", "prompt_log_sigma", "solve_logit_sigma"):
            require(getattr(self, name) >= 0, f"synthetic.{name}", f"must be >= 0 (got {getattr(self, name)})")


def generate_trace(params: SyntheticParams, seed: int = 0) -> list[TraceRow]:
    """A multi-epoch trace drawn from the model in the module header; deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    P, G = params.n_prompts, params.group_size
    base = rng.normal(params.log_base_mu, params.log_base_sigma, P)
    prompt_bytes = np.maximum(8, np.round(np.exp(rng.normal(params.prompt_log_mu, params.prompt_log_sigma, P))))
    texts = [_prompt_text(p, int(n)) for p, n in enumerate(prompt_bytes)]
    solve = np.random.default_rng([seed, REWARD_STREAM])  # its own stream: the lengths do not depend on it
    ability = solve.normal(params.solve_logit_mu, params.solve_logit_sigma, P)
    rows, step = [], 0
    for epoch in range(params.n_epochs):
        u = rng.normal(0.0, params.epoch_sigma, P)
        order = rng.permutation(P)
        for start in range(0, P, params.prompts_per_step):
            for p in order[start:start + params.prompts_per_step]:
                logs = base[p] + params.drift_per_epoch * epoch + u[p] + rng.normal(0.0, params.within_sigma, G)
                raw = np.maximum(1, np.round(np.exp(logs))).astype(int)
                odds = ability[p] + params.solve_drift_per_epoch * epoch
                right = solve.random(G) < 1.0 / (1.0 + np.exp(-odds))
                for s, length in enumerate(raw):
                    trunc = bool(length >= params.max_length)
                    rows.append(TraceRow(f"syn-{p}", texts[p], epoch, step, s, len(texts[p].encode()),
                                         int(min(length, params.max_length)), trunc,
                                         float(right[s] and not trunc)))
            step += 1
    return rows


REWARD_STREAM = 0x5EED
"""The reward draws' stream key beside the seed (`np.random.default_rng([seed, REWARD_STREAM])`)."""


def _prompt_text(p: int, n_bytes: int) -> str:
    head = f"synthetic prompt {p}:"
    filler = " lorem" * max(0, (n_bytes - len(head)) // 6 + 1)
    return (head + filler)[:max(n_bytes, len(head))]


def _length_of(row) -> int:
    return row.response_len if hasattr(row, "response_len") else row.response_length


def fit_params(rows: Sequence) -> SyntheticParams:
    """Moment estimates of `SyntheticParams` from a trace (`TraceRow`s or `LengthRow`s with epochs)."""
    if not rows or any(r.epoch is None for r in rows):
        raise DataError("fit_params: needs a non-empty trace whose rows all carry an epoch")
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    steps: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in rows:
        groups[(r.prompt_id, r.epoch)].append(math.log(max(_length_of(r), 1)))
        steps[(r.epoch, r.step)].add(r.prompt_id)
    G = Counter(len(v) for v in groups.values()).most_common(1)[0][0]
    within_var = float(np.mean([np.var(v, ddof=1) for v in groups.values() if len(v) > 1] or [0.0]))
    means = {k: float(np.mean(v)) for k, v in groups.items()}
    epochs = sorted({e for _, e in means})
    drift = _drift(means, epochs)
    resid: dict[str, list[float]] = defaultdict(list)
    for (pid, e), m in means.items():
        resid[pid].append(m - drift * e)
    b_hat = {pid: float(np.mean(v)) for pid, v in resid.items()}
    dev2 = sum((x - b_hat[pid]) ** 2 for pid, v in resid.items() for x in v)
    dof = sum(len(v) - 1 for v in resid.values())
    noise = within_var / G
    epoch_var = max(0.0, dev2 / dof - noise) if dof else 0.0
    n_ep = float(np.mean([len(v) for v in resid.values()]))
    spread = float(np.var(list(b_hat.values()), ddof=1)) if len(b_hat) > 1 else 0.0
    base_var = max(0.0, spread - (epoch_var + noise) / n_ep)
    trunc = [_length_of(r) for r in rows if r.truncated]
    prompt_logs = np.log([max(1, len(r.prompt.encode())) for r in {r.prompt_id: r for r in rows}.values()])
    return SyntheticParams(
        n_prompts=len(b_hat), n_epochs=len(epochs), group_size=G,
        prompts_per_step=max(1, round(np.mean([len(v) for v in steps.values()]))),
        log_base_mu=float(np.mean(list(b_hat.values()))), log_base_sigma=math.sqrt(base_var),
        epoch_sigma=math.sqrt(epoch_var), within_sigma=math.sqrt(within_var), drift_per_epoch=drift,
        max_length=max(trunc) if trunc else max(_length_of(r) for r in rows),
        prompt_log_mu=float(prompt_logs.mean()),
        prompt_log_sigma=float(prompt_logs.std(ddof=1)) if len(prompt_logs) > 1 else 0.0,
    )


def _drift(means: dict[tuple[str, int], float], epochs: list[int]) -> float:
    """Slope of the per-epoch average log length over epochs (0 with a single epoch)."""
    if len(epochs) < 2:
        return 0.0
    avg = [np.mean([m for (_, e), m in means.items() if e == ep]) for ep in epochs]
    return float(np.polyfit(epochs, avg, 1)[0])
