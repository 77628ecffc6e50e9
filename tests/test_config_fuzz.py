"""Fuzzing `rlhfless train --dry-run` with YAML configs and dotted overrides (hypothesis).

Whatever the input, the CLI either accepts it (exit 0) or rejects it with exit 2 and one line naming the field
(or the file) at fault; it never crashes with a traceback. `--dry-run` makes every check `train` makes before
work, so this covers the path a user's typo takes.
"""

from __future__ import annotations

import dataclasses
import os
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfless.cli import main
from rlhfless.config import RunConfig

FUZZ_EXAMPLES = int(os.environ.get("RLHFLESS_FUZZ_EXAMPLES", "250"))


def _fields(cls, prefix="") -> list[str]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _fields(tp, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


KEYS = _fields(RunConfig)
SECTIONS = sorted({k.split(".")[0] for k in KEYS})
# Sizes that could make a valid config do real work are kept small: the fuzz is about types and structure.
SAFE_SIZES = {"task.arith.num_train": 64, "task.arith.num_eval": 16, "train.eval_prompts": 16}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 600), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["ewma", "contiguous", "lpt", "offline", "1e-4", "true", "[1, 2]"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=6)
keys = st.one_of(st.sampled_from(KEYS), st.sampled_from(SECTIONS), st.text(max_size=16),
                 st.builds(lambda k, j: f"{k}.{j}", st.sampled_from(KEYS), st.text(max_size=6)))


def _nest(flat: dict[str, object]) -> dict:
    doc: dict = {}
    for key, value in flat.items():
        *head, last = key.split(".")
        node = doc
        for part in head:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        node[last] = value
    return doc


def _override(key: str, value) -> str:
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    return f"{key}={text.removesuffix('...').strip()}"


overrides = st.lists(st.one_of(st.builds(_override, keys, values), st.text(max_size=20)), max_size=4)
odd_keys = st.one_of(st.integers(-2, 2), st.none(), st.booleans())  # YAML keys that are not strings
configs = st.one_of(st.dictionaries(keys, values, max_size=4).map(_nest), values, st.text(max_size=40),
                    st.dictionaries(st.one_of(keys, odd_keys), values, max_size=3))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=configs, extra=overrides)
def test_any_config_and_overrides_exit_0_or_2_with_a_message_naming_the_field(doc, extra, tmp_path_factory,
                                                                               capsys):
    d = tmp_path_factory.mktemp("fuzz")
    path = d / "c.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    args = ["train", "--dry-run", "--config", str(path), "--out", str(d / "out"), "--",
            *[f"{k}={v}" for k, v in SAFE_SIZES.items()], *extra]
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    assert not (d / "out").exists()  # a dry run never creates the run folder
    if rc == 2:
        line = err.strip().splitlines()[-1]
        assert line.startswith(("rlhfless: error:", "rlhfless train: error:", "usage:")), err
        named = [k for k in KEYS + SECTIONS + [str(path), "override", "config", "defaults"] if k in line]
        assert named or "usage" in err, err


@pytest.mark.parametrize("text,field", [
    ("algo: {group_size: 1}", "algo.group_size"),
    ("rollout: {temperature: hot}", "rollout.temperature"),
    ("train: [1, 2]", "train"),
    ("plan: {policy: fastest}", "plan.policy"),
    ("bogus: 3", "bogus"),
    (": :\n  - [", "c.yaml"),
])
def test_known_bad_configs_name_their_field(tmp_path, capsys, text, field):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["train", "--dry-run", "--config", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and len(err.splitlines()) == 1, err


def test_dry_run_accepts_the_quickstart_and_prints_the_resolved_config(capsys, tmp_path):
    assert main(["train", "--dry-run", "--no-progress", "--config", "experiments/configs/quickstart.yaml",
                 "--out", str(tmp_path / "o")]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["algo"]["group_size"] == 8 and not (tmp_path / "o").exists()


def test_dry_run_needs_no_out_and_makes_the_real_runs_checks(capsys, tmp_path):
    """Without --out it still checks what the run checks before its first step: here the time profile."""
    profile = tmp_path / "profile.json"
    profile.write_text('{"rows": "garbage"}')
    assert main(["train", "--dry-run", "--no-progress", "train.eval_prompts=0", "train.steps=1"]) == 0
    assert "config OK" in capsys.readouterr().err
    assert main(["train", "--dry-run", "--no-progress", f"plan.time_profile={profile}"]) == 2
    assert str(profile) in capsys.readouterr().err
