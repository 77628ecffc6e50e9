"""Trace I/O (plain and gzip) and the length statistics against hand-computed values."""

import math

import pytest

from rlhfless.core.errors import DataError
from rlhfless.core.records import TraceRow
from rlhfless.core.traces import TraceWriter, length_stats, read_trace


def _row(pid, epoch, step, sample, length):
    return TraceRow(pid, f"{pid}=", epoch, step, sample, 4, length, False, 0.0)


ROWS = [
    _row("a", 0, 1, 0, 10), _row("a", 0, 1, 1, 30),  # group cv: std 10 / mean 20 = 0.5
    _row("b", 0, 1, 0, 100), _row("b", 0, 1, 1, 100),  # identical
    _row("a", 1, 2, 0, 20), _row("a", 1, 2, 1, 20),
    _row("b", 1, 2, 0, 90), _row("b", 1, 2, 1, 110),  # cv 10/100 = 0.1
]


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip(tmp_path, name):
    with TraceWriter(tmp_path / name) as w:
        w.write(ROWS)
    assert list(read_trace(tmp_path / name)) == ROWS


def test_length_stats_by_hand():
    s = length_stats(ROWS)
    assert s["prompt_mean_spread"] == pytest.approx(100 / 20)
    assert s["within_group_cv_mean"] == pytest.approx((0.5 + 0 + 0 + 0.1) / 4)
    assert s["within_group_identical_frac"] == pytest.approx(0.5)
    assert s["epoch_corr_pearson"] != s["epoch_corr_pearson"] or math.isnan(s["epoch_corr_pearson"])  # 2 prompts
    assert s["top10_token_share"] == pytest.approx(110 / 480)
    assert s["max_over_p50"] == pytest.approx(110 / 60)


def test_malformed_trace_names_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt_id": "a"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing trace field"):
        list(read_trace(p))
    p.write_text("\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        list(read_trace(p))


def test_truncated_gzip_names_the_file_and_line(tmp_path):
    p = tmp_path / "t.jsonl.gz"
    with TraceWriter(p) as w:
        w.write([_row(f"p{i}", 0, 1, s, 10 + i) for i in range(400) for s in range(4)])
    blob = p.read_bytes()
    p.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match=r"t.jsonl.gz:\d+: cannot read the trace file past line \d+: .*trunc") as err:
        list(read_trace(p))
    assert "\n" not in str(err.value)
    p.write_bytes(b"\x1f\x8b" + bytes(range(200)))  # gzip magic, then garbage
    with pytest.raises(DataError, match=r"t.jsonl.gz:1: cannot read"):
        list(read_trace(p))
    q = tmp_path / "latin1.jsonl"
    q.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.jsonl:1: cannot read .*UnicodeDecodeError"):
        list(read_trace(q))


@pytest.mark.parametrize("field, value, message", [
    ("response_len", "12", "'response_len' must be an integer >= 0"),
    ("epoch", -1, "'epoch' must be an integer >= 0"),
    ("sample", 1.5, "'sample' must be an integer >= 0"),
    ("step", True, "'step' must be an integer >= 0"),
    ("prompt_id", 7, "'prompt_id' must be a string"),
    ("truncated", "no", "'truncated' must be true or false"),
    ("reward", None, "'reward' must be a number"),
])
def test_wrongly_typed_trace_field_names_the_line(tmp_path, field, value, message):
    import dataclasses
    import json

    p = tmp_path / "bad.jsonl"
    good = dataclasses.asdict(ROWS[0])
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n")
    with pytest.raises(DataError, match=rf"bad.jsonl:2: trace field {message}"):
        list(read_trace(p))
