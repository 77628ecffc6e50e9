"""Figure helpers shared by the studies: one seaborn theme, PNGs saved at a readable size, figures closed."""

from __future__ import annotations

from pathlib import Path


def theme():
    """pyplot with the Agg backend and the project's seaborn theme (import-time cost paid only when plotting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def save(fig, path: Path, tight: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
