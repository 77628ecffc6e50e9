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


# One row per part: the parts it may import (its own modules always). A part is a sub-package of rlhfless, or one
# of the root modules `config` (the run config composing every part's config) and `cli` (the thin dispatcher).
# Read top to bottom, the table is the layering: nothing imports a part listed after it in `LAYERS`.
BELOW_STEP = ("core", "algo", "tasks", "model", "predictor", "plan", "rollout", "learn", "config")
MAY_IMPORT = {
    "": (),  # the root package's __init__
    "core": (),
    "algo": ("core",),
    "tasks": ("core",),
    "model": ("core",),  # the weights package: never a task or the loop (task texts are passed in)
    "predictor": ("core", "model"),
    "plan": ("core",),  # the planner: never the loop, the rollout or the predictor
    "rollout": ("core", "algo", "model", "plan"),
    "learn": ("core", "algo", "model", "rollout", "plan"),
    "sim": ("core", "plan", "predictor"),  # numpy only: never torch, the runtime or the learner
    # their *.config modules only, and the torch-free list of the algo variants a config may name
    "config": ("core", "algo", "tasks", "plan", "predictor", "learn", "runtime"),
    "step": BELOW_STEP,
    "runtime": BELOW_STEP + ("step", "sim"),  # sim: emulated devices run on the simulator's performance model
    # sim: the emulated length table, checked before OUT exists; the comparison's emulated arms in modelled seconds
    "run": BELOW_STEP + ("step", "runtime", "sim"),
    "bench": BELOW_STEP + ("step", "runtime", "run", "sim"),
    "repro": BELOW_STEP + ("step", "runtime", "run", "sim", "bench"),
    "cli": ("core",),  # subcommands are found by module name, so `--help` imports none of them
}
MUST_NOT = {  # the boundaries a reader relies on, stated on their own so a change to the table above cannot drop them
    "sim": ("rlhfless.runtime", "rlhfless.learn"),  # and never torch: test_the_simulator_never_imports_torch
    "plan": ("rlhfless.step", "rlhfless.rollout", "rlhfless.predictor"),
    "model": ("rlhfless.tasks", "rlhfless.step"),
    "runtime": ("rlhfless.run", "rlhfless.bench", "rlhfless.repro", "rlhfless.cli"),
    "rollout": ("rlhfless.runtime", "rlhfless.tasks", "rlhfless.step", "rlhfless.config"),
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""  # "" = the root package's __init__ (a docstring only)


def _under(module: str, pkg: str) -> bool:
    return module == pkg or module.startswith(pkg + ".")


def _boundary_breaks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    bad = []
    for mod, deps in graph.items():
        allowed = MAY_IMPORT.get(_part(mod))
        if allowed is None:
            bad.append((mod, "(a part missing from MAY_IMPORT)"))
            continue
        for d in deps:
            p = _part(d)
            if p in ("", _part(mod)):
                continue
            if p not in allowed or (_part(mod) == "config" and p != "core" and not d.endswith(".config")
                                    and d != "rlhfless.algo.variants"):
                bad.append((mod, d))
    return sorted(bad)


def _reach(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_every_part_imports_only_the_parts_below_it():
    assert _boundary_breaks(_graph()) == []


@pytest.mark.parametrize("part", sorted(MUST_NOT))
def test_the_stated_boundaries_hold_through_every_import_chain(part):
    """Transitively, lazy imports included: a module the part imports may not import what the part must not."""
    graph = _graph()
    reached = _reach(graph, {m for m in graph if _part(m) == part})
    bad = {(m, d) for m in reached for d in graph[m] if any(_under(d, f) for f in MUST_NOT[part])}
    assert not bad, sorted(bad)


def test_the_simulator_never_imports_torch():
    """Every simulator module imported in a fresh interpreter leaves torch (and transformers) unloaded: the
    simulator is numpy, and a torch import costs seconds at every `rlhfless simulate`."""
    import subprocess
    import sys

    code = ("import pkgutil, importlib, sys, rlhfless.sim as s\n"
            "for m in pkgutil.walk_packages(s.__path__, 'rlhfless.sim.'): importlib.import_module(m.name)\n"
            "print(sorted(k for k in ('torch', 'transformers') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PKG.parent).stdout
    assert out.strip() == "[]"


def test_the_boundary_check_sees_a_deliberate_break():
    """The table is not vacuous: a simulator module importing the runtime, a planner module importing the
    rollout, and `plan` not catching `planning`-like names are each seen (or not) as they should be."""
    graph = {m: set(d) for m, d in _graph().items()}
    graph["rlhfless.sim.events"].add("rlhfless.runtime.platform.pool")
    graph["rlhfless.plan.cost"].add("rlhfless.rollout.engine")
    assert ("rlhfless.sim.events", "rlhfless.runtime.platform.pool") in _boundary_breaks(graph)
    assert ("rlhfless.plan.cost", "rlhfless.rollout.engine") in _boundary_breaks(graph)
    assert not _under("rlhfless.planning_glue", "rlhfless.plan") and _under("rlhfless.plan.cost", "rlhfless.plan")
    reached = _reach(graph, {m for m in graph if _part(m) == "sim"})
    assert "rlhfless.runtime.platform.pool" in reached


# The inside of the runtime, one row per folder (the driver is the runtime's own modules; `wire` and `records` are
# the vocabulary all four share). Read top to bottom: a folder imports only the folders its row names.
RUNTIME_SHARED = ("rlhfless.runtime.wire", "rlhfless.runtime.records")
RUNTIME_MAY_IMPORT = {
    "shared": (),
    "devices": ("shared",),  # the worker process knows no mode, platform or driver
    "modes": (),  # a mode decides from plain values and returns data: it imports nothing of the runtime
    "platform": ("shared", "devices"),  # it starts worker processes: their entry point is the device's
    "driver": ("shared", "devices", "modes", "platform"),
}


def _runtime_part(module: str) -> str | None:
    """shared, devices, modes, platform or driver for a module of `rlhfless.runtime`; None outside it."""
    parts = module.split(".")
    if parts[:2] != ["rlhfless", "runtime"] or len(parts) < 3:
        return None
    if module in RUNTIME_SHARED:
        return "shared"
    return parts[2] if parts[2] in RUNTIME_MAY_IMPORT else "driver"


def _runtime_breaks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    bad = []
    for mod, deps in graph.items():
        part = _runtime_part(mod)
        for d in deps:
            other = _runtime_part(d)
            if part and other and other != part and other not in RUNTIME_MAY_IMPORT[part]:
                bad.append((mod, d))
    return sorted(bad)


def test_the_runtime_folders_import_only_the_folders_below_them():
    assert _runtime_breaks(_graph()) == []


def test_the_runtime_check_sees_a_deliberate_break():
    """A device asking a mode, a mode reaching the pool or the shared clock, and the platform reaching the driver
    are each seen; the driver using all four is not a break."""
    graph = {m: set(d) for m, d in _graph().items()}
    graph["rlhfless.runtime.devices.worker"].add("rlhfless.runtime.modes.policy")
    graph["rlhfless.runtime.modes.policy"].add("rlhfless.runtime.platform.pool")
    graph["rlhfless.runtime.modes.policy"].add("rlhfless.runtime.records")  # `now`: a mode that acted stamped times
    graph["rlhfless.runtime.platform.pool"].add("rlhfless.runtime.executor")
    bad = _runtime_breaks(graph)
    assert ("rlhfless.runtime.devices.worker", "rlhfless.runtime.modes.policy") in bad
    assert ("rlhfless.runtime.modes.policy", "rlhfless.runtime.platform.pool") in bad
    assert ("rlhfless.runtime.modes.policy", "rlhfless.runtime.records") in bad
    assert ("rlhfless.runtime.platform.pool", "rlhfless.runtime.executor") in bad
    assert not [b for b in bad if b[0] == "rlhfless.runtime.executor"]
    assert _runtime_part("rlhfless.runtime.wire") == "shared" and _runtime_part("rlhfless.runtime.stages") == "driver"
