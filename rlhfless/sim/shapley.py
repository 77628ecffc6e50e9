"""An order-independent account of where RLHFless's gain over the paper's verl comes from: exact Shapley values.

`shapley(players, value)` computes each factor's marginal gain averaged over every order from the 2^n coalition
values (`value` called once per subset); the values add up to v(N) - v(empty) exactly. `scenario.attribution(cfg)`
and `scenario.mechanisms(cfg)` play the simulator's games. The rule it keeps: exact values only, no sampling (at most
6 players: 64 systems, each simulated once). The formula, players and value functions:
docs/internals.md#simshapleypy.

Deviations from the paper:
1. The paper reports a cumulative ablation (one mechanism added at a time); this attribution does not depend on the
   order.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Callable, Sequence

import numpy as np

PLAYERS = ("baseline settings", "learner", "paper design", "overlap", "hybrid", "extras")
EXTRAS = ("size_learner", "wide", "draws")
SUB_PLAYERS = ("serverless functions", "dedup", "assign", "migrate", "scale", "prewarm")


def shapley(players: Sequence[str], value: Callable[[frozenset], float]) -> dict[str, float]:
    """Exact Shapley values of `players` under the coalition value `value` (called once per subset: 2^n calls).

    Returns {player: phi}; sum(phi) == value(all) - value(empty) up to rounding."""
    n = len(players)
    v = {frozenset(c): value(frozenset(c)) for k in range(n + 1) for c in combinations(players, k)}
    w = [math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) for k in range(n)]
    return {p: float(sum(w[len(s)] * (v[s | {p}] - v[s]) for s in v if p not in s)) for p in players}


def terms(summaries: dict[frozenset, dict], players: Sequence[str]) -> dict:
    """Shapley terms on speed (factors, product = total speedup) and cost (points, sum = total cost reduction)
    from each coalition's summary; also the totals and the coalition values."""
    base = summaries[frozenset()]
    full = summaries[frozenset(players)]
    sp = shapley(players, lambda s: math.log(base["step_time_s"] / summaries[s]["step_time_s"]))
    co = shapley(players, lambda s: 1.0 - summaries[s]["cost_device_s"] / base["cost_device_s"])
    return {"players": list(players),
            "speed_factor": {p: math.exp(x) for p, x in sp.items()}, "cost_points": co,
            "speedup": base["step_time_s"] / full["step_time_s"],
            "cost_reduction": 1.0 - full["cost_device_s"] / base["cost_device_s"],
            "coalitions": {" + ".join(p for p in players if p in s) or "(none)":
                           {"step_time_s": summaries[s]["step_time_s"], "cost_device_s": summaries[s]["cost_device_s"]}
                           for s in summaries}}


def target_players(cfg, full: bool = False) -> list[str]:
    """The factors the case's RLHFless differs in from its headline verl (`full`: every factor, from the paper's
    verl with verl's learner to the extended design with one optimizer step)."""
    if full:
        return list(PLAYERS)
    sw = cfg.switches()
    out = ["baseline settings"] if cfg.baseline == "paper" else []
    out.append("paper design")
    out += [p for p in ("overlap", "hybrid") if getattr(sw, p)]
    return out + (["extras"] if any(getattr(sw, m) for m in EXTRAS) else [])


def named(t: dict, tol: float = 5e-4) -> list[str]:
    """The players whose term moves speed or cost by more than `tol` (0.05% / 0.05 points), largest first: the
    only ones the report's prose may name as reasons."""
    size = {p: max(abs(math.log(t["speed_factor"][p])), abs(t["cost_points"][p])) for p in t["players"]}
    return [p for p in sorted(size, key=lambda p: -size[p]) if size[p] > tol]


def prose(t: dict, what: str) -> str:
    """One sentence from the terms: each named player's factor on speed and points of cost, nothing else."""
    parts = [f"{p} x{t['speed_factor'][p]:.3f} speed, {t['cost_points'][p]:+.1%} cost" for p in named(t)]
    total = f"{what}: {t['speedup']:.3f}x, {t['cost_reduction']:.1%} = "
    return total + ("; ".join(parts) if parts else "no factor moves it") + " (Shapley, order-independent)"


def check_sums(t: dict) -> tuple[float, float]:
    """(|product of speed factors - speedup|, |sum of cost points - cost reduction|): 0 up to rounding."""
    prod = float(np.prod(list(t["speed_factor"].values())))
    return abs(prod - t["speedup"]), abs(sum(t["cost_points"].values()) - t["cost_reduction"])
