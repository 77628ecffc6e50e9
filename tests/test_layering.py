"""Packages import downward only: no import cycle between any two modules of `rlhfless`, nothing in the engine or
the runtime reaches back up into the runner, and the rollout engine knows token ids, not tasks.

Imports inside functions count too: a lazy import still ties the two modules together for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rlhfless"


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """module -> the rlhfless modules it imports (`from a import b` counts b when b is a module)."""
    files = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                out |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[mod] = {m for m in out if m in files and m != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("package,forbidden", [
    ("rlhfless.runtime", ("rlhfless.runner", "rlhfless.train_cli", "rlhfless.cli", "rlhfless.bench",
                          "rlhfless.repro")),
    ("rlhfless.rollout", ("rlhfless.runner", "rlhfless.runtime", "rlhfless.tasks", "rlhfless.bench",
                          "rlhfless.loop", "rlhfless.config")),
])
def test_lower_packages_do_not_reach_up(package, forbidden):
    graph = _graph()
    bad = {(m, d) for m, deps in graph.items() if m.startswith(package)
           for d in deps if d.startswith(forbidden)}
    assert not bad, sorted(bad)
