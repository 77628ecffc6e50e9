"""Sensitivity in emulation: the emulated arms over the cold-start constants and the keep-alive (issue 39 item 6).

The emulated testbed at the `emulated` study's quick size (`emulated_study.QUICK`: Qwen2.5-3B on 8 emulated L40S,
16 prompts x 8, time scale 0.05) is run once per point of the sweep: the simulator's container start, inference-engine
start and storage bandwidth (`runtime.emulated_*`, defaults in `sim.overheads`) each halved and doubled, and the
keep-alive at 0, 5 (the config's), 60 and 300 modelled seconds. Each point runs the two serverless arms (ours,
`runtime.design=extended`, and the paper's design); the two verl arms (the tuned engine and the paper's settings,
`run.compare.PAPER_ENGINE_ARM`) run once, at the defaults: a held pool starts in step 1, which the modelled
numbers leave out, so its steady step sees none of the swept constants (the serverful arms bill no keep-alive).
Every number is modelled seconds per step, steps 2.. (`sim.modelled.modelled_arm`), and each serverless arm's step
time and bill are put over both verl readings. The figure: those four ratios per point, per arm.

Quick size (CI's repro-quick stage): 4 emulated L40S, 8 prompts x 4, 2 steps, each constant doubled and the
keep-alive at 0 and 60 modelled s (5 points x 2 arms + the 2 verl arms: about a minute on a loaded 2-core machine).
Deviation: the planner's own cold-start assumption (`plan.cold_start_s`) is not swept; the runtime calibrates it
from the cold starts it measures. The quick size is not the testbed: its numbers show the direction, not the
paper's claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfless.repro.records import PaperRow, StudyResult

ARMS = ("serverless", "serverless-paper")
"""The arms each point runs (the verl arms run once: module header)."""
VERL = ("serverful", "serverful-paper-engine")
CONSTANTS = ("engine_init_s", "storage_gbps", "container_start_s")
"""The swept cold-start constants (`runtime.emulated_<name>`)."""
FACTORS, QUICK_FACTORS = (0.5, 2.0), (2.0,)
KEEP_ALIVE_S, QUICK_KEEP_ALIVE_S = (0.0, 60.0, 300.0), (0.0, 60.0)
"""Keep-alive points in modelled seconds beside the config's 5 s (the base point)."""
TINY = ["runtime.units=4", "plan.max_actors=4", "rollout.prompts_per_step=8", "task.arith.num_train=8",
        "algo.group_size=4", "train.steps=2"]
"""The quick size over the emulated study's quick size (module header)."""


@dataclass(frozen=True)
class Point:
    """One point of the sweep: its label, the constant or knob it moves and the value (modelled units), and the
    run's overrides."""

    label: str
    knob: str
    value: float
    overrides: tuple[str, ...]


def points(quick: bool, scale: float, base_keep_s: float) -> list[Point]:
    """The sweep (module header): the base, each constant at each factor of the simulator's value, each keep-alive
    (modelled s; the runtime's knob is real seconds: x `scale`)."""
    from rlhfless.sim.overheads import DEFAULT

    out = [Point("base", "base", 0.0, ())]
    for k in CONSTANTS:
        for f in QUICK_FACTORS if quick else FACTORS:
            out.append(Point(f"{k} x{f:g}", k, DEFAULT[k] * f, (f"runtime.emulated_{k}={DEFAULT[k] * f:g}",)))
    for s in QUICK_KEEP_ALIVE_S if quick else KEEP_ALIVE_S:
        if s != base_keep_s:
            out.append(Point(f"keep-alive {s:g} s", "keep_alive_s", s, (f"runtime.keep_alive_s={s * scale:g}",)))
    return out


def run_arm(cfg, arm: str, out: Path) -> dict:
    """One arm of `cfg` (`run.compare.arm_config`) into `out`, once (reused while its summary exists); its modelled
    numbers per step (`sim.modelled.modelled_arm`)."""
    from rlhfless.core.rundir import RunDir
    from rlhfless.run.compare import arm_config
    from rlhfless.run.runner import train
    from rlhfless.sim.modelled import modelled_arm

    if RunDir(out).read_summary() is None:
        train(arm_config(cfg, arm), out, progress=False)
    return modelled_arm(out, cfg.runtime.time_scale)


def rows(verl: dict[str, dict], swept: dict[str, dict[str, dict]]) -> list[dict]:
    """One row per (point, serverless arm): step time, bill, cold starts and held idle (modelled s per step) and
    the ratios over both verl readings (pure)."""
    out = []
    for label, arms in swept.items():
        for arm, m in arms.items():
            r = {"point": label, "arm": arm, "step_time_s": m["step_time_s"], "billed_device_s": m["billed_device_s"],
                 "cold_start_device_s": m["cold_start_device_s"], "held_idle_device_s": m["held_idle_device_s"]}
            for v, tag in zip(VERL, ("tuned", "paper")):
                r[f"step_ratio_{tag}"] = m["step_time_s"] / verl[v]["step_time_s"]
                r[f"cost_ratio_{tag}"] = m["billed_device_s"] / verl[v]["billed_device_s"]
            out.append(r)
    return out


def plot(table: list[dict], path: Path) -> Path:
    """A 2 x 2 grid: step-time and bill ratios (rows) over verl with the tuned engine and at the paper's settings
    (columns), per point (x) and arm (hue); 1 = as verl."""
    import pandas as pd

    from rlhfless.repro.plots import save, theme
    from rlhfless.run.compare import label

    plt, sns = theme()
    long = pd.DataFrame([{"point": r["point"], "arm": label(r["arm"]), "metric": m, "against": label(v),
                          "ratio": r[f"{k}_{t}"]}
                         for r in table for k, m in (("step_ratio", "step time"), ("cost_ratio", "bill"))
                         for t, v in zip(("tuned", "paper"), VERL)])
    g = sns.catplot(long, x="point", y="ratio", hue="arm", row="metric", col="against", kind="point",
                    linestyle="none", dodge=0.2, height=3.0, aspect=1.7, sharey=False)
    for ax in g.axes.flat:
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")  # as verl
        plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
    g.set_titles("{row_name} over {col_name}")
    g.set_axis_labels("", "serverless / verl")
    g.figure.suptitle("Emulated arms over the cold-start constants and keep-alive (modelled s per step, steps 2..)")
    sns.move_legend(g, "lower center", bbox_to_anchor=(0.5, 0.0), ncol=2, title=None)
    g.figure.tight_layout(rect=(0, 0.05, 1, 0.97))
    return save(g.figure, path, tight=False)


def emulated_sensitivity(ctx, extra: tuple[str, ...] = (), only: tuple[str, ...] = ()) -> StudyResult:
    """The study (module header); `extra`: overrides after the size's; `only`: the labels of the points to run
    (all when empty: a test's tiny sweep)."""
    from rlhfless.config import load_run_config
    from rlhfless.repro.emulated_study import CONFIG, QUICK, REPO

    size = QUICK + (TINY if ctx.quick else []) + list(extra) + [f"train.seed={ctx.seed}", "tracking.mode=disabled",
                                                                 "runtime.gantt_every=0"]
    cfg = load_run_config(str(CONFIG), size)
    scale = cfg.runtime.time_scale
    pts = [p for p in points(ctx.quick, scale, cfg.runtime.keep_alive_s / scale) if not only or p.label in only]
    root = ctx.out / "emulated-sensitivity" / ("quick" if ctx.quick else "full") / f"seed{ctx.seed}"
    verl = {a: run_arm(cfg, a, root / "verl" / a) for a in VERL}
    swept = {}
    for p in pts:
        c = load_run_config(str(CONFIG), size + list(p.overrides))
        swept[p.label] = {a: run_arm(c, a, root / p.label.replace(" ", "_") / a) for a in ARMS}
    table = rows(verl, swept)
    res = StudyResult("emulated-sensitivity", "The emulated arms over the cold-start constants and the keep-alive "
                      "(modelled s)", {"config": str(CONFIG.relative_to(REPO)), "size": size,
                                       "points": [p.label for p in pts], "seed": ctx.seed})
    res.figures.append(plot(table, ctx.out / "emulated-sensitivity" / "ratios.png"))
    res.numbers = {"verl": {a: {"step_time_s": m["step_time_s"], "billed_device_s": m["billed_device_s"]}
                            for a, m in verl.items()}, "rows": table, "time_scale": scale}
    for arm in ARMS:
        mine = [r for r in table if r["arm"] == arm]
        lo, hi = min(mine, key=lambda r: r["cost_ratio_tuned"]), max(mine, key=lambda r: r["cost_ratio_tuned"])
        res.rows.append(PaperRow(
            f"emulated {arm}: bill over verl across cold-start constants and keep-alive", "(no claim)",
            f"{lo['cost_ratio_paper']:.2f}x to {hi['cost_ratio_paper']:.2f}x ({lo['point']} .. {hi['point']}); "
            f"step {min(r['step_ratio_paper'] for r in mine):.2f}x to {max(r['step_ratio_paper'] for r in mine):.2f}x",
            "measured", "the runtime's decisions on emulated L40S with the simulator's compute times, at the quick "
            "size; the ratios over verl at the paper's settings, here; over the tuned engine in the tuned column",
            ours_tuned=f"{lo['cost_ratio_tuned']:.2f}x to {hi['cost_ratio_tuned']:.2f}x; step "
                       f"{min(r['step_ratio_tuned'] for r in mine):.2f}x to "
                       f"{max(r['step_ratio_tuned'] for r in mine):.2f}x"))
    return res
