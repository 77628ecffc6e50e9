"""Length data schema, readers (length data and loop traces), GSM8K conversion, grouping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfless.core.errors import DataError
from rlhfless.predictor.data import (
    LengthRow,
    group_observations,
    gsm8k_lengths,
    read_lengths,
    rows_from_trace,
    write_lengths,
)
from rlhfless.core.records import TraceRow
from rlhfless.core.traces import TraceWriter


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_round_trip_and_optional_fields(tmp_path):
    rows = [LengthRow("a", "text a", 10), LengthRow("b", "text b", 20, epoch=1, step=3, sample=2, truncated=True)]
    p = tmp_path / "l.jsonl"
    assert write_lengths(rows, p) == 2
    assert read_lengths(p) == rows
    assert "epoch" not in json.loads(p.read_text().splitlines()[0])


def test_reads_loop_trace_directly(tmp_path):
    trace = [TraceRow("p0", "q", 0, 0, s, 5, 30 + s, False, 1.0) for s in range(3)]
    with TraceWriter(tmp_path / "t.jsonl") as w:
        w.write(trace)
    rows = read_lengths(tmp_path / "t.jsonl")
    assert [r.response_length for r in rows] == [30, 31, 32]
    assert rows == rows_from_trace(trace)


@pytest.mark.parametrize("line, msg", [
    ("{not json", "not valid JSON"),
    ('{"prompt_id": "a", "prompt": "x"}', "missing field 'response_length'"),
    ('{"prompt_id": 3, "prompt": "x", "response_length": 4}', "'prompt_id' must be a string"),
    ('{"prompt_id": "a", "prompt": "x", "response_length": "4"}', "must be an integer"),
    ('{"prompt_id": "a", "prompt": "x", "response_length": -1}', "must be >= 0"),
    ('{"prompt_id": "a", "prompt": "x", "response_length": 4, "epoch": 1.5}', "'epoch' must be an integer"),
    ('{"prompt_id": "a", "prompt": "x", "response_length": 4, "truncated": "no"}', "'truncated' must be true or false"),
    ("[1, 2]", "expected a JSON object"),
])
def test_malformed_rows_name_the_line(tmp_path, line, msg):
    good = '{"prompt_id": "a", "prompt": "x", "response_length": 4}'
    p = _write(tmp_path / "bad.jsonl", [good, "", line])
    with pytest.raises(DataError, match=rf"bad.jsonl:3: .*{msg}"):
        read_lengths(p)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DataError, match="no rows"):
        read_lengths(_write(tmp_path / "e.jsonl", ["", "  "]))
    with pytest.raises(DataError, match="not found"):
        read_lengths(tmp_path / "nope.jsonl")


def test_group_observations_orders_steps_and_samples():
    rows = [LengthRow("b", "B", 7, 1, 4, 1), LengthRow("a", "A", 5, 0, 0, 1), LengthRow("a", "A", 3, 0, 0, 0),
            LengthRow("b", "B", 9, 1, 4, 0)]
    batches = group_observations(rows)
    assert [[(o.prompt_id, o.lengths, o.epoch, o.step) for o in b] for b in batches] == [
        [("a", (3, 5), 0, 0)], [("b", (9, 7), 1, 4)]]


def test_gsm8k_lengths_uses_byte_tokenizer(tmp_path):
    src = _write(tmp_path / "g.jsonl", [json.dumps({"question": "Q1?", "answer": "é #### 2"}),
                                         json.dumps({"question": "Q2?", "answer": "4"})])
    assert gsm8k_lengths(src, tmp_path / "out.jsonl") == 2
    rows = read_lengths(tmp_path / "out.jsonl")
    # "é #### 2" is 9 UTF-8 bytes; + EOS
    assert [(r.prompt_id, r.prompt, r.response_length) for r in rows] == [("gsm8k-1", "Q1?", 10), ("gsm8k-2", "Q2?", 2)]


def test_gsm8k_bad_line_is_named(tmp_path):
    src = _write(tmp_path / "g.jsonl", [json.dumps({"question": "Q", "answer": "A"}), json.dumps({"question": "Q"})])
    with pytest.raises(DataError, match="g.jsonl:2: expected an object with string fields"):
        gsm8k_lengths(src, tmp_path / "out.jsonl")


def test_real_gsm8k_converts(tmp_path, gsm8k_file):
    n = gsm8k_lengths(gsm8k_file, tmp_path / "gsm.jsonl")
    rows = read_lengths(tmp_path / "gsm.jsonl")
    assert n == len(rows) > 7000
    assert all(r.response_length > 1 and r.epoch is None for r in rows)
