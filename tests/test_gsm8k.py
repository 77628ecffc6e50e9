"""GSM8K-format loader: template, answers, shared header, and DataErrors that name the bad line."""

from __future__ import annotations

import json

import pytest

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.tasks.gsm8k import GSM8KConfig, load_prompts, missing_message, read_jsonl

from conftest import GSM8K as REAL
from conftest import REQUIRE_SHARED, require_shared_file


@pytest.fixture
def real_gsm8k() -> Path:
    return require_shared_file(REAL)


def _write(tmp_path, lines):
    p = tmp_path / "qa.jsonl"
    p.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return str(p)


ROWS = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}=<<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
        for i in range(1, 6)]


def test_prompts_share_the_few_shot_header_and_answers_follow_hashes(tmp_path):
    path = _write(tmp_path, ROWS)
    prompts = load_prompts(GSM8KConfig(path=path, n_shots=2, system="SYS\n"))
    assert [p.answer for p in prompts] == ["6", "8", "10"]
    assert [p.prompt_id for p in prompts] == ["gsm8k-00003", "gsm8k-00004", "gsm8k-00005"]
    shot = "Question: What is {i} plus {i}?\nAnswer: {a}\n\n"
    header = "SYS\n" + "".join(shot.format(i=i, a=ROWS[i - 1]["answer"]) for i in (1, 2))
    assert prompts[0].text == header + "Question: What is 3 plus 3?\nAnswer:"
    assert len({p.text[: p.meta["header_chars"]] for p in prompts}) == 1
    assert len(load_prompts(GSM8KConfig(path=path, n_shots=0, limit=2))) == 2


@pytest.mark.parametrize("bad,match", [
    ("{not json", r":3: not valid JSON"),
    (json.dumps({"question": "q"}), r":3: needs a non-empty string 'question'"),
    (json.dumps([1, 2]), r":3: expected a JSON object"),
    (json.dumps({"question": "q", "answer": "no final"}), r":3: 'answer' must end with '#### <final answer>'"),
])
def test_bad_rows_name_their_line(tmp_path, bad, match):
    path = _write(tmp_path, ROWS[:2] + [bad] + ROWS[2:])
    with pytest.raises(DataError, match=match):
        read_jsonl(path)


def test_missing_file_too_few_rows_and_bad_config(tmp_path):
    with pytest.raises(DataError, match="GSM8K file not found"):
        load_prompts(GSM8KConfig(path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(DataError, match="n_shots=2 leaves no prompts"):
        load_prompts(GSM8KConfig(path=_write(tmp_path, ROWS[:2]), n_shots=2))
    with pytest.raises(ConfigError, match="gsm8k.template"):
        GSM8KConfig(template="no placeholder")
    with pytest.raises(ConfigError, match="gsm8k.n_shots"):
        GSM8KConfig(n_shots=-1)


def test_real_gsm8k_file_loads(real_gsm8k):
    prompts = load_prompts(GSM8KConfig(path=str(real_gsm8k), n_shots=2, limit=20))
    assert len(prompts) == 20
    assert all(p.answer.replace(",", "").lstrip("-").replace(".", "").isdigit() for p in prompts)
    assert len({p.text[: p.meta["header_chars"]] for p in prompts}) == 1


def test_a_missing_shared_file_skips_with_the_reason_and_fails_when_required(tmp_path, monkeypatch):
    absent = tmp_path / "shared" / "train.jsonl"
    monkeypatch.delenv(REQUIRE_SHARED, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"GSM8K file not found at .*train.jsonl: .*\.\./shared/data/gsm"):
        require_shared_file(absent)
    monkeypatch.setenv(REQUIRE_SHARED, "1")
    with pytest.raises(pytest.fail.Exception, match="RLHFLESS_REQUIRE_SHARED=1"):
        require_shared_file(absent)
    present = tmp_path / "qa.jsonl"
    present.write_text(json.dumps(ROWS[0]) + "\n")
    assert require_shared_file(present) == present and missing_message(present) is None
