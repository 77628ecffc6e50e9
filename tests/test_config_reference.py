"""docs/config-reference.md lists every config field and is what the generator makes of today's dataclasses;
`rlhfless config show` prints a section or a key, and an unknown key is one line naming close ones."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from rlhfless.cli import main
from rlhfless.config import RunConfig
from rlhfless.run.configref import REFERENCE_PAGE, fields_of, reference_markdown, rules
from rlhfless.sim.scenario import SimConfig

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / REFERENCE_PAGE


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every field under `cls`, walked here independently of the generator."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += _leaf_keys(tp, f"{prefix}{f.name}.")
        elif f.init:
            out.append(f"{prefix}{f.name}")
    return out


def test_every_field_is_in_the_committed_page():
    text = PAGE.read_text()
    missing = [k for k in _leaf_keys(RunConfig) if f"| `{k}` |" not in text]
    assert not missing, f"{REFERENCE_PAGE} lacks {missing}; run `make config-reference`"


def test_the_committed_page_is_what_the_generator_writes():
    assert PAGE.read_text() == reference_markdown(), f"{REFERENCE_PAGE} is stale; run `make config-reference`"


def test_each_field_has_its_type_default_and_description():
    by_key = {f.key: f for f in fields_of(RunConfig)}
    assert list(by_key) == _leaf_keys(RunConfig)
    assert all(f.doc for f in by_key.values()), [k for k, f in by_key.items() if not f.doc]
    steps = by_key["train.steps"]
    assert (steps.type, steps.default, steps.allowed) == ("int", str(RunConfig().train.steps), ("must be >= 1",))
    assert by_key["algo.loss_agg"].type.startswith("one of: token_mean")
    assert by_key["algo.group_size"].default == "null"
    assert by_key["plan.billing.granularity_s"].doc  # documented in its class docstring, not under the field
    # a cross-section check lives in the class above the field's own
    assert any("algo.group_size" in rule for rule in by_key["plan.capacity"].allowed)


def test_a_check_in_a_loop_is_found_for_each_key_it_names():
    found = rules(type(RunConfig().train))
    assert {"train.eval_every", "train.table_every", "train.checkpoint_every"} <= set(found)


def test_show_prints_a_key_and_a_section(capsys):
    assert main(["config", "show", "train.steps"]) == 0
    out = capsys.readouterr().out
    assert "train.steps = 400  (int)" in out and "must be >= 1" in out and "GRPO steps." in out
    assert main(["config", "show", "optim"]) == 0
    out = capsys.readouterr().out
    assert "[optim]" in out and all(f"optim.{k} =" in out for k in ("lr", "weight_decay", "grad_clip"))


def test_show_gives_the_value_a_config_and_overrides_give(capsys):
    assert main(["config", "show", "algo.group_size", "--config", "experiments/configs/quickstart_ppo.yaml"]) == 0
    assert "value here: 1" in capsys.readouterr().out
    assert main(["config", "show", "train.steps", "train.steps=7"]) == 0
    assert "value here: 7" in capsys.readouterr().out


@pytest.mark.parametrize("key, close", [("trian.steps", "train.steps"), ("steps", "train.steps"),
                                        ("optm", "optim")])
def test_an_unknown_key_is_one_line_naming_close_ones(key, close, capsys):
    assert main(["config", "show", key]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"unknown key '{key}'" in err and close in err


def test_every_allowed_value_is_rendered_in_the_page():
    """Issue 42: no check's message may reach the page as an f-string template (`{low}`, `{sorted(REGISTRY)}`):
    the allowed column of every row holds values, taken from the registries and enums themselves."""
    import re

    assert {f.key: a for f in fields_of(RunConfig) for a in f.allowed if "{" in a or "}" in a} == {}
    rows = [ln for ln in PAGE.read_text().splitlines() if ln.startswith("| `")]
    cells = [re.split(r"(?<!\\)\|", ln)[1:-1] for ln in rows]
    assert len(cells) == len(fields_of(RunConfig)) + len(fields_of(SimConfig)) and all(len(c) == 5 for c in cells)
    assert [c[0] for c in cells if "{" in c[3] or "}" in c[3]] == []
    allowed = {c[0].strip(" `"): c[3] for c in cells}
    assert "custom" in allowed["runtime.design"] and "paper" in allowed["runtime.design"]
    assert "gae, grpo, rloo" in allowed["algo.adv_estimator"] and "clip, dual_clip" in allowed["algo.policy_loss"]


def test_the_simulator_keys_are_in_the_page_after_the_run_config():
    """Issue 41: `rlhfless simulate KEY=VALUE` keys (SimConfig) have their own part, each with its type and
    checks, e.g. the iteration source switch and the published length fits."""
    text = PAGE.read_text()
    sim = text[text.index("# Simulator keys"):]
    assert all(f"| `{f.key}` |" in sim for f in fields_of(SimConfig))
    assert "| `iteration` | one of: vllm, kernels | `vllm` |" in sim
    assert "verl-gsm8k-grpo" in next(ln for ln in sim.splitlines() if ln.startswith("| `lengths.fit_to`"))


def test_the_registered_variants_are_read_from_the_registries():
    from rlhfless.algo.registry import POLICY_LOSSES, register_policy_loss
    from rlhfless.algo.variants import POLICY_LOSS_NAMES, declare_policy_loss
    from rlhfless.run.configref import all_rules

    declare_policy_loss("zz_test_loss", "a loss declared by this test")
    register_policy_loss("zz_test_loss")(lambda *a: None)
    try:
        assert "zz_test_loss" in " ".join(all_rules(RunConfig)["algo.policy_loss"])
    finally:
        POLICY_LOSS_NAMES.pop("zz_test_loss")
        POLICY_LOSSES.pop("zz_test_loss")
