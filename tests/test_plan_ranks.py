"""The learner's width as a plan decision (plan/ranks.py) and the one reduction both modes use
(runtime/devices/dist.py): a rank whose share is done goes unless work comes inside its keep-alive, and the shares
summed from files equal the serverful pool's gathered sum bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.plan.ranks import next_work_after_share, reducer, release_after_share
from rlhfless.runtime.devices.dist import ShareWritten, rank_order_sum, share_all_reduce

seconds = st.floats(0.0, 1e4, allow_nan=False)


@given(seconds, seconds)
def test_a_rank_is_released_exactly_when_its_next_work_comes_after_its_keep_alive(nxt, keep):
    assert release_after_share(nxt, keep) == (nxt > keep)


@given(seconds, seconds, seconds)
@settings(max_examples=200)
def test_a_longer_keep_alive_never_releases_more(nxt, keep, more):
    # monotone: a platform that keeps functions longer lets the plan keep at least the same ranks
    assert release_after_share(nxt, keep + more) <= release_after_share(nxt, keep)


def test_without_history_a_rank_is_kept_unless_the_platform_keeps_nothing():
    assert not release_after_share(None, 2.0) and release_after_share(None, 0.0)
    with pytest.raises(ValueError, match="keep_alive_s"):
        release_after_share(1.0, -1.0)


@given(st.lists(seconds, min_size=1, max_size=8), st.lists(seconds, max_size=8))
def test_the_next_work_is_the_shortest_tail_plus_the_shortest_gap(tails, between):
    assert next_work_after_share(tails, between) == min(tails) + (min(between) if between else 0.0)
    assert next_work_after_share([], between) is None


def test_the_last_share_in_reduces():
    assert reducer([1, 0, 2]) == 2
    with pytest.raises(ValueError):
        reducer([])


@given(world=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_shares_through_files_sum_to_the_gathered_sum_bit_for_bit(tmp_path_factory, world, seed):
    tmp = tmp_path_factory.mktemp("shares")
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(257, generator=g) * 10.0 ** float(r) for r in range(world)]  # magnitudes: order shows
    files = [str(tmp / f"share-{r}.safetensors") for r in range(world)]
    for r in range(world):
        with pytest.raises(ShareWritten):  # a rank's part leaves as a file, and the rank skips the step
            share_all_reduce(out=files[r])(parts[r].clone())
    t = torch.zeros(257)
    share_all_reduce(shares=files)(t)  # the reducer: its own buffer is replaced by the sum of the files
    assert torch.equal(t, rank_order_sum(parts))


def test_the_rank_order_is_part_of_the_result():
    # why both modes must add in one order: float addition is not associative
    parts = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8])]
    assert not torch.equal(rank_order_sum(parts), rank_order_sum([parts[0], parts[2], parts[1]]))
