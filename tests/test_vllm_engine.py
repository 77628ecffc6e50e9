"""The optional vLLM rollout engine against the project's own engine, on the shipped SFT checkpoint.

Marked `vllm`: run with `make test-vllm` (its own venv). Skips, saying why, where vLLM cannot be imported.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhfless.core.errors import UserError
from rlhfless.bench.engine_bench import arith_template_prompts, load_policy
from rlhfless.rollout.engine import SamplingParams, generate

pytestmark = pytest.mark.vllm

GREEDY = SamplingParams(192, temperature=0.0)


@pytest.fixture(scope="module")
def engine(sft_checkpoint):
    from rlhfless.rollout.vllm_engine import VLLMEngine, vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)
    eng = VLLMEngine(sft_checkpoint, threads=1)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def policy(sft_checkpoint):
    return load_policy(sft_checkpoint)[0]


@pytest.fixture(scope="module")
def task_prompts():
    from rlhfless.model.tokenizer import ByteTokenizer
    from rlhfless.tasks.arith import ArithTaskConfig, make_splits

    train, _ = make_splits(ArithTaskConfig())
    return [ByteTokenizer().encode(p.text, bos=True) for p in train[:16]]


def test_greedy_equals_own_engine_on_the_task_mix(engine, policy, task_prompts):
    ours = generate(policy, task_prompts, 2, GREEDY)
    out = engine.generate(task_prompts, 2, GREEDY)
    assert out.responses == ours.responses and out.truncated == ours.truncated
    assert any(r[-1] == 2 for r in out.responses)  # EOS is kept, as the own engine keeps it


def test_greedy_equals_own_engine_on_templated_prompts_with_prefix_cache_hits(engine, policy):
    prompts = arith_template_prompts(6)  # ~170 tokens each behind one shared header
    out = engine.generate(prompts, 2, GREEDY)
    assert out.responses == generate(policy, prompts, 2, GREEDY).responses
    assert out.prefix_cache["hits"] > 0 and out.prefill.tokens_computed < out.prefill.tokens_naive
    assert out.prefill.tokens_naive == 2 * sum(map(len, prompts))
    assert engine.prefix_cache_stats()["hits"] >= out.prefix_cache["hits"]


def test_truncated_rows_are_flagged_like_the_own_engine(engine, policy, task_prompts):
    short = SamplingParams(6, temperature=0.0)
    out = engine.generate(task_prompts, 1, short)
    ours = generate(policy, task_prompts, 1, short)
    assert out.responses == ours.responses and out.truncated == ours.truncated
    assert all(out.truncated) and out.lengths == [6] * len(task_prompts)


def test_load_weights_changes_outputs_and_loading_the_original_restores_them(engine, policy, sft_checkpoint):
    prompts = arith_template_prompts(4)  # long shared prefix: stale cached KV would show
    before = engine.generate(prompts, 1, GREEDY).responses
    original = {k: v.clone() for k, v in policy.state_dict().items()}
    torch.manual_seed(0)
    try:
        policy.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in original.items()})
        engine.load_weights(policy.state_dict())
        changed = engine.generate(prompts, 1, GREEDY).responses
        assert changed != before
        assert changed == generate(policy, prompts, 1, GREEDY).responses  # every tensor, head included, moved
    finally:
        policy.load_state_dict(original)
        engine.load_weights(sft_checkpoint / "model.safetensors")
    assert engine.generate(prompts, 1, GREEDY).responses == before


def test_load_weights_refuses_partial_or_misshaped_or_untied_weights(engine, policy):
    sd = policy.state_dict()
    partial = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    with pytest.raises(UserError, match="missing"):
        engine.load_weights(partial)
    with pytest.raises(UserError, match="shape"):
        engine.load_weights({**sd, "model.norm.weight": torch.ones(3)})
    with pytest.raises(UserError, match="ties"):
        engine.load_weights({**sd, "lm_head.weight": sd["lm_head.weight"] + 1})


def test_sampling_returns_g_rows_per_prompt_reproducibly(engine, task_prompts):
    params = SamplingParams(64, temperature=1.0)
    a = engine.generate(task_prompts, 4, params, seed=7)
    b = engine.generate(task_prompts, 4, params, seed=7)
    c = engine.generate(task_prompts, 4, params, seed=8)
    assert len(a.responses) == len(task_prompts) * 4 == len(a.truncated) == len(a.logprobs)
    assert a.responses == b.responses and a.logprobs == b.logprobs
    assert a.responses != c.responses
    groups = [a.responses[g * 4:(g + 1) * 4] for g in range(len(task_prompts))]
    assert any(len({tuple(r) for r in grp}) > 1 for grp in groups)  # G distinct streams, not one copied


def test_a_rows_tokens_depend_only_on_its_seed_not_on_the_rest_of_the_batch(engine, task_prompts):
    from vllm.inputs import TokensPrompt

    from rlhfless.rollout.vllm_engine import row_seed

    params = SamplingParams(64, temperature=1.0)
    full = engine.generate(task_prompts, 4, params, seed=5)
    alone = engine.llm.generate([TokensPrompt(prompt_token_ids=task_prompts[3])],
                                engine._params(params, 1, row_seed(5, 3 * 4 + 2)), use_tqdm=False)
    assert list(alone[0].outputs[0].token_ids) == full.responses[3 * 4 + 2]


def test_logprobs_have_the_responses_shape_and_equal_the_learners(engine, policy, task_prompts):
    from rlhfless.rollout.forward import response_logprobs

    out = engine.generate(task_prompts, 4, SamplingParams(96, temperature=1.0), seed=3)
    assert [len(lp) for lp in out.logprobs] == out.lengths
    assert all(math.isfinite(x) and x <= 0 for lp in out.logprobs for x in lp)
    with torch.no_grad():  # group-major rows: row g*G+s answers prompt g, so the learner's log-probs line up
        ref = response_logprobs(policy, task_prompts, out.responses, 4)
    got = torch.zeros_like(ref.logp)
    for i, lp in enumerate(out.logprobs):
        got[i, : len(lp)] = torch.tensor(lp)
    assert float((got - ref.logp).abs().max()) < 1e-3


def test_bench_engine_times_vllm_beside_the_own_engine(tmp_path):
    import json

    from rlhfless.cli import main

    out = tmp_path / "engine.json"
    rc = main(["bench", "engine", "--json", str(out), "--prompts", "3", "--group-size", "2", "--max-new-tokens", "8",
               "--repeats", "1", "--engines", "own,vllm", "--gsm8k-prompts", "2", "--gsm8k-max-new-tokens", "6"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["greedy"]["vllm_greedy_identical"] is True and r["vllm"]["start_s"] > 0
    for mode in ("greedy", "sampled"):
        assert set(r[mode]["ratio_to_own"]) == {"own", "vllm"} and r[mode]["vllm_tokens"] > 0
    g = r["gsm8k"]  # the long-prompt workload runs vLLM on its own model (a context that holds the prompts)
    if "skipped" not in g:
        assert g["greedy"]["vllm_greedy_identical"] is True and g["sampled"]["vllm_tokens"] > 0


def test_a_hugging_face_checkpoint_with_its_own_tokenizer_runs_on_vllm(tmp_path):
    """A user's folder (BPE tokenizer, chat template, untied head, stop id not the byte EOS): greedy rows equal
    the own engine's, stopping at the tokenizer's stop ids."""
    from rlhfless.model.factory import load_policy as load_any
    from rlhfless.model.hf import TinyHFConfig, build_tiny_hf
    from rlhfless.model.tokenizer import load_tokenizer
    from rlhfless.rollout.vllm_engine import VLLMEngine, vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)
    texts = [f"Sam has {a} pens and gets {b} more. How many now?\n#### {a + b}" for a in range(3, 40) for b in (2, 5)]
    folder = build_tiny_hf(tmp_path / "hf", texts, TinyHFConfig(vocab_size=400, max_positions=256, seed=3))
    tok, model = load_tokenizer(folder), load_any(folder)
    prompts = [tok.encode_prompt(f"Sam has {a} pens and gets 2 more. How many now?") for a in (4, 9, 17)]
    # stop at a token greedy decoding really emits, so stopping is exercised (a random model rarely says <|im_end|>)
    first = generate(model, prompts, 1, SamplingParams(24, 0.0, stop_ids=tuple(tok.stop_ids))).responses
    params = SamplingParams(24, 0.0, stop_ids=tuple(tok.stop_ids) + (first[0][3],))
    ours = generate(model, prompts, 2, params)
    eng = VLLMEngine(folder, threads=1)
    try:
        out = eng.generate(prompts, 2, params)
    finally:
        eng.close()
    assert out.responses == ours.responses and out.truncated == ours.truncated
    assert not out.truncated[0] and out.responses[0][-1] == first[0][3]


def test_sampled_rows_with_long_prompts_that_share_a_step(tmp_path):
    """Many seeded rows of ~1,000-token prompts exceed one step's token budget: with chunked prefill, vLLM 0.32's
    CPU runner crashed rewinding their generators ("CPU Generator does not use offset"). The engine turns chunked
    prefill off; sampled rows must come back, and reproduce for a seed."""
    from rlhfless.model.factory import save_checkpoint
    from rlhfless.model.tokenizer import ByteTokenizer
    from rlhfless.bench.engine_bench import fresh_model
    from rlhfless.rollout.vllm_engine import VLLMEngine, vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)
    model, _ = fresh_model(2048)
    # distinct ~900-token prompts (no shared prefix for the cache to absorb): 8 x 8 rows need several steps
    prompts = [ByteTokenizer().encode("".join(f"Q{q}.{i}: {i} + {q} = {i + q}.\n" for i in range(60)), bos=True)
               for q in range(8)]
    assert min(map(len, prompts)) > 900
    eng = VLLMEngine(save_checkpoint(model, tmp_path / "ckpt"), threads=1, max_num_seqs=64)
    try:
        params = SamplingParams(12, 1.0)
        a, b = (eng.generate(prompts, 8, params, seed=5).responses for _ in range(2))
    finally:
        eng.close()
    assert len(a) == 64 and all(a) and a == b
