"""`rlhfless config show [KEY]` and `rlhfless config reference [--write]`: the run config's keys from the terminal.

`show` prints one section (`train`) or one key (`train.steps`) with its type, default, allowed values and
description, all sections' names without KEY, and with `--config C` (and overrides) the value that config gives
too. `reference` prints docs/config-reference.md as `rlhfless.run.configref` generates it; `--write` rewrites the
committed page (tests/test_config_reference.py fails when it is stale).
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap

from rlhfless.core.errors import ConfigError, quote
from rlhfless.core.outpaths import REPO_ROOT as REPO


def register(sub, bench) -> None:
    p = sub.add_parser("config", help="show a config section or key (type, default, allowed values), or write the "
                       "configuration reference", description=__doc__.split("\n\n")[1].replace("\n", " "))
    cmds = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = cmds.add_parser("show", help="print one section or key (all section names without KEY)",
                           epilog="example: rlhfless config show train.steps")
    show.add_argument("key", nargs="?", default=None, metavar="KEY", help="a section (train) or key (train.steps)")
    show.add_argument("--config", default=None, help="also print the value this YAML config gives")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied on top of --config")
    show.set_defaults(func=_show)
    ref = cmds.add_parser("reference", help="print the configuration reference (markdown), or --write it to "
                          "docs/config-reference.md")
    ref.add_argument("--write", action="store_true", help="rewrite docs/config-reference.md in this checkout")
    ref.set_defaults(func=_reference)


def _reference(args: argparse.Namespace) -> int:
    from rlhfless.run.configref import REFERENCE_PAGE, reference_markdown

    text = reference_markdown()
    if not args.write:
        sys.stdout.write(text)
        return 0
    page = REPO / REFERENCE_PAGE
    page.write_text(text)
    print(f"wrote {page}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from rlhfless.config import RunConfig
    from rlhfless.run.configref import sections

    if args.key is not None and "=" in args.key:  # `config show train.steps=5`: an override, no KEY
        args.overrides, args.key = [args.key, *args.overrides], None
    key = args.key
    # render only the checks of what is shown: a check listing a registry imports it (torch, for algo's variants)
    keep = (lambda k: k == key or k.startswith(key + ".")) if key else (
        None if (args.config or args.overrides) else (lambda k: False))
    secs = [s for s in sections(RunConfig, keep=keep) if s.key]
    if args.key is None and not (args.config or args.overrides):
        for s in secs:
            print(f"{s.key:14s} {s.doc}")
        print("\n`rlhfless config show SECTION` or `... KEY` for the keys; all of them: docs/config-reference.md")
        return 0
    values = _values(args)
    chosen = [s for s in secs if args.key is None or s.key == args.key]
    if not chosen:
        chosen = [s for s in secs if s.key.startswith(args.key + ".")]  # task: its own fields and subsections
    fields = [f for s in (chosen or secs) for f in s.fields if chosen or f.key == args.key]
    if not fields:
        raise ConfigError(_unknown(args.key, [s.key for s in secs] + [f.key for s in secs for f in s.fields]))
    for s in chosen:
        if len(chosen) > 1 or args.key is not None:
            print(f"[{s.key}] {s.doc}")
        for f in s.fields:
            _print_field(f, values)
        below = [t.key for t in secs if t.key.startswith(s.key + ".")]
        if below and len(chosen) == 1:
            print(f"  (subsections: {', '.join(below)})")
    if not chosen:
        _print_field(fields[0], values)
    return 0


def _values(args: argparse.Namespace) -> dict[str, object] | None:
    """Dotted key -> value of the config --config and the overrides give (None without either)."""
    if not (args.config or args.overrides):
        return None
    from rlhfless.config import load_run_config
    from rlhfless.core.configbase import to_dict

    flat: dict[str, object] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            walk(v, f"{prefix}{k}.") if isinstance(v, dict) else flat.__setitem__(f"{prefix}{k}", v)

    walk(to_dict(load_run_config(args.config, args.overrides)), "")
    return flat


def _print_field(f, values: dict[str, object] | None) -> None:
    from rlhfless.run.configref import yaml_value

    print(f"  {f.key} = {f.default}  ({f.type})")
    if values is not None and f.key in values:
        print(f"      value here: {yaml_value(values[f.key])}")
    for rule in f.allowed:
        print(textwrap.fill(rule, 100, initial_indent="      allowed: ", subsequent_indent="        "))
    print(textwrap.fill(f.doc, 100, initial_indent="      ", subsequent_indent="      "))


def _unknown(key: str, keys: list[str]) -> str:
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    if not close:  # a key's last part alone, e.g. `steps` for train.steps
        close = [k for k in keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else "; `rlhfless config show` lists the sections"
    return f"config show: unknown key {quote(key, 40)}{hint}"
