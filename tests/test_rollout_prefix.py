"""Deduplicated prefill: the plan (pure, vs brute force), the [prefix | pad | suffix] layout vs unpadded prompts,
and clear errors on bad input."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core.errors import UserError
from rlhfless.model.factory import ModelConfig, build_model
from rlhfless.rollout.engine import prefill
from rlhfless.rollout.prefix import PrefixCost, _lcp, choose_segments, plan_prefill

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                    max_positions=128)
TEMPLATE = [1] + list(range(10, 50))  # BOS + 40 template tokens
FREE_PASS = PrefixCost(pass_overhead=0)  # small examples: let sharing pay despite the fixed cost of a pass


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return build_model(SMALL, seed=0).eval()


def _templated(suffixes):
    return [TEMPLATE + s for s in suffixes]


# ------------------------------------------------------------------------------------------------ plan (pure)


def test_template_is_shared_once_and_counts_add_up():
    prompts = _templated([[60, 61], [60, 62, 63], [70], [80, 81, 82, 83]])
    plan = plan_prefill(prompts, 8, cost=FREE_PASS)
    assert plan.mode == "prefix"
    assert [(g.length, g.members) for g in plan.groups] == [(len(TEMPLATE), (0, 1, 2, 3))]
    assert plan.tokens_naive == 8 * sum(map(len, prompts))
    assert plan.tokens_computed == len(TEMPLATE) + 2 + 3 + 1 + 4
    assert plan.row_prefix == (0,) * 32


def test_shared_prefix_stops_one_token_short_of_a_prompt_that_is_all_template():
    prompts = [TEMPLATE, TEMPLATE + [60], TEMPLATE + [61, 62]]
    plan = plan_prefill(prompts, 4, cost=FREE_PASS)
    assert plan.groups[0].length == len(TEMPLATE) - 1  # prompt 0 keeps one own token for its first logits


def test_two_templates_make_two_groups_and_loners_are_left_alone():
    other = [1] + list(range(100, 140))
    prompts = [TEMPLATE + [5], other + [6], TEMPLATE + [7], other + [8], [1, 3, 4]]
    plan = plan_prefill(prompts, 2, cost=FREE_PASS)
    assert sorted((g.length, g.members) for g in plan.groups) == [(len(TEMPLATE), (0, 2)), (len(other), (1, 3))]
    assert plan.prefix_of(4) == -1
    assert plan.row_prefix[8:] == (-1, -1)


def test_tiny_shared_prefix_is_not_worth_a_second_pass():
    prompts = [[1, 7, 8, 9], [1, 5, 6], [1, 4, 4, 4, 4]]  # only BOS in common
    assert plan_prefill(prompts, 8).mode == "group"
    assert plan_prefill(prompts, 8, cost=PrefixCost(0, 0, 0)).mode == "prefix"


def test_switches_select_the_ablation_paths():
    prompts = _templated([[60], [61]])
    assert plan_prefill(prompts, 4, dedup=False).mode == "naive"
    assert plan_prefill(prompts, 4, dedup=False).tokens_computed == 4 * sum(map(len, prompts))
    assert plan_prefill(prompts, 4, share_prefixes=False).mode == "group"
    forced = plan_prefill(prompts, 4, shared_prefix_len=5)
    assert [(g.length, g.members) for g in forced.groups] == [(5, (0, 1))]


def _gain(seg, cost):
    n, length = len(seg), min(min(len(p) for p in seg) - 1, min(_lcp(a, b) for a in seg for b in seg))
    return max(0.0, (n - 1) * length - cost.copy_cost * n * length - cost.group_overhead) if length > 0 else 0.0


def _brute_force(sorted_prompts, cost):
    n, best = len(sorted_prompts), 0.0
    for cuts in itertools.product([0, 1], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        best = max(best, sum(_gain(sorted_prompts[a:b], cost) for a, b in zip(bounds, bounds[1:])))
    return best


prompt_sets = st.lists(st.lists(st.integers(3, 5), min_size=1, max_size=7), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(prompt_sets, st.floats(0, 0.5), st.floats(0, 4))
def test_segmentation_is_optimal_and_valid(prompts, copy_cost, group_overhead):
    cost = PrefixCost(copy_cost=copy_cost, group_overhead=group_overhead, pass_overhead=0)
    ordered = sorted(prompts)
    segs = choose_segments(ordered, cost)
    total = 0.0
    for start, end, length in segs:
        members = ordered[start:end]
        assert end - start >= 2 and all(len(p) > length and p[:length] == members[0][:length] for p in members)
        total += (end - start - 1) * length - copy_cost * (end - start) * length - group_overhead
    assert total == pytest.approx(_brute_force(ordered, cost), abs=1e-9)
    plan = plan_prefill(prompts, 3, cost=cost)
    members = [m for g in plan.groups for m in g.members]
    assert len(members) == len(set(members))
    assert plan.tokens_computed <= sum(map(len, prompts))


# ------------------------------------------------------------------------------------------ execution (model)


def _reference_logits(model, prompts):
    """Last-token logits of each prompt run alone, unpadded: the ground truth for any batched layout."""
    with torch.no_grad():
        return torch.stack([model(input_ids=torch.tensor([p])).logits[0, -1].float() for p in prompts])


def test_holes_in_the_mask_with_explicit_positions_match_unpadded_prompts(model):
    other = [1] + list(range(100, 130))
    prompts = [TEMPLATE + [60, 61], other + [7, 8, 9], TEMPLATE + [70], other + [5], [1, 2 + 3, 9, 9]]
    ref = _reference_logits(model, prompts)
    G = 3
    for kw in (dict(dedup=False), dict(dedup=True, share_prefixes=False), dict(dedup=True, prefix_cost=FREE_PASS)):
        state = prefill(model, prompts, G, **kw)
        torch.testing.assert_close(state.next_logits, ref.repeat_interleave(G, 0), atol=2e-5, rtol=1e-5)
        assert state.next_pos.tolist() == [len(p) for p in prompts for _ in range(G)]
    state = prefill(model, prompts, G, prefix_cost=FREE_PASS)
    assert state.stats.plan.mode == "prefix" and len(state.stats.plan.groups) == 2
    # layout [pad | prefix | pad | suffix]: row 2's mask has a hole between its template and its suffix
    row = state.attention_mask[2 * G].tolist()
    first = row.index(1)
    assert 0 in row[first:] and sum(row) == len(prompts[2])
    assert state.stats.tokens_computed == len(TEMPLATE) + len(other) + 2 + 3 + 1 + 1 + len(prompts[4])
    assert state.stats.saved_tokens == state.stats.tokens_naive - state.stats.tokens_computed


def test_dedup_ratio_is_g_for_pure_group_dedup(model):
    prompts = [[1, 5, 6], [1, 7, 8, 9]]
    state = prefill(model, prompts, 4, share_prefixes=False)
    assert state.stats.dedup_ratio == 4.0
    assert prefill(model, prompts, 4, dedup=False).stats.dedup_ratio == 1.0


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("prompts,G,kw,match", [
    ([[1, 5], []], 2, {}, "prompt 1 is empty"),
    ([], 2, {}, "no prompts"),
    ([[1, 5]], 0, {}, "group_size must be >= 1"),
    ([[1] * 200], 2, {}, "prompt 0 has 200 tokens; the model's context is 128"),
    ([[1, 5, 6], [1, 5]], 2, {"shared_prefix_len": 2}, "prompt 1 has only 2 tokens"),
    ([[1, 5, 6], [1, 4, 6]], 2, {"shared_prefix_len": 2}, "prompt 1 differs from prompt 0"),
    ([[1, 5, 6]], 2, {"shared_prefix_len": 0}, "shared_prefix_len must be >= 1"),
])
def test_bad_input_raises_clear_user_errors(model, prompts, G, kw, match):
    with pytest.raises(UserError, match=match):
        prefill(model, prompts, G, **kw)
