from pathlib import Path

import pytest

from rlhfless.config import RunConfig, load_run_config
from rlhfless.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_yaml_loads_and_overrides_apply():
    cfg = load_run_config(REPO / "experiments/configs/quickstart.yaml", ["algo.group_size=4", "optim.lr=3e-4"])
    assert isinstance(cfg, RunConfig)
    assert cfg.algo.group_size == 4 and cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.rollout.dedup_prefill is True


def test_every_shipped_config_loads():
    for path in (REPO / "experiments/configs").glob("*.yaml"):
        if path.name.startswith(("plan_", "sim_")):
            continue
        load_run_config(path)


@pytest.mark.parametrize("override, field", [
    ("algo.group_size=1", "algo.group_size"),
    ("optim.lr=-0.1", "optim.lr"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("task.k_max=1", "task.k_max"),
    ("rollout.prompts_per_step=abc", "rollout.prompts_per_step"),
    ("rollout.dedup_prefill=3", "rollout.dedup_prefill"),
    ("tracking.mode=cloud", "tracking.mode"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(None, [override])


def test_unknown_keys_are_rejected_with_allowed_list():
    with pytest.raises(ConfigError, match="unknown config key 'rollout.group_siz'.*prompts_per_step"):
        load_run_config(None, ["rollout.group_siz=3"])


def test_defaults_inheritance(tmp_path):
    (tmp_path / "base.yaml").write_text("algo:\n  group_size: 4\ntrain:\n  steps: 7\n")
    (tmp_path / "child.yaml").write_text("defaults: base.yaml\ntrain:\n  steps: 9\n")
    cfg = load_run_config(tmp_path / "child.yaml")
    assert cfg.algo.group_size == 4 and cfg.train.steps == 9


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_run_config(tmp_path / "nope.yaml")
