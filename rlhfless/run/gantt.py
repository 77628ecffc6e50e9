"""Per-function timelines (Gantt charts) from a run's workers.jsonl and invocations.jsonl.

One lane per worker alive in the window: the light bar is the time it was held (billed), the hatched part its
cold start, coloured bars its invocations by function kind. `plot_steps` draws one panel per run (serverful
above serverless in a comparison), on the same time axis, so idle billed time is visible at a glance.
"""

from __future__ import annotations

from pathlib import Path

from rlhfless.core.rundir import RunDir

KIND_COLOURS = {"decode": "#4C72B0", "reward": "#DD8452", "reference": "#55A868", "learner": "#C44E52",
                "prefill": "#8172B3", "values": "#937860", "critic": "#DA8BC3"}


def gantt_steps(steps: int, every: int) -> list[int]:
    """The steps drawn: the first, then every `every`-th (`runtime.gantt_every`; 0: the first only)."""
    return sorted({1, *(range(every, steps + 1, every) if every else ())} & set(range(1, steps + 1)))


def read_records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(workers, invocations) of a runtime run folder ([] for a file the run did not write)."""
    run = RunDir(run_dir)
    return run.read_workers(), run.read_invocations()


def step_window(invocations: list[dict], step: int) -> tuple[float, float] | None:
    inv = [i for i in invocations if i["step"] == step]
    if not inv:
        return None
    return min(i["requested_s"] for i in inv), max(i["finished_s"] for i in inv)


def _scaled(rows: list[dict], scale: float) -> list[dict]:
    """Records with every time divided by `scale` (an emulated run's real seconds -> modelled seconds)."""
    if scale == 1.0:
        return rows
    keys = ("spawned_s", "ready_s", "released_s", "requested_s", "started_s", "finished_s")
    return [{**r, **{k: r[k] / scale for k in keys if r.get(k) is not None}} for r in rows]


def _lanes(workers: list[dict], t0: float, t1: float) -> list[dict]:
    """The workers alive in [t0, t1): one lane each."""
    return [w for w in workers if w["spawned_s"] < t1 and (w["released_s"] is None or w["released_s"] > t0)]


def _panel(ax, workers: list[dict], invocations: list[dict], t0: float, t1: float, title: str) -> None:
    lanes = _lanes(workers, t0, t1)
    for y, w in enumerate(lanes):
        end = w["released_s"] if w["released_s"] is not None else t1
        ax.barh(y, min(end, t1) - max(w["spawned_s"], t0), left=max(w["spawned_s"], t0) - t0, height=0.8,
                color="#DDDDDD", edgecolor="none")
        if w["ready_s"] is not None and w["ready_s"] > t0:
            s = max(w["spawned_s"], t0)
            ax.barh(y, min(w["ready_s"], t1) - s, left=s - t0, height=0.8, color="#BBBBBB", hatch="//",
                    edgecolor="#888888", linewidth=0)
        for i in invocations:
            if i["worker"] == w["worker"] and i["finished_s"] > t0 and i["started_s"] < t1:
                s, e = max(i["started_s"], t0), min(i["finished_s"], t1)
                ax.barh(y, max(e - s, 1e-3), left=s - t0, height=0.5, color=KIND_COLOURS.get(i["kind"], "k"),
                        alpha=1.0 if i["ok"] else 0.4)
        if w.get("killed"):
            ax.plot([min(end, t1) - t0], [y], "kx")
    ax.set_yticks(range(len(lanes)), [w["worker"] for w in lanes], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.invert_yaxis()


def plot_steps(runs: dict[str, Path], step: int, path: Path, scale: float = 1.0) -> Path | None:
    """Draw `step` of each run (label -> run dir) in stacked panels on one time axis; None if no data. `scale`:
    an emulated run's `runtime.time_scale`, so the axis is in modelled seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Patch

    data = {k: tuple(_scaled(x, scale) for x in read_records(v)) for k, v in runs.items()}
    windows = {k: step_window(inv, step) for k, (_, inv) in data.items()}
    if not any(windows.values()):
        return None
    span = max(w[1] - w[0] for w in windows.values() if w)
    sns.set_theme(style="whitegrid")
    # each panel as tall as its lanes (a serverless arm may hold 3x the pool's workers in one step)
    n = [max(2, len(_lanes(data[k][0], *windows[k]))) if windows[k] else 2 for k in data]
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.2 + max(1.6 * len(runs), 0.16 * sum(n))), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": n})
    for ax, (label, (workers, inv)) in zip(axes[:, 0], data.items()):
        w = windows[label]
        if w is None:
            ax.set_title(f"{label}: no invocations in step {step}")
            continue
        _panel(ax, workers, inv, w[0], w[1], f"{label}: step {step} ({w[1] - w[0]:.2f} s)")
        ax.set_xlim(0, span * 1.02)
    axes[-1, 0].set_xlabel("seconds since the step's first request" + (" (modelled)" if scale != 1.0 else ""))
    handles = [Patch(color=c, label=k) for k, c in KIND_COLOURS.items()]
    handles += [Patch(color="#DDDDDD", label="held (billed)"), Patch(facecolor="#BBBBBB", hatch="//",
                                                                      label="cold start")]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=4)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
