"""The learner stage as a stream: each finished GRPO group goes to its learner rank while the rest still decodes.

`LearnerStream` lives for one step: the decode stage calls `group_done(g, ...)` once group g is scored, then
`finish(...)`. The rule it keeps: what a rank computes is fixed by group index (`plan.schedule.microbatches`) and
shares are summed in rank order, so the update is bitwise the same however groups arrive, in either mode. A
serverless rank writes its share to the scratch tmpfs and leaves; the last one in reduces (`_finish_shares`).
Units, messages and faults: docs/internals.md#runtimestreamingpy.

Deviations from the paper (its learner is one FSDP function started after the rollout):
1. Finished groups stream into the learner ranks during decode (docs/architecture.md, "Overlap").
2. While streaming, the ranks run the reference forward (a reference function would need a spare unit).
3. The hybrid image: a decode function that finishes goes on warm as a learner rank.
4. Separate images (the paper's design): a rank's function is kept warm for a later step's rank only when holding
   it through the rollout bills less than the cold start it saves (`plan.lifecycle.hold_pays`), and the next
   step's decode pre-warm is retried into the units ranks free at their shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlhfless.core import metrics as M
from rlhfless.plan import lifecycle
from rlhfless.plan.ranks import reducer, release_after_share
from rlhfless.plan.schedule import microbatches
from rlhfless.runtime import wire
from rlhfless.runtime.attempts import Attempts, running
from rlhfless.runtime.platform.backend import WorkerDied
from rlhfless.runtime.context import StepContext
from rlhfless.runtime.devices.dist import reserve_port
from rlhfless.runtime.records import now


@dataclass
class _Rank:
    """One learner rank of this step: its worker and what it was sent."""

    rank: int
    groups: list[int]
    handle: object = None
    begun: bool = False
    sent: set[int] = field(default_factory=set)
    requested: float = 0.0
    cold: bool = False
    ended: bool = False
    tries: Attempts | None = None
    """The attempts of this rank's work (`runtime.attempts`: only its own failures while it runs use one)."""
    shared: bool = False
    """Serverless: its share of the update is written (`dist.share_all_reduce`); it is no rank of the step any
    more (released, or kept warm for its keep-alive) and its share stays valid whatever happens after."""

    def reset(self) -> None:
        """No worker any more: the rank starts over (a new worker gets learn_begin and every group again)."""
        self.handle, self.begun, self.sent, self.requested, self.ended = None, False, set(), 0.0, False


def early_share(group_busy: list[list[list[float]]], rollout_end: float) -> float:
    """Share of the learner ranks' group compute seconds finished by `rollout_end` (the last decode function's
    end): what overlap hid under the rollout. group_busy: per rank, its groups' [start, end) compute intervals
    (any clock, the same as rollout_end's). 0 when nothing was computed. Pure."""
    spans = [(a, b) for rank in group_busy for a, b in rank]
    total = sum(b - a for a, b in spans)
    early = sum(max(0.0, min(b, rollout_end) - a) for a, b in spans)
    return early / total if total > 0 else 0.0


class LearnerStream:
    def __init__(self, ctx: StepContext, prompts: list[list[int]], seed: int, overlap: bool):
        # ctx: what the stream reads, and the collaborators (workers, ledger, weights, clock) that own what it changes
        self.ctx, self.step, self.prompts, self.seed = ctx, ctx.step, prompts, seed
        self.overlap = overlap
        self.G = ctx.cfg.algo.group_size
        world = ctx.policy.learner_world(ctx.config)
        self.plan = microbatches(len(prompts), ctx.config.learner_microbatch_groups, world)
        self.ranks = [_Rank(r, [g for c in chunks for g in c],
                            tries=Attempts(f"learner rank {r} of step {self.step}", ctx.config.max_attempts))
                      for r, chunks in enumerate(self.plan)]
        self.owner = {g: r.rank for r in self.ranks for g in r.groups}
        self.with_ref = ctx.cfg.algo.kl_coef > 0
        self.finished: dict[int, tuple[list[list[int]], list[float]]] = {}
        self.files: dict[int, str] = {}
        self.ref: torch.Tensor | None = None
        self.generation = 1
        """Bumped whenever a death resets ranks: a loop that sent to the old workers starts over."""
        self.rollout_end: float | None = None
        self.prewarm_due = False
        self.starting_all = False  # finish: every rank starts now (all groups are in)
        self.first_share: float | None = None  # serverless: when the step's first share came in
        self.held: list = []  # serverless: functions whose share is in, held to the update's end (`_shared`)
        # serverless ranks end with shares (`_finish_shares`), emulated ones too (`EmulatedWorker._learn_share`); the
        # pool ends together in its gloo group
        self.shares = ctx.policy.traits.ranks_leave_at_share
        self._decode_pw: tuple[float, tuple | None] = (0.0, None)  # (since, next_decode_prewarm) while finishing
        self._end: dict = {}
        self._adopt_warm()

    def _adopt_warm(self) -> None:
        """Which functions hold the ranks as the step starts: the mode's policy decides (the pool's workers, or
        the last step's learner functions kept warm: `ModePolicy.learner_ranks`, carried out by the worker set)."""
        seats = self.ctx.workers.seat_learners(len(self.ranks))
        for r, h in zip(self.ranks, seats.handles):
            r.handle = h
            if seats.warm:  # invoked now: a kept function's request and cold start are this step's
                r.requested, r.cold = now(), self.ctx.ledger.first_use(h)

    # -- feeding ------------------------------------------------------------------------------------------------
    def handles(self) -> list:
        """The workers that are ranks of this step now (a rank whose share is in has let its worker go)."""
        return [r.handle for r in self.ranks if r.handle is not None and not r.shared]

    def group_done(self, g: int, responses: list[list[int]], rewards: list[float]) -> None:
        """All G rows of group g are scored: hand it to its rank now (overlap) or keep it for `finish`."""
        self.finished[g] = (responses, rewards)
        if self.overlap:
            self.pump()

    def _waiting(self, r: _Rank) -> bool:
        """Whether rank r has finished groups not sent yet: work that can start now."""
        return any(g in self.finished and g not in r.sent for g in r.groups)

    def take(self, h) -> bool:
        """Hybrid image (runtime.hybrid): a decode function whose rows are all done goes on as the rank with the
        most finished groups waiting (ties: the lowest), if any has work that can start now; else False (no
        work now: the caller keeps it for its keep-alive or releases it). It is warm; its policy is at this step's
        version when it decoded this step or was a rank of the last (learn_begin then loads nothing; else it
        loads the state, as any rank behind the version does). A function pre-warmed and not invoked yet runs its
        first invocation here, so the rank carries its cold start."""
        free = [r for r in self.ranks if r.handle is None and (self._waiting(r) or self.starting_all)]
        if not free or not getattr(h, "home", True):  # ranks run on the learner's node (the group binds loopback)
            return False
        r = max(free, key=lambda x: sum(g in self.finished for g in x.groups))
        self._assign(r, h)
        self.pump()
        return True

    def _assign(self, r: _Rank, h) -> None:
        r.handle, r.requested, r.cold = h, now(), self.ctx.ledger.first_use(h)
        self.ctx.workers.pool.busy(h)
        self.ctx.workers.add_learner(h)

    def prewarm(self) -> None:
        """The policy's pre-warm time has come: start ranks ahead of their first group, into free units only;
        ranks that find none start as decode functions release theirs (`pump`)."""
        self.prewarm_due = True
        for r in self.ranks:
            if r.handle is None and not self._start(r, prewarmed=True):
                return

    def pump(self, start_all: bool = False) -> None:
        """Start the ranks that have work (serverless: only onto free units) and send them what is ready. Without
        overlap nothing moves before `finish` (start_all)."""
        if self.prewarm_due and not start_all:
            self.prewarm()
        if not (self.overlap or start_all):
            return
        gen = self.generation
        for r in self.ranks:
            todo = [g for g in r.groups if g in self.finished and g not in r.sent]
            if r.handle is None and (todo or start_all) and not self._start(r, prewarmed=False):
                continue
            if r.handle is None:
                continue
            if not r.begun:
                r.begun = True
                self._send(r, {"op": "learn_begin", "step": self.step, "seed": self.step, "with_ref": self.with_ref,
                               "chunks": self.plan[r.rank], **self.ctx.weights.state_setup()})
            for g in todo:
                if self.generation != gen:
                    break
                self._send(r, {"op": "learn_group", "step": self.step, "g": g, "batch": self._file(g)})
                if self.generation == gen:  # found dead on this send: r was reset onto a new worker, never sent g
                    r.sent.add(g)
            if self.generation != gen:
                # a rank died on a send just now and was reset (a whole restart: every rank, on new workers); what was
                # computed here for the old workers no longer holds, so start over: a new worker gets learn_begin
                # before any group (never a group first, which it could not add to an update it does not have)
                return self.pump(start_all)

    def _start(self, r: _Rank, prewarmed: bool) -> bool:
        """A worker for rank r: a warm idle hybrid function (kept alive: no cold start), else a
        new one onto a free unit. Invoked from its start: nothing may evict it (`preempt` may); until its groups
        come it is held but idle (the meter counts only its compute intervals as busy)."""
        ctx = self.ctx
        # a warm function of the learner's image, kept from an earlier step (`plan.lifecycle`: reuse), when no
        # group binds it to its old rank (ranks that leave at their share); a hybrid one only for work that
        # waits (pre-warmed, the rank would take a decode function that may still get cut rows)
        reuse = ctx.hybrid or ctx.policy.traits.ranks_leave_at_share
        warm = [h for h in ctx.workers.pool.warm_idle(ctx.workers.image("learner"))
                if getattr(h, "home", True)] if reuse else []
        h = warm[0] if warm and (not prewarmed or not ctx.hybrid) else ctx.workers.start_learner(prewarmed)
        if h is None:
            return False
        self._assign(r, h)
        return True

    def _file(self, g: int) -> str:
        if g not in self.files:
            responses, rewards = self.finished[g]
            # None with overlap: the rank runs the group's reference forward itself (learn_group)
            ref = self.ref[g * self.G:(g + 1) * self.G] if self.with_ref and self.ref is not None else None
            path = self.ctx.scratch / f"group-{self.step}-{g}.safetensors"
            wire.write_batch(path, [self.prompts[g]], responses, torch.tensor(rewards), ref)
            self.files[g] = str(path)
        return self.files[g]

    def _send(self, r: _Rank, msg: dict) -> None:
        if r.requested == 0.0:
            r.requested = now()
        try:
            self.ctx.workers.backend.send(r.handle, msg)
        except WorkerDied:
            self.on_death(r.handle, sent=msg["op"] != "learn_begin")

    # -- messages and faults ------------------------------------------------------------------------------------
    def owns(self, h) -> bool:
        return any(r.handle is h and not r.shared for r in self.ranks)

    def on_message(self, h, msg: dict | None) -> dict | None:
        """A message (None: death) from one of this stream's ranks; returns a `learned` reply, else None."""
        if msg is None:
            self.on_death(h)
            return None
        if msg["op"] == "ready":
            self.ctx.workers.on_ready(h, msg)
        elif msg["op"] == "learned" and msg.get("step") == self.step:
            return msg
        return None

    def on_death(self, h, sent: bool = True) -> None:
        """A rank died (`sent`: False when found dead on sending it its first message). Before the optimiser step
        it restarts alone (its groups are re-sent); after `learn_end` every rank restarts (their gloo group is
        broken). A mode whose deaths restart every worker (`ModePolicy.on_death`): every worker restarts. Only the
        dead rank's attempts can be used, and only if it was running its work (`runtime.attempts`)."""
        ctx = self.ctx
        dead = next(r for r in self.ranks if r.handle is h and not r.shared)
        was_running = running(sent=dead.begun and sent, ready_s=h.ready_s)
        # a death after learn_end breaks a group that ends together; serverless shares need none
        ending = not self.shares and any(r.ended for r in self.ranks)
        ctx.ledger.count(M.RUNTIME_RETRIES)
        death = ctx.policy.on_death("learner")
        whole = death.whole
        victims = self.ranks if ending or whole else [dead]
        for r in victims:
            if r.handle is not None:
                self._drop(r, dead=r is dead, stop=ending, whole=whole)
        self.generation += 1
        dead.tries.failed(was_running)
        if whole:
            ctx.workers.restart_pool(dead=h)
            return self.pool_restarted(death.rollout_over)
        for r in victims:
            r.reset()

    def _drop(self, r: _Rank, dead: bool, stop: bool = False, whole: bool = False, **extra) -> None:
        """Record the rank's unfinished invocation and let its worker go (`whole`: leave it to the restart of every
        worker the mode decided on this death, `ModePolicy.on_death`). `stop`: a survivor of a death after learn_end
        is ended at once, not asked to shut down: it waits inside the group's rendezvous or broken all-reduce and
        would read `shutdown` only at gloo's timeout (the driver stalled 5 s per survivor before killing it)."""
        ctx = self.ctx
        ctx.ledger.record(self.step, "learner", r.handle, r.requested or now(), r.requested or now(), now(), r.cold,
                   r.tries.number, ok=False, **extra)
        if not whole:
            if dead:
                ctx.workers.pool.dead(r.handle)
            else:
                ctx.workers.pool.stop(r.handle) if stop else ctx.workers.pool.release(r.handle)
        ctx.workers.drop_learner(r.handle)

    def preempt(self) -> bool:
        """Free a unit for decode work that must start (rows with nowhere else to go): release a rank that has
        not reached the optimiser step; it restarts later and its groups are recomputed. False if none."""
        if not self.ctx.policy.traits.preempts_learners:
            return False
        for r in reversed(self.ranks):
            if r.handle is not None and not r.ended and not r.shared:
                self._drop(r, dead=False, preempted=1)
                r.reset()
                return True
        return False

    def pool_restarted(self, from_step_start: bool = False) -> None:
        """Serverful: the pool restarted whole (a worker died), so every rank starts over on the new workers from
        the step's starting state; `from_step_start`: the rollout starts over too, so no group is finished yet."""
        for r in self.ranks:
            r.reset()
        if from_step_start:
            self.finished.clear()
        self._adopt_warm()

    # -- the optimiser step -------------------------------------------------------------------------------------
    def finish(self, responses: list[list[int]], rewards: torch.Tensor, ref_logp: torch.Tensor | None
               ) -> dict[str, float]:
        """Send every remaining group and the optimiser step; returns rank 0's metrics once every rank is done."""
        ctx = self.ctx
        self.rollout_end = self.rollout_end or now()
        self.starting_all = True
        self.ref = ref_logp
        for g in range(len(self.prompts)):
            if g not in self.finished:
                self.finished[g] = (responses[g * self.G:(g + 1) * self.G],
                                    rewards[g * self.G:(g + 1) * self.G].tolist())
        end = self._end = {"op": "learn_end", "step": self.step, "rewards": rewards.tolist(),
                           "lengths": [len(r) for r in responses]}
        if not self.shares:
            while True:
                replies = self._finish_once(end)
                if replies is not None:
                    break
            for r in self.ranks:
                self._record(r, replies[r.rank])
            metrics = replies[0]["metrics"]
        else:
            replies, metrics = self._finish_shares(end)
        ctx.ledger.count(M.RUNTIME_LEARNER_EARLY,
                         early_share([x["group_busy"] for x in replies.values()], self.rollout_end))
        ctx.ledger.count(M.RUNTIME_LEARNER_TAIL_S, now() - self.rollout_end)
        ctx.ledger.count(M.RUNTIME_LEARNER_BUFFERED, float(max(x["buffered_peak"] for x in replies.values())))
        for path in self.files.values():
            Path(path).unlink(missing_ok=True)
        for r in self.ranks:
            self._share_path(r.rank).unlink(missing_ok=True)
        return metrics

    def _record(self, r: _Rank, reply: dict) -> None:
        self.ctx.ledger.record(self.step, "learner", r.handle, r.requested, reply["t_start"], reply["t_end"], r.cold,
                            r.tries.number, sync_s=reply["sync_s"], compute_s=reply["compute_s"], groups=r.groups,
                            busy=reply["busy"])

    # -- serverless: shares through files, reduced by the last rank -----------------------------------------------
    def _share_path(self, rank: int) -> Path:
        return self.ctx.scratch / f"share-{self.step}-{rank}.safetensors"

    def _finish_shares(self, end: dict) -> tuple[dict[int, dict], dict[str, float]]:
        """Every rank writes its share as soon as its groups are done and, all but the last, goes at once
        (`_shared`); the last one in sums the shares in rank order and steps (the same sum as the serverful
        pool's all-reduce: bitwise equal updates). Returns (each rank's share reply, the update's metrics)."""
        ctx, world = self.ctx, len(self.ranks)
        replies: dict[int, dict] = {}
        order: list[int] = []
        self._decode_pw = (now(), ctx.clock.next_decode_prewarm())  # timed from here, the start of the learner's end
        while len(replies) < world:
            self._start_missing()
            gen = self.generation
            for r in self.ranks:
                if r.shared or r.ended or r.handle is None:
                    continue
                r.ended = True
                self._send(r, {**end, **ctx.weights.state_setup(), "share": {"rank": r.rank, "world": world,
                                                                     "out": str(self._share_path(r.rank))}})
                if self.generation != gen:  # that rank was found dead and reset: the next pass restarts it
                    break
            for h, msg in ctx.workers.poll(self._watch(), self._prewarm_decode()):
                if not self.owns(h):
                    self._other(h, msg)
                    continue
                reply = self.on_message(h, msg)
                if reply is None:
                    continue
                r = next(x for x in self.ranks if x.handle is h and not x.shared)
                replies[r.rank] = reply
                order.append(r.rank)
                if len(replies) < world:  # the last share in is not let go: that rank reduces
                    self._shared(r, reply, len(order) == 1)
            late = [r for r in self.ranks if r.ended and not r.shared and r.handle is not None
                    and now() - r.requested > ctx.config.invocation_timeout_s]
            for r in late[:1]:  # over time: killed, so its death re-runs it
                ctx.workers.backend.kill(r.handle)
        last = self.ranks[reducer(order)]
        reply = self._reduce(last, replies[last.rank])
        self._prewarm_decode(final=True)
        return replies, reply["metrics"]

    def _prewarm_decode(self, final: bool = False) -> float:
        """Start the next step's decode functions when the policy's pre-warm time (since the learner's end began)
        has come, into free units only, and again at every later poll until as many are warm or starting as the
        next rollout needs (a rank released at its share frees a unit: `_shared`); the poll timeout until then."""
        t0, pw = self._decode_pw
        if pw is not None and (final or now() >= t0 + pw[0]):
            # the functions the next rollout will find warm count against it (`plan.lifecycle`: a pre-warm only
            # for what keep-alive does not already keep); the rest retried as units free up, a rank's at its share
            pool = self.ctx.workers.pool
            warm = [h for h in pool.warm(self.ctx.workers.image("decode")) if h.worker not in pool.working]
            need = pw[1] - len(warm) - len(self.held)
            started = self.ctx.workers.start_decoders(max(0, need), prewarmed=True)
            left = need - len(started)
            self._decode_pw = (t0, None if left <= 0 or final else (pw[0], pw[1]))
            return 1.0
        # wake at the pre-warm time, and at least every second: the callers check invocation timeouts between polls
        return 1.0 if pw is None else max(0.0, min(1.0, t0 + pw[0] - now()))

    def _start_missing(self) -> None:
        """After the rollout every rank without a worker starts now (evicting idle capacity when none is free)."""
        self.pump(start_all=True)
        while any(r.handle is None and not r.shared for r in self.ranks):
            if not self.ctx.workers.pool.make_room(1):
                raise RuntimeError("runtime: no free unit for a learner rank after the rollout (a bug: only "
                                   "this step's learner ranks are busy now)")
            self.pump(start_all=True)

    def _shared(self, r: _Rank, reply: dict, first: bool) -> None:
        """Rank r's share is in and it is not the last: its invocation ends here, and its function is released
        now, kept for its keep-alive, or held to the update's end, as the plan's rules say
        (`plan.ranks.release_after_share`, `plan.ranks.hold_after_share`)."""
        ctx = self.ctx
        self._record(r, reply)
        r.shared = True
        if first:
            self.first_share = now()
        ctx.workers.drop_learner(r.handle)
        if ctx.hybrid and ctx.clock.holds_after_share():  # held to the update's end: warm for the next step's decode
            self.held.append(r.handle)  # busy in the pool (billed, no lapse); idled with the ranks (`learn`)
            return
        ctx.workers.pool.idle(r.handle)
        if ctx.hybrid:  # its next work is the next step's decode
            go = release_after_share(ctx.clock.next_work_after_share(), ctx.keep_alive_s)
        else:  # a separate learner image's next work is the next update: held through the rollout only when that
            # bills less than the cold start it saves (`plan.lifecycle.hold_pays`; a pre-warm hides the cold start),
            # and never while the next step's decode pre-warm waits for the unit it would take
            cold = ctx.clock.cold_start("learner", ctx.cfg.plan.cold_start_s)
            go = lifecycle.let_go(ctx.clock.next_learner_work_after_share(), cold, ctx.keep_alive_s) or (
                self._decode_pw[1] is not None and not ctx.workers.pool.free_cores())
        if go:
            ctx.workers.pool.release(r.handle, early=True)
        # else kept warm: a rank of a later step takes it (`_start`), or idle capacity yields to work that waits

    def _reduce(self, r: _Rank, share: dict) -> dict:
        """The last rank in sums every share in rank order, steps and writes the next state version. Its
        invocation runs from its start to the step's end. A death here re-runs the reduction on a fresh function
        (the shares are files: nothing else is recomputed)."""
        ctx, world = self.ctx, len(self.ranks)
        msg = {**self._end, **ctx.weights.state_setup(), "with_ref": self.with_ref,
               "state_out": str(ctx.weights.next_state_path()),
               "share": {"rank": 0, "world": world, "shares": [str(self._share_path(k)) for k in range(world)]}}
        tries = Attempts(f"learner of step {self.step} (its reduction)", ctx.config.max_attempts)
        while True:
            reply = self._reduce_once(r, msg)
            if reply is not None:
                self._record(r, {**share, "t_end": reply["t_end"], "busy": share["busy"] + reply["busy"],
                                 "sync_s": share["sync_s"] + reply["sync_s"]})
                if self.first_share is not None:
                    ctx.clock.observe_share_tail(now() - self.first_share)
                return reply
            ctx.ledger.count(M.RUNTIME_RETRIES)
            tries.failed(running(sent=True, ready_s=r.handle.ready_s))
            if self.held:  # a held function's unit is the first to give up for the reduction
                ctx.workers.pool.release(self.held.pop(), reason="evicted")
            h = ctx.workers.start_learner(prewarmed=False)
            if h is None:
                raise RuntimeError("runtime: no free unit to re-run the learner's reduction")
            r.handle, r.requested, r.cold = h, now(), ctx.ledger.first_use(h)
            ctx.workers.pool.busy(h)

    def _reduce_once(self, r: _Rank, msg: dict) -> dict | None:
        """Send the reduction to r's worker and wait for its reply; None when the worker died."""
        ctx = self.ctx
        try:
            ctx.workers.backend.send(r.handle, msg)
        except WorkerDied:
            ctx.workers.pool.dead(r.handle)
            return None
        t0 = now()
        while True:
            for h, m in ctx.workers.poll(self._watch(), self._prewarm_decode()):
                if h is not r.handle:
                    self._other(h, m)
                elif m is None:
                    ctx.workers.pool.dead(h)
                    return None
                elif m["op"] == "ready":
                    ctx.workers.on_ready(h, m)
                elif m["op"] == "learned" and m.get("step") == self.step:
                    return m
            if now() - t0 > ctx.config.invocation_timeout_s:
                # over time: its death (next poll) re-runs the reduction on a fresh one
                ctx.workers.backend.kill(r.handle)

    def _finish_once(self, end: dict) -> dict[int, dict] | None:
        """One attempt at the optimiser step; None when a rank died (the caller tries again)."""
        ctx = self.ctx
        self.pump(start_all=True)
        while any(r.handle is None for r in self.ranks):  # after the rollout every unit is free but a kept one
            if not ctx.workers.pool.make_room(1):
                raise RuntimeError("runtime: no free unit for a learner rank after the rollout (a bug: only "
                                   "this step's learner ranks are busy now)")
            self.pump(start_all=True)
        # taken after pump: a death inside it restarted the ranks and pump sent the new workers all they need. Taken
        # before, a restart there looked like a death during learn_end, whose first send had already gone to a new
        # rank: it got learn_end twice and crashed on the second (an extra death, an extra retry)
        gen = self.generation
        port, held = reserve_port()  # held until the ranks have joined: every reply is in, or a rank died
        try:
            for r in self.ranks:
                # a group formed when the workers started (`forms_learner_group` false) needs no rendezvous
                dist = {**ctx.workers.dist_spec(r.rank, len(self.ranks), port), "announce": True} \
                    if ctx.policy.traits.forms_learner_group else None
                r.ended = True
                self._send(r, {**end, **ctx.weights.state_setup(), "dist": dist, "leave": ctx.hybrid,
                               "state_out": str(ctx.weights.next_state_path()) if r.rank == 0 else None})
                if self.generation != gen:  # found dead on the send: every rank was reset, the caller tries again
                    return None
                # the others connect once rank 0 listens: early, they are refused and back off (dist.init_group)
                if r.rank == 0 and dist is not None and len(self.ranks) > 1 and not self._await_open(gen):
                    return None
            return self._await_learned(gen)
        finally:
            held.close()

    def _watch(self) -> list:
        """This step's ranks and the workers still starting (a pre-warmed decode function says ready meanwhile)."""
        hs = self.handles()
        return hs + [h for h in self.ctx.workers.pool.live() if h.ready_s is None and h not in hs]

    def _other(self, h, msg: dict | None) -> None:
        """A message from a worker that is not a rank of this step: its ready, or its death (a pre-warmed decode
        worker died: the next rollout starts another)."""
        if msg is None:
            self.ctx.workers.pool.dead(h)
        elif msg["op"] == "ready":
            self.ctx.workers.on_ready(h, msg)

    def _await_open(self, gen: int) -> bool:
        """Wait for rank 0's `rendezvous_open` (it may first finish the groups it was sent); False when a rank
        died meanwhile (the attempt is over)."""
        ctx, rank0 = self.ctx, self.ranks[0].handle
        t0 = now()
        while True:
            for h, msg in ctx.workers.poll(self._watch(), 1.0):
                if h is rank0 and msg is not None and msg["op"] == "rendezvous_open":
                    return True
                if not self.owns(h):
                    self._other(h, msg)
                    continue
                self.on_message(h, msg)
                if self.generation != gen:
                    return False
            if now() - t0 > ctx.config.invocation_timeout_s:
                ctx.workers.backend.kill(rank0)  # over time: its death resets every rank and ends this attempt

    def _await_learned(self, gen: int) -> dict[int, dict] | None:
        """Every rank's `learned` reply by rank (None when a rank died), pre-warming the next decode meanwhile."""
        ctx = self.ctx
        replies: dict[int, dict] = {}
        t0 = now()
        pw = ctx.clock.next_decode_prewarm()
        while len(replies) < len(self.ranks):
            if pw is not None and now() >= t0 + pw[0]:
                ctx.workers.start_decoders(pw[1], prewarmed=True)  # into free units only
                pw = None
            # wake at the pre-warm time, and at least every second for the timeout check below
            timeout = 1.0 if pw is None else max(0.0, min(1.0, t0 + pw[0] - now()))
            for h, msg in ctx.workers.poll(self._watch(), timeout):
                if not self.owns(h):
                    self._other(h, msg)
                    continue
                reply = self.on_message(h, msg)
                if self.generation != gen:
                    return None
                if reply is not None:
                    replies[next(r.rank for r in self.ranks if r.handle is h)] = reply
            if now() - t0 > ctx.config.invocation_timeout_s:
                # over time: one kill is enough, a death after learn_end resets every rank and the update is tried again
                ctx.workers.backend.kill(self.ranks[0].handle)
        if pw is not None:  # the update ended before the pre-warm time: the next rollout needs them now
            ctx.workers.start_decoders(pw[1], prewarmed=True)
        return replies
