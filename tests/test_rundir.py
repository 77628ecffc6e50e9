"""The run folder's one owner (`rlhfless.core.rundir`): names, and readers that tolerate absent files and name the
file and line of a malformed one."""

from __future__ import annotations

import gzip
import json

import pytest

from rlhfless.core.errors import DataError
from rlhfless.core.rundir import RunDir


def test_readers_return_the_rows_and_empty_for_files_a_run_did_not_write(tmp_path):
    run = RunDir(tmp_path)
    assert run.read_metrics() == [] and run.read_workers() == [] and run.read_digests() == {}
    assert run.read_summary() is None and run.rollouts is None
    run.metrics.write_text('{"step": 1, "timing_s/step": 2.0}\n\n{"step": 2}\n')
    run.traces.mkdir()
    run.digests.write_text('{"step": 1, "sha256": "ab"}\n')
    with gzip.open(run.traces / "rollouts.jsonl.gz", "wt") as f:
        f.write(json.dumps({"step": 1}) + "\n")
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    assert list(run.read_step_metrics()) == [1]  # step 2 never completed
    assert run.read_digests() == {1: "ab"} and run.rollouts.name == "rollouts.jsonl.gz"
    assert run.arm("serverless").workers == tmp_path / "serverless" / "workers.jsonl"


def test_a_malformed_line_names_the_file_and_line(tmp_path):
    run = RunDir(tmp_path)
    run.invocations.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(DataError, match=r"invocations.jsonl:2"):
        run.read_invocations()
