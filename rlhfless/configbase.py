"""Generic machinery for typed config dataclasses: build from nested dicts, YAML, dotted overrides.

Every part of rlhfless owns one small dataclass (a docstring per field, validation in `__post_init__` via
`rlhfless.errors.require`). This module turns plain dicts (from YAML or `key=value` overrides) into those
dataclasses with type checking, and rejects unknown keys with the list of allowed ones. YAML is read with
`yaml.safe_load` (no object tags, so a config file cannot construct Python objects); a file that is not YAML
or not a mapping, an unknown key, a wrong type and an out-of-range value raise a one-line `ConfigError`, which
`build_config` prefixes with the file's path when the file itself (not an override) is at fault.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlhfless.errors import ConfigError, one_line

T = TypeVar("T")
OVERRIDE_EXAMPLE = "algo.group_size=8"  # a valid override of `rlhfless train` (tests apply it)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp`; convert ints to floats and lists to tuples where declared."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{path}: unexpected value {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{path}: must be one of {list(allowed)} (got {value!r})")
        return value
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping of fields (got {type(value).__name__})")
        return from_dict(tp, value, prefix=path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list (got {value!r})")
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number (got {value!r})")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer (got {value!r})")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false (got {value!r})")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string (got {value!r})")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from `data`, recursively; unknown keys and wrong types raise `ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of fields (got {type(data).__name__})")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)  # YAML keys may be numbers or null
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key {where + str(unknown[0])!r}; allowed keys{' under ' + prefix if prefix else ''}: "
            f"{', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], path)
    return cls(**kwargs)


def build_config(cls: type[T], data: dict[str, Any], overrides: list[str], source: str | Path | None = None,
                 prefix: str = "", example: str = OVERRIDE_EXAMPLE) -> T:
    """`cls` from file `data` plus dotted `overrides`; an error the file causes on its own names `source`.

    Validating the file alone only on failure keeps a file that an override completes (say a cross-field
    bound) loadable, while a bad value in the file is reported as ``path: field: message``.
    """
    try:
        return from_dict(cls, apply_overrides(data, overrides, example), prefix=prefix)
    except ConfigError as exc:
        if source is not None:
            try:
                from_dict(cls, data, prefix=prefix)
            except ConfigError as alone:
                if str(alone) == str(exc):
                    raise ConfigError(f"{source}: {exc}") from None
        raise


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (for YAML, W&B config and summaries)."""
    return dataclasses.asdict(obj)


def parse_override(item: str, example: str = OVERRIDE_EXAMPLE) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML so numbers, booleans and lists keep their types.

    `example`: a valid override where the caller uses it (its messages suggest it), e.g. ``alpha=0.3``.
    """
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected dotted.key=value, for example {example}")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r}: empty key, expected dotted.key=value, for example {example}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({one_line(exc)})") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str], example: str = OVERRIDE_EXAMPLE) -> dict[str, Any]:
    """Return a copy of nested `data` with every ``dotted.key=value`` override applied (`example`: see
    `parse_override`)."""
    out = _deep_copy(data)
    for item in overrides:
        keys, value = parse_override(item, example)
        node = out
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {k!r} is not a section")
            node = child
        node[keys[-1]] = value
    return out


def _deep_copy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or a non-mapping raises `ConfigError` naming the path."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({one_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    return data


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `extra` into a copy of `base` (YAML `defaults:` inheritance)."""
    out = _deep_copy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out
