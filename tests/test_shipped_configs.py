"""Every shipped config passes `rlhfless train --dry-run` in every runtime mode `train --help` offers for it, as
written (no extra flag: plan.max_actors above the units is capped with one line, `RunConfig.check_machine`).

gsm8k_hf.yaml needs the GSM8K file, which the repository does not ship: without it, its dry run must refuse in one
line naming where to get the file and the override that points at it.
"""

from __future__ import annotations

import pytest

from conftest import REPO
from rlhfless.cli import main
from rlhfless.runtime.config import available_cores

CONFIGS = sorted(p.name for p in (REPO / "experiments" / "configs").glob("*.yaml"))
MODES = ["inline", "serverless", "serverful", "compare"]


def test_the_list_of_shipped_configs_is_complete():
    assert {"quickstart.yaml", "quickstart_ppo.yaml", "serverless_vs_serverful.yaml", "gsm8k_hf.yaml"} <= set(CONFIGS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [c for c in CONFIGS if c != "gsm8k_hf.yaml"])
def test_a_shipped_config_passes_the_dry_run_in_every_mode(name, mode, monkeypatch, capsys):
    if "ppo" in name and mode in ("serverless", "compare") and available_cores() < 2:
        pytest.skip("PPO's actor and critic functions need 2 units")
    monkeypatch.chdir(REPO)
    rc = main(["train", "--dry-run", "--no-progress", "--config", f"experiments/configs/{name}",
               f"runtime.mode={mode}"])
    err = capsys.readouterr().err
    if mode == "inline" and _emulated(name):  # the emulated keys would go unused: refused in one line
        assert rc == 2 and "runtime.device=emulated needs a runtime mode" in err, err[-2000:]
        return
    assert rc == 0, err[-2000:]
    assert "rlhfless: config OK" in err


def _emulated(name: str) -> bool:
    from rlhfless.config import load_run_config

    return load_run_config(str(REPO / "experiments" / "configs" / name), []).runtime.device == "emulated"


def test_the_gsm8k_config_without_its_file_names_the_source_and_the_override(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(REPO)
    missing = tmp_path / "train.jsonl"
    assert main(["train", "--dry-run", "--no-progress", "--config", "experiments/configs/gsm8k_hf.yaml",
                 f"task.gsm8k.path={missing}", f"policy.checkpoint={tmp_path / 'model'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and len(err) <= 300, err
    assert str(missing) in err and "github.com/openai/grade-school-math" in err and "task.gsm8k.path=FILE" in err
    assert not (tmp_path / "model").exists()  # refused before the policy's build started
