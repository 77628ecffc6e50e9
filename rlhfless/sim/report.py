"""Figures of a simulated case: a Gantt chart of one step per policy and the stage/cost breakdown (PNG).

Purpose: `gantt(timelines, step, path)` draws every span of one step (rows: function instances, colour: kind,
hatched: cold start) per policy; `breakdown(case, path)` draws mean rollout / score / update seconds per policy
beside the device-seconds billed per step. Observers only: they read `Timeline`s and the case report.

Non-goals: interactive plots. Deviations from the paper: none (its figures are bar charts of the same numbers).
"""

from __future__ import annotations

from pathlib import Path

COLORS = {"decode": "#4c72b0", "prefill": "#55a868", "reference": "#c44e52", "value": "#8172b2",
          "learner": "#ccb974", "trainer": "#dddddd", "pool": "#eeeeee"}


def gantt(timelines: dict, step: int, path: str | Path) -> Path:
    """One panel per policy: the spans of `step` (decode actors one row each), cold starts hatched, pre-warm
    billed before the step's start drawn pale at negative times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(timelines)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        tl = timelines[name][0]
        spans = [s for s in tl.spans if s.step == step and s.kind not in ("pool", "trainer")]
        t0 = next((a for k, name_, a, _ in tl.stages if k == step and name_ == "rollout"), 0.0)
        rows = sorted({(s.kind != "decode", s.kind, s.instance) for s in spans})
        for s in spans:
            y = rows.index((s.kind != "decode", s.kind, s.instance))
            color = COLORS.get(s.kind, "grey")
            start = max(s.start_s, t0)
            ax.barh(y, s.end_s - start, left=start - t0, color=color, height=0.8)
            if s.start_s < t0:  # pre-warmed during the previous step: billed, off this step's critical path
                ax.barh(y, t0 - s.start_s, left=s.start_s - t0, color=color, alpha=0.3, height=0.8)
            if s.cold_s > 0:
                ax.barh(y, s.cold_s, left=start - t0, color="none", hatch="///", edgecolor="black", height=0.8)
        ax.axvline(0.0, color="black", lw=0.6)
        ax.set_yticks(range(len(rows)), [f"{k}{i}" if k == "decode" else k for _, k, i in rows], fontsize=6)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds from the step's start (hatched: cold start; pale, before 0: pre-warm, billed)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in COLORS.items() if k not in ("pool", "trainer")]
    fig.legend(handles, [k for k in COLORS if k not in ("pool", "trainer")], loc="upper right", fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def breakdown(case: dict, path: str | Path) -> Path:
    """Mean stage seconds per step (stacked) and billed device-seconds per step, per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", font_scale=0.8)
    pol = case["policies"]
    names = list(pol)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    bottom = [0.0] * len(names)
    for stage, color in (("rollout_s", "#4c72b0"), ("score_s", "#c44e52"), ("update_s", "#ccb974")):
        vals = [pol[n][stage] for n in names]
        a1.bar(names, vals, bottom=bottom, color=color, label=stage[:-2])
        bottom = [b + v for b, v in zip(bottom, vals)]
    a1.set_ylabel("seconds per step")
    a1.legend(fontsize=7)
    a2.bar(names, [pol[n]["cost_device_s"] for n in names], color="#55a868")
    a2.set_ylabel("device-seconds billed per step")
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{case['name']}: speedup {case['speedup']:.2f}x, cost reduction {case['cost_reduction']:.1%} "
                 f"(RLHFless vs verl)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
