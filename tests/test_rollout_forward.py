"""Teacher-forced response log-probs: running each prompt once per group (reuse_prefix) gives the same
log-probs, entropies and loss gradient as the naive layout."""

from __future__ import annotations

import random

import pytest
import torch

from rlhfless.core.errors import UserError
from rlhfless.model.factory import ModelConfig, build_model
from rlhfless.model.tokenizer import EOS_ID
from rlhfless.rollout.forward import response_logprobs

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                    max_positions=128)


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    rng = random.Random(0)
    template = [1] + [rng.randrange(3, 259) for _ in range(20)]
    prompts = [template + [rng.randrange(3, 259) for _ in range(rng.randrange(1, 8))] for _ in range(3)]
    prompts.append([1, 40, 41])  # a short prompt: left padding in the prompt pass
    G = 3
    responses = []
    for _ in range(len(prompts) * G):
        n = rng.randrange(1, 12)
        responses.append([rng.randrange(3, 259) for _ in range(n - 1)] + [EOS_ID])
    return prompts, responses, G


def _loss_and_grad(model, prompts, responses, G, reuse):
    model.zero_grad(set_to_none=True)
    out = response_logprobs(model, prompts, responses, G, with_entropy=True, reuse_prefix=reuse)
    loss = -(out.logp.sum() + 0.1 * out.entropy.sum()) / out.mask.sum()
    loss.backward()
    return out, torch.cat([p.grad.flatten() for p in model.parameters()])


def test_reuse_prefix_matches_naive_logprobs_and_gradient(batch):
    prompts, responses, G = batch
    model = build_model(SMALL, seed=1).train()
    naive, g_naive = _loss_and_grad(model, prompts, responses, G, reuse=False)
    reuse, g_reuse = _loss_and_grad(model, prompts, responses, G, reuse=True)
    torch.testing.assert_close(reuse.mask, naive.mask)
    torch.testing.assert_close(reuse.logp, naive.logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reuse.entropy, naive.entropy, atol=1e-5, rtol=1e-5)
    assert g_naive.norm() > 0
    assert ((g_reuse - g_naive).norm() / g_naive.norm()).item() < 1e-5


def test_logprobs_are_those_of_each_row_run_alone(batch):
    prompts, responses, G = batch
    model = build_model(SMALL, seed=2).eval()
    with torch.no_grad():
        out = response_logprobs(model, prompts, responses, G, reuse_prefix=True)
        for r, resp in enumerate(responses):
            ids = torch.tensor([prompts[r // G] + resp])
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            P = len(prompts[r // G])
            ref = lp[P - 1: P - 1 + len(resp)].gather(-1, torch.tensor(resp).unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(out.logp[r, : len(resp)], ref, atol=1e-5, rtol=1e-5)
            assert out.mask[r].sum() == len(resp)


def test_wrong_number_of_responses_is_a_user_error(batch):
    prompts, responses, G = batch
    model = build_model(SMALL, seed=1)
    with pytest.raises(UserError, match="need exactly 12, group-major"):
        response_logprobs(model, prompts, responses[:-1], G)
