from pathlib import Path

import pytest

from rlhfless.config import RunConfig, load_run_config
from rlhfless.core.errors import ConfigError

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
    ("task.arith.k_max=1", "task.arith.k_max"),
    ("rollout.prompts_per_step=abc", "rollout.prompts_per_step"),
    ("rollout.dedup_prefill=3", "rollout.dedup_prefill"),
    ("tracking.mode=cloud", "tracking.mode"),
    ("rollout.engine=sglang", "rollout.engine"),
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


def test_a_bad_value_in_a_file_names_the_file_and_an_override_names_itself(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("algo:\n  group_size: 1\n")
    with pytest.raises(ConfigError, match=rf"^{p}: algo\.group_size: must be >= 2"):
        load_run_config(p)
    p.write_text("algo:\n  group_size: 4\n")
    with pytest.raises(ConfigError, match=r"^algo\.group_size: must be >= 2"):
        load_run_config(p, ["algo.group_size=1"])
    # a file that only an override completes still loads (max_seq_len_norm must cover max_new_tokens)
    p.write_text("algo:\n  max_seq_len_norm: 100\n")
    assert load_run_config(p, ["rollout.max_new_tokens=64"]).algo.max_seq_len_norm == 100
    with pytest.raises(ConfigError, match=rf"^{p}: algo\.max_seq_len_norm"):
        load_run_config(p)


@pytest.mark.parametrize("text, message", [
    ("plan:\n  max_actors: many\n", r"plan\.max_actors: expected an integer"),
    ("plan:\n  max_actor: 4\n", r"unknown config key 'plan\.max_actor'"),
    ("plan: 5\n", "'plan' must be a mapping"),
    ("plan:\n  policy: [unclosed\n", "not valid YAML"),
    ("- 1\n- 2\n", "expected a mapping at the top level"),
    ("plan:\n  policy: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
])
def test_plan_config_file_errors_name_the_file_in_one_line(tmp_path, text, message):
    from rlhfless.plan.cli import load_plan_config

    p = tmp_path / "plan.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_plan_config(str(p), [])
    assert str(err.value).startswith(str(p)) and "\n" not in str(err.value)


def test_vllm_engine_runs_in_every_mode_but_takes_no_shipped_kv():
    for mode in ("inline", "serverless", "serverful", "compare"):
        assert load_run_config(None, ["rollout.engine=vllm", f"runtime.mode={mode}"]).rollout.engine == "vllm"
    auto = load_run_config(None, ["rollout.engine=vllm", "runtime.mode=serverless", "runtime.ship_prefix_kv=auto"])
    assert auto.runtime.ship_prefix_kv == "auto"  # accepted: the decode stage never ships KV to vLLM
    with pytest.raises(ConfigError, match=r"runtime\.ship_prefix_kv: always .* rollout\.engine=vllm cannot take"):
        load_run_config(None, ["rollout.engine=vllm", "runtime.mode=serverless", "runtime.ship_prefix_kv=always"])
