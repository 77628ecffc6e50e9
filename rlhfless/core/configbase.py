"""Generic machinery for typed config dataclasses: build from nested dicts, YAML, dotted overrides.

Every part of rlhfless owns one small dataclass (a docstring per field, validation in `__post_init__` via
`rlhfless.core.errors.require`). This module turns plain dicts (from YAML or `key=value` overrides) into those
dataclasses with type checking, and rejects unknown keys with the list of allowed ones. YAML is read with
a bounded safe loader (`load_text`: no object tags, so a config file cannot construct Python objects; limits on
size, nesting depth, aliases and their expanded size, and integer length, so a few hundred hostile bytes cannot
hang or exhaust the process); a file that is not YAML or not a mapping, an unknown key, a wrong type, a non-finite
or out-of-range number raise a one-line `ConfigError` quoting at most a short prefix of the value
(`errors.quote`), which `build_config` prefixes with the file's path when the file itself (not an override) is
at fault.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlhfless.core.errors import ConfigError, one_line, quote

T = TypeVar("T")
OVERRIDE_EXAMPLE = "algo.group_size=8"  # a valid override of `rlhfless train` (tests apply it)

# Limits of what a config may hold. Real configs are a few KB, a few levels deep and use no aliases; the limits
# sit far above that and far below what hangs the loader (a 311-byte "billion laughs" file once did).
MAX_CONFIG_BYTES = 1 << 20
MAX_OVERRIDE_CHARS = 10_000
MAX_DEPTH = 32
MAX_ALIASES = 64
MAX_EXPANDED_NODES = 100_000
MAX_INT_DIGITS = 30
INT_LIMIT = 2**63 - 1  # every count and seed fits an int64 (torch, numpy and JSON readers agree on it)


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
        raise ConfigError(errors[0] if errors else f"{path}: unexpected value {quote(value)}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{path}: must be one of {list(allowed)} (got {quote(value)})")
        return value
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping of fields (got {type(value).__name__})")
        return from_dict(tp, value, prefix=path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list (got {quote(value)})")
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                parsed = float(value)
            except ValueError:
                pass
            else:
                return _finite(parsed, path, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number (got {quote(value)})")
        return _finite(value, path)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer (got {quote(value)})")
        if abs(value) > INT_LIMIT:
            raise ConfigError(f"{path}: must be an integer within +-(2**63 - 1) (got {quote(value)})")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false (got {quote(value)})")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string (got {quote(value)})")
        return value
    return value


def _finite(value: int | float, path: str, given: object = None) -> float:
    """`value` as a float; inf, nan and ints beyond float range are refused (every float field means a finite
    number: a learning rate of inf once trained a run whose weights all became non-finite)."""
    try:
        f = float(value)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(f"{path}: must be a finite number (got {quote(value if given is None else given)})")
    return f


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from `data`, recursively; unknown keys and wrong types raise `ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of fields (got {type(data).__name__})")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)  # YAML keys may be numbers or null
    if unknown:
        where = f"{prefix}." if prefix else ""
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f" (did you mean {where + close[0]!r}?)" if close else ""
        under = f" under {prefix}" if prefix else ""
        raise ConfigError(  # the hint first: the CLI cuts a long line, and the list of keys is at its end
            f"unknown config key {quote(where + str(unknown[0]))}{hint}; allowed keys{under}: "
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
    if len(item) > MAX_OVERRIDE_CHARS:
        raise ConfigError(f"override {quote(item)}: longer than {MAX_OVERRIDE_CHARS:,} characters")
    if "=" not in item:
        raise ConfigError(f"override {quote(item)}: expected dotted.key=value, for example {example}")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {quote(item)}: empty key, expected dotted.key=value, for example {example}")
    try:
        value = load_text(raw) if raw.strip() else ""
    except ConfigError as exc:
        raise ConfigError(f"override {quote(item)}: value {exc}") from None
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
                raise ConfigError(f"override {quote(item)}: {quote(k)} is not a section")
            node = child
        node[keys[-1]] = value
    return out


def _deep_copy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or a non-mapping raises `ConfigError` naming the path."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder; name a YAML config file, e.g. experiments/configs/quickstart.yaml")
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"larger than {MAX_CONFIG_BYTES:,} bytes, which no config needs")
        text = p.read_bytes().decode("utf-8")
        data = load_text(text) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); save the config as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({one_line(exc, 120)})") from None
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
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


# --- bounded YAML -----------------------------------------------------------------------------------------
class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses deep nesting, many aliases, a large expanded size and huge integers while
    composing, before any Python object (or its repr) can grow."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise ConfigError(f"more than {MAX_ALIASES} YAML aliases (*name); write the values out")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ConfigError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        if self._aliases and _expanded_size(node, {}) > MAX_EXPANDED_NODES:
            raise ConfigError(f"its aliases expand to more than {MAX_EXPANDED_NODES:,} values (an alias bomb?)")
        return node

    def construct_mapping(self, node, deep=False):
        """A key twice in one mapping is refused naming both lines (YAML's last-one-wins would drop the first
        silently); keys that `<<` merges in may repeat, that is what merging is for."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key.start_mark.line + 1
                if (key.tag, key.value) in seen:
                    raise ConfigError(f"duplicate key {quote(key.value)} at lines {seen[key.tag, key.value]} and "
                                      f"{line}; the second would silently replace the first: keep one")
                seen[key.tag, key.value] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise ConfigError(f"an integer of {digits} digits (line {node.start_mark.line + 1}); "
                              f"at most {MAX_INT_DIGITS} digits")
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values `node` stands for once every alias is expanded, counted without expanding (memoised per node);
    the count stops growing past the limit, so a shared node deep in a chain costs one visit."""
    key = id(node)
    if key not in memo:
        memo[key] = 1
        if isinstance(node, yaml.SequenceNode):
            memo[key] += sum(_expanded_size(n, memo) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            memo[key] += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
        memo[key] = min(memo[key], MAX_EXPANDED_NODES + 1)
    return memo[key]


def load_text(text: str):
    """YAML text -> Python data through `_BoundedLoader`; any refusal or syntax error is a one-line `ConfigError`
    (without the file name: callers add it)."""
    try:
        loader = _BoundedLoader(text)  # the reader checks the characters here already
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML ({one_line(exc, 160)})") from None
    except RecursionError:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels") from None
