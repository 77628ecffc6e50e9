"""Every example an error message or a help text gives is valid: each one is taken from the message itself and
parsed or applied where the message points (a malformed-override message once suggested `rollout.group_size=8`,
which is not a key). A scan of the sources makes a new example fail here until it is checked too."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path

import pytest

from rlhfless.sim.scenario import case_configs
from rlhfless.cli import build_parser
from rlhfless.config import load_run_config
from rlhfless.core.configbase import apply_overrides, from_dict
from rlhfless.core.errors import ConfigError, DataError, UserError
from rlhfless.run.pretrain import PretrainConfig
from rlhfless.plan.cli import load_plan_config
from rlhfless.predictor import cli as predictor_cli
from rlhfless.predictor.synthetic import SyntheticParams

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = re.compile(r"for example (?:--set )?(\S+?)\)?$")


def _example_of(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    found = EXAMPLE.search(str(err.value))
    assert found, f"no example in: {err.value}"
    return found.group(1)


def _synthetic(sets: list[str]) -> SyntheticParams:
    """What `rlhfless data synthetic-trace --set ...` validates before writing anything."""
    return from_dict(SyntheticParams, predictor_cli._synthetic_params(sets), prefix="synthetic")


# (what triggers the message, how to apply the example it gives) for every message that suggests a value
OVERRIDE_MESSAGES = {
    "train override": (lambda: load_run_config(None, ["rollout.group_size"]), lambda ex: load_run_config(None, [ex])),
    "train empty key": (lambda: load_run_config(None, ["=8"]), lambda ex: load_run_config(None, [ex])),
    "pretrain override": (lambda: apply_overrides({}, ["steps"], "steps=300"),
                          lambda ex: from_dict(PretrainConfig, apply_overrides({}, [ex]))),
    "plan --set": (lambda: load_plan_config(None, ["max_actors"]), lambda ex: load_plan_config(None, [ex])),
    "predictor --set": (lambda: predictor_cli._config("ewma", ["alpha"]),
                        lambda ex: predictor_cli._config("ewma", [ex])),
    "predictor nested --set": (lambda: predictor_cli._config("ewma", ["a.b=1"]),
                               lambda ex: predictor_cli._config("ewma", [ex])),
    "synthetic --set": (lambda: _synthetic(["n_prompts"]), lambda ex: _synthetic([ex])),
}


@pytest.mark.parametrize("case", list(OVERRIDE_MESSAGES))
def test_override_example_in_each_message_applies(case):
    trigger, apply = OVERRIDE_MESSAGES[case]
    example = _example_of(trigger)
    apply(example)  # raises if the suggested key or value is not allowed there
    if case == "train override":
        assert example == "algo.group_size=8" and load_run_config(None, [example]).algo.group_size == 8


def test_an_invalid_suggestion_would_be_caught():
    """The check above is real: the old suggestion is rejected where it was suggested."""
    with pytest.raises(ConfigError, match="unknown config key 'rollout.group_size'"):
        load_run_config(None, ["rollout.group_size=8"])


# --- help texts: every "e.g." of every option of every command --------------------------------------------------
def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


HELP_CHECKS = {  # "command option": how to apply the example its help gives
    "train overrides": lambda ex: load_run_config(REPO / "experiments/configs/quickstart.yaml", ex.split()),
    "simulate overrides": lambda ex: case_configs("quick", None, ex.split()),
    "plan what-if overrides": lambda ex: case_configs("quick", None, ex.split()),  # the simulator's keys
    "repro --set": lambda ex: case_configs("quick", None, [a for a in ex.split(";")[0].split() if a != "--set"]),
    "bench faults overrides": lambda ex: load_run_config(REPO / "experiments/configs/faults.yaml", ex.split()),
    "pretrain overrides": lambda ex: from_dict(PretrainConfig, apply_overrides({}, ex.split())),
    "bench plan-trace --trace": lambda ex: (REPO / ex).is_file() or pytest.fail(f"{ex} does not exist"),
    "bench plan-trace --set": lambda ex: load_plan_config(None, [ex.removeprefix("--set ")]),
    "predictor train --set": lambda ex: predictor_cli._config("ewma", [ex.removeprefix("--set ")]),
    "predictor compare --set": lambda ex: predictor_cli._config("ewma", [ex.removeprefix("--set ")]),
    "data synthetic-trace --set": lambda ex: _synthetic([ex.removeprefix("--set ")]),
    "plan what-if --model": lambda ex: [_hardware().model(m.strip()) for m in ex.split("(")[0].split(",")],
    "plan what-if --devices": lambda ex: [_whatif().parse_devices(d.strip()) for d in ex.split(",")],
}


def _hardware():
    from rlhfless.sim import hardware

    return hardware


def _whatif():
    from rlhfless.sim import whatif

    return whatif


def _help_examples():
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            found = re.search(r"(?:e\.g\.|for example) (.+?)(?: \(repeatable\))?$", action.help or "")
            if found:
                name = action.option_strings[0] if action.option_strings else action.dest
                yield f"{' '.join(path)} {name}", found.group(1)


def test_every_help_example_applies():
    seen = {}
    for key, example in _help_examples():
        assert key in HELP_CHECKS, f"help of '{key}' gives the example {example!r}: add a check for it here"
        HELP_CHECKS[key](example)
        seen[key] = example
    assert set(seen) == set(HELP_CHECKS)


# --- command lines quoted in messages, help texts and epilogs -----------------------------------------------------
def _message_strings():
    """Every string constant in rlhfless that is not a docstring (f-string parts are joined with 'X')."""
    for f in sorted((REPO / "rlhfless").rglob("*.py")):
        tree = ast.parse(f.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                docs.update(id(v) for v in node.values)
                yield f, "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                yield f, node.value


def _quoted_commands():
    for f, text in _message_strings():
        for cmd in re.findall(r"`(rlhfless [^`]+)`", text) + re.findall(r"^example: (rlhfless .+)$", text):
            if "<" not in cmd:  # `rlhfless <command> --help` is a pattern, not a command line
                yield f.name, cmd


def test_every_quoted_command_line_parses():
    parser = build_parser()
    commands = list(_quoted_commands())
    assert len(commands) >= 6
    for where, cmd in commands:
        try:
            args = parser.parse_args(shlex.split(cmd)[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{cmd}` does not parse")
        if args.command == "train":
            load_run_config(args.config, args.overrides)


def test_messages_quote_the_commands_that_fix_them(tmp_path):
    """The commands above are the ones users see: trigger each message and find its command in the scan."""
    from rlhfless.model.factory import load_checkpoint
    from rlhfless.predictor.config import load_predictor
    from rlhfless.rollout.tpot import load_profile

    quoted = {cmd for _, cmd in _quoted_commands()}
    for call in (lambda: load_predictor(tmp_path), lambda: load_checkpoint(tmp_path),
                 lambda: load_profile(tmp_path / "p.json")):
        with pytest.raises(DataError) as err:
            call()
        cmds = re.findall(r"`(rlhfless [^`]+)`", str(err.value))
        assert cmds and set(cmds) <= quoted, str(err.value)
