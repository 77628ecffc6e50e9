"""User-facing errors.

Anything the user can fix (a bad config value, a missing file, malformed data) raises `UserError` (or a
subclass). The CLI prints its message and exits with status 2, without a traceback. Programming errors stay
ordinary exceptions so they keep their traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An error the user can fix; the message says what is wrong and what is allowed."""


class ConfigError(UserError):
    """A config key, type or value is not allowed."""


class DataError(UserError):
    """A data file is missing, empty or malformed."""


class TrainingError(UserError):
    """Training cannot continue (for example a NaN loss); the message says what was kept."""


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message on one line (third-party messages span lines), cut to `limit` characters."""
    text = " ".join(str(exc).split())
    return text if limit is None else text[:limit]


def require(cond: bool, field: str, message: str) -> None:
    """Raise `ConfigError` naming `field` unless `cond` holds.

    Used in every config dataclass's `__post_init__` so messages share one shape:
    ``algo.group_size: must be >= 2 (got 1)``.
    """
    if not cond:
        raise ConfigError(f"{field}: {message}")
