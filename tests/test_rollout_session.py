"""Decode sessions (the serverless decode actor's contract), on real runs of the shipped SFT checkpoint with
arithmetic prompts: rows split over sessions, sessions cut and their rows migrated (re-prefilled elsewhere,
including rows at different steps in one session), prefill slices shipped through safetensors, and bad input.
Every check compares tokens with one undisturbed `decode` of the whole step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.model.factory import load_checkpoint
from rlhfless.model.tokenizer import EOS_ID, ByteTokenizer
from rlhfless.rollout.engine import SamplingParams, decode, prefill
from rlhfless.rollout.session import (
    DecodeSession,
    PartialRow,
    resume_prefill,
    resume_session,
    state_from_tensors,
    state_to_tensors,
)
from rlhfless.tasks.arith import ArithTaskConfig, make_splits

G, SEED = 4, 5
PARAMS = SamplingParams(80, 1.0, compact_fraction=0.1)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_checkpoint("data/checkpoints/sft").eval()


@pytest.fixture(scope="module")
def prompts():
    train, _ = make_splits(ArithTaskConfig(num_train=12, num_eval=1))
    return [ByteTokenizer().encode(p.text, bos=True) for p in train]


@pytest.fixture(scope="module")
def ref(model, prompts):
    """The undisturbed run: one decode of all rows (row r = sample r % G of prompt r // G)."""
    out = decode(model, prefill(model, prompts, G), PARAMS, seed=SEED)
    lengths = sorted(out.lengths)
    assert lengths[0] < 20 and sum(out.truncated) >= 2 and not all(out.truncated)  # rows end at many times
    return out


def _merge(into: dict, rows: dict) -> None:
    assert not set(into) & set(rows)
    into.update(rows)


def _as_output(rows: dict, n: int):
    assert sorted(rows) == list(range(n))
    return [rows[r][0] for r in range(n)], [rows[r][1] for r in range(n)]


def test_rows_split_over_sessions_reproduce_the_full_decode(model, prompts, ref):
    n = len(prompts) * G
    state = prefill(model, prompts, G)
    rows: dict = {}
    # three actors holding interleaved rows (sliced from one prefill), plus one holding the last prompts' rows
    # from its own prefill; none of them holds row n - 1 except the last, so n_total must be explicit.
    for part in (list(range(0, n - 8, 3)), list(range(1, n - 8, 3)), list(range(2, n - 8, 3))):
        s = DecodeSession(model, state.select(part), PARAMS, SEED, row_ids=part, n_total=n)
        assert s.advance(PARAMS.max_new_tokens)
        _merge(rows, s.finished_rows())
    tail = prefill(model, prompts[-2:], G)
    s = DecodeSession(model, tail, PARAMS, SEED, row_ids=torch.arange(n - 8, n), n_total=n, impl="hf")
    while not s.advance(7):
        pass
    _merge(rows, s.finished_rows())
    assert _as_output(rows, n) == (ref.responses, ref.truncated)
    # the state that was sliced is intact: it still decodes to the reference
    assert decode(model, state, PARAMS, seed=SEED).responses == ref.responses


@pytest.mark.parametrize("k", [0, 6, 25])
def test_cut_session_migrates_its_rows_exactly(model, prompts, ref, k):
    n = len(prompts) * G
    s = DecodeSession(model, prefill(model, prompts, G), PARAMS, SEED)
    assert not s.advance(k)
    prog = s.progress()
    finished = s.finished_rows()
    assert prog.rows == n and prog.finished == len(finished) and len(prog.unfinished) == n - len(finished)
    assert sorted(finished) == [r for r, n in enumerate(ref.lengths) if n <= k]  # 25: some rows have ended
    assert all(length == k for _, length in prog.unfinished)
    partials = s.take_unfinished()
    assert s.done and s.progress().unfinished == () and s.advance(3)
    assert [(p.row_id, len(p.tokens)) for p in partials] == list(prog.unfinished)
    for p in partials:
        assert list(p.tokens) == ref.responses[p.row_id][:k]
    state = resume_prefill(model, [prompts[p.row_id // G] for p in partials], partials)
    assert state.stats.tokens_computed == sum(len(prompts[p.row_id // G]) + k for p in partials)
    t = DecodeSession(model, state, PARAMS, SEED, row_ids=[p.row_id for p in partials], n_total=n,
                      prefix_tokens=[p.tokens for p in partials])
    assert t.advance(PARAMS.max_new_tokens)
    rows = dict(finished)
    _merge(rows, t.finished_rows())
    assert _as_output(rows, n) == (ref.responses, ref.truncated)


def test_rows_at_different_steps_resume_in_one_session(model, prompts, ref):
    """Two actors cut at different times; their partial rows (different lengths) continue in one session, each
    on its own step's random stream; a second migration of that session is exact too."""
    n = len(prompts) * G
    state = prefill(model, prompts, G)
    rows: dict = {}
    partials: list[PartialRow] = []
    for part, k in ((list(range(0, n, 2)), 4), (list(range(1, n, 2)), 11)):
        s = DecodeSession(model, state.select(part), PARAMS, SEED, row_ids=part, n_total=n)
        s.advance(k)
        _merge(rows, s.finished_rows())
        partials += s.take_unfinished()
    assert {len(p.tokens) for p in partials} == {4, 11}
    s = resume_session(model, [prompts[p.row_id // G] for p in partials], partials, PARAMS, SEED, n)
    s.advance(9)
    _merge(rows, s.finished_rows())
    again = s.take_unfinished()
    assert {len(p.tokens) for p in again} == {13, 20}
    s = resume_session(model, [prompts[p.row_id // G] for p in again], again, PARAMS, SEED, n, impl="hf")
    assert s.advance(PARAMS.max_new_tokens)
    _merge(rows, s.finished_rows())
    assert _as_output(rows, n) == (ref.responses, ref.truncated)


@pytest.mark.parametrize("impl", ["fast", "hf"])
def test_state_slice_shipped_through_safetensors_decodes_identically(model, prompts, ref, impl, tmp_path):
    n = len(prompts) * G
    part = [1, 2, 7, 20, 33, n - 1]
    # a cross-prompt prefix plan inserts pad columns inside the prompt: ship that layout too
    state = prefill(model, prompts, G, shared_prefix_len=1)
    assert state.stats.plan.mode == "prefix"
    tensors, meta = state_to_tensors(state.select(part))
    save_file(tensors, tmp_path / "kv.safetensors", metadata=meta)
    with safe_open(tmp_path / "kv.safetensors", "pt") as f:
        meta_back = f.metadata()
    loaded = state_from_tensors(load_file(tmp_path / "kv.safetensors"), meta_back, model)
    assert loaded.stats.tokens_computed == state.stats.tokens_computed
    out = decode(model, loaded, PARAMS, seed=SEED, row_ids=torch.tensor(part), n_total=n, impl=impl)
    assert out.responses == [ref.responses[r] for r in part]
    with pytest.raises(DataError, match="layers"):
        state_from_tensors(tensors, {**meta, "layers": "3"}, model)
    with pytest.raises(DataError, match="missing"):
        state_from_tensors({k: v for k, v in tensors.items() if k != "kv.1.values"}, meta, model)
    with pytest.raises(DataError, match="format"):
        state_from_tensors(tensors, {}, model)


DECODE_IN_ANOTHER_PROCESS = """
import json, sys, torch
from safetensors import safe_open
from safetensors.torch import load_file
from rlhfless.model.factory import load_checkpoint
from rlhfless.rollout.engine import SamplingParams
from rlhfless.rollout.session import DecodeSession, state_from_tensors
torch.set_num_threads(1)
path, req = sys.argv[1], json.loads(sys.argv[2])
model = load_checkpoint("data/checkpoints/sft").eval()
with safe_open(path, "pt") as f:
    meta = f.metadata()
state = state_from_tensors(load_file(path), meta, model)
s = DecodeSession(model, state, SamplingParams(**req["params"]), req["seed"], row_ids=req["rows"],
                  n_total=req["n_total"])
s.advance(req["params"]["max_new_tokens"])
print(json.dumps({str(k): v for k, v in s.finished_rows().items()}))
"""


@pytest.mark.slow
def test_state_slice_decodes_identically_in_another_process(model, prompts, ref, tmp_path):
    """The prefill function writes a slice; a fresh interpreter (no shared state) decodes it to the same tokens."""
    n = len(prompts) * G
    part = list(range(3, n, 5))
    tensors, meta = state_to_tensors(prefill(model, prompts, G).select(part))
    save_file(tensors, tmp_path / "slice.safetensors", metadata=meta)
    req = {"params": {"max_new_tokens": PARAMS.max_new_tokens, "temperature": PARAMS.temperature},
           "seed": SEED, "rows": part, "n_total": n}
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", DECODE_IN_ANOTHER_PROCESS, str(tmp_path / "slice.safetensors"),
                          json.dumps(req)], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert {int(k): v[0] for k, v in rows.items()} == {r: ref.responses[r] for r in part}


def test_bad_input_is_refused_with_a_clear_error(model, prompts):
    state = prefill(model, prompts[:2], G)
    with pytest.raises(ConfigError, match="row_ids: has 3 entries for a state of 8 rows"):
        DecodeSession(model, state, PARAMS, row_ids=[0, 1, 2], n_total=8)
    with pytest.raises(ConfigError, match="n_total: must exceed the largest row id 9"):
        DecodeSession(model, state, PARAMS, row_ids=range(2, 10), n_total=9)
    with pytest.raises(ConfigError, match="n_total: must be given"):
        DecodeSession(model, state, PARAMS, row_ids=range(8))
    with pytest.raises(ConfigError, match="row_ids: must be distinct"):
        DecodeSession(model, state, PARAMS, row_ids=[0] * 8, n_total=8)
    long = [[5] * 80] + [[]] * 7
    with pytest.raises(ConfigError, match="prefix_tokens: row 0 already has 80 tokens; max_new_tokens=80"):
        DecodeSession(model, state, PARAMS, prefix_tokens=long)
    with pytest.raises(ConfigError, match="prefix_tokens: row 1 contains a stop token"):
        DecodeSession(model, state, PARAMS, prefix_tokens=[[]] + [[5, EOS_ID]] + [[]] * 6)
    with pytest.raises(ConfigError, match="one prompt per row"):
        resume_prefill(model, prompts[:1], [PartialRow(0, (5,)), PartialRow(1, ())])
    with pytest.raises(ConfigError, match="prefill.select: rows must be in"):
        state.select([0, 8])
    s = DecodeSession(model, state, PARAMS)
    with pytest.raises(ConfigError, match="max_iters"):
        s.advance(-1)
