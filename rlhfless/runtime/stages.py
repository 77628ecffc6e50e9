"""The stages as functions: decode (with live cut-and-migrate and re-runs of killed workers), reference, learner.

DecodeStage is one event loop over the decode workers' messages: `ready`, `progress` (cut-and-migrate: the live
progress goes through the planner's own `plan_migrations`, the same rule the time model simulates), `cut_rows`
(a source's unfinished rows, sent on to their destinations as `adopt`), `done` (scored rows), and death
(the worker's outstanding rows are re-run on a fresh worker from their prompts, or from the tokens they had when
they were migrated: the same random streams give the same tokens). It also fires the pre-warm of the learner
group at the time the policy says. With the hybrid image (runtime.hybrid) a function whose rows are all done goes
on as a learner rank (`LearnerStream.take`, `_Actor.handed`): from then on its messages and its death are the
learner stream's, and no cut row is sent to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlhfless.core import metrics as M
from rlhfless.plan import ActorProgress, SeqProgress, plan_migrations
from rlhfless.core.records import Sample
from rlhfless.rollout.engine import PrefillStats, RolloutOutput
from rlhfless.runtime import wire
from rlhfless.runtime.attempts import Attempts, running
from rlhfless.runtime.platform.backend import WorkerDied
from rlhfless.runtime.context import StepContext
from rlhfless.runtime.modes.policy import ship_saves_tokens, should_ship
from rlhfless.runtime.records import now


@dataclass
class _Actor:
    """One decode function of this step: its worker, rows still owed, and its open invocation."""

    index: int
    handle: object
    rows: set[int]
    requested: float
    cold: bool
    tries: Attempts | None = None
    """The attempts of this function's work (its index's rows): kept by the actors that re-run it
    (`runtime.attempts`: only its own failures while it runs use one)."""
    done: bool = False
    cut: bool = False
    progress: tuple[int, list] = (0, [])
    extra: dict = field(default_factory=dict)
    moves: dict = field(default_factory=dict)
    """After a cut: row -> the destination actor the planner chose for it."""
    groups: set[int] = field(default_factory=set)
    """Groups whose fresh rows it was sent (for the record: the plan as executed)."""
    finished: int = 0
    """Rows this invocation finished (streamed and final), for its record."""
    handed: bool = False
    """Its worker went on as a learner rank of this step (runtime.hybrid): it takes no more decode work."""


def destination(planned: _Actor | None, actors: list[_Actor], pool) -> _Actor | None:
    """Where a cut row goes, given the planner's choice `planned` and this step's `actors` (`pool`: the live
    workers by id). The planner's choice while it still decodes; else any actor still decoding and not cut;
    else a finished actor whose worker is still warm (keep-alive), re-invoked: no cold start, and on a cluster
    no new resources to wait for (a fresh actor can queue forever behind warm workers holding every CPU);
    else None: a fresh function is needed."""
    def live(x: _Actor) -> bool:
        return x.handle.worker in pool and not x.handed
    if planned is not None and not planned.done and live(planned):
        return planned
    running = [x for x in actors if not x.done and not x.cut and live(x)]
    if running:
        return running[0]
    warm = [x for x in actors if x.done and live(x)]
    return warm[0] if warm else None


class DecodeStage:
    def __init__(self, ctx: StepContext, groups, seed: int, plan, stream):
        # ctx: what the stage reads, and the collaborators (workers, ledger, weights, clock) that own what it changes
        self.ctx, self.groups, self.seed, self.plan, self.step = ctx, groups, seed, plan, ctx.step
        self.stream = stream  # finished groups go to the learner as they complete (runtime.streaming)
        self.streamed_groups: set[int] = set()
        self.G = ctx.cfg.algo.group_size
        self.n_rows = len(groups) * self.G
        self.split = ctx.policy.decode_split(len(groups), plan, ctx.config.workers())
        self.migrate = ctx.policy.migrates(ctx.config.migrate, plan)
        self.tau = ctx.cfg.plan.tau
        self.results: dict[int, list] = {}
        self.prefix: dict[int, list[int]] = {}  # rows moved: the tokens they had when cut
        self.actors: dict[str, _Actor] = {}
        self.pred = {g * self.G + s: plan.jobs[g].lengths()[s] for g in range(len(groups)) for s in range(self.G)} \
            if plan is not None else {}
        self.migrated = 0
        self.prefill = [0, 0, 0.0]
        self.restarts = 0  # serverful: times the step's rollout started over (`_restart_step`)

    # -- requests -----------------------------------------------------------------------------------------------
    def _items(self, rows: set[int]) -> list[dict]:
        """Rows as request items: fresh rows grouped by prompt, moved rows with their partial responses."""
        by_group: dict[int, list[int]] = {}
        items = []
        for r in sorted(rows):
            if r in self.prefix:
                g = r // self.G
                items.append(self._item(g, [r], [self.prefix[r]]))
            else:
                by_group.setdefault(r // self.G, []).append(r)
        return [self._item(g, rs, None) for g, rs in by_group.items()] + items

    def _item(self, g: int, rows: list[int], prefix) -> dict:
        grp = self.groups[g]
        return {"g": g, "pid": grp.prompt.prompt_id, "prompt": grp.token_ids, "answer": grp.prompt.answer,
                "rows": rows, "prefix": prefix}

    def _send(self, a: _Actor, op: str, rows: set[int], kv: dict | None = None) -> None:
        """Send a decode/adopt request; a worker found dead on sending is handled like one that died working."""
        msg = {"op": op, "step": self.step, "seed": self.seed, "n_total": self.n_rows, "items": self._items(rows),
               "report": self.migrate, "progress_every": self.ctx.config.progress_every, "kv": kv,
               "stream": self.stream.overlap,
               **self.ctx.weights.state_setup()}
        try:
            self.ctx.workers.backend.send(a.handle, msg)
        except WorkerDied:
            self._died(a.handle)

    def _ship_kv(self) -> list[dict] | None:
        """Run the prefill function when the policy says shipping its KV pays; the files per actor, or None."""
        ctx = self.ctx
        prompts = [g.token_ids for g in self.groups]
        saved = ship_saves_tokens(prompts, self.split, self.G, ctx.cfg.rollout.dedup_prefill)
        tm = ctx.time_model
        # vLLM decode functions prefill in their own engine (prefix cache): shipped KV cannot enter it
        ship = ctx.policy.traits.may_ship_kv and ctx.cfg.rollout.engine == "own" and should_ship(
            ctx.config.ship_prefix_kv, saved, tm.prefill_s_per_token,
            ctx.clock.cold_start("prefill", ctx.clock.cold_start("decode", 0.3)))
        ctx.ledger.count(M.RUNTIME_SHIP_KV, float(ship))
        ctx.ledger.count(M.RUNTIME_SHIP_SAVED_TOKENS, float(saved))
        if not ship:
            return None
        msg_in = {"op": "prefill", "prompts": prompts, "groups": list(range(len(prompts))), "actors": self.split,
                  "out_prefix": str(ctx.scratch / f"kv-{self.step}"), **ctx.weights.state_setup()}
        tries = Attempts(f"prefill function of step {self.step}", ctx.config.max_attempts)
        while True:
            h = ctx.workers.start_single("prefill")
            msg = _call(ctx, "prefill", h, msg_in, "prefilled", tries.number)
            if msg is not None:
                self.prefill = list(msg["prefill"])
                ctx.workers.pool.release(h)
                return msg["files"]
            tries.failed(running(sent=True, ready_s=h.ready_s))

    def _tries(self, index: int) -> Attempts:
        return Attempts(f"decode function {index} of step {self.step}", self.ctx.config.max_attempts)

    def _handles(self, n: int) -> list:
        return self.ctx.workers.decoders(n)

    def _by_locality(self, handles: list) -> list:
        """The paper's locality rule: the decode function with the most rows runs on the learner's node (the
        backend placed one decode worker there, `home`), so the largest share of the step's results never
        crosses nodes. Tokens do not depend on where a row runs; backends without nodes keep the order."""
        home = next((h for h in handles if getattr(h, "home", False)), None)
        if home is None or not self.split:
            return handles
        heaviest = max(range(len(self.split)), key=lambda i: len(self.split[i]))
        rest = [h for h in handles if h is not home]
        rest.insert(heaviest, home)
        return rest

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> tuple[RolloutOutput, list[Sample]]:
        ctx = self.ctx
        t_start = now()
        kv = self._ship_kv()  # first: the prefill function needs a unit, which the decode functions then take
        handles = self._by_locality(self._handles(len(self.split)))
        for i, (h, gs) in enumerate(zip(handles, self.split)):
            rows = {g * self.G + s for g in gs for s in range(self.G)}
            a = _Actor(i, h, rows, now(), cold=ctx.ledger.first_use(h), tries=self._tries(i), groups=set(gs))
            self.actors[h.worker] = a
            if rows:
                ctx.workers.pool.busy(h)
                self._send(a, "decode", rows, kv[i] if kv else None)
                if self.restarts:  # found dead on sending: the pool restarted and every function was sent
                    break
            else:
                a.done = True
                ctx.workers.no_rows(h)
        ctx.clock.set_decode_prewarm(len([a for a in self.actors.values() if a.rows]))
        pw = self._learner_prewarm()
        # streamed rows can all be in before the last decode function's `done` (its record and release)
        while len(self.results) < self.n_rows or any(not a.done for a in self.actors.values()):
            if pw is not None and now() >= t_start + pw:
                self.stream.prewarm()  # into free units only
                pw = None
            timeout = None if pw is None else max(0.0, t_start + pw - now())
            pool = ctx.workers.pool
            watch = {a.handle.worker: a.handle for a in self.actors.values() if a.handle.worker in pool.handles}
            # workers still starting (pre-warmed ranks): their `ready` gives the measured cold start pre-warm reads
            watch.update({h.worker: h for h in pool.live() if h.ready_s is None and h.worker not in self.actors})
            # learner ranks not watched as decode actors (where a worker holds both roles at once, every rank is)
            watch.update({h.worker: h for h in self.stream.handles()
                          if h.ready_s is not None and h.worker in ctx.workers.pool.handles and h.worker not in watch})
            # wake at the learner's pre-warm time, and at least every second: `_check_timeouts` needs no message
            for h, msg in ctx.workers.poll(list(watch.values()), min(timeout, 1.0) if timeout is not None else 1.0):
                if msg is not None and h.worker not in ctx.workers.pool.handles:
                    continue  # read together with a death that restarted the pool: its work is re-run
                a = self.actors.get(h.worker)
                if (a is None or self._handed(a)) and self.stream.owns(h):
                    self.stream.on_message(h, msg)
                else:
                    self._on(h, msg)
            self._check_timeouts()
        self.stream.rollout_end = now()
        ctx.clock.observe_rollout(now() - t_start, self.plan.decision.plan.makespan_s if self.plan is not None else 0.0)
        return self._output(now() - t_start)

    def _handed(self, a: _Actor) -> bool:
        """Whether a's worker went on as a learner rank of this step (taken when it finished, or later, kept
        warm, by a rank whose groups were waiting): from then on its messages are the stream's."""
        if not a.handed and a.done and self.ctx.policy.traits.roles_change_hands and self.stream.owns(a.handle):
            a.handed = True
        return a.handed

    def _learner_prewarm(self) -> float | None:
        ctx = self.ctx
        predicted = self.plan.decision.plan.makespan_s if self.plan is not None else 0.0
        return ctx.clock.learner_prewarm_after(predicted, bool(ctx.workers.learners))

    def _on(self, h, msg: dict | None) -> None:
        ctx = self.ctx
        if msg is None:
            return self._died(h)
        op = msg["op"]
        if op == "learned":  # a worker holding both roles at once (`roles_change_hands` false) is also a rank
            self.stream.on_message(h, msg)
            return
        if op in ("progress", "cut_rows", "done") and msg.get("step") != self.step:
            return  # a late message of an earlier step from a worker kept warm: its rows are settled
        if op == "ready":
            ctx.workers.on_ready(h, msg)
        elif op == "progress":
            a = self.actors[h.worker]
            a.progress = (msg["finished"], msg["unfinished"])
            self._maybe_cut(a)
        elif op == "cut_rows":
            self._hand_over(self.actors[h.worker], msg["rows"])
        elif op == "rows":
            self._rows(self.actors[h.worker], msg["results"])
        elif op == "done":
            self._done(self.actors[h.worker], msg)
        else:
            raise RuntimeError(f"runtime: unexpected {op!r} from {h.worker} during decode")

    def _rows(self, a: _Actor, results: list) -> None:
        """Scored rows (streamed during decode, or in the final reply); a group whose G rows are all in goes to
        the learner stream at once."""
        touched = set()
        for row, tokens, truncated, reward, correct, well_formed in results:
            self.results[row] = [tokens, truncated, reward, correct, well_formed]
            a.rows.discard(row)
            a.finished += 1
            touched.add(row // self.G)
        for g in sorted(touched):
            rows = range(g * self.G, (g + 1) * self.G)
            if g not in self.streamed_groups and all(r in self.results for r in rows):
                self.streamed_groups.add(g)
                self.stream.group_done(g, [self.results[r][0] for r in rows], [self.results[r][2] for r in rows])

    def _done(self, a: _Actor, msg: dict) -> None:
        ctx = self.ctx
        self._rows(a, msg["results"])
        for k in ("adopted", "iterations"):
            a.extra[k] = a.extra.get(k, 0) + msg.get(k, 0)
        if msg.get("prefill"):
            self.prefill = [x + y for x, y in zip(self.prefill, msg["prefill"])]
        ctx.ledger.record(self.step, "decode", a.handle, a.requested, msg["t_start"], msg["t_decode_end"], a.cold,
                   a.tries.number, groups=list(a.groups), engine=msg.get("engine", ""), rows=a.finished,
                   sync_s=msg["sync_s"], **a.extra)
        a.groups, a.finished = set(), 0
        ctx.ledger.record(self.step, "reward", a.handle, msg["t_decode_end"], msg["t_decode_end"], msg["t_end"], False)
        ctx.ledger.count(M.RUNTIME_WEIGHT_SYNC_S, msg["sync_s"])
        if a.rows:  # rows adopted after it finished: a second run is on its way
            a.requested, a.cold, a.extra = now(), False, {}
            return
        a.done = True
        a.tries.succeeded()
        if ctx.workers.decoder_done(a.handle, self.stream):  # it goes on as a learner rank now
            a.handed = True

    # -- cut-and-migrate ----------------------------------------------------------------------------------------
    def _maybe_cut(self, a: _Actor) -> None:
        finished, unfinished = a.progress
        if not self.migrate or a.cut or not unfinished or finished / (finished + len(unfinished)) < self.tau:
            return
        live = [x for x in self.actors.values() if not x.done and not x.cut]
        cap = self.ctx.cfg.plan.capacity
        progress = []
        for x in live:
            fin, unf = x.progress if x.progress[1] or x.progress[0] else (0, [[r, 0] for r in sorted(x.rows)])
            seqs = tuple(SeqProgress(str(r), gen, max(0.0, self.pred.get(r, 0.0) - gen),
                                     len(self.groups[r // self.G].token_ids)) for r, gen in unf)
            progress.append(ActorProgress(x.index, fin, seqs, max(0, cap - len(seqs))))
        moves, _ = plan_migrations(progress, self.tau)
        by_index = {x.index: x for x in live}
        for src in {m.src for m in moves.moves}:
            s = by_index[src]
            try:
                self.ctx.workers.backend.send(s.handle, {"op": "cut", "step": self.step})
            except WorkerDied:  # it finished and released meanwhile: nothing to cut
                continue
            s.cut = True
            s.moves = {int(m.seq_id): by_index[m.dst] for m in moves.moves if m.src == src}

    def _hand_over(self, src: _Actor, rows: list) -> None:
        moves = src.moves
        by_dst: dict[str, list] = {}
        for x in self.actors.values():
            self._handed(x)
        for row, tokens in rows:
            self.prefix[row] = tokens
            src.rows.discard(row)
            dst = destination(moves.get(row), list(self.actors.values()), self.ctx.workers.pool.handles)
            if dst is None:
                dst = self._spare()
            elif dst.done:
                self._reinvoke(dst)
            dst.rows.add(row)
            by_dst.setdefault(dst.handle.worker, []).append(row)
        for wid, rs in by_dst.items():
            dst = self.actors[wid]
            self.migrated += len(rs)
            self._send(dst, "adopt", set(rs))

    def _reinvoke(self, a: _Actor) -> None:
        """A finished function whose worker is still warm (keep-alive) takes migrated rows: a new invocation on a
        warm worker, recorded when it is done like any other."""
        a.done, a.requested, a.cold, a.extra = False, now(), False, {}
        self.ctx.workers.pool.busy(a.handle)

    def _spare(self) -> _Actor:
        """A fresh decode function for rows that have nowhere to go (every destination already finished)."""
        h = self.ctx.workers.start_decoders(1, prewarmed=False)[0]
        i = len(self.actors)
        a = _Actor(i, h, set(), now(), cold=self.ctx.ledger.first_use(h), tries=self._tries(i))
        self.actors[h.worker] = a
        self.ctx.workers.pool.busy(h)
        return a

    # -- faults -------------------------------------------------------------------------------------------------
    def _died(self, h) -> None:
        """A decode worker died: its invocation is recorded as failed and its rows re-run, on a fresh function
        (serverless), or with every row of the step on a new pool (`ModePolicy.on_death`: `_restart_step`). Only its
        own work's attempts can be used, and only if it was running it (`runtime.attempts`)."""
        ctx = self.ctx
        a = self.actors.get(h.worker)
        ctx.workers.pool.dead(h)
        if a is None or a.done and not a.rows:
            return
        ctx.ledger.record(self.step, "decode", h, a.requested, a.requested, now(), a.cold, a.tries.number, ok=False)
        if not a.rows:  # it died after streaming its last rows: nothing to re-run
            a.done = True
            return
        ctx.ledger.count(M.RUNTIME_RETRIES)
        a.tries.failed(running(sent=True, ready_s=h.ready_s))
        death = ctx.policy.on_death("decode")
        if death.whole:
            return self._restart_step(a, death.rollout_over)
        new = ctx.workers.start_decoders(1, prewarmed=False)[0]
        b = _Actor(a.index, new, set(a.rows), now(), cold=ctx.ledger.first_use(new), tries=a.tries, groups=a.groups)
        del self.actors[h.worker]
        self.actors[new.worker] = b
        ctx.workers.pool.busy(new)
        self._send(b, "decode", b.rows)

    def _restart_step(self, dead: _Actor, from_step_start: bool) -> None:
        """The pool restarts whole (its workers share a data-parallel group), and the step's rollout starts over
        from its start, as a verl job resumed from the step's checkpoint would: every row is decoded again from its
        prompt on the new pool (the same random streams: the same tokens). The survivors' interrupted invocations
        are recorded as failed (`restarted`); their attempts are not used (`runtime.attempts`)."""
        ctx = self.ctx
        for x in self.actors.values():
            if x is not dead and not x.done and x.handle.worker in ctx.workers.pool.handles:
                ctx.ledger.record(self.step, "decode", x.handle, x.requested, x.requested, now(), x.cold,
                                  x.tries.number, ok=False, restarted=1)
        tries = {x.index: x.tries for x in self.actors.values()}
        self.restarts += 1
        gen = self.restarts
        ctx.workers.restart_pool()
        self.stream.pool_restarted(from_step_start)
        self.actors, self.streamed_groups = {}, set()
        self.results.clear()
        self.prefill = [0, 0, 0.0]  # counted again as the rows are prefilled again
        for i, (h, gs) in enumerate(zip(self._by_locality(ctx.workers.pool_workers()), self.split)):
            rows = {g * self.G + s for g in gs for s in range(self.G)}
            b = _Actor(i, h, rows, now(), cold=ctx.ledger.first_use(h), tries=tries[i], groups=set(gs))
            self.actors[h.worker] = b
            if rows:
                ctx.workers.pool.busy(h)
                self._send(b, "decode", rows)
                if self.restarts != gen:  # found dead on sending: restarted again, and sent, in there
                    return
            else:
                b.done = True

    def _check_timeouts(self) -> None:
        """Re-run the rows of an actor that is over time, or whose worker left the pool without a reply (nobody
        watches such a worker any more, so without this its rows would be waited for forever)."""
        limit = self.ctx.config.invocation_timeout_s
        for a in list(self.actors.values()):
            if a.done:
                continue
            if a.handle.worker not in self.ctx.workers.pool.handles or now() - a.requested > limit:
                self._died(a.handle)

    # -- result -------------------------------------------------------------------------------------------------
    def _output(self, seconds: float) -> tuple[RolloutOutput, list[Sample]]:
        tok = self.ctx.tok
        responses, truncated, samples = [], [], []
        for r in range(self.n_rows):
            tokens, trunc, reward, correct, well_formed = self.results[r]
            responses.append(tokens)
            truncated.append(trunc)
            g, s = divmod(r, self.G)
            samples.append(Sample(g, s, tuple(tokens), tok.decode(tokens), trunc, reward, correct, well_formed))
        computed, naive, pre_s = self.prefill
        stats = PrefillStats(int(computed), int(naive) or 1, pre_s)
        self.ctx.ledger.count(M.RUNTIME_MIGRATED_SEQS, self.migrated)
        self.ctx.ledger.count(M.RUNTIME_DECODE_ACTORS, len(self.split))
        if self.plan is not None and self.ctx.policy.traits.plans_decode:
            self._measure_time_model(responses)
        return RolloutOutput(responses, truncated, stats, seconds, []), samples


    def _measure_time_model(self, responses: list[list[int]]) -> None:
        """Measured decode busy seconds over what the planner's base time model predicts for the same placement
        with the true lengths: the runtime feeds it (smoothed) back to the planner."""
        from rlhfless.plan import PlanJob, realized_plan

        true = [PlanJob(j.group_id, j.n_seqs, tuple(float(len(responses[g * self.G + s])) for s in range(self.G)),
                        j.prompt_len) for g, j in enumerate(self.plan.jobs)]
        planner = self.ctx.planner
        predicted = sum(realized_plan(self.plan.decision, true, planner.base_time_model, self.tau).busy_s)
        measured = self.ctx.ledger.decode_busy_s(self.step)
        if predicted > 0 and measured > 0:
            self.ctx.ledger.count(M.RUNTIME_DECODE_BUSY_S, measured)
            self.ctx.ledger.count(M.RUNTIME_DECODE_BUSY_MODEL_S, predicted)
            self.ctx.clock.observe_time_scale(measured / predicted)


def run_reference(ctx: StepContext, prompts, responses) -> torch.Tensor:
    """Reference log-probs [B*G, T] from the worker the mode names (`WorkerSet.reference_function`)."""
    step = ctx.step
    batch, out = ctx.scratch / f"ref-in-{step}.safetensors", ctx.scratch / f"ref-out-{step}.safetensors"
    wire.write_batch(batch, prompts, responses, torch.zeros(len(responses)), None)
    tries = Attempts(f"reference of step {step}", ctx.config.max_attempts)
    while True:
        h = ctx.workers.reference_function()
        msg = _call(ctx, "reference", h, {"op": "reference", "batch": str(batch), "out": str(out)},
                    "referenced", tries.number)
        if msg is not None:
            # serverless: kept warm for the next step (idle, so a function that must start may evict it), or gone
            ctx.workers.no_work_now(h)
            if h.worker not in ctx.workers.pool.handles:
                ctx.workers.keep_reference(None)
            logp = wire.read_tensors(out)["ref_logp"]
            batch.unlink(missing_ok=True)
            out.unlink(missing_ok=True)
            return logp
        ctx.workers.keep_reference(None)
        tries.failed(running(sent=True, ready_s=h.ready_s))
        death = ctx.policy.on_death("reference")
        if death.whole:  # the dead worker was a pool worker: every worker starts again
            ctx.workers.restart_pool()
            stream = ctx.workers.stream
            if stream is not None:  # the step's learner side holds pool workers that are gone now
                stream.pool_restarted(death.rollout_over)


def _call(ctx: StepContext, kind: str, h, msg: dict, reply_op: str, attempt: int) -> dict | None:
    """One invocation of a single-worker function: send, wait for `reply_op`, record it. A worker that dies (or
    is found dead on sending) is recorded as a failed attempt and reaped; returns None then."""
    step = ctx.step
    requested, cold = now(), ctx.ledger.first_use(h)
    ctx.workers.pool.busy(h)
    try:
        ctx.workers.backend.send(h, msg)
        reply = ctx.workers.await_reply(h, reply_op)
    except WorkerDied:
        reply = None
    if reply is not None:
        ctx.ledger.record(step, kind, h, requested, reply["t_start"], reply["t_end"], cold, attempt)
        return reply
    ctx.ledger.record(step, kind, h, requested, requested, now(), cold, attempt, ok=False)
    ctx.workers.pool.dead(h)
    ctx.ledger.count(M.RUNTIME_RETRIES)
    return None
