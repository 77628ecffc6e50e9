"""The GSM8K and JSONL tasks: answer extraction and matching (exact tables), rewards, hash splits (properties),
config errors that name the field, data errors that name file:line, and the real GSM8K file (skipped when absent)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfless.core.configbase import build_config
from rlhfless.core.errors import ConfigError, DataError
from rlhfless.tasks.answers import answers_match, extract_final, normalize_number
from rlhfless.tasks.config import TASK_NAMES, TaskConfig, make_task
from rlhfless.tasks.gsm8k import GSM8KTask, GSM8KTaskConfig, read_jsonl
from rlhfless.tasks.hashsplit import normalize_question
from rlhfless.tasks.jsonl_task import JSONLTask, JSONLTaskConfig, file_stem

# ---------------------------------------------------------------- answers: exact tables

NORMALIZE = [
    ("72", "72"),
    ("  72 \n", "72"),
    ("-3", "-3"),
    ("+5", "5"),
    ("0.50", "0.5"),
    ("2.50", "2.5"),
    (".5", "0.5"),
    ("-0.25", "-0.25"),
    ("1,000", "1000"),
    ("1,234,567", "1234567"),
    ("$1,234.00", "1234"),
    ("-$5", "-5"),
    ("$-5", "-5"),
    ("18 dollars", "18"),
    ("72 clips.", "72"),
    ("5%", "5"),
    ("12.", "12"),
    ("12.0", "12"),
    ("007", "7"),
    ("-0", "0"),
    ("x = 18", "18"),
    ("3/4", "0.75"),     # fractions become their exact canonical form
    ("6/8", "0.75"),
    ("2/6", "1/3"),      # a repeating decimal stays a reduced fraction
    ("-1/3", "-1/3"),
    ("", None),
    ("abc", None),
    ("$", None),
    ("5 or 6", None),    # two numbers: ambiguous, no credit
    ("48/2 = 24", None),
    ("10-3", None),      # subtraction, not a negative 3
    ("1,2,3", None),     # not thousands groups: three numbers
    ("1,00", None),
    ("3/0", None),
    ("1.5/2", None),
]


@pytest.mark.parametrize("text, expected", NORMALIZE)
def test_normalize_number_table(text, expected):
    assert normalize_number(text) == expected


EXTRACT = [
    ("48/2 = 24\n48+24 = 72\n#### 72", "72"),
    ("#### 5\nwait\n#### 7", "7"),                  # the last #### wins
    ("#### 18 dollars\n\nQuestion: next one 3", "18 dollars"),  # a base model running on: first line only
    ("####\n  42  \n", "42"),                       # first non-empty line after the mark
    ("so #### ", None),                             # a mark with nothing after it
    ("The answer is 72.", "72"),                    # no mark: last number of the last non-empty line
    ("It costs $1,234.50.\n\n", "1,234.50"),
    ("first 3 then 4\nso -2 and finally -7\n", "-7"),
    ("left over: 10-3", "3"),                       # a '-' after a digit is subtraction, not a sign
    ("10 apples\nno number on this line", None),    # only the LAST non-empty line is read
    ("", None),
    ("   \n  ", None),
]


@pytest.mark.parametrize("response, expected", EXTRACT)
def test_extract_final_table(response, expected):
    assert extract_final(response) == expected


MATCH = [
    ("2.50", "2.5", True),
    ("$1,200", "1200", True),
    ("1200.00", "1,200", True),
    ("72 clips", "72", True),
    ("0.75", "3/4", True),
    ("-3", "3", False),
    ("7", "72", False),
    ("5 or 72", "72", False),
    (None, "72", False),
    ("abc", "abc", False),  # not numbers: the GSM8K reward only matches numbers
]


@pytest.mark.parametrize("pred, gold, expected", MATCH)
def test_answers_match_table(pred, gold, expected):
    assert answers_match(pred, gold) is expected


NUMBERISH = st.text(alphabet="0123456789,.$-+/% ax", max_size=14)


@given(NUMBERISH)
def test_normalize_number_is_idempotent_and_canonical(text):
    n = normalize_number(text)
    if n is not None:
        assert normalize_number(n) == n
        assert "," not in n and "$" not in n and not n.endswith(".") and not n.startswith("+")


@given(st.integers(-10**9, 10**9), st.integers(0, 99))
def test_formatted_integers_and_cents_match_their_plain_value(n, cents):
    assert answers_match(f"${n:,}", str(n))
    assert answers_match(f"{n}.{cents:02d}0", f"{n}.{cents:02d}")


# ---------------------------------------------------------------- GSM8K reward

def _gsm(**kw) -> GSM8KTask:
    return GSM8KTask(GSM8KTaskConfig(**kw))


@pytest.mark.parametrize("response, finished, fr, reward, correct, formed", [
    ("6*12 = 72\n#### 72", True, 0.0, 1.0, True, True),
    ("6*12 = 72\n#### 72", False, 0.2, 0.0, False, False),   # truncated: nothing, even if the number is right
    ("#### 71", True, 0.0, 0.0, False, True),
    ("#### 71", True, 0.2, 0.2, False, True),                # format reward for a well-formed wrong answer
    ("#### 72", True, 0.2, 1.0, True, True),                 # never 1 + format_reward
    ("The answer is 72.", True, 0.2, 1.0, True, False),      # right without the mark: correct, not well formed
    ("The answer is 71.", True, 0.2, 0.0, False, False),     # neither: no format reward
    ("#### seventy-two", True, 0.2, 0.0, False, False),      # a mark without a number is not the format
    ("#### $72.00", True, 0.0, 1.0, True, True),
])
def test_gsm8k_score_cases(response, finished, fr, reward, correct, formed):
    s = _gsm(format_reward=fr).score(response, "72", finished)
    assert (s.reward, s.correct, s.well_formed) == (reward, correct, formed)


@given(st.text(alphabet="0123456789#$,. \nab", max_size=30), st.sampled_from(["72", "1,200", "-3", "0.5"]),
       st.booleans(), st.floats(0.0, 1.0))
def test_gsm8k_reward_is_one_format_reward_or_zero_and_never_above_one(response, answer, finished, fr):
    s = _gsm(format_reward=fr).score(response, answer, finished)
    assert s.reward == (1.0 if s.correct else fr if s.well_formed else 0.0) and s.reward <= 1.0
    assert finished or (s.reward, s.correct, s.well_formed) == (0.0, False, False)


# ---------------------------------------------------------------- files and splits

def _write(path: Path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _rows(questions, answers=None):
    answers = answers or [str(i * 7) for i in range(len(questions))]
    return [{"question": q, "answer": f"Work for {q}.\n#### {a}"} for q, a in zip(questions, answers)]


SMALL = _rows([f"How many apples does person {i} have?" for i in range(30)])


def test_gsm8k_prompts_ids_answers_and_header(tmp_path):
    path = _write(tmp_path / "qa.jsonl", SMALL)
    train, held = _gsm(path=path, n_shots=2, num_eval=5, system="S\n", template="Q: {question}\nA:").splits()
    assert len(held) == 5 and len(train) == 30 - 2 - 5
    lines = sorted(p.meta["line"] for p in train + held)
    assert lines == list(range(3, 31))  # the two shot rows (lines 1-2) are in neither split
    p = held[0]
    row = SMALL[p.meta["line"] - 1]
    assert p.prompt_id == f"gsm8k-{p.meta['line']:05d}" and p.answer == row["answer"].rpartition("#### ")[2]
    header = "S\n" + "".join(f"Q: {r['question']}\nA: {r['answer']}\n\n" for r in SMALL[:2])
    assert p.text == header + f"Q: {row['question']}\nA:" and p.meta["header_chars"] == len(header)
    assert [q.meta["line"] for q in held] == sorted(q.meta["line"] for q in held)  # file order


def test_a_row_repeating_a_shot_question_is_in_neither_split(tmp_path):
    rows = SMALL[:12] + [{"question": "  HOW many apples does person 0   have? ", "answer": "#### 1"}]
    train, held = _gsm(path=_write(tmp_path / "qa.jsonl", rows), n_shots=1, num_eval=3).splits()
    assert 13 not in {p.meta["line"] for p in train + held} and len(train) + len(held) == 11


def test_splits_are_cached_and_callers_cannot_corrupt_them(tmp_path, monkeypatch):
    import rlhfless.tasks.gsm8k as gsm8k

    calls = []
    monkeypatch.setattr(gsm8k, "read_jsonl", lambda path: calls.append(path) or read_jsonl(path))
    task = _gsm(path=_write(tmp_path / "qa.jsonl", SMALL), num_eval=4)
    first = task.splits()
    first[0].clear()
    assert task.splits() == task.splits() and len(task.splits()[0]) == 26 and len(calls) == 1


QUESTION = st.sampled_from(["Q one?", "q  ONE?", "Q two?", "Q three?", "Q four?", "Q five?", "Q six?", "Q seven?",
                            "Q eight?", "Q nine?", "Q ten?", "Q eleven?", "Q twelve?"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(QUESTION, min_size=4, max_size=20), st.integers(0, 2), st.integers(1, 3), st.integers(0, 3))
def test_hash_split_properties_on_random_files_with_duplicates(questions, n_shots, num_eval, seed):
    with tempfile.TemporaryDirectory() as d:
        path = _write(Path(d) / "qa.jsonl", _rows(questions))
        cfg = dict(path=path, n_shots=n_shots, num_eval=num_eval, split_seed=seed)
        try:
            train, held = _gsm(**cfg).splits()
        except DataError as exc:  # too few distinct questions left for these sizes: the message says so
            assert "num_eval" in str(exc)
            return
        q = {p.meta["line"]: normalize_question(questions[p.meta["line"] - 1]) for p in train + held}
        held_q, train_q = {q[p.meta["line"]] for p in held}, {q[p.meta["line"]] for p in train}
        shot_q = {normalize_question(x) for x in questions[:n_shots]}
        assert len(held) == num_eval and train
        assert not held_q & train_q and not (held_q | train_q) & shot_q  # disjoint, duplicates included
        # every other row is a shot, or a duplicate dropped at the held-out boundary
        for line in set(range(n_shots + 1, len(questions) + 1)) - set(q):
            assert normalize_question(questions[line - 1]) in held_q | shot_q
        again = _gsm(**cfg).splits()
        assert again == (train, held)  # deterministic
        smaller_train, same_held = _gsm(**cfg, num_train=1).splits()
        assert same_held == held and len(smaller_train) == 1 and smaller_train[0] in train


def test_larger_num_eval_only_adds_to_the_held_out_set_and_the_seed_changes_it(tmp_path):
    path = _write(tmp_path / "qa.jsonl", SMALL)
    held4 = {p.prompt_id for p in _gsm(path=path, num_eval=4).splits()[1]}
    held9 = {p.prompt_id for p in _gsm(path=path, num_eval=9).splits()[1]}
    other = {p.prompt_id for p in _gsm(path=path, num_eval=9, split_seed=1).splits()[1]}
    assert held4 < held9 and other != held9


def test_too_few_rows_say_what_to_do(tmp_path):
    path = _write(tmp_path / "qa.jsonl", SMALL[:6])
    with pytest.raises(DataError, match=r"qa\.jsonl \(after 1 few-shot rows\): 5 usable rows, too few for "
                                         r"task\.gsm8k\.num_eval=5 .*lower task\.gsm8k\.num_eval"):
        _gsm(path=path, n_shots=1, num_eval=5).splits()
    with pytest.raises(DataError, match=r"qa\.jsonl: 6 usable rows, too few for task\.jsonl\.num_eval=3 and "
                                         r"task\.jsonl\.num_train=4"):
        _jsonl(path=path, num_eval=3, num_train=4).splits()
    dup = _write(tmp_path / "dup.jsonl", _rows(["Same?", "same? ", "SAME?"]))
    with pytest.raises(DataError, match=r"only 0 rows left for train.*never split"):
        _gsm(path=dup, num_eval=1).splits()


# ---------------------------------------------------------------- the JSONL task

def _jsonl(**kw) -> JSONLTask:
    return JSONLTask(JSONLTaskConfig(**kw))


def test_jsonl_task_on_a_gsm8k_file_gives_the_gsm8k_tasks_prompts(tmp_path):
    path = _write(tmp_path / "qa.jsonl", SMALL)
    common = dict(path=path, num_eval=7, num_train=11, split_seed=3, template="Q: {question}\nA:", system="S\n")
    gsm = _gsm(**common).splits()
    generic = _jsonl(**common, answer_regex=r"####\s*(.+)$").splits()
    for a, b in zip(gsm, generic):
        assert [(p.meta["line"], p.text, p.answer) for p in a] == [(p.meta["line"], p.text, p.answer) for p in b]
    assert generic[1][0].prompt_id == f"qa-{generic[1][0].meta['line']:05d}"


def test_jsonl_task_fields_numbers_and_string_answers(tmp_path):
    rows = [{"q": f"Capital number {i}?", "a": i} for i in range(8)] + [{"q": "Capital of France?", "a": "Paris"}]
    task = _jsonl(path=_write(tmp_path / "caps.jsonl", rows), question_field="q", answer_field="a",
                  num_eval=2, response_regex=r"ANSWER:\s*(\S+)", format_reward=0.25)
    train, held = task.splits()
    assert sorted(p.answer for p in train + held) == sorted([str(i) for i in range(8)] + ["Paris"])
    assert {p.prompt_id.rsplit("-", 1)[0] for p in train} == {"caps"} and file_stem("d/v1.jsonl.gz") == "v1"
    assert task.score("ANSWER: 3 ... ANSWER: 7.00", "7", True) == _score(1.0, True, True)  # last match
    assert task.score("ANSWER: Paris", "Paris", True) == _score(1.0, True, True)
    assert task.score("ANSWER: paris", "Paris", True) == _score(0.25, False, True)  # strings: exact
    assert task.score("Paris", "Paris", True) == _score(0.0, False, False)          # no fallback
    assert task.score("ANSWER: 7", "7", False) == _score(0.0, False, False)         # truncated
    strict = _jsonl(path="x.jsonl", numeric=False)
    assert strict.score("#### 7.0", "7", True).correct is False and strict.score("#### 7", "7", True).correct


def _score(reward, correct, formed):
    from rlhfless.tasks.base import Score

    return Score(reward, correct, formed)


@pytest.mark.parametrize("line, match", [
    ({"answer": "#### 1"}, r"bad\.jsonl:3: needs a non-empty string 'question' \(task\.jsonl\.question_field\)"),
    ({"question": "q?"}, r"bad\.jsonl:3: needs a string or number 'answer' \(task\.jsonl\.answer_field\)"),
    ({"question": "q?", "answer": True}, r"bad\.jsonl:3: needs a string or number 'answer'"),
    ({"question": "q?", "answer": "no mark"}, r"bad\.jsonl:3: task\.jsonl\.answer_regex .* does not match"),
    ({"question": "q?", "answer": "####  "}, r"bad\.jsonl:3: the reference answer is empty"),
    ("{oops", r"bad\.jsonl:3: not valid JSON"),
])
def test_jsonl_malformed_rows_name_file_and_line(tmp_path, line, match):
    path = _write(tmp_path / "bad.jsonl", SMALL[:2] + [line] + SMALL[2:])
    with pytest.raises(DataError, match=match):
        _jsonl(path=path, answer_regex=r"####\s*(.+)$", num_eval=2).splits()


def test_gsm8k_malformed_row_names_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", SMALL[:4] + [{"question": "q?", "answer": "7"}])
    with pytest.raises(DataError, match=r"bad\.jsonl:5: 'answer' must end with '#### <final answer>'"):
        _gsm(path=path, num_eval=1).splits()


# ---------------------------------------------------------------- config: errors name the field, overrides work

@pytest.mark.parametrize("overrides, field", [
    (["gsm8k.format_reward=1.5"], "task.gsm8k.format_reward"),
    (["gsm8k.format_reward=-0.1"], "task.gsm8k.format_reward"),
    (["gsm8k.template=no placeholder"], "task.gsm8k.template"),
    (["gsm8k.template='{question} {other}'"], "task.gsm8k.template"),
    (["gsm8k.num_eval=0"], "task.gsm8k.num_eval"),
    (["gsm8k.num_train=0"], "task.gsm8k.num_train"),
    (["gsm8k.n_shots=-1"], "task.gsm8k.n_shots"),
    (["jsonl.format_reward=2"], "task.jsonl.format_reward"),
    (["jsonl.template=Question"], "task.jsonl.template"),
    (["jsonl.response_regex='####.*'"], "task.jsonl.response_regex"),  # no capture group
    (["jsonl.answer_regex='(unclosed'"], "task.jsonl.answer_regex"),
    (["jsonl.answer_regex='#+'"], "task.jsonl.answer_regex"),
    (["jsonl.question_field=''"], "task.jsonl.question_field"),
    (["name=math"], "task.name"),
    (["name=jsonl"], "task.jsonl.path"),  # only once the jsonl task is built
])
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make_task(build_config(TaskConfig, {}, overrides, prefix="task"))


def test_overrides_build_each_task_with_optional_and_float_fields(tmp_path):
    path = _write(tmp_path / "qa.jsonl", SMALL)
    cfg = build_config(TaskConfig, {}, ["name=gsm8k", "gsm8k.num_eval=5", "gsm8k.num_train=null",
                                        "gsm8k.format_reward=0", f"gsm8k.path={path}"], prefix="task")
    assert cfg.gsm8k.num_train is None and cfg.gsm8k.format_reward == 0.0
    assert isinstance(cfg.gsm8k.format_reward, float)
    task = make_task(cfg)
    assert isinstance(task, GSM8KTask) and task.name == "gsm8k" and len(task.splits()[1]) == 5
    cfg = build_config(TaskConfig, {"jsonl": {"answer_regex": r"####\s*(.+)$"}},
                       ["name=jsonl", f"jsonl.path={path}", "jsonl.num_eval=5", "jsonl.num_train=3",
                        "jsonl.numeric=false"], prefix="task")
    task = make_task(cfg)
    assert isinstance(task, JSONLTask) and len(task.splits()[0]) == 3 and cfg.jsonl.numeric is False
    assert TASK_NAMES == ("arith", "gsm8k", "jsonl") and make_task(TaskConfig()).name == "arith"


def test_defaults_are_valid_when_their_task_is_not_selected():
    cfg = TaskConfig()  # jsonl.path is empty: fine until task.name=jsonl
    assert (cfg.gsm8k.n_shots, cfg.gsm8k.num_eval, cfg.gsm8k.num_train, cfg.gsm8k.format_reward) == (0, 500, None, 0.0)
    assert (cfg.jsonl.path, cfg.jsonl.response_regex, cfg.jsonl.numeric) == ("", r"####\s*(.+)", True)


# ---------------------------------------------------------------- the real GSM8K file

def test_real_gsm8k_reference_solutions_score_one_and_default_split_sizes(gsm8k_file):
    rows = read_jsonl(gsm8k_file)
    task = GSM8KTask(GSM8KTaskConfig(path=str(gsm8k_file)))
    for r in rows:  # the reward accepts every reference solution against its own answer
        assert task.score(r.answer, r.final, True).reward == 1.0, r.line
    train, held = task.splits()
    distinct = len({normalize_question(r.question) for r in rows})
    assert len(held) == task.cfg.num_eval == 500 and len(train) == len(rows) - 500 and distinct == len(rows)
    train2, held2 = GSM8KTask(GSM8KTaskConfig(path=str(gsm8k_file), n_shots=2, num_train=1000)).splits()
    assert len(train2) == 1000 and len(held2) == 500
