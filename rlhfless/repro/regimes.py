"""The regime map (issue 41 item 2): where the paper's design pays against the paper's verl, and why.

`regimes(ctx)` simulates the paper's design (`design=paper`, verl's learner in both) against verl on a grid of
conditions around the 70B headline (`paper-sim`): the response tail (spread, cap, median, within-group spread, the
published fits of `sim.workload.PUBLISHED_LENGTHS`), cluster size, model size, the decode function's engine start
and the container start, keep-alive, and, computed from each condition's device-seconds, the serverless-to-on-demand
price ratio. Each condition is compared at equal engine settings (the tuned verl: the same TP and engine as the
paper design's functions) and at the paper's settings (verl as the paper ran it, `SimConfig.paper_verl`), and its
Shapley account against the paper's verl is played (two players: "baseline settings", the paper verl's engine
against the tuned one, and "paper design", serverful to the paper's functions and mechanisms; `sim.shapley`).
Conditions run in worker processes (`jobs`), one simulation each, nothing shared.

Figures: per map a heatmap of speedup, cost reduction and break-even price ratio (2 baselines), and one of the two
Shapley terms; `regimes.json` holds every condition. A region is the cells of a map on one side of speedup 1 and
cost cut 0 against the paper's verl; the report gives each region's mean Shapley terms and, in the full run, the
paper design's split over its mechanisms (`scenario.mechanisms`, 8 steps) at the median cell of the largest region
of each kind (faster or slower, cheaper or dearer): the games of every region would take hours on 2 cores.

Deviations from the paper: the paper reports one condition per scale; this map is ours. The price ratio is not
simulated: serverless dollars are billed device-seconds x the serverless price, serverful ones held device-seconds
x the on-demand price (`plan.cost`), so the dollar cut at ratio r is 1 - r x ours / verl and breaks even at
r* = verl device-s / ours.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

from rlhfless.repro.plots import save, theme
from rlhfless.repro.records import PaperRow, StudyResult

BASE = ("design=paper", "baseline=paper", "learner=parity")
"""Every condition: the paper's design against the paper's verl, verl's learner in both (docs/reproduction.md)."""
PAPER_POINTS = {"testbed": (1.35, 0.448), "160-GPU": (1.23, 0.387)}
MODELS = ("qwen2.5-7b", "llama-3-8b", "qwen2.5-14b", "qwen2.5-32b", "llama-70b")
CLUSTERS = (40, 80, 160, 320, 640)


@dataclass(frozen=True)
class Axis:
    key: str
    """A `SimConfig` key (dotted for nested ones)."""
    values: tuple
    quick: tuple
    label: str = ""


@dataclass(frozen=True)
class RegimeMap:
    name: str
    x: Axis
    y: Axis
    fixed: tuple[str, ...] = ()
    """Overrides of every cell besides the two axes (tp=0: each model at its tuned TP)."""
    quick: bool = False
    """Played in the --quick (CI) run too."""


def _x(base: float, mults=(0.0, 0.5, 1.0, 2.0, 4.0)) -> tuple:
    """A default and its multiples (0: free)."""
    return tuple(round(base * m, 3) for m in mults)


def maps() -> tuple[RegimeMap, ...]:
    """The grid: pairs of axes, every other setting at paper-sim's (defaults read from the code, so a changed
    default moves the map, not a stale number)."""
    from rlhfless.sim.overheads import DEFAULT

    eng, cont = DEFAULT["engine_init_s"], DEFAULT["container_start_s"]
    sigma = Axis("lengths.prompt_sigma", (0.25, 0.5, 0.8, 1.2), (0.25, 0.8), "per-prompt spread of log length")
    cap = Axis("lengths.max_response", (1024, 2048, 4096, 16384), (2048, 16384), "response cap (tokens)")
    nodes = Axis("n_devices", CLUSTERS, (40, 160), "devices (H100)")
    model = Axis("model", MODELS, ("qwen2.5-14b", "llama-70b"), "model")
    engine = Axis("engine_init_s", _x(eng), (0.0, eng), "decode engine start (s)")
    engine4 = Axis("engine_init_s", _x(eng, (0.0, 1.0, 2.0, 4.0)), (0.0, eng), "decode engine start (s)")
    container = Axis("container_start_s", _x(cont), (cont,), "container start (s)")
    keep = Axis("billing.keep_alive_s", (0.0, 2.0, 5.0, 10.0, 30.0, 60.0), (0.0, 30.0), "keep-alive (s)")
    return (
        RegimeMap("tail", sigma, cap, quick=True),
        RegimeMap("lengths", Axis("lengths.median", (150, 220, 280, 450, 600), (), "median response (tokens)"),
                  Axis("lengths.within_sigma", (0.1, 0.35, 0.5, 0.7), (), "within-group spread of log length")),
        RegimeMap("cluster-model", nodes, model, ("tp=0",), quick=True),
        RegimeMap("cluster-tail", nodes, sigma),
        RegimeMap("cluster-cap", nodes, cap),
        RegimeMap("model-tail", sigma, model, ("tp=0",)),
        RegimeMap("cold-start", engine, container, quick=True),
        RegimeMap("keep-alive", keep, engine4, quick=True),
        RegimeMap("keep-alive-cluster", keep, nodes),
    )


def conditions(quick: bool, only: tuple[str, ...] = ()) -> list[tuple[str, dict, list[str]]]:
    """(map, {axis key: value}, overrides) of every cell; the published fits as a map of one axis. `only`: these
    maps alone (names of `maps()`, or "published-fits")."""
    from rlhfless.sim.workload import PUBLISHED_LENGTHS

    out = []
    for m in maps():
        if (quick and not m.quick) or (only and m.name not in only):
            continue
        xs, ys = (m.x.quick, m.y.quick) if quick else (m.x.values, m.y.values)
        for y in ys:
            for x in xs:
                out.append((m.name, {m.x.key: x, m.y.key: y}, [*m.fixed, f"{m.x.key}={x}", f"{m.y.key}={y}"]))
    fits = list(PUBLISHED_LENGTHS)[:1] if quick else list(PUBLISHED_LENGTHS)
    for fit in fits if not only or "published-fits" in only else ():
        out.append(("published-fits", {"lengths.fit_to": fit}, [f"lengths.fit_to={fit}"]))
    return out


def _condition(args: tuple) -> dict:
    """One cell: both baselines, the break-even price ratio and the two-player Shapley account (one process)."""
    name, at, overrides, steps, sim = args
    from rlhfless.core.errors import ConfigError
    from rlhfless.sim.scenario import attribution, case_configs, run_case

    t0 = time.process_time()
    try:
        cfg = case_configs("paper-sim", steps, [*sim, *BASE, *overrides])[0]
        case = run_case(cfg, only=("verl", "verl-paper", "rlhfless"), jobs=1)
        shap = attribution(cfg, jobs=1)
    except ConfigError as exc:  # a model that does not fit the cluster: an empty cell, said why
        return {"map": name, "at": at, "error": str(exc)}
    p = case["policies"]
    out = {"map": name, "at": at, "paper_tp": case["paper_tp"], "tp": case["tp"],
           "n_actors": p["rlhfless"]["n_actors"], "cpu_s": time.process_time() - t0,
           "shapley_speed": shap["speed_factor"], "shapley_cost": shap["cost_points"]}
    for base, pol in (("paper", "verl-paper"), ("tuned", "verl")):
        b = case["baselines"][base]
        out[base] = {"speedup": b["speedup"], "cost_reduction": b["cost_reduction"],
                     "cost_reduction_usd": b["cost_reduction_usd"],
                     "break_even_ratio": p[pol]["cost_device_s"] / p["rlhfless"]["cost_device_s"],
                     "step_s": p[pol]["step_time_s"], "device_s": p[pol]["cost_device_s"]}
    out["ours"] = {"step_s": p["rlhfless"]["step_time_s"], "device_s": p["rlhfless"]["cost_device_s"]}
    return out


def run_map(quick: bool, steps: int, sim: tuple = (), jobs: int | None = None,
            only: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """Every condition (`only`: of these maps) in `jobs` processes (default: this process's cores); returns
    (cells, timing)."""
    todo = [(n, at, ov, steps, tuple(sim)) for n, at, ov in conditions(quick, only)]
    jobs = jobs or len(os.sched_getaffinity(0))
    t0, c0 = time.perf_counter(), os.times()
    if jobs <= 1:
        cells = [_condition(a) for a in todo]
    else:
        cells = _fork_map(_condition, todo, jobs)
    c1 = os.times()
    timing = {"conditions": len(todo), "steps": steps, "jobs": jobs, "wall_s": time.perf_counter() - t0,
              "cpu_s": (c1.children_user + c1.children_system + c1.user + c1.system)
              - (c0.children_user + c0.children_system + c0.user + c0.system),
              "load_avg": os.getloadavg(),
              "cpu_s_per_condition": sum(c.get("cpu_s", 0) for c in cells) / max(len(cells), 1)}
    return cells, timing


def _fork_map(fn, args: list, jobs: int) -> list:
    """[fn(a) for a in args] in `jobs` forked processes, in order. The cut simulation's numba kernel is loaded
    here first, so the processes share it instead of each loading it; an executor, not a multiprocessing.Pool,
    so a process that dies (killed, out of memory) fails the map instead of leaving it waiting forever."""
    from concurrent.futures import ProcessPoolExecutor

    from rlhfless.plan.migrate import warm_kernel

    warm_kernel()
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
        return list(pool.map(fn, args))


def catalog_ratio(device: str = "H100") -> float:
    """The catalog's serverless-to-on-demand price ratio per device-second (`plan.cost.CATALOG`)."""
    from rlhfless.plan.cost import price

    p = price(device)
    return p.serverless_usd_per_s / (p.ondemand_usd_per_h / 3600.0)


def regions(cells: list[dict]) -> list[dict]:
    """Each map's cells grouped by the side of speedup 1 and cost cut 0 against the paper's verl, with the mean
    Shapley terms (geometric for speed factors) and the median cell (by cost cut)."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        if "error" in c:
            continue
        p = c["paper"]
        groups.setdefault((c["map"], p["speedup"] >= 1.0, p["cost_reduction"] >= 0.0), []).append(c)
    out = []
    for (name, faster, cheaper), cs in sorted(groups.items()):
        cs = sorted(cs, key=lambda c: c["paper"]["cost_reduction"])
        players = list(cs[0]["shapley_speed"])
        out.append({"map": name, "faster": faster, "cheaper": cheaper, "cells": len(cs),
                    "speed": {pl: math.exp(sum(math.log(c["shapley_speed"][pl]) for c in cs) / len(cs))
                              for pl in players},
                    "cost": {pl: sum(c["shapley_cost"][pl] for c in cs) / len(cs) for pl in players},
                    "median": cs[len(cs) // 2]["at"]})
    return out


def _label(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def heatmap_figure(m: RegimeMap, cells: list[dict], catalog: float):
    """speedup, cost cut and break-even price ratio against both verls, one row per baseline (a pyplot figure)."""
    import pandas as pd

    plt, sns = theme()
    rows = [{"x": _label(c["at"][m.x.key]), "y": _label(c["at"][m.y.key]), "base": base, **c[base]}
            for c in cells if "error" not in c for base in ("tuned", "paper")]
    df = pd.DataFrame(rows)
    xs = [_label(v) for v in dict.fromkeys(c["at"][m.x.key] for c in cells)]
    ys = [_label(v) for v in dict.fromkeys(c["at"][m.y.key] for c in cells)]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = (("speedup", "speedup", "RdBu", 1.0, ".2f"), ("cost_reduction", "cost reduction (device-s)", "RdBu",
              0.0, ".0%"), ("break_even_ratio", f"break-even price ratio (catalog {catalog:.2f})", "RdBu", 1.0,
                            ".2f"))
    for r, (base, title) in enumerate((("tuned", "equal engine settings (tuned verl)"),
                                       ("paper", "the paper's settings (paper verl)"))):
        sub = df[df.base == base]
        for k, (col, label, cmap, center, fmt) in enumerate(panels):
            grid = sub.pivot(index="y", columns="x", values=col).reindex(index=ys, columns=xs)
            sns.heatmap(grid.astype(float), annot=True, fmt=fmt, cmap=cmap, center=center, ax=axes[r, k],
                        cbar=False, annot_kws={"fontsize": 7}, mask=grid.isna())
            axes[r, k].set(title=f"{label}\nvs {title}", xlabel=m.x.label or m.x.key, ylabel=m.y.label or m.y.key)
            axes[r, k].title.set_fontsize(9)
    fig.suptitle(f"regime map '{m.name}': the paper's design vs verl (simulated, paper-sim around 160 x H100 70B)")
    return fig


def _shapley_heatmaps(m: RegimeMap, cells: list[dict], path):
    import pandas as pd

    plt, sns = theme()
    ok = [c for c in cells if "error" not in c]
    players = list(ok[0]["shapley_speed"])
    xs = [_label(v) for v in dict.fromkeys(c["at"][m.x.key] for c in cells)]
    ys = [_label(v) for v in dict.fromkeys(c["at"][m.y.key] for c in cells)]
    fig, axes = plt.subplots(2, len(players), figsize=(5 * len(players), 8), squeeze=False)
    for k, pl in enumerate(players):
        for r, (key, label, center, fmt) in enumerate((("shapley_speed", "speed factor", 1.0, ".2f"),
                                                       ("shapley_cost", "cost points", 0.0, ".0%"))):
            df = pd.DataFrame([{"x": _label(c["at"][m.x.key]), "y": _label(c["at"][m.y.key]), "v": c[key][pl]}
                               for c in ok])
            grid = df.pivot(index="y", columns="x", values="v").reindex(index=ys, columns=xs).astype(float)
            sns.heatmap(grid, annot=True, fmt=fmt, cmap="RdBu", center=center, ax=axes[r, k], cbar=False,
                        annot_kws={"fontsize": 7}, mask=grid.isna())
            axes[r, k].set(title=f"Shapley: {pl}, {label}", xlabel=m.x.label or m.x.key, ylabel=m.y.label or m.y.key)
    fig.suptitle(f"regime map '{m.name}': Shapley terms against the paper's verl (speed factors multiply, cost "
                 "points add)")
    return save(fig, path)


def holds(cells: list[dict], point: tuple[float, float]) -> list[dict]:
    """The cells where the paper design reaches the paper's (speedup, cost cut) against each verl."""
    return [{"map": c["map"], "at": c["at"], "baseline": b, "speedup": c[b]["speedup"],
             "cost_reduction": c[b]["cost_reduction"]}
            for c in cells if "error" not in c for b in ("paper", "tuned")
            if c[b]["speedup"] >= point[0] and c[b]["cost_reduction"] >= point[1]]


MECHANISM_STEPS = 8
"""Steps of each mechanisms game (33 systems; at 24 steps one game is about 2 CPU-minutes of 70B)."""


def _mechanism_splits(regs: list[dict], sim: tuple, jobs: int) -> dict[tuple, dict]:
    """The paper design's split over its mechanisms (`scenario.mechanisms`) at one median cell per kind of region
    (faster or slower, cheaper or dearer, over all maps: the largest region of each kind), MECHANISM_STEPS steps:
    the whole grid's regions would take hours on 2 cores. Returns {(faster, cheaper): game}."""
    from rlhfless.sim.scenario import case_configs

    by_map = {m.name: m for m in maps()}
    kinds: dict[tuple, dict] = {}
    for r in regs:
        k = (r["faster"], r["cheaper"])
        if k not in kinds or r["cells"] > kinds[k]["cells"]:
            kinds[k] = r
    args = []
    for r in kinds.values():
        m = by_map.get(r["map"])
        ov = [*(m.fixed if m else ()), *(f"{k}={v}" for k, v in r["median"].items())]
        args.append(case_configs("paper-sim", MECHANISM_STEPS, [*sim, *BASE, *ov])[0])
    games = _fork_map(_mechanisms_one, args, max(min(jobs, len(args)), 1))
    return {k: {"map": r["map"], "at": r["median"], "steps": MECHANISM_STEPS, **g}
            for (k, r), g in zip(kinds.items(), games)}


def _mechanisms_one(cfg) -> dict:
    from rlhfless.sim.scenario import mechanisms

    t = mechanisms(cfg, jobs=1)
    return {"speed": t["speed_factor"], "cost": t["cost_points"], "speedup": t["speedup"],
            "cost_reduction": t["cost_reduction"]}


def regimes(ctx) -> StudyResult:
    """The regime map: heatmaps of speed and cost cut (both verls), the break-even price ratio, Shapley per
    region, and where the paper's two headline points hold in this model."""
    from rlhfless.core.errors import ConfigError
    from rlhfless.core.jsonl import write_json

    steps = 3 if ctx.quick else 24
    sim = tuple(ctx.sim)
    cells, timing = run_map(ctx.quick, steps, sim)
    if all("error" in c for c in cells):  # e.g. a bad --sim override: every cell says why; the first is enough
        raise ConfigError(f"regimes: no condition ran: {cells[0]['error'] if cells else 'no conditions'}")
    regs = regions(cells)
    out = ctx.out / "regimes"
    write_json({"timing": timing, "cells": cells, "regions": regs}, out / "regimes.json")  # before the games
    splits = {}
    if not ctx.quick:  # 33 systems per game: the full run only
        t0 = time.perf_counter()
        splits = _mechanism_splits(regs, sim, timing["jobs"])
        timing["mechanisms_wall_s"] = time.perf_counter() - t0
    catalog = catalog_ratio()
    res = StudyResult("regimes", "Regime map: where the paper's design pays against verl (simulated, paper-sim)",
                      {"scenario": "paper-sim", "steps": steps, "base": list(BASE), "sim": list(sim),
                       "conditions": len(cells)})
    for m in maps():
        mine = [c for c in cells if c["map"] == m.name]
        if mine and any("error" not in c for c in mine):
            res.figures.append(save(heatmap_figure(m, mine, catalog), out / f"{m.name}.png"))
            res.figures.append(_shapley_heatmaps(m, mine, out / f"{m.name}-shapley.png"))
    found = {k: holds(cells, pt) for k, pt in PAPER_POINTS.items()}
    res.numbers = {"timing": timing, "catalog_price_ratio": catalog, "cells": cells, "regions": regs,
                   "holds": found, "mechanisms": [{"faster": k[0], "cheaper": k[1], **g} for k, g in splits.items()]}
    res.artifacts.append(write_json(res.numbers, out / "regimes.json"))
    ok = [c for c in cells if "error" not in c]
    for key, (sp, cut) in PAPER_POINTS.items():
        best = max(ok, key=lambda c: c["paper"]["speedup"])
        cheapest = max(ok, key=lambda c: c["paper"]["cost_reduction"])
        res.rows.append(PaperRow(
            f"regime map: conditions where the paper design reaches {sp}x and {cut:.1%} ({key})",
            f"{sp}x, {cut:.1%}", f"{len([h for h in found[key] if h['baseline'] == 'paper'])} of {len(ok)} "
            f"conditions against the paper's verl, {len([h for h in found[key] if h['baseline'] == 'tuned'])} "
            f"against the tuned one; fastest {best['paper']['speedup']:.2f}x at {best['at']} ({best['map']}), "
            f"largest cut {cheapest['paper']['cost_reduction']:.1%} at {cheapest['at']}", "simulated",
            "the Shapley terms per region (regimes.json) say which side each gain comes from"))
    res.notes.append(f"{timing['conditions']} conditions x {steps} steps in {timing['wall_s']:.0f} s wall, "
                     f"{timing['cpu_s']:.0f} CPU-s on {timing['jobs']} processes, load average "
                     f"{timing['load_avg'][0]:.1f} at the end")
    return res
