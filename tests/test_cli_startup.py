"""`rlhfless --help`, `--version` and usage errors import no heavy library (torch alone once cost 4-19 s of the
help). Each case runs in a fresh interpreter, since this test process has long imported them; the time it takes
is measured by hand (README), never asserted here: the machine's load decides it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "numpy", "scipy", "sklearn", "matplotlib", "wandb", "ray")

# Runs the CLI's main in-process, then reports its exit status and which heavy modules it had imported.
PROBE = """
import json, sys
exec(sys.argv.pop(1))
from rlhfless.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}), file=sys.__stderr__)
""" % (HEAVY,)


def _probe(*argv: str, first: str = "") -> dict:
    """Run `rlhfless ARGV` in a fresh interpreter (after the code `first`): its exit status and heavy imports."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, first, *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0),
    (["--version"], 0),
    (["train", "--help"], 0),
    (["simulate", "--help"], 0),
    (["repro", "--help"], 0),
    (["config", "--help"], 0),
    (["no-such-command"], 2),
    (["train", "--no-such-flag"], 2),
    (["simulate", "--steps", "0"], 2),
])
def test_help_version_and_usage_errors_import_nothing_heavy(argv, code):
    found = _probe(*argv)
    assert found["code"] == code, found
    assert found["heavy"] == [], f"rlhfless {' '.join(argv)} imported {found['heavy']}"


def test_the_probe_sees_an_import():
    """The check above would catch a heavy import: one made before the help shows up."""
    found = _probe("--help", first="import torch")
    assert found["code"] == 0 and "torch" in found["heavy"]


@pytest.mark.parametrize("argv", [["config", "show"], ["config", "show", "train.steps"], ["config", "show", "runtime"],
                                  ["config", "show", "algo.group_size"], ["config", "show", "runtime.keep_alive_s"],
                                  ["config", "show", "task"], ["config", "show", "algo"],
                                  ["config", "show", "algo.adv_estimator"], ["config", "show", "algo.policy_loss"],
                                  ["config", "show", "algo.name"],
                                  ["config", "show", "algo.policy_loss", "--config",
                                   "experiments/configs/quickstart.yaml", "algo.policy_loss=dual_clip"]])
def test_config_show_imports_no_torch(argv):
    """Issue 42: the command the docs send newcomers to costs no torch (1.7-2.3 s of CPU before), the algo
    variants' keys included: their allowed values are the torch-free declared names (`algo.variants`)."""
    found = _probe(*argv)
    assert found["code"] == 0 and "torch" not in found["heavy"], found


def test_simulate_imports_no_tqdm_or_study_registry():
    """`rlhfless simulate` (the simulator's whole command line) starts without tqdm under --no-progress and
    without the repro studies' registry (`repro --help` builds it when asked): CPU each run paid at start-up."""
    code = ("import sys\nfrom rlhfless.cli import main\n"
            "main(['simulate', '--scenario', 'quick', '--steps', '1', '--no-progress'])\n"
            "print(sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('tqdm',)}"
            " | {m for m in sys.modules if m == 'rlhfless.repro.studies'}), file=sys.__stderr__)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "[]"
