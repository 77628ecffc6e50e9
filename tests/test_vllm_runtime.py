"""`rollout.engine=vllm` in the runtime modes: vLLM sessions with the decode functions' methods, and a real run.

The sessions are checked directly against the own engine (greedy) and against the inline vLLM engine (sampled,
same per-row streams); the run checks that serverless decode workers ran vLLM and that the learner's new weights
reached their engines. Marked `vllm`: run with `make test-vllm` (its own venv). Skips, saying why, where vLLM
cannot be imported.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rlhfless.rollout.engine import SamplingParams, generate

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
GREEDY = SamplingParams(64, temperature=0.0)
SAMPLED = SamplingParams(64, temperature=1.0)
G = 2
# tests/test_runtime_e2e.py's tiny run; migration off, so every row keeps its own stream, and a learning rate that
# makes one update change sampled tokens (at 1e-4 step 2 samples as the starting weights do: the check is blind)
TINY = ["plan.max_actors=2", "rollout.prompts_per_step=6", "algo.group_size=4", "rollout.max_new_tokens=64",
        "train.eval_prompts=0", "train.checkpoint_every=0", "train.table_every=1", "tracking.mode=disabled",
        "runtime.gantt_every=0", "task.arith.k_max=6", "rollout.engine=vllm", "runtime.migrate=never",
        "optim.lr=3e-3"]


@pytest.fixture(scope="module")
def engine(sft_checkpoint):
    from rlhfless.rollout.vllm_engine import VLLMEngine, vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)
    eng = VLLMEngine(sft_checkpoint, threads=1, kv_cache_gib=0.25, enforce_eager=True)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts():
    from rlhfless.model.tokenizer import ByteTokenizer
    from rlhfless.tasks.arith import ArithTaskConfig, make_splits

    train, _ = make_splits(ArithTaskConfig())
    return [ByteTokenizer().encode(p.text, bos=True) for p in train[:6]]


def _rows(prompts):
    """Row ids group-major (row g*G + s answers prompt g) and each row's prompt."""
    rows = list(range(len(prompts) * G))
    return rows, [prompts[r // G] for r in rows]


def _run_all(*sessions) -> dict:
    """Advance the sessions in turns until every one is done; their finished rows, merged."""
    while not all(s.done for s in sessions):
        for s in sessions:
            s.advance(3)
    return {row: tokens for s in sessions for row, (tokens, _) in s.finished_rows().items()}


def test_greedy_rows_split_over_two_sessions_equal_the_own_engine(engine, prompts, sft_checkpoint):
    from rlhfless.bench.engine_bench import load_policy

    own = generate(load_policy(sft_checkpoint)[0], prompts, G, GREEDY).responses
    rows, P = _rows(prompts)
    a = engine.session(P[1::3], GREEDY, row_ids=rows[1::3])  # an arbitrary split: every third row, and the rest
    rest = [r for r in rows if r % 3 != 1]
    b = engine.session([P[r] for r in rest], GREEDY, row_ids=rest)
    got = _run_all(a, b)
    assert [got[r] for r in rows] == own
    assert a.iterations and b.iterations and a.progress().finished == len(a.row_ids)


def test_a_cut_row_migrated_to_another_session_continues_the_uncut_greedy_tokens(engine, prompts):
    rows, P = _rows(prompts)
    uncut = _run_all(engine.session(P, GREEDY, row_ids=rows))
    src = engine.session(P, GREEDY, row_ids=rows)
    src.advance(5)
    assert [gen for _, gen in src.progress().unfinished] == [5] * len(rows)  # one token per row and step
    partials = src.take_unfinished()
    assert src.done and not src.finished_rows() and [len(p.tokens) for p in partials] == [5] * len(rows)
    dst = engine.session([P[p.row_id] for p in partials], GREEDY, row_ids=[p.row_id for p in partials],
                         prefix_tokens=[p.tokens for p in partials])
    assert _run_all(dst) == uncut and not engine._owners  # nothing left behind in the engine


def test_sampled_rows_reproduce_for_a_seed_do_not_depend_on_the_split_and_equal_inline_generate(engine, prompts):
    rows, P = _rows(prompts)
    whole = _run_all(engine.session(P, SAMPLED, 7, row_ids=rows))
    a = engine.session(P[::2], SAMPLED, 7, row_ids=rows[::2])
    b = engine.session(P[1::2], SAMPLED, 7, row_ids=rows[1::2])
    assert _run_all(b, a) == whole
    assert [whole[r] for r in rows] == engine.generate(prompts, G, SAMPLED, seed=7).responses  # the inline streams
    assert _run_all(engine.session(P, SAMPLED, 8, row_ids=rows)) != whole


def test_migrated_sampled_rows_get_a_stream_of_their_own_and_generate_waits_for_open_sessions(engine, prompts):
    from rlhfless.core.errors import UserError
    from rlhfless.rollout.vllm_engine import row_seed, session_seed

    assert session_seed(7, 3, 0) == row_seed(7, 3) and session_seed(7, 3, 5) != session_seed(7, 3, 6)
    rows, P = _rows(prompts)
    src = engine.session(P, SAMPLED, 7, row_ids=rows)
    src.advance(2)
    with pytest.raises(UserError, match="sessions still hold"):
        engine.generate(prompts, G, SAMPLED)
    partials = src.take_unfinished()
    dst = engine.session([P[p.row_id] for p in partials], SAMPLED, 7, row_ids=[p.row_id for p in partials],
                         prefix_tokens=[p.tokens for p in partials])
    got = _run_all(dst)
    assert all(got[p.row_id][:len(p.tokens)] == list(p.tokens) for p in partials)  # continues the tokens
    assert all(len(t) <= SAMPLED.max_new_tokens for t in got.values())  # the cap counts the prefix


# -- a real run --------------------------------------------------------------------------------------------------
def _digest(responses: list[list[int]]) -> str:
    """`runner.write_digest` over plain responses (row order)."""
    h = hashlib.sha256()
    for r in responses:
        h.update(bytes(str(list(r)), "ascii") + b"\n")
    return h.hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory, engine):
    """Serverless with vLLM decode functions: step 1, its weights kept aside, then step 2 (a resume)."""
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train
    from rlhfless.runtime.config import available_cores

    if available_cores() < 2:
        pytest.skip("the runtime tests need 2 cores")
    tmp = tmp_path_factory.mktemp("vllm-runtime")
    out = tmp / "run"
    first = load_run_config(REPO / "experiments/configs/quickstart.yaml",
                            TINY + ["runtime.mode=serverless", "train.steps=1"])
    train(first, out, progress=False)
    shutil.copytree(out / "checkpoints" / "final", tmp / "after-1")  # the learner's weights after step 1
    cfg = load_run_config(REPO / "experiments/configs/quickstart.yaml", TINY + ["runtime.mode=serverless",
                                                                             "train.steps=2"])
    return cfg, out, tmp / "after-1", train(cfg, out, progress=False, resume=True)


def test_serverless_decode_functions_run_vllm(run):
    _, out, _, summary = run
    assert summary["steps"] == 2 and summary["runtime"]["mode"] == "serverless"
    inv = [json.loads(x) for x in (out / "invocations.jsonl").read_text().splitlines() if x.strip()]
    decodes = [i for i in inv if i["kind"] == "decode" and i["ok"]]
    assert {i["step"] for i in decodes} == {1, 2} and {i["engine"] for i in decodes} == {"vllm"}
    assert sum(i["extra"]["rows"] for i in decodes) == 2 * 6 * 4
    # runtime.overlap (on for serverless, kl 0): finished groups reached the learner while vLLM still decoded
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert sum(r["runtime/learner_compute_before_rollout_end"] for r in metrics) > 0


def test_step_2_samples_come_from_the_learners_weights_after_step_1(run, engine, sft_checkpoint):
    """Step 2's rows equal the inline vLLM engine's on the weights after step 1 (the same per-row streams), and
    differ from what the starting weights give: without the weight load into the workers' engines this fails."""
    from rlhfless.run.runner import PromptStream
    from rlhfless.run.compare import read_digests
    from rlhfless.step.textenv import make_env

    cfg, out, after_1, _ = run
    env = make_env(cfg)
    stream = PromptStream(env.task.splits()[0], cfg.rollout.prompts_per_step, cfg.train.seed, cfg.algo.group_size,
                          env)
    stream.next()
    groups = stream.next()[1]
    prompts = [g.token_ids for g in groups]
    params = env.sampling(cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p)
    seed = cfg.train.seed * 1_000_003 + 2  # runner._loop's seed of step 2
    try:
        engine.load_weights(after_1)
        updated = engine.generate(prompts, cfg.algo.group_size, params, seed=seed).responses
    finally:
        engine.load_weights(sft_checkpoint)
    start = engine.generate(prompts, cfg.algo.group_size, params, seed=seed).responses
    assert updated != start  # one update changes the samples (or this test could not tell)
    assert read_digests(out)[2] == _digest(updated)


def test_serverful_pool_workers_decode_with_vllm_the_same_samples(run, tmp_path):
    """The serverful control on the same seed: its pool workers' learner updates the replica in place (no state
    file load), and the vLLM engine must still get those weights. Without migration every row keeps its stream,
    so both modes give the same samples step for step."""
    from dataclasses import replace

    from rlhfless.run.launch import train
    from rlhfless.run.compare import samples_match

    cfg, serverless, _, _ = run
    out = tmp_path / "serverful"
    summary = train(replace(cfg, runtime=replace(cfg.runtime, mode="serverful")), out, progress=False)
    assert summary["runtime"]["mode"] == "serverful" and summary["runtime"]["weight_sync_s"] > 0
    inv = [json.loads(x) for x in (out / "invocations.jsonl").read_text().splitlines() if x.strip()]
    assert {i["engine"] for i in inv if i["kind"] == "decode"} == {"vllm"}
    identical, first, n = samples_match(out, serverless)
    assert n == 2 and identical, f"samples differ from step {first}"
