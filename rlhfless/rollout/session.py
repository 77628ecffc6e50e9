"""Decode sessions: the decode contract of a serverless decode actor (resumable, splittable, migratable).

A `DecodeSession` decodes some rows of a step in slices (`advance`), reports `progress`, hands its unfinished
rows back as `PartialRow`s at tau (`take_unfinished`), and a target continues them after `resume_prefill`.
The rule it keeps: row r at decode step t samples with u(seed, t, r) whatever batch or session it is in, so a
split, a cut or shipped KV give the tokens of one undisturbed decode (up to float rounding at near-ties).
The cache layout, devices and non-goals: docs/internals.md#rolloutsessionpy.

Deviations from a production engine:
1. Migrated rows are re-prefilled (prompt + tokens so far), not moved with their decode KV (counted as cost).
2. Own and adopted rows run as two interleaved sessions, not one merged batch (a paged KV would merge them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from rlhfless.core.devices import model_device
from rlhfless.core.errors import DataError, UserError, require
from rlhfless.model.tokenizer import PAD_ID
from rlhfless.rollout.prefix import left_pad
from rlhfless.rollout.state import (
    IterationRecord,
    PrefillState,
    PrefillStats,
    SamplingParams,
    row_uniforms,
    dynamic_cache,
    sample_tokens,
)
from rlhfless.rollout.prefix import cached_forward
from rlhfless.rollout.stepper import make_stepper

__all__ = ["PartialRow", "SessionProgress", "DecodeSession", "resume_prefill", "resume_session",
           "state_to_tensors", "state_from_tensors"]

STATE_FORMAT = "rlhfless.prefill_state"
STATE_VERSION = "1"


@dataclass(frozen=True)
class PartialRow:
    """An unfinished row handed over for migration: its index in the step's full batch and its tokens so far."""

    row_id: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class SessionProgress:
    """Where a session stands: its rows, how many finished, and (row_id, tokens so far incl. prefix) per
    unfinished row (rows taken by `take_unfinished` count as neither)."""

    rows: int
    finished: int
    unfinished: tuple[tuple[int, int], ...]


class DecodeSession:
    """Decode of some rows of one step, run in slices (see the module docstring).

    row_ids: index of each state row in the step's full batch (default 0..R-1); n_total: rows in that full batch
    (required with row_ids); prefix_tokens: per state row, tokens already generated (migrated rows; empty for
    fresh rows); the row's first sampled token is its step len(prefix) and max_new_tokens counts the prefix.
    """

    @torch.no_grad()
    def __init__(self, model, state: PrefillState, params: SamplingParams, seed: int = 0, *,
                 row_ids: torch.Tensor | Sequence[int] | None = None, n_total: int | None = None,
                 prefix_tokens: Sequence[Sequence[int]] | None = None, impl: str = "auto"):
        t0 = time.perf_counter()
        R = int(state.attention_mask.shape[0])
        require(R >= 1, "decode.state", "holds no rows")
        require(state.next_logits.shape[0] == R and state.next_pos.shape[0] == R, "decode.state",
                f"next_logits/next_pos have {state.next_logits.shape[0]}/{state.next_pos.shape[0]} rows, "
                f"attention_mask has {R}")
        if row_ids is None:
            rid = torch.arange(R)
            n_total = R if n_total is None else n_total
        else:
            rid = torch.as_tensor(row_ids, dtype=torch.long).reshape(-1).clone()
            require(len(rid) == R, "decode.row_ids", f"has {len(rid)} entries for a state of {R} rows")
            require(n_total is not None, "decode.n_total", "must be given with row_ids (rows in the step's full "
                    "batch: the random streams are drawn for all of them)")
            require(int(rid.min()) >= 0, "decode.row_ids", f"must be >= 0 (got {int(rid.min())})")
            require(len(torch.unique(rid)) == R, "decode.row_ids", "must be distinct")
        require(n_total > int(rid.max()), "decode.n_total",
                f"must exceed the largest row id {int(rid.max())} (got {n_total})")
        n = params.max_new_tokens
        offset = torch.zeros(R, dtype=torch.long)
        self._tokens = torch.full((R, n), PAD_ID, dtype=torch.long)
        if prefix_tokens is not None:
            require(len(prefix_tokens) == R, "decode.prefix_tokens", f"has {len(prefix_tokens)} rows for a "
                    f"state of {R} rows")
            for i, p in enumerate(prefix_tokens):
                p = list(p)
                require(len(p) < n, "decode.prefix_tokens", f"row {int(rid[i])} already has {len(p)} tokens; "
                        f"max_new_tokens={n} counts them and leaves none to generate")
                require(not set(p) & set(params.stop_ids), "decode.prefix_tokens",
                        f"row {int(rid[i])} contains a stop token: it is finished")
                if p:
                    self._tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
                    offset[i] = len(p)
        self.model, self.params, self.seed, self.n_total, self.row_ids = model, params, seed, int(n_total), rid
        self._stop = torch.tensor(params.stop_ids, dtype=torch.long)
        self._length = offset.clone()  # tokens held per FINISHED state row (live rows: offset + iterations)
        self._finished = torch.zeros(R, dtype=torch.bool)
        self._taken = torch.zeros(R, dtype=torch.bool)
        # the live batch (shrinks on compaction): state row, row id, step offset, live flag, next position
        self._local, self._rid, self._off = torch.arange(R), rid, offset
        self._live = torch.ones(R, dtype=torch.bool)
        self._pos = state.next_pos.cpu().clone()  # with the bookkeeping; the stepper moves it to the device
        self._logits: torch.Tensor | None = state.next_logits
        self._offsets = sorted(set(offset.tolist()))
        self._stepper = make_stepper(model, state.cache, state.attention_mask, n - self._offsets[0], impl)
        self._it = 0
        self.iterations: list[IterationRecord] = []
        self.busy_seconds = time.perf_counter() - t0
        """Wall seconds spent in this session's calls (stepper setup, advance, take_unfinished)."""

    @property
    def done(self) -> bool:
        """No row left to decode (all finished, or the unfinished ones were taken)."""
        return self._logits is None

    def _uniforms(self) -> torch.Tensor | None:
        if self.params.temperature == 0:
            return None
        if len(self._offsets) == 1:
            return row_uniforms(self.seed, self._offsets[0] + self._it, self.n_total)[self._rid]
        u = torch.empty(len(self._rid), dtype=torch.float64)
        for o in self._offsets:
            m = self._off == o
            u[m] = row_uniforms(self.seed, o + self._it, self.n_total)[self._rid[m]]
        return u

    def _release(self) -> None:
        self._logits = self._stepper = None

    def _stops(self, tok: torch.Tensor) -> torch.Tensor:
        """[b] bool: the token ends its row (one comparison for the usual single stop id)."""
        return tok == self._stop[0] if len(self._stop) == 1 else torch.isin(tok, self._stop)

    def _truncated(self, tokens: list[int]) -> bool:
        return tokens[-1] not in self.params.stop_ids

    @torch.no_grad()
    def advance(self, max_iters: int) -> bool:
        """Run up to `max_iters` decode iterations; True when no row is left to decode."""
        require(max_iters >= 0, "decode.max_iters", f"must be >= 0 (got {max_iters})")
        t_start = time.perf_counter()
        p, last = self.params, self.params.max_new_tokens - 1
        for _ in range(max_iters):
            if self.done:
                break
            t0 = time.perf_counter()
            live, local = self._live, self._local
            # sampled on the logits' device, kept on the CPU with the bookkeeping (a no-op on a CPU model)
            tok = sample_tokens(self._logits, self._uniforms(), p.temperature, p.top_p).cpu()
            if len(self._offsets) == 1:  # every row at the same step (no migrated rows): scalar indexing
                step = self._offsets[0] + self._it
                self._tokens[local[live], step] = tok[live]
                ended = live if step >= last else live & self._stops(tok)
                self._length[local[ended]] = step + 1
            else:
                steps = self._off + self._it  # [b] the decode step of each batch row
                self._tokens[local[live], steps[live]] = tok[live]
                ended = live & (self._stops(tok) | (steps >= last))
                self._length[local[ended]] = steps[ended] + 1
            self._finished[local[ended]] = True
            live = live & ~ended
            self._it += 1
            n_live = int(live.sum())
            if n_live == 0:
                self._release()
                break
            # Compacting copies the whole cache, so wait until enough rows have finished to make it pay.
            if len(live) - n_live >= max(1, p.compact_fraction * len(live)):
                keep = live.nonzero().squeeze(-1)
                self._stepper.select(keep)
                tok, live = tok[keep], live[keep]
                self._pos, self._local, self._rid, self._off = (self._pos[keep], local[keep], self._rid[keep],
                                                                self._off[keep])
                self._offsets = sorted(set(self._off.tolist())) if len(self._offsets) > 1 else self._offsets
            self._live = live
            self._logits = self._stepper.step(torch.where(live, tok, PAD_ID), self._pos, live)
            self._pos = self._pos + 1
            self.iterations.append(IterationRecord(len(live), self._stepper.context, time.perf_counter() - t0))
        self.busy_seconds += time.perf_counter() - t_start
        return self.done

    def _open_rows(self) -> list[int]:
        """State rows still decoding, and their token counts (prefix + generated)."""
        open_ = (~self._finished & ~self._taken).nonzero().squeeze(-1)
        if self.done or len(open_) == 0:
            return open_.tolist()
        self._length[self._local[self._live]] = self._off[self._live] + self._it
        return open_.tolist()

    def progress(self) -> SessionProgress:
        """Rows, finished count, and (row_id, tokens so far incl. prefix) of every unfinished row."""
        open_ = self._open_rows()
        return SessionProgress(len(self._finished), int(self._finished.sum()),
                               tuple((int(self.row_ids[i]), int(self._length[i])) for i in open_))

    def take_unfinished(self) -> list[PartialRow]:
        """Remove the rows still decoding (state order) and return them; the session is then done."""
        t0 = time.perf_counter()
        open_ = self._open_rows()
        out = [PartialRow(int(self.row_ids[i]), tuple(self._tokens[i, : int(self._length[i])].tolist()))
               for i in open_]
        self._taken[open_] = True
        self._release()
        self.busy_seconds += time.perf_counter() - t0
        return out

    def finished_rows(self) -> dict[int, tuple[list[int], bool]]:
        """row_id -> (tokens incl. prefix, EOS included when emitted; truncated = hit max_new_tokens)."""
        idx = self._finished.nonzero().squeeze(-1).tolist()
        toks = self._tokens[idx].tolist()
        out = {}
        for i, t in zip(idx, toks):
            t = t[: int(self._length[i])]
            out[int(self.row_ids[i])] = (t, self._truncated(t))
        return out

    def outputs(self) -> tuple[list[list[int]], list[bool]]:
        """(responses, truncated) in state row order; every row must have finished."""
        if not bool(self._finished.all()):
            raise UserError(f"decode session: {int((~self._finished).sum())} rows have not finished "
                            "(advance until done, or use finished_rows() / take_unfinished())")
        toks, lens = self._tokens.tolist(), self._length.tolist()
        rows = [t[:n] for t, n in zip(toks, lens)]
        return rows, [self._truncated(r) for r in rows]


@torch.no_grad()
def resume_prefill(model, prompts: Sequence[Sequence[int]], partials: Sequence[PartialRow]) -> PrefillState:
    """Prefill for migrated rows: prompts[i] + partials[i].tokens, one row each (left padded), so the state's
    next logits continue each partial row. Its stats count the recomputed tokens (the migration cost)."""
    from transformers import DynamicCache

    require(len(prompts) == len(partials), "resume.prompts", f"has {len(prompts)} prompts for {len(partials)} "
            "partial rows (one prompt per row)")
    require(len(partials) >= 1, "resume.partials", "is empty: nothing to resume")
    t0 = time.perf_counter()
    rows = [list(p) + list(r.tokens) for p, r in zip(prompts, partials)]
    limit = model.config.max_position_embeddings
    for r, row in zip(partials, rows):
        require(len(row) > 0, "resume.prompts", f"row {r.row_id} has an empty prompt")
        require(len(row) < limit, "resume.partials", f"row {r.row_id} has {len(row)} tokens with its prompt; the "
                f"model's context is {limit}")
    ids, mask = (t.to(model_device(model)) for t in left_pad(rows))
    cache = DynamicCache(config=model.config)
    logits = cached_forward(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), cache)
    n = sum(map(len, rows))
    return PrefillState(cache, mask, mask.sum(-1), logits, PrefillStats(n, n, time.perf_counter() - t0))


def resume_session(model, prompts: Sequence[Sequence[int]], partials: Sequence[PartialRow],
                   params: SamplingParams, seed: int, n_total: int, *, impl: str = "auto") -> DecodeSession:
    """`resume_prefill` + a session that continues the partial rows' streams (the migration target's call)."""
    state = resume_prefill(model, prompts, partials)
    return DecodeSession(model, state, params, seed, row_ids=[r.row_id for r in partials], n_total=n_total,
                         prefix_tokens=[r.tokens for r in partials], impl=impl)


def state_to_tensors(state: PrefillState) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A prefill state as named tensors + string metadata, ready for `safetensors.torch.save_file(t, path, meta)`.

    The plan (`stats.plan`) is not shipped: it is a log of the prefill, not needed to decode.
    """
    layers = list(state.cache.layers)
    tensors = {"attention_mask": state.attention_mask, "next_pos": state.next_pos,
               "next_logits": state.next_logits}
    for i, layer in enumerate(layers):
        tensors[f"kv.{i}.keys"], tensors[f"kv.{i}.values"] = layer.keys, layer.values
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}  # files hold host memory
    st = state.stats
    meta = {"format": STATE_FORMAT, "version": STATE_VERSION, "layers": str(len(layers)),
            "rows": str(int(state.attention_mask.shape[0])), "tokens_computed": str(st.tokens_computed),
            "tokens_naive": str(st.tokens_naive), "prefill_seconds": repr(float(st.seconds))}
    return tensors, meta


def state_from_tensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str | int], model) -> PrefillState:
    """Rebuild a `PrefillState` written by `state_to_tensors` (e.g. read back with `safetensors.torch.load_file`
    and `safe_open(...).metadata()`), checked against `model`'s shape. Raises DataError on a mismatch."""
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    if meta.get("format") != STATE_FORMAT or meta.get("version") != STATE_VERSION:
        raise DataError(f"prefill state: metadata says format={meta.get('format')!r} version={meta.get('version')!r}"
                        f"; expected {STATE_FORMAT!r} version {STATE_VERSION}")
    cfg = model.config
    n_layers = int(meta.get("layers", -1))
    if n_layers != cfg.num_hidden_layers:
        raise DataError(f"prefill state has {n_layers} layers; the model has {cfg.num_hidden_layers}")
    need = ["attention_mask", "next_pos", "next_logits"] + [f"kv.{i}.{s}" for i in range(n_layers)
                                                            for s in ("keys", "values")]
    missing = [k for k in need if k not in tensors]
    if missing:
        raise DataError(f"prefill state is missing tensors {missing[:4]}")
    mask = tensors["attention_mask"]
    R, P = mask.shape
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_shape = (R, cfg.num_key_value_heads, P, head_dim)
    for k in need[3:]:
        if tuple(tensors[k].shape) != kv_shape:
            raise DataError(f"prefill state tensor {k} has shape {tuple(tensors[k].shape)}; expected {kv_shape} "
                            "(rows, kv heads, prompt width, head dim) for this model")
    if int(meta.get("rows", -1)) != R or tensors["next_pos"].shape != (R,) or tensors["next_logits"].shape[0] != R:
        raise DataError(f"prefill state: rows disagree (metadata {meta.get('rows')}, mask {R}, next_pos "
                        f"{tuple(tensors['next_pos'].shape)}, next_logits {tuple(tensors['next_logits'].shape)})")
    dev = model_device(model)
    cache = dynamic_cache([(tensors[f"kv.{i}.keys"].to(dev), tensors[f"kv.{i}.values"].to(dev))
                           for i in range(n_layers)])
    stats = PrefillStats(int(meta.get("tokens_computed", 0)), int(meta.get("tokens_naive", 0)),
                         float(meta.get("prefill_seconds", 0.0)))
    return PrefillState(cache, mask.long().to(dev), tensors["next_pos"].long().to(dev),
                        tensors["next_logits"].float().to(dev), stats)
