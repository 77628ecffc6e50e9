"""User-facing errors.

Anything the user can fix (a bad config value, a missing file, malformed data) raises `UserError` (or a
subclass). The CLI prints its message and exits with status 2, without a traceback. Programming errors stay
ordinary exceptions so they keep their traceback.
"""

from __future__ import annotations

from contextlib import contextmanager


class UserError(Exception):
    """An error the user can fix; the message says what is wrong and what is allowed."""


class ConfigError(UserError):
    """A config key, type or value is not allowed."""


class DataError(UserError):
    """A data file is missing, empty or malformed."""


class TrainingError(UserError):
    """Training cannot continue (for example a NaN loss); the message says what was kept."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped the command. The CLI raises it from its signal handler; the code that
    knows where the work stood re-raises it with `where` (what was cut short and how to continue). The exit
    status is the shell's convention, 128 + the signal: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, signum: int = 2, where: str = ""):
        super().__init__(where)
        self.signum, self.where = signum, where

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


_HELD = {"depth": 0, "signum": None}


def interrupt(signum: int) -> None:
    """Raise `Interrupted` (the CLI's signal handler calls this), or, inside `interrupts_held`, when it ends."""
    if _HELD["depth"]:
        _HELD["signum"] = _HELD["signum"] or signum
        return
    raise Interrupted(signum)


@contextmanager
def interrupts_held():
    """Hold an interrupt that arrives inside until the block ends: for a step that must not be cut in the middle
    (handing a new worker's file descriptors to the fork server: cut there, the server prints a traceback)."""
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
        signum, _HELD["signum"] = (_HELD["signum"], None) if not _HELD["depth"] else (None, _HELD["signum"])
        if signum is not None:
            raise Interrupted(signum)


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message on one line (third-party messages span lines), cut to `limit` characters."""
    text = " ".join(str(exc).split())
    return text if limit is None else text[:limit]


# errno -> (what failed, what to do): the OS errors a user can meet and fix (a full disk, a read-only mount)
_OS_ADVICE = {
    "EROFS": ("is on a read-only file system", "name a path you can write, e.g. under runs/ or /tmp"),
    "EACCES": ("permission denied", "name a path this user can write, or fix its permissions"),
    "EPERM": ("operation not permitted", "name a path this user can write, or fix its permissions"),
    "ENOSPC": ("no space left on the device", "free space or name another folder, then run again"),
    "EDQUOT": ("disk quota exceeded", "free space or name another folder, then run again"),
    "ELOOP": ("a symlink loop (a link on the path points back to itself)", "fix or remove the link"),
    "ENAMETOOLONG": ("the name is too long for the file system", "name a shorter path"),
    "ENOENT": ("no such file or folder", "check the path"),
    "ENOTDIR": ("a part of the path is a file, not a folder", "check the path"),
    "EISDIR": ("is a folder, not a file", "name a file"),
    "EMFILE": ("too many open files", "raise the limit (ulimit -n) and run again"),
}


RESUMABLE = ("ENOSPC", "EDQUOT")
"""Errors after which a training run continues from its last checkpoint (`os_error_message(..., train=True)`)."""


def os_error_message(exc: OSError, train: bool = False) -> str:
    """One line for an OS error the user can act on: the path, what failed and what to do (`train`: the command
    was `rlhfless train`, whose run continues with --resume; no other command's hint names it)."""
    import errno

    name = errno.errorcode.get(exc.errno or -1, "")
    what, todo = _OS_ADVICE.get(name, (" ".join((exc.strerror or str(exc)).split()), "check the path and the disk"))
    path = exc.filename if exc.filename is not None else exc.filename2
    where = f"{quote(str(path), 160)}: " if path is not None else ""
    if train and name in RESUMABLE:
        todo += " (the run continues from its last complete checkpoint with --resume)"
    return f"{where}{what} ({name or type(exc).__name__}); {todo}"


def require(cond: bool, field: str, message: str) -> None:
    """Raise `ConfigError` naming `field` unless `cond` holds.

    Used in every config dataclass's `__post_init__` so messages share one shape:
    ``algo.group_size: must be >= 2 (got 1)``.
    """
    if not cond:
        raise ConfigError(f"{field}: {message}")


QUOTE_LIMIT = 60
"""Characters of a bad value an error message quotes: enough to recognise it, never the whole of a huge value."""
MESSAGE_LIMIT = 300
"""The longest error line the CLI prints (a message that quotes user input stays readable and bounded)."""


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` cut to about `limit` characters, safe on any size: the one way messages quote user values.

    A YAML alias bomb expands to gigabytes and an integer of thousands of digits has no `repr` at all (Python
    refuses to print more than 4,300 digits), so messages must never call `repr` on user input directly.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, (list, tuple, dict, set)):
        return _short_repr(value, limit)
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _short_repr(value: object, limit: int) -> str:
    """A container's repr from a bounded walk (never the full repr of an expanded alias bomb)."""
    import reprlib

    class _Repr(reprlib.Repr):
        def repr_int(self, x, level):
            return quote(x)

    r = _Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset, r.maxstring, r.maxother = 3, 6, 6, 4, 6, 30, 30
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def short_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` on one line and at most `limit` characters (the CLI's last guard on what it prints)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."
