"""Bad runtime settings are rejected before any work, with a message naming the field."""

import pytest

from rlhfless.config import load_run_config
from rlhfless.core.errors import ConfigError
from rlhfless.run.launch import train
from rlhfless.runtime.config import RuntimeConfig, available_cores

QS = "experiments/configs/quickstart.yaml"


@pytest.mark.parametrize("override, field", [
    ("runtime.mode=cloud", "runtime.mode"),
    ("runtime.backend=k8s", "runtime.backend"),
    ("runtime.units=-1", "runtime.units"),
    ("runtime.start_method=fork", "runtime.start_method"),
    ("runtime.keep_alive_s=-1", "runtime.keep_alive_s"),
    ("runtime.ship_prefix_kv=sometimes", "runtime.ship_prefix_kv"),
    ("runtime.progress_every=0", "runtime.progress_every"),
    ("runtime.max_attempts=0", "runtime.max_attempts"),
    ("runtime.billing_granularity_s=0", "runtime.billing_granularity_s"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(QS, [override])


def test_serverless_needs_the_planner():
    with pytest.raises(ConfigError, match=r"train\.plan"):
        load_run_config(QS, ["runtime.mode=serverless", "train.plan=false"])


@pytest.mark.parametrize("overrides, field", [
    ([f"runtime.units={available_cores() + 1}"], "runtime.units"),
    (["runtime.mode=serverless", f"plan.min_actors={available_cores() + 1}",
      f"plan.max_actors={available_cores() + 1}"], "plan.min_actors"),
    ([f"runtime.serverful_workers={available_cores() + 1}", "runtime.mode=serverful"], "runtime.serverful_workers"),
    ([f"runtime.learner_units={available_cores() + 1}", "runtime.mode=serverless"], "runtime.learner_units"),
])
def test_what_this_machine_cannot_run_fails_before_any_work(tmp_path, overrides, field):
    cfg = load_run_config(QS, overrides + ["tracking.mode=disabled"])
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        train(cfg, out, progress=False)
    assert not out.exists()  # nothing was started or written


def test_max_actors_above_the_units_is_capped_at_them_with_one_line(capsys):
    units = available_cores()
    for mode in ("serverless", "compare"):
        cfg = load_run_config(QS, [f"runtime.mode={mode}", f"runtime.units={units}", f"plan.max_actors={units + 6}"])
        cfg.check_machine()
        assert cfg.plan.max_actors == units
        assert capsys.readouterr().err.strip() == (f"rlhfless: plan.max_actors={units + 6} capped at runtime.units="
                                                   f"{units} (one unit per serverless decode function)")
    inline = load_run_config(QS, [f"plan.max_actors={units + 6}"])
    inline.check_machine()  # inline and serverful runs start no decode functions: nothing to cap
    assert inline.plan.max_actors == units + 6 and capsys.readouterr().err == ""


def test_compare_needs_the_same_data_parallel_degree_in_both_modes():
    if available_cores() < 2:
        pytest.skip("needs 2 cores")
    rt = RuntimeConfig(mode="compare", learner_units=1, serverful_workers=2)
    with pytest.raises(ConfigError, match=r"runtime\.learner_units"):
        rt.check_machine(1)


@pytest.mark.parametrize("overrides", [
    ["runtime.ray_address=auto"],  # the local backend joins no cluster
    ["runtime.backend=ray", "runtime.ray_address=headnode"],  # no port
    ["runtime.backend=ray", "runtime.ray_address=null"],
])
def test_bad_ray_addresses_name_the_field(overrides):
    with pytest.raises(ConfigError, match=r"runtime\.ray_address"):
        load_run_config(QS, overrides)


def test_ray_addresses_accepted_and_a_clusters_units_not_bounded_by_this_machine():
    for address in ("", "auto", "10.0.0.1:6379"):
        assert load_run_config(QS, ["runtime.backend=ray", f"runtime.ray_address={address}"]).runtime.ray_address \
            == address
    units = available_cores() + 4  # a cluster's cores are on its nodes, not in this driver's affinity mask
    RuntimeConfig(backend="ray", units=units).check_machine(1)
    with pytest.raises(ConfigError, match=r"runtime\.units"):
        RuntimeConfig(backend="local", units=units).check_machine(1)


def test_scratch_dir_must_be_a_writable_folder(tmp_path):
    RuntimeConfig(scratch_dir=str(tmp_path)).check_machine(1)
    with pytest.raises(ConfigError, match=r"runtime\.scratch_dir"):
        RuntimeConfig(scratch_dir=str(tmp_path / "missing")).check_machine(1)
