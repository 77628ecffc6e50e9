"""Trace I/O (plain and gzip) and the length statistics against hand-computed values."""

import math

import pytest

from rlhfless.errors import DataError
from rlhfless.records import TraceRow
from rlhfless.traces import TraceWriter, length_stats, read_trace


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
