"""Progress for phases that take seconds but have no natural loop (loading, checking, fitting).

`with phases(["read", "fit"], "predictor train", enabled) as step:` gives a callable: each call names the phase
starting now and advances the bar past the one before; leaving the block ends the bar, also on an error (the bar
is cleared before the error's line prints). A bar appears on stderr only when `enabled` (commands pass
`not args.no_progress`), so scripted runs stay quiet. Nothing here touches a numeric path.
"""

from __future__ import annotations

from collections.abc import Callable


class Phases:
    """A tqdm bar over named phases; `close()` (or the last `done()`) finishes it."""

    def __init__(self, names: list[str], desc: str, enabled: bool):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=len(names), desc=desc, disable=not enabled, leave=False, unit="check")
        self.started = False

    def __call__(self, name: str) -> None:
        if self.started:
            self.bar.update()
        self.started = True
        self.bar.set_postfix_str(name)
        self.bar.refresh()

    def close(self) -> None:
        if self.started:
            self.bar.update()
        self.bar.close()

    def __enter__(self) -> "Phases":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Finish the bar; on an error clear it without advancing, so the CLI's error line starts a line of its
        own (it once printed as `dry-run checks: 75%|...|rlhfless: error: ...`)."""
        if exc_type is None:
            self.close()
        else:
            self.bar.close()


def phases(names: list[str], desc: str, enabled: bool) -> Phases:
    return Phases(names, desc, enabled)


def count_bar(total: int, desc: str, enabled: bool, unit: str = "it") -> tuple[Callable[[int], None], Callable]:
    """(advance(n), close) of a tqdm bar over `total` items."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, disable=not enabled, leave=False, unit=unit)
    return bar.update, bar.close
