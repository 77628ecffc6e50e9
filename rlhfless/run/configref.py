"""The configuration reference: every field of the run config with its type, default, allowed values and the
docstring its dataclass carries, generated from the dataclasses themselves so it cannot drift from them.

`fields_of(RunConfig)` walks the config from its root (`rlhfless.config.RunConfig`) into every section
(`FieldDoc` per field, dotted key first); `reference_markdown()` renders docs/config-reference.md, which
`rlhfless config reference --write` (or `make config-reference`) rewrites and `tests/test_config_reference.py`
compares with the committed page. The allowed values come from the type (a `Literal`'s choices) and from the
`require(...)` checks of the dataclass's `__post_init__` (and its `_check*` helpers), read from the source:
each check's message without its `(got ...)` part. Checks of the machine (`check_machine`) are left out: they
depend on where the run starts.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REFERENCE_PAGE = "docs/config-reference.md"
_GOT = re.compile(r"\s*\(got [^()]*(?:\([^()]*\)[^()]*)*\)")


@dataclass(frozen=True)
class FieldDoc:
    key: str
    """Dotted key, e.g. `train.steps`."""
    type: str
    default: str
    """The default as YAML would write it."""
    allowed: tuple[str, ...]
    """Each rule the config checks on this field when it is built (a Literal's choices are in `type`)."""
    doc: str


@dataclass(frozen=True)
class SectionDoc:
    key: str
    doc: str
    fields: tuple[FieldDoc, ...]


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def type_name(tp: Any) -> str:
    """An annotation as a user writes the value: `int`, `float | null`, `one of: a, b`."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    return getattr(tp, "__name__", str(tp))


def yaml_value(value: Any) -> str:
    """`value` as it would stand in a YAML config."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '""' if value == "" else value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return repr(value)


def _source_tree(cls: type) -> ast.ClassDef:
    return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]


def field_docstrings(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of `cls` (PEP 257's attribute docstrings), else the field's
    entry `name: text` in the class docstring (as `PredictorConfig` and `BillingRules` write them)."""
    body = _source_tree(cls).body
    docs = _class_doc_entries(cls)
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def _class_doc_entries(cls: type) -> dict[str, str]:
    names = {f.name for f in dataclasses.fields(cls)}
    entries: dict[str, list[str]] = {}
    current = None
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        head, sep, rest = line.partition(": ")
        if sep and head in names:
            current = entries[head] = [rest]
        elif current is not None and line.startswith(" "):
            current.append(line.strip())
        else:
            current = None
    return {k: " ".join(v) for k, v in entries.items()}


def section_doc(cls: type) -> str:
    """The first paragraph of the class docstring."""
    return " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())


def _value(expr: ast.expr, scope: dict[str, Any]) -> str:
    """`expr` of a check's message: its value when it needs only module-level names or names the check imports
    itself (`list(MODES)`, `sorted(ADVANTAGE_ESTIMATORS)`: the registry as it is), else the expression without
    `self.` (`{self.algo.group_size}` -> `{algo.group_size}`; a message that needs the instance belongs in its
    `(got ...)` part, and `tests/test_config_reference.py` fails on a `{` left in the page)."""
    code, scope = compile(ast.Expression(expr), "<check>", "eval"), dict(scope)
    for _ in range(8):  # one retry per name the check imports inside its method
        try:
            return str(eval(code, scope))  # our own source
        except NameError as exc:
            found = _local_import(scope, exc.name)
            if found is None:
                break
            scope[exc.name] = found
        except Exception:  # noqa: BLE001 - it needs the instance or a local: keep the expression
            break
    return "{" + ast.unparse(expr).replace("self.", "") + "}"


def _local_import(scope: dict[str, Any], name: str | None) -> Any:
    """`name` as the checking method imports it (`from rlhfless.algo import POLICY_LOSSES` inside the method),
    else None. Imported only when a message needs it: `config show KEY` loads no more than KEY's checks need."""
    where = scope.get(_IMPORTS, {}).get(name)
    if where is None:
        return None
    import importlib

    return getattr(importlib.import_module(where[0]), where[1], None)


_IMPORTS = "__configref_imports__"


def _method_imports(method: ast.FunctionDef) -> dict[str, tuple[str, str]]:
    """name -> (module, attribute) of each `from M import A [as B]` inside `method`."""
    return {(a.asname or a.name): (n.module, a.name) for n in ast.walk(method)
            if isinstance(n, ast.ImportFrom) and n.module and not n.level for a in n.names}


def _text(node: ast.AST, names: dict[str, str], scope: dict[str, Any]) -> str | None:
    """A string or f-string node as text: a loop variable becomes its value, other values their expression
    (`_value`); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            parts.append(str(part.value))
        elif isinstance(part.value, ast.Name) and part.value.id in names:
            parts.append(names[part.value.id])
        else:
            parts.append(_value(part.value, scope))
    return "".join(parts)


def _loops(tree: ast.AST) -> dict[ast.AST, dict[str, list[str]]]:
    """For each node inside `for NAME in ("a", "b"):`, the values NAME takes there."""
    found: dict[ast.AST, dict[str, list[str]]] = {}

    def visit(node: ast.AST, names: dict[str, list[str]]) -> None:
        if (isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple)
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.iter.elts)):
            names = {**names, node.target.id: [e.value for e in node.iter.elts]}
        found[node] = names
        for child in ast.iter_child_nodes(node):
            visit(child, names)

    visit(tree, {})
    return found


def rules(cls: type, keep: Callable[[str], bool] | None = None) -> dict[str, list[str]]:
    """Dotted key -> the messages of the `require(cond, KEY, MESSAGE)` checks in `__post_init__`, `_check*` and
    `_resolve*`; `keep`: only the keys it accepts have their messages rendered (a registry a message lists is
    imported to render it)."""
    found: dict[str, list[str]] = {}
    module_scope = vars(inspect.getmodule(cls))
    for method in _source_tree(cls).body:
        if not (isinstance(method, ast.FunctionDef) and (method.name == "__post_init__" or
                                                          method.name.startswith(("_check", "_resolve")))):
            continue
        scope = {**module_scope, _IMPORTS: _method_imports(method)}
        for node, loop in _loops(method).items():
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require"
                    and len(node.args) == 3):
                continue
            for values in _bindings(loop):
                key = _text(node.args[1], values, scope)
                if key and keep is not None and not keep(key):
                    continue
                message = _text(node.args[2], values, scope)
                if key and message:
                    message = _GOT.sub("", message).strip()
                    message = re.sub(r"(\b[\w.]+)=\{\1\}", r"\1", message)  # "x={x}" says x twice
                    found.setdefault(key, [])
                    if message not in found[key]:
                        found[key].append(message)
    return found


def _bindings(loop: dict[str, list[str]]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = [{}]
    for name, values in loop.items():
        out = [{**b, name: v} for b in out for v in values]
    return out


def _classes(root: type) -> list[type]:
    """`root` and every section class under it."""
    hints = typing.get_type_hints(root)
    return [root] + [c for f in dataclasses.fields(root) if is_section(hints[f.name]) for c in _classes(hints[f.name])]


def all_rules(root: type, keep: Callable[[str], bool] | None = None) -> dict[str, list[str]]:
    """The checks of every section under `root`, by key (a cross-section check lives in the class above)."""
    found: dict[str, list[str]] = {}
    for cls in _classes(root):
        for key, messages in rules(cls, keep).items():
            found.setdefault(key, []).extend(m for m in messages if m not in found[key])
    return found


def _restates(message: str, choices: tuple[str, ...]) -> bool:
    """A Literal's check that only says its choices again (they are in the type already)."""
    return message.startswith("must be") and all(c in message for c in choices) and len(message) < 60 + sum(
        map(len, choices))


def sections(root: type, prefix: str = "", checks: dict[str, list[str]] | None = None,
             keep: Callable[[str], bool] | None = None) -> list[SectionDoc]:
    """Every section of `root` (itself first when it has fields of its own), depth first in field order; `keep`:
    the keys whose checks are rendered (all by default; `config show KEY` renders KEY's)."""
    checks = all_rules(root, keep) if checks is None else checks
    hints = typing.get_type_hints(root)
    docs = field_docstrings(root)
    own, nested = [], []
    for f in dataclasses.fields(root):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if is_section(tp):
            nested += sections(tp, key + ".", checks)
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        choices = tuple(str(a) for a in typing.get_args(tp)) if typing.get_origin(tp) is typing.Literal else ()
        said = tuple(m for m in checks.get(key, ()) if not (choices and _restates(m, choices)))
        own.append(FieldDoc(key, type_name(tp), yaml_value(default), said, docs.get(f.name, "")))
    head = [SectionDoc(prefix.rstrip("."), section_doc(root), tuple(own))]
    return (head if own or not prefix else []) + nested


def fields_of(root: type) -> list[FieldDoc]:
    return [f for s in sections(root) for f in s.fields]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """docs/config-reference.md, generated from `rlhfless.config.RunConfig`."""
    from rlhfless.config import RunConfig

    secs = [s for s in sections(RunConfig) if s.key]
    count = sum(len(s.fields) for s in secs)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `rlhfless config reference --write` (make config-reference) from the config dataclasses;",
        "     do not edit by hand: tests/test_config_reference.py fails when this page is stale. -->",
        "",
        f"Every key of a run config ({count} fields in {len(secs)} sections), as YAML (`train:` then `steps: 50`) "
        "or a dotted override (`train.steps=50`). **Allowed** lists the choices of the type and the checks the "
        "config makes when it is built (`-`: only the type's), and a value outside them fails in one line naming "
        "the key; a check that depends on the machine (cores, GPUs) runs at start-up and is not listed. "
        "`rlhfless config show KEY` prints one section or key from the terminal. "
        "How configs and overrides work: [configuration](configuration.md).",
        "",
        "Sections: " + ", ".join(f"[`{s.key}`](#{s.key.replace('.', '')})" for s in secs) + ".",
    ]
    for s in secs:
        lines += _section_lines(s, s.key)
    return "\n".join(lines + _simulator_lines()) + "\n"


def _section_lines(s: SectionDoc, heading: str) -> list[str]:
    lines = ["", f"## {heading}", "", s.doc, "", "| key | type | default | allowed | description |",
             "|---|---|---|---|---|"]
    return lines + [f"| `{f.key}` | {_cell(f.type)} | `{_cell(f.default)}` | {_cell('; '.join(f.allowed)) or '-'} "
                    f"| {_cell(f.doc)} |" for f in s.fields]


def _simulator_lines() -> list[str]:
    """The simulator's case config (`rlhfless.sim.scenario.SimConfig`): the keys of `rlhfless simulate KEY=VALUE`,
    apart from the run config's (a case is not a run)."""
    from rlhfless.sim.scenario import SimConfig

    secs = sections(SimConfig)
    lines = ["", "# Simulator keys", "",
             f"`rlhfless simulate --scenario NAME KEY=VALUE ...` overrides these keys of each simulated case "
             f"({sum(len(s.fields) for s in secs)} fields in {len(secs)} sections; `rlhfless.sim.scenario."
             f"SimConfig`); they are not run-config keys."]
    for s in secs:
        lines += _section_lines(s, f"simulate.{s.key}" if s.key else "simulate")
    return lines
