"""Deduplicated prefill: which prompt prefixes to compute once, and running the plan on a Hugging Face model.

Two kinds of sharing, both exact (a token's KV depends only on the tokens before it): a GRPO group's G samples
share the whole prompt (run once, KV repeated G times), and prompts that start with the same tokens share that
prefix (sorted by token ids, prompts sharing a prefix lie together, so a sorted-prefix scan finds them).
The rule it keeps (the paper's is not public): share only where a cost model in prompt-token computations,
padded cells counted, says it gains: a dynamic programme picks the segmentation of the sorted prompts with the
largest gain, and the plan runs only if its passes cost less than one pass over whole prompts. After it each
row is ``[pad | prefix | pad | suffix]`` with positions that continue the row's own prefix, so the model sees
exactly the unpadded prompt. The cost formulas: docs/internals.md#rolloutprefixpy.
Non-goals: nested sharing, sharing across steps; attention's quadratic cost (the linear layers dominate here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rlhfless.core.devices import model_device
from rlhfless.core.errors import UserError, require
from rlhfless.model.tokenizer import PAD_ID

Mode = Literal["naive", "group", "prefix"]


@dataclass(frozen=True)
class PrefixCost:
    """Cost model of cross-prompt prefix sharing, in units of one prompt token computed by the model."""

    copy_cost: float = 0.02
    """Copying one cached token's KV to one row, relative to computing that token (>= 0)."""
    group_overhead: float = 16.0
    """Fixed cost of one shared group (its row in the prefix pass), in tokens (>= 0)."""
    pass_overhead: float = 128.0
    """Fixed cost of the extra forward pass a shared prefix needs, in tokens (>= 0). Measured on the tiny model,
    one CPU thread: a [1, 8] forward takes ~3.5 ms, the time of ~120 tokens in a large batch (~28 us/token)."""

    def __post_init__(self) -> None:
        require(self.copy_cost >= 0, "prefix.copy_cost", f"must be >= 0 (got {self.copy_cost})")
        require(self.group_overhead >= 0, "prefix.group_overhead", f"must be >= 0 (got {self.group_overhead})")
        require(self.pass_overhead >= 0, "prefix.pass_overhead", f"must be >= 0 (got {self.pass_overhead})")


@dataclass(frozen=True)
class PrefixGroup:
    """Prompts (indices into the step's prompt list) whose first `length` tokens are computed once."""

    length: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class PrefillPlan:
    """What a prefill computes. Rows of the result are group-major: row g*G + s is sample s of prompt g."""

    mode: Mode
    """naive: every row; group: each prompt once; prefix: shared prefixes once, then each prompt's suffix."""
    group_size: int
    prompt_lens: tuple[int, ...]
    groups: tuple[PrefixGroup, ...]
    """Shared prefixes (empty unless mode == "prefix")."""

    def prefix_of(self, prompt: int) -> int:
        """Index into `groups` of the prefix prompt `prompt` reuses, or -1."""
        for k, g in enumerate(self.groups):
            if prompt in g.members:
                return k
        return -1

    @property
    def row_prefix(self) -> tuple[int, ...]:
        """For every output row, the shared prefix group it reuses (-1: none)."""
        per_prompt = [-1] * len(self.prompt_lens)
        for k, g in enumerate(self.groups):
            for m in g.members:
                per_prompt[m] = k
        return tuple(k for k in per_prompt for _ in range(self.group_size))

    @property
    def tokens_naive(self) -> int:
        return self.group_size * sum(self.prompt_lens)

    @property
    def tokens_computed(self) -> int:
        """Real (unpadded) prompt tokens run through the model."""
        if self.mode == "naive":
            return self.tokens_naive
        shared = sum(g.length * (len(g.members) - 1) for g in self.groups)
        return sum(self.prompt_lens) - shared


def check_prompts(prompts: list[list[int]], group_size: int, max_positions: int) -> None:
    """Raise UserError for input no prefill can run: no prompts, empty or over-long prompts, G < 1."""
    if group_size < 1:
        raise UserError(f"group_size must be >= 1 samples per prompt (got {group_size})")
    if not prompts:
        raise UserError("no prompts given: need at least one prompt")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise UserError(f"prompt {i} is empty: every prompt needs at least one token")
        if len(p) >= max_positions:
            raise UserError(f"prompt {i} has {len(p)} tokens; the model's context is {max_positions} "
                            f"(prompt + at least one generated token must fit)")


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def choose_segments(sorted_prompts: list[list[int]], cost: PrefixCost) -> list[tuple[int, int, int]]:
    """Best segmentation of lexicographically sorted prompts into shared groups.

    Returns (start, end, length) for each shared segment [start, end) of `sorted_prompts` (singletons omitted).
    O(n^2) in the worst case (everything shares a template); the inner scan stops once the common prefix is 0.
    """
    n = len(sorted_prompts)
    lcp = [_lcp(sorted_prompts[i], sorted_prompts[i + 1]) for i in range(n - 1)]
    best = [0.0] * (n + 1)
    back: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (segment start, shared length) ending at j
    for j in range(1, n + 1):
        best[j], back[j] = best[j - 1], (j - 1, 0)
        length = len(sorted_prompts[j - 1]) - 1  # each prompt keeps one own token for its first-token logits
        for i in range(j - 2, -1, -1):
            length = min(length, lcp[i], len(sorted_prompts[i]) - 1)
            if length <= 0:
                break
            size = j - i
            # the prefix once instead of `size` times, minus copying its KV to each member and the group's pass row
            gain = (size - 1) * length - cost.copy_cost * size * length - cost.group_overhead
            if gain > 0 and best[i] + gain > best[j]:
                best[j], back[j] = best[i] + gain, (i, length)
    segments, j = [], n
    while j > 0:
        i, length = back[j]
        if length > 0:
            segments.append((i, j, length))
        j = i
    return segments[::-1]


def _forced_group(prompts: list[list[int]], length: int) -> PrefixGroup:
    head = prompts[0][:length]
    for i, p in enumerate(prompts):
        if len(p) <= length:
            raise UserError(f"shared_prefix_len={length} but prompt {i} has only {len(p)} tokens: the shared "
                            "prefix must be shorter than every prompt (each prompt keeps at least one own token)")
        if p[:length] != head:
            raise UserError(f"shared_prefix_len={length} but prompt {i} differs from prompt 0 within its first "
                            f"{length} tokens (at token {_lcp(p, head)})")
    return PrefixGroup(length, tuple(range(len(prompts))))


def _padded_cost_ok(prompts: list[list[int]], groups: list[PrefixGroup], cost: PrefixCost) -> bool:
    """Is the two-pass plan cheaper than one pass over whole prompts, counting padded cells?"""
    prefix_of = {m: g.length for g in groups for m in g.members}
    b, lp = len(prompts), max(g.length for g in groups)
    ls = max(len(p) - prefix_of.get(i, 0) for i, p in enumerate(prompts))
    # batched passes cost their padded cells (rows x width), and a second pass a fixed overhead
    two_pass = cost.pass_overhead + len(groups) * lp + b * ls + cost.copy_cost * b * lp
    return two_pass < b * max(len(p) for p in prompts)


def plan_prefill(prompts: list[list[int]], group_size: int, *, dedup: bool = True, share_prefixes: bool = True,
                 cost: PrefixCost | None = None, shared_prefix_len: int | None = None) -> PrefillPlan:
    """Decide what the prefill computes (pure: token ids in, plan out).

    shared_prefix_len: force one prefix of this many tokens shared by all prompts (they must agree on it and each
    must be longer), skipping the search; useful when the template length is known.
    """
    cost = cost or PrefixCost()
    lens = tuple(len(p) for p in prompts)
    if not dedup:
        return PrefillPlan("naive", group_size, lens, ())
    if shared_prefix_len is not None:
        if shared_prefix_len < 1:
            raise UserError(f"shared_prefix_len must be >= 1 token (got {shared_prefix_len})")
        return PrefillPlan("prefix", group_size, lens, (_forced_group(prompts, shared_prefix_len),))
    if not share_prefixes or len(prompts) < 2:
        return PrefillPlan("group", group_size, lens, ())
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    segs = choose_segments([prompts[i] for i in order], cost)
    groups = [PrefixGroup(length, tuple(sorted(order[s:e]))) for s, e, length in segs]
    if not groups or not _padded_cost_ok(prompts, groups, cost):
        return PrefillPlan("group", group_size, lens, ())
    return PrefillPlan("prefix", group_size, lens, tuple(groups))


def left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad to a [B, P] id tensor and its attention mask (1 = real token)."""
    width = max(1, max(len(p) for p in rows))
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, p in enumerate(rows):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def cached_forward(model, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache):
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    return out.logits[:, -1, :].float()


@torch.no_grad()
def run_plan(model, prompts: list[list[int]], plan: PrefillPlan):
    """Execute `plan`: returns (DynamicCache, attention mask [R, W] long, next-token logits [R, V] float32), R = B*G,
    all on the model's device (ids are laid out on the CPU and moved once per pass)."""
    from transformers import DynamicCache

    G = plan.group_size
    cache = DynamicCache(config=model.config)
    if plan.mode != "prefix":
        rows = prompts if plan.mode == "group" else [p for p in prompts for _ in range(G)]
        ids, mask = (t.to(model_device(model)) for t in left_pad(rows))
        logits = cached_forward(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), cache)
    else:
        mask, logits = _run_two_pass(model, prompts, plan, cache)
    if plan.mode != "naive" and G > 1:
        cache.batch_repeat_interleave(G)
        mask = mask.repeat_interleave(G, dim=0)
        logits = logits.repeat_interleave(G, dim=0)
    return cache, mask, logits


def _run_two_pass(model, prompts: list[list[int]], plan: PrefillPlan, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared prefixes in one pass, expand their KV to the prompts that use them, then every suffix in one pass."""
    dev = model_device(model)
    heads = [prompts[g.members[0]][: g.length] for g in plan.groups]
    p_ids, p_mask = (t.to(dev) for t in left_pad(heads))
    cached_forward(model, p_ids, p_mask, (p_mask.cumsum(-1) - 1).clamp(min=0), cache)
    owner = torch.full((len(prompts),), -1, dtype=torch.long)
    shared = torch.zeros(len(prompts), dtype=torch.long)
    for k, g in enumerate(plan.groups):
        owner[list(g.members)] = k
        shared[list(g.members)] = g.length
    s_ids, s_mask = left_pad([p[int(n):] for p, n in zip(prompts, shared)])
    owner, shared, s_ids, s_mask = owner.to(dev), shared.to(dev), s_ids.to(dev), s_mask.to(dev)
    # Prompts without a shared prefix borrow group 0's rows with an all-zero mask: they attend to none of it.
    cache.batch_select_indices(owner.clamp(min=0))
    head_mask = p_mask[owner.clamp(min=0)] * (owner >= 0).long().unsqueeze(-1)
    # positions continue from each row's own prefix length, so the model sees exactly the unpadded prompt
    s_pos = (shared.unsqueeze(-1) + s_mask.cumsum(-1) - 1).clamp(min=0)
    mask = torch.cat([head_mask, s_mask], dim=1)
    logits = cached_forward(model, s_ids, mask, s_pos, cache)
    return mask, logits
