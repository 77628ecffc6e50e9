"""An order-independent account of where RLHFless's gain over the paper's verl comes from: exact Shapley values.

Purpose: a ladder that adds one factor per rung credits each factor with its gain *given the rungs below it*, so
the rung order decides the attribution. The Shapley value of a factor is its marginal gain averaged
over every order, phi_i = sum over S in N minus i of |S|! (n - |S| - 1)! / n! x (v(S + i) - v(S)), and the values
add up to v(N) - v(empty) exactly. `shapley(players, value)` computes it from the 2^n coalition values (each
played once: `value` is called once per subset); `scenario.attribution(cfg)` plays the simulator's game:
  * empty coalition: verl as the paper ran it (`SimConfig.paper_verl`) on verl's learner (learner parity);
  * players (those the case's target differs in): `baseline settings` (the paper verl's engine settings ->
    tuned: fastest TP, 0.9 of memory, CUDA graphs, the KV cache kept, shard-only resharding), `learner` (verl's
    mini-batch update -> one optimizer step; only when asked for: `learner=single_step` is ours), `paper design`
    (serverful colocated verl -> the paper's serverless functions with its mechanisms), `overlap`, `hybrid`,
    `extras` (the sized learner, the wide actor, drawn lengths in the scaler);
  * a coalition is a system: without `paper design` it is serverful verl (overlap: `verl-overlap`; hybrid and
    extras then change nothing, the pool is colocated already); with it, RLHFless with the coalition's switches;
  * v_speed(S) = ln(T(empty) / T(S)) (terms multiply: exp(phi) is a factor on speed, their product the total
    speedup); v_cost(S) = 1 - C(S) / C(empty) (terms add in points of cost reduction, device-seconds).
`scenario.mechanisms(cfg)`: the paper design's own split over its mechanisms, a second exact game on the tuned engine and
the case's learner: players `serverless functions`, dedup, assign, migrate, scale, prewarm (a mechanism does
nothing without functions), empty = tuned verl; its terms add up to the paper design's gain in that context.

Non-goals: no sampled (Monte Carlo) Shapley: with at most 6 players a game is 64 systems, each simulated once.

Deviations from the paper: the paper reports a cumulative ablation (one mechanism added at a time).
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
