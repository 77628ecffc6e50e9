"""The decode function's body, inside a worker: prefill its rows, decode them in sessions, obey cut/adopt, score.

Rows arrive as items (group index, prompt, answer, row ids, and a prefix per migrated row); the job opens its
sessions through one factory per engine (`open_sessions`: `rollout.engine`, own or vllm), so `run_decode` calls the
same session methods whichever engine is behind them. The rule it keeps: with the own engine a migrated row
continues exactly (mode-vs-mode sample identity); with vllm a migrated row samples from a stream of its own. Items
and both engines in full: docs/internals.md#runtimedevicesdecodingpy.

Deviation from a paged-KV engine (own engine): an adopted batch is stepped in turn beside the running one, not
merged into it, so on a CPU core adopted rows cost almost their own stream of iterations (the migration's cost is
measured, not assumed). With vllm the adopted rows join the running batch.
"""

from __future__ import annotations

import torch

from rlhfless.core.errors import ConfigError
from rlhfless.rollout.engine import prefill
from rlhfless.rollout.session import DecodeSession, PartialRow, resume_prefill, state_from_tensors, state_to_tensors
from rlhfless.runtime import wire
from rlhfless.runtime.records import now


class _OwnSessions:
    """The own engine's `DecodeSession`s on the worker's policy replica."""

    engine = "own"

    def __init__(self, worker, params, seed: int, n_total: int):
        self.worker, self.params, self.seed, self.n_total = worker, params, seed, n_total
        self.prefill = [0, 0, 0.0]  # prompt tokens computed, naive tokens, seconds

    def fresh(self, items: list[dict]) -> DecodeSession:
        G = self.worker.G
        state = prefill(self.worker.model, [it["prompt"] for it in items], G,
                        dedup=self.worker.cfg.rollout.dedup_prefill)
        st = state.stats
        self.prefill = [self.prefill[0] + st.tokens_computed, self.prefill[1] + st.tokens_naive,
                        self.prefill[2] + st.seconds]
        rows = torch.tensor([it["g"] * G + s for it in items for s in range(G)])
        wanted = {row for it in items for row in it["rows"]}
        if len(wanted) < len(rows):  # a re-run of a group some of whose rows moved away: decode only the rest
            keep = torch.tensor([i for i, r in enumerate(rows.tolist()) if r in wanted])
            state, rows = state.select(keep), rows[keep]
        return DecodeSession(self.worker.model, state, self.params, self.seed, row_ids=rows, n_total=self.n_total)

    def shipped(self, kv: dict) -> DecodeSession:
        """The prefix KV the prefill function computed for this actor's groups (rows in kv["rows"] order)."""
        from safetensors import safe_open

        with safe_open(kv["path"], framework="pt") as fh:
            meta = fh.metadata()
        state = state_from_tensors(wire.read_tensors(kv["path"]), meta, self.worker.model)
        return DecodeSession(self.worker.model, state, self.params, self.seed, row_ids=kv["rows"],
                             n_total=self.n_total)

    def resumed(self, prompts: list[list[int]], partials: list[PartialRow]) -> DecodeSession:
        state = resume_prefill(self.worker.model, prompts, partials)
        return DecodeSession(self.worker.model, state, self.params, self.seed, row_ids=[p.row_id for p in partials],
                             n_total=self.n_total, prefix_tokens=[p.tokens for p in partials])

    def prefill_stats(self) -> list:
        return self.prefill


class _VLLMSessions:
    """`VLLMSession`s in the worker's vLLM engine; prefill is vLLM's (prefix cache), counted from its counters."""

    engine = "vllm"

    def __init__(self, worker, params, seed: int, n_total: int):
        self.vllm, self.params, self.seed = worker.vllm, params, seed
        self._before = self.vllm.prefix_cache_stats()
        self._naive = 0  # prompt (+ prefix) tokens sent: what a prefill without any cache would compute

    def fresh(self, items: list[dict]):
        prompts = [it["prompt"] for it in items for _ in it["rows"]]
        self._naive += sum(map(len, prompts))
        return self.vllm.session(prompts, self.params, self.seed, row_ids=[r for it in items for r in it["rows"]])

    def shipped(self, kv: dict):
        raise ConfigError("runtime.ship_prefix_kv: rollout.engine=vllm prefills with its own prefix cache; the "
                          "prefill function's KV does not apply (use never or auto)")

    def resumed(self, prompts: list[list[int]], partials: list[PartialRow]):
        self._naive += sum(len(p) + len(r.tokens) for p, r in zip(prompts, partials))
        return self.vllm.session(prompts, self.params, self.seed, row_ids=[p.row_id for p in partials],
                                 prefix_tokens=[p.tokens for p in partials])

    def prefill_stats(self) -> list:
        after = self.vllm.prefix_cache_stats()
        missed = (after["queries"] - self._before["queries"]) - (after["hits"] - self._before["hits"])
        return [missed, self._naive, 0.0]  # vLLM overlaps prefill with decode: its seconds are in decode's


def open_sessions(worker, params, seed: int, n_total: int) -> _OwnSessions | _VLLMSessions:
    """The session factory of the worker's engine (`rollout.engine`; the worker started vLLM when it is vllm)."""
    kind = _VLLMSessions if worker.vllm is not None else _OwnSessions
    return kind(worker, params, seed, n_total)


class _Job:
    """One decode invocation's sessions and results (lives inside `run_decode`)."""

    def __init__(self, worker, msg: dict):
        r = worker.cfg.rollout
        self.worker = worker
        params = worker.env.sampling(r.max_new_tokens, r.temperature, r.top_p)
        self.open = open_sessions(worker, params, msg["seed"], msg["n_total"])
        self.sessions: list = []
        self.answers: dict[int, str] = {}
        self.adopted = 0
        self.reported: set[int] = set()  # rows already sent (streamed as they finish when overlapping)
        self.reward_s = 0.0

    def add(self, items: list[dict], kv: dict | None = None) -> None:
        fresh = [it for it in items if it.get("prefix") is None]
        moved = [it for it in items if it.get("prefix") is not None]
        for it in items:
            for row in it["rows"]:
                self.answers[row] = it["answer"]
        if fresh:
            self.sessions.append(self.open.shipped(kv) if kv is not None else self.open.fresh(fresh))
        if moved:
            partials = [PartialRow(row, tuple(p)) for it in moved for row, p in zip(it["rows"], it["prefix"])]
            self.sessions.append(self.open.resumed([it["prompt"] for it in moved for _ in it["rows"]], partials))
            self.adopted += len(partials)

    def unfinished(self) -> list[list[int]]:
        return [[row, gen] for s in self.sessions for row, gen in s.progress().unfinished]

    def cut(self) -> list[list]:
        rows = []
        for s in self.sessions:
            rows += [[p.row_id, list(p.tokens)] for p in s.take_unfinished()]
        return rows

    def results(self) -> list[list]:
        """Finished rows not reported yet, scored here (the seconds go to `reward_s`)."""
        t0 = now()
        out = []
        for s in self.sessions:
            for row, (tokens, truncated) in s.finished_rows().items():
                if row in self.reported:
                    continue
                self.reported.add(row)
                _, sc = self.worker.env.score_ids(tokens, self.answers[row], truncated)
                out.append([row, tokens, truncated, sc.reward, sc.correct, sc.well_formed])
        self.reward_s += now() - t0
        return out


def run_decode(worker, msg: dict, conn, sync_s: float) -> dict:
    """Decode the request's rows to the end (or until cut); returns the `done` reply with scored rows."""
    t0 = now()
    job = _Job(worker, msg)
    job.add(msg["items"], msg.get("kv"))
    every, report, stream = msg.get("progress_every", 8), msg.get("report", False), msg.get("stream", False)
    cut_rows: list = []
    worker.model.eval()
    with torch.no_grad():
        while any(not s.done for s in job.sessions):
            for s in job.sessions:
                if not s.done:
                    s.advance(every)
            if stream:  # finished rows go out at once: their groups can train while this decode goes on
                rows = job.results()
                if rows:
                    wire.send(conn, {"op": "rows", "step": msg["step"], "t": now(), "results": rows})
            if report:
                finished = sum(len(s.finished_rows()) for s in job.sessions)
                wire.send(conn, {"op": "progress", "step": msg["step"], "t": now(), "finished": finished,
                                 "unfinished": job.unfinished()})
            while conn.poll():
                ctl = wire.recv(conn)
                if ctl["op"] == "cut":
                    cut_rows = job.cut()
                    wire.send(conn, {"op": "cut_rows", "step": msg["step"], "rows": cut_rows, "t": now()})
                elif ctl["op"] == "adopt":
                    job.add(ctl["items"])
                else:  # not for this decode (a learner's group, shutdown): served after it, in order
                    worker.deferred.append(ctl)
    t_decode = now()
    results = job.results()
    return {"op": "done", "step": msg["step"], "t_start": t0, "t_decode_end": t_decode, "t_end": now(),
            "sync_s": sync_s, "reward_s": job.reward_s, "results": results, "prefill": job.open.prefill_stats(),
            "adopted": job.adopted, "cut": len(cut_rows), "iterations": sum(len(s.iterations) for s in job.sessions),
            "engine": job.open.engine}


def run_prefill(worker, msg: dict, sync_s: float) -> dict:
    """The prefill function: every group's prompt (and prefixes shared across prompts) computed ONCE for the whole
    step, then each decode actor's rows written to its own safetensors file (KV, masks, first logits)."""
    t0 = now()
    G = worker.G
    with torch.no_grad():
        state = prefill(worker.model, msg["prompts"], G, dedup=worker.cfg.rollout.dedup_prefill)
    pos = {g: i for i, g in enumerate(msg["groups"])}
    files = []
    for a, gs in enumerate(msg["actors"]):
        rows = [pos[g] * G + s for g in gs for s in range(G)]
        tensors, meta = state_to_tensors(state.select(torch.tensor(rows)))
        path = f"{msg['out_prefix']}-{a}.safetensors"
        wire.write_tensors(path, tensors, meta)
        files.append({"path": path, "rows": [g * G + s for g in gs for s in range(G)]})
    st = state.stats
    return {"op": "prefilled", "t_start": t0, "t_end": now(), "sync_s": sync_s, "files": files,
            "prefill": [st.tokens_computed, st.tokens_naive, st.seconds]}
