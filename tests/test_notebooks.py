"""Notebooks: each runs top to bottom at the test size (RLHFLESS_NB_SMALL=1) on an in-memory copy (the committed
file is never written), shows every figure it lists, and used the data it says it used. The committed notebooks
carry the outputs of a full-size run (`make notebooks`) made from the data the repo ships now.

What a notebook used and produced comes from its `provenance.json` (see notebooks/provenance.py), checked here
against the files themselves: sha256 and row counts are recomputed by the test, not taken on trust.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GSM8K = Path(os.environ.get("RLHFLESS_GSM8K") or REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl")

# The data each notebook states it uses (its first markdown cell): input role -> path in the repo.
STATED = {
    "01_quickstart": {"checkpoint": "data/checkpoints/sft/model.safetensors"},
    "02_prefill": {"checkpoint": "data/checkpoints/sft/model.safetensors"},
    "03_length_predictors": {"trace": "data/traces/quickstart.jsonl.gz"},
    "04_simulator": {"trace": "data/traces/quickstart.jsonl.gz"},
    "05_planner_scaler": {"trace": "data/traces/quickstart.jsonl.gz", "time_profile": "data/profiles/tpot_tiny_cpu.json",
                          "config": "experiments/configs/quickstart.yaml"},
    "06_serverless_runtime": {"checkpoint": "data/checkpoints/sft/model.safetensors",
                              "config": "experiments/configs/serverless_vs_serverful.yaml",
                              "config_defaults": "experiments/configs/quickstart.yaml"},
    "07_repro": {"trace": "data/traces/quickstart.jsonl.gz", "checkpoint": "data/checkpoints/sft/model.safetensors"},
    "08_what_if": {},  # simulated: the workload and the price lists are made in the notebook (recorded as such)
    "09_emulated_testbed": {"config": "experiments/configs/emulated_testbed_7b_grpo.yaml",
                            "config_defaults": "experiments/configs/quickstart.yaml",
                            "checkpoint": "data/checkpoints/sft/model.safetensors"},
}
# Figures each notebook must produce (file stems); GSM8K's only where the data is present.
FIGURES = {
    "01_quickstart": {"reward_and_length"},
    "02_prefill": {"saving_vs_g", "saving_vs_prefix"},
    "03_length_predictors": {"compare", "predicted_vs_actual", "ewma_alpha", "ewma_online"},
    "04_simulator": {"stages", "gantt", "sweep_tau", "sweep_lambda", "sweep_n"},
    "05_planner_scaler": {"policies", "sweet_spot", "tau"},
    "06_serverless_runtime": {"gantt", "billed_by_kind", "step_time"},
    # the full size adds timeline_gantt and sim_vs_real_stages (two training runs: `make repro-quick` in CI)
    "07_repro": {"headline_testbed", "large_scale_paper_sim", "ablation_ladder", "ablation_shapley",
                 "sensitivity_tau_lambda_n", "prefill_saving", "predictor_ewma"},
    "08_what_if": {"recommended_mode", "step_and_cost", "regime_cluster_model"},
    "09_emulated_testbed": {"gantt", "bill_split"},
}

# Notebooks whose run starts runtime workers, one per core (test_runtime_e2e.py skips below 2 as well).
NEEDS_TWO_CORES = {"06_serverless_runtime"}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(path: Path) -> int:
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as fh:
        return sum(1 for line in fh if line.strip())


def _code_outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _errors(nb) -> list:
    return [f"{o.ename}: {o.evalue}" for o in _code_outputs(nb) if o.output_type == "error"]


def _shown_pngs(nb) -> list[bytes]:
    return [base64.b64decode(o.data["image/png"]) for o in _code_outputs(nb)
            if o.output_type in ("display_data", "execute_result") and "image/png" in o.get("data", {})]


def _printed_provenance(nb) -> dict:
    """The JSON line the last code cell prints (`Provenance.write`)."""
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.text for o in last.get("outputs", []) if o.output_type == "stream" and o.name == "stdout")
    assert text.strip(), "the last cell printed no provenance record"
    return json.loads(text.strip().splitlines()[-1])


def _check_inputs(name: str, inputs: list[dict], size: str) -> None:
    """The stated data was used, whole, and is byte for byte the file in the repo now; nothing synthetic."""
    by_role = {i["role"]: i for i in inputs}
    for role, path in STATED[name].items():
        entry = by_role.get(role)
        assert entry is not None, f"{name} recorded no '{role}' input (stated: {path})"
        assert entry["path"] == path and entry.get("used", True)
        assert entry["sha256"] == _sha256(REPO / path), f"{name} used another {role} than {path} holds now"
        if path.endswith((".jsonl", ".jsonl.gz")):
            assert entry["rows"] == entry["rows_read"] == _rows(REPO / path), f"{name} did not read all of {path}"
            assert 0 < entry["rows_used"] <= entry["rows_read"]
    for entry in inputs:
        assert "synthetic" not in entry["role"], entry
        local = REPO / entry.get("path", "")  # an absolute recorded path stays absolute
        if entry.get("used", True) and "path" in entry and (local.resolve().is_relative_to(REPO) or local.is_file()):
            assert entry["sha256"] == _sha256(local), f"{entry['path']} changed since the notebook ran"
    if name == "03_length_predictors":
        gsm = by_role["gsm8k"]
        if size == "full":
            assert gsm.get("used", True), "a full-size run compares predictors on GSM8K"
        elif GSM8K.is_file():
            assert gsm.get("used", True) and gsm["sha256"] == _sha256(GSM8K) and gsm["rows_read"] == _rows(GSM8K)
        else:
            assert gsm["used"] is False and gsm["reason"]


# Executing a notebook takes 8-60 s on 2 cores: the default suite runs the quickstart's, `make test-slow` runs the
# rest (CI runs both); the committed outputs of every notebook are checked by default (the test below this one).
@pytest.mark.parametrize("path", [p if p.stem == "01_quickstart" else pytest.param(p, marks=pytest.mark.slow)
                                  for p in NOTEBOOKS], ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_shows_its_figures_and_used_the_stated_data(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if path.stem in NEEDS_TWO_CORES and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("its runtime run needs 2 cores (one worker per core), as tests/test_runtime_e2e.py")
    monkeypatch.setenv("RLHFLESS_NB_SMALL", "1")
    monkeypatch.setenv("RLHFLESS_NB_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # committed full-size outputs must not pass for this run's
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    assert not _errors(nb)

    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record == _printed_provenance(nb)
    assert record["notebook"] == path.stem and record["size"] == "small"
    figures = [Path(f) for f in record["figures"]]
    expected = FIGURES[path.stem] | ({"gsm8k_predicted_vs_actual"} if "03" in path.stem and GSM8K.is_file() else set())
    assert {f.stem for f in figures} == expected
    shown = _shown_pngs(nb)
    for f in figures:
        data = f.read_bytes()
        assert f.parent == tmp_path and data.startswith(PNG_MAGIC) and len(data) > 1000, f
        assert data in shown, f"{f.name} is listed but not shown inline"
    assert len(shown) == len(figures), "a figure is shown that provenance does not list"
    _check_inputs(path.stem, record["inputs"], "small")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_outputs_come_from_a_full_size_run_of_the_shipped_data(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any(c.get("outputs") for c in code), f"{path.name} carries no outputs: run `make notebooks` and commit"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "not one top-to-bottom run"
    assert not _errors(nb)
    record = _printed_provenance(nb)
    assert record["notebook"] == path.stem
    assert record["size"] == "full", f"{path.name} carries {record['size']}-size outputs: run `make notebooks`"
    assert len(_shown_pngs(nb)) == len(record["figures"]) > 0
    assert {Path(f).stem for f in record["figures"]} >= FIGURES[path.stem]
    _check_inputs(path.stem, record["inputs"], "full")
