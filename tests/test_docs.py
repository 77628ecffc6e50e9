"""The README and docs/ cannot go stale silently: every relative link (and #section) points at something that exists,
every `rlhfless <command>` and `make <target>` they name exists, every command line in their code blocks parses (a
`train` line's overrides are applied to its config), and `rlhfless --version` prints the installed version.
Each checker is also fed a broken page here, so a check that stopped finding anything would fail."""

from __future__ import annotations

import argparse
import re
import shlex
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import REPO
from rlhfless.cli import build_parser, main, parse
from rlhfless.config import load_run_config

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
# `rlhfless CMD [SUB]` where it stands as a command (not `rlhfless/` paths, not `rlhfless.module`, not prose)
MAKE = re.compile(r"(?:^|(?<=[\s`]))make +([a-z][\w-]*)", re.M)
COMMAND = re.compile(r"(?:^|(?<=[\s`(/]))rlhfless +([a-z][\w-]*)(?: +([a-z][\w|-]*))?", re.M)


def _prose(text: str) -> str:
    """The page without code, so a `[x](y)` inside code is not taken for a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _code(text: str) -> list[str]:
    """Fenced blocks and inline code spans: where a command is written as one."""
    return FENCE.findall(text) + INLINE_CODE.findall(FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to -."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in HEADING.findall(FENCE.sub("", path.read_text())):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file, or whose #section in a markdown file, does not exist."""
    bad = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... (not checked offline)
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}: {target} (no such file)")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{page.name}: {target} (no section #{frag} in {dest.name})")
    return bad


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_commands(page: Path) -> list[str]:
    """Each `rlhfless CMD [SUB]` in the page's code that the CLI does not have (SUB checked where CMD has subcommands;
    `a|b` checks both)."""
    top = _subcommands(build_parser())
    bad = []
    for code in _code(page.read_text()):
        for cmd, sub in COMMAND.findall(code):
            if cmd not in top:
                bad.append(f"{page.name}: rlhfless {cmd}")
                continue
            subs = _subcommands(top[cmd])
            if subs and sub:
                bad += [f"{page.name}: rlhfless {cmd} {s}" for s in sub.split("|") if s not in subs]
    return bad


def unknown_make_targets(page: Path, makefile: Path = REPO / "Makefile") -> list[str]:
    """Each `make TARGET` in the page's code that the Makefile does not define."""
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile.read_text(), re.M))
    return [f"{page.name}: make {m}" for code in _code(page.read_text()) for m in MAKE.findall(code) if m not in targets]


def command_lines(text: str) -> list[str]:
    """Lines of a page's fenced blocks that run rlhfless (`\\` continuations joined, a trailing # comment dropped);
    `make demo ARGS=...` is the quickstart train command with those overrides. A line with a placeholder (`...`,
    `[optional]`) is a synopsis, not a command, and is left out."""
    lines = []
    for block in FENCE.findall(text):
        for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines():
            line = line.split(" #", 1)[0].strip()
            if "..." in line or "[" in line:
                continue
            if re.match(r"(\S*/)?rlhfless ", line):
                lines.append(line[line.index("rlhfless "):])
            elif line.startswith("make demo"):
                words = shlex.split(line)[2:]
                args = " ".join(w.split("=", 1)[1] for w in words if w.startswith("ARGS="))  # make splits it
                out = next((w.split("=", 1)[1] for w in words if w.startswith("OUT=")), "runs/quickstart")
                lines.append(f"rlhfless train --config experiments/configs/quickstart.yaml --out {out} {args}")
    return lines


def unparsable(lines: list[str]) -> list[str]:
    bad = []
    for line in lines:
        try:
            args = parse(build_parser(), shlex.split(line)[1:])
            if args.command == "train":
                load_run_config(str(REPO / args.config) if args.config else None, args.overrides)
        except SystemExit as exc:
            if exc.code:
                bad.append(f"{line} (does not parse)")
        except Exception as exc:  # noqa: BLE001 - any refusal means the README line is wrong
            bad.append(f"{line} ({exc})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file_and_section_that_exist(page):
    assert not broken_links(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_rlhfless_command_a_page_names_exists(page):
    assert not unknown_commands(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_make_target_a_page_names_exists(page):
    assert not unknown_make_targets(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_of_a_page_parses_and_its_overrides_apply(page):
    assert not unparsable(command_lines(page.read_text()))


def test_the_readme_shows_its_commands():
    assert len(command_lines((REPO / "README.md").read_text())) >= 5


def test_the_readme_links_every_docs_page():
    """A page nobody links is a page nobody reads: the README's "where to read on" list names each one."""
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(_prose((REPO / "README.md").read_text()))}
    assert not [p.name for p in PAGES[1:] if p.resolve() not in linked]


def test_the_checkers_find_what_is_broken(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` section, here\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n[ok](other.md) [ok](other.md#a-code-section-here) [ok](#page) ![x](missing.png)\n"
                    "[gone](other.md#nowhere) `[in code](nowhere.md)`\n\n"
                    "```bash\nrlhfless train --out x\nrlhfless trian --out x\nrlhfless bench loop|nope\n```\n"
                    "Prose about rlhfless itself and `rlhfless/cli.py` is no command.\n")
    assert broken_links(page) == ["page.md: missing.png (no such file)",
                                  "page.md: other.md#nowhere (no section #nowhere in other.md)"]
    assert unknown_commands(page) == ["page.md: rlhfless trian", "page.md: rlhfless bench nope"]
    (tmp_path / "Makefile").write_text("demo: env\n\tdo it\n")
    page.write_text("`make demo`, `make dmeo OUT=x` and the word make in prose\n")
    assert unknown_make_targets(page, tmp_path / "Makefile") == ["page.md: make dmeo"]
    assert command_lines('```\nmake demo ARGS="train.steps=3 train.eval_prompts=20" OUT=/tmp/x\n'
                         'rlhfless train --out y \\\n    train.steps=2   # comment\n'
                         '.venv-x/bin/rlhfless repro --list\nrlhfless train ... a=1\nrlhfless x [--y]\n```') == \
        ["rlhfless train --config experiments/configs/quickstart.yaml --out /tmp/x train.steps=3 train.eval_prompts=20",
         "rlhfless train --out y train.steps=2", "rlhfless repro --list"]
    assert len(unparsable(["rlhfless train --config experiments/configs/quickstart.yaml --out x algo.nope=1",
                           "rlhfless simulate --scenario quick --bogus",
                           "rlhfless train --out x train.steps=3"])) == 2


def test_version_prints_the_installed_packages_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"rlhfless {version('rlhfless')}\n"
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version("rlhfless") == declared, "the installed metadata is older than pyproject.toml: pip install -e ."
