"""PPO's stages in the runtime (algo.name=ppo): the value function, and the actor and critic updates side by side.

Rollout and reference are GRPO's (the rollout without streaming: PPO whitens over the whole batch);
`PpoStream.values` runs the critic image's forward, `PpoStream.finish` the actor and critic functions at once
(the critic starts once the actor has written the returns). The rule it keeps: a function that dies is re-run on
a fresh worker from the same files (state version k, batch, values, returns), so the update is the same.
Which worker plays which role, per mode: docs/internals.md#runtimeppo_stagespy.

Ranks (`runtime.learner_units`, `RuntimeConfig.ppo_ranks`; 0 = one each): the actor and the critic are data-parallel
over W ranks each (`ppo_update`'s `shard=`). Serverful: W = 1 (the actor on pool worker 0, the critic on the last) or
every pool worker, each an actor rank and a critic rank in the pool's group, run one after the other as verl's
colocated workers run them. Serverless: W actor functions and W critic functions, each role a gloo group of its own
per update (`dist`): actor ranks 1.. are taken as the value forward starts, critic ranks start once the returns are
written and a unit is free (the actor's ranks free theirs as they reply); a rank's death re-runs its whole role.

Deviations:
1. From the paper: its actor is FSDP over several devices; here the ranks are data-parallel replicas (every rank
   holds the whole model and AdamW).
2. From verl: the value forward is its own function after the reference forward, not on the critic's workers, and
   it is not split across ranks (one value function); the actor's old log-prob forward is (`shard_old_logprobs`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlhfless.core import metrics as M
from rlhfless.learn.critic import value_chunks
from rlhfless.learn.ppo_update import needs_old_logprobs
from rlhfless.runtime import wire
from rlhfless.runtime.attempts import Attempts, running
from rlhfless.runtime.platform.backend import WorkerDied
from rlhfless.runtime.context import StepContext
from rlhfless.runtime.records import CRITIC_IMAGE, now


ROLE_NAMES = {"learner": "PPO actor", "critic": "PPO critic", "values": "value function"}
"""A PPO function's name in the error of a step out of attempts, by invocation kind."""
REPLY_ROLES = {"ppo_learned": "learner", "critic_learned": "critic"}
"""The update's reply ops and the role each completes."""


class PpoStream:
    """The learner side of one PPO step; the decode stage talks to it as to GRPO's `LearnerStream`."""

    def __init__(self, ctx: StepContext, prompts: list[list[int]]):
        # ctx: what the stream reads, and the collaborators (workers, ledger, weights, clock) that own what it changes
        self.ctx, self.step, self.prompts = ctx, ctx.step, prompts
        ctx = self.ctx
        self.G = ctx.cfg.algo.group_size
        self.overlap = ctx.overlap  # the value forward's chunks stream into the value function during decode
        self.chunks = value_chunks(len(prompts), self.G, ctx.cfg.critic.values_chunk)
        self.finished: dict[int, list[list[int]]] = {}
        self.sent: set[int] = set()  # chunks the current value function has been sent
        self.streamed: set[int] = set()  # ... of which while some group still decoded
        self.values_requested: tuple[float, bool] | None = None  # (first chunk sent, cold) of its invocation
        self.values_tries = self.tries("values")
        self.actor = None
        self.critic = None
        self.rollout_end: float | None = None
        self.prewarm_due = False
        self.working = False  # the update was sent: neither worker may be preempted any more
        self.actor_requested: tuple | None = None  # (worker, when, cold): the actor's invocation began (take, start)
        self.actor_tries = self.tries("learner")
        self.files: set[Path] = set()
        self.early: dict[int, object] = {}  # serverless actor ranks 1.. taken during the value forward (`_early_ranks`)
        if ctx.policy.ppo_rank("learner", 0).held:  # the actor and the critic are held pool workers: set now
            self.pool_restarted()

    # -- the decode stage's side (LearnerStream's interface) ----------------------------------------------------
    def _live(self, h) -> bool:
        return h is not None and h.worker in self.ctx.workers.pool.handles

    def group_done(self, g: int, responses: list[list[int]], rewards) -> None:
        """All G rows of group g are scored: with overlap, a chunk whose groups are all in goes to the value
        function now (the update itself needs the whole batch)."""
        self.finished[g] = responses
        if self.overlap:
            self.pump()

    def take(self, h) -> bool:
        """Hybrid image: the last decode function to finish goes on as the actor (warm, at the step's version)."""
        ctx = self.ctx
        if self._live(self.actor) or not getattr(h, "home", True):
            return False
        pool = ctx.workers.pool
        if any(x is not h and "decode" in x.kinds and x.worker in pool.working for x in pool.live()):
            return False  # others still decode: an actor taken now would sit idle, billed, through the tail
        self.actor = h
        # its time from here on is the actor's (as GRPO's ranks)
        self.actor_requested = (h, now(), ctx.ledger.first_use(h))
        ctx.workers.pool.busy(h)
        return True

    def prewarm(self) -> None:
        """The learner pre-warm is due: the critic image goes into a free unit (the value forward comes first). Due
        only where the mode pre-warms (`ModePolicy.prewarms`, `StepClock.learner_prewarm_after`), so only where
        roles are functions started for their work: a held pool has nothing to pre-warm."""
        self.prewarm_due = True
        ctx = self.ctx
        if not self._live(self.critic) and not ctx.workers.pool.warm(CRITIC_IMAGE):
            ctx.workers.start_critic(must=False, prewarmed=True)

    def pump(self) -> None:
        """Pre-warm when due; with overlap, send the value function every chunk whose groups are all in (starting
        it onto a free unit: none free, the chunks wait for a decode function to release one)."""
        if self.prewarm_due:
            self.prewarm()
        if not self.overlap:
            return
        ready = [k for k, gs in enumerate(self.chunks) if k not in self.sent and all(g in self.finished for g in gs)]
        if ready:
            h = self._critic_worker(must=False)
            for k in ready:
                if h is None or not self._send_chunk(h, k):
                    return

    def handles(self) -> list:
        hs = [h for h in (self.actor, self.critic) if self._live(h)]
        return hs[:1] if len(hs) == 2 and hs[0] is hs[1] else hs  # a pool of one worker: it holds both roles

    def owns(self, h) -> bool:
        return h is not None and (h is self.actor or h is self.critic)

    def on_message(self, h, msg: dict | None) -> None:
        if msg is None:
            return self._critic_lost(h, dead=True) if h is self.critic else self._actor_lost(h, dead=True)
        if msg["op"] == "ready":
            self.ctx.workers.on_ready(h, msg)

    def _actor_lost(self, h, dead: bool) -> None:
        """The actor died (or was preempted) before its update was sent: its invocation so far is recorded as a
        failed attempt (a death counts a retry); the update goes to a new actor."""
        ctx = self.ctx
        if self.actor_requested is not None and self.actor_requested[0] is h:
            self._lost_attempt("learner", h, self.actor_requested[1:], self.actor_tries, dead)
            self.actor_requested = None
        ctx.workers.pool.dead(h) if dead else ctx.workers.pool.release(h)
        self.actor = None if h is self.actor else self.actor

    def tries(self, kind: str) -> Attempts:
        """The attempts of this step's `kind` work (`runtime.attempts`)."""
        return Attempts(f"{ROLE_NAMES[kind]} of step {self.step}", self.ctx.config.max_attempts)

    def _lost_attempt(self, kind: str, h, requested: tuple[float, bool], tries: Attempts, dead: bool,
                      retry: bool = True, charged: bool = True) -> None:
        """Record the invocation of `kind` that h held since `requested` (when, cold) as failed, preempted unless
        `dead`; a death counts a retry (unless the caller counts it: `retry`) and, when h was running the work
        (`charged`: not a survivor of a pool restarted for another worker's death), uses one of its attempts
        (`runtime.attempts`: past runtime.max_attempts the step ends)."""
        ctx = self.ctx
        extra = {"preempted": 1} if not dead else {} if charged else {"restarted": 1}
        ctx.ledger.record(self.step, kind, h, requested[0], requested[0], now(), requested[1], tries.number, ok=False,
                   **extra)
        if not dead:
            return
        if retry:
            ctx.ledger.count(M.RUNTIME_RETRIES)
        if charged:
            tries.failed(running(sent=True, ready_s=getattr(h, "ready_s", None)))

    def preempt(self) -> bool:
        """Free a unit for decode work that must start: the actor taken early goes (it starts again later), else
        a value function taking streamed chunks (its chunks are sent again to the next one)."""
        if not self.ctx.policy.traits.preempts_learners or self.working:
            return False
        for r, h in list(self.early.items()):  # an actor rank waiting for the update goes first (it starts again)
            if self._live(h):
                del self.early[r]
                self.ctx.workers.pool.release(h)
                return True
        if self._live(self.actor):
            self._actor_lost(self.actor, dead=False)
            return True
        if self._live(self.critic):
            self._critic_lost(self.critic, dead=False)
            return True
        return False

    def pool_restarted(self, from_step_start: bool = False) -> None:
        """The held workers (re)started: pool worker 0 is the actor, the last the critic; nothing was sent yet
        (`from_step_start`: the rollout starts over too, so no group is finished yet)."""
        if from_step_start:
            self.finished.clear()
        hs = self.ctx.workers.pool_workers()
        self.actor, self.critic = hs[0], hs[-1]
        self.sent, self.streamed, self.values_requested, self.actor_requested = set(), set(), None, None

    # -- values -------------------------------------------------------------------------------------------------
    def _file(self, name: str) -> Path:
        path = self.ctx.scratch / f"ppo-{name}-{self.step}.safetensors"
        self.files.add(path)
        return path

    def held_worker(self, role: str, rank: int = 0):
        """The held pool worker of `role` when the policy starts no functions: with one rank, worker 0 the actor
        and the last the critic; with several, pool worker r holds rank r of both. One found dead restarts the
        pool whole."""
        if not all(self._live(h) for h in self.ctx.workers.pool_workers()):
            self.ctx.workers.restart_pool()
            self.pool_restarted()
        if self.ctx.config.ppo_ranks() > 1:
            return self.ctx.workers.pool_workers()[rank]
        return self.actor if role == "learner" else self.critic

    def _critic_worker(self, must: bool):
        """The value function: this step's, one kept warm or pre-warmed, else a new one (must: evicting idle
        workers; otherwise only onto a free unit, or None); the held critic worker where the mode seats the critic
        on the pool (`ModePolicy.ppo_rank`)."""
        if self.ctx.policy.ppo_rank("critic", 0).held:
            return self.held_worker("critic")
        if self._live(self.critic):
            return self.critic
        warm = self.ctx.workers.pool.warm(CRITIC_IMAGE)
        for h in warm[1:]:
            self.ctx.workers.pool.release(h)
        self.critic = warm[0] if warm else self.ctx.workers.start_critic(must=must)
        if self.critic is not None:
            self.ctx.workers.pool.busy(self.critic)  # invoked from now on: nothing may evict it (`preempt` may)
        return self.critic

    def _send_chunk(self, h, k: int) -> bool:
        """Chunk k to the value function h; False when h was found dead (its chunks go to the next one)."""
        gs = self.chunks[k]
        path = self.ctx.scratch / f"ppo-chunk-{self.step}-{k}.safetensors"
        if path not in self.files:
            self.files.add(path)
            responses = [r for g in gs for r in self.finished[g]]
            wire.write_batch(path, [self.prompts[g] for g in gs], responses, torch.zeros(len(responses)), None)
        if self.values_requested is None:
            self.values_requested = (now(), self.ctx.ledger.first_use(h))
        try:
            self.ctx.workers.backend.send(h, {"op": "values_chunk", "step": self.step, "k": k, "batch": str(path),
                                      **self.ctx.weights.critic_setup()})
        except WorkerDied:
            self._critic_lost(h, dead=True)
            return False
        self.sent.add(k)
        if len(self.finished) < len(self.prompts):  # sent while some group still decodes
            self.streamed.add(k)
        return True

    def _critic_lost(self, h, dead: bool) -> None:
        """The value function died (or was preempted) holding chunks: recorded as a failed attempt; the next one
        is sent every chunk again (a mode whose deaths restart every worker: `ModePolicy.on_death`)."""
        ctx = self.ctx
        if self.values_requested is not None:
            self._lost_attempt("values", h, self.values_requested, self.values_tries, dead)
        self.sent, self.streamed, self.values_requested, self.critic = set(), set(), None, None
        if ctx.policy.on_death("critic").whole:
            ctx.workers.restart_pool(dead=h if dead else None)
            self.pool_restarted()
        else:
            ctx.workers.pool.dead(h) if dead else ctx.workers.pool.release(h)

    def values(self, responses: list[list[int]]) -> torch.Tensor:
        """[B*G, T] the critic's values of the rollout: the chunks not streamed yet, then `values_end` (the
        critic update follows on the same worker)."""
        ctx = self.ctx
        for g in range(len(self.prompts)):
            self.finished.setdefault(g, responses[g * self.G:(g + 1) * self.G])
        self.values_file = self._file("values")
        if not ctx.policy.ppo_rank("learner", 0).held and not self._live(self.actor):
            self.actor = ctx.workers.start_learner(prewarmed=False)  # its cold start overlaps the value forward
            if self.actor is not None:
                self.actor_requested = (self.actor, now(), ctx.ledger.first_use(self.actor))
                ctx.workers.pool.busy(self.actor)  # invoked from its start: nothing may evict it while it loads
        self._old_ahead(responses)
        self._early_ranks()
        while True:  # until a value function replies: one found dead is replaced and sent every chunk again
            h = self._critic_worker(must=True)
            if all(self._send_chunk(h, k) for k in range(len(self.chunks)) if k not in self.sent):
                reply = self._values_end(h)
                if reply is not None:
                    ctx.ledger.count(M.RUNTIME_VALUES_STREAMED, float(len(self.streamed)))
                    return wire.read_tensors(self.values_file)["values"]

    def _early_ranks(self) -> None:
        """Several actor ranks, serverless: ranks 1.. are taken when the value forward starts, as rank 0 is, so their
        cold starts overlap it: idle warm functions of the learner's image first (hybrid: decode functions kept
        alive), then new ones onto free units only (a rank that finds none starts with the update,
        `_Update._function`; work that must start preempts a waiting rank first, `preempt`). Taken from the
        learner pre-warm on instead, the 7B testbed's step was no shorter (the last rank waits for the value
        function's unit and cold-starts then, whatever the others do) and billed 9% more (ranks held idle)."""
        ctx, W = self.ctx, self.ctx.config.ppo_ranks()
        pool = ctx.workers.pool
        taken = {h.worker for h in (self.actor, self.critic, *self.early.values()) if self._live(h)}
        for r in range(1, W):
            if ctx.policy.ppo_rank("learner", r).held or self._live(self.early.get(r)):
                continue  # held: the pool worker is the rank already
            warm = [h for h in pool.warm_idle(ctx.workers.image("learner")) if h.worker not in taken]
            h = warm[0] if warm else ctx.workers.start_learner(prewarmed=True)
            if h is None:
                return
            pool.busy(h)  # invoked from now on: nothing may evict it while it waits for the update
            self.early[r] = h
            taken.add(h.worker)

    def _old_ahead(self, responses: list[list[int]]) -> None:
        """The actor computes the old log-probs while the value function runs (verl computes them in the same
        phase); its invocation starts now. A death is handled when the update is sent."""
        ctx, h = self.ctx, self.actor
        if not self._live(h) or not needs_old_logprobs(ctx.cfg.algo, len(responses)) or ctx.config.ppo_ranks() > 1:
            return  # several ranks: they split the forward inside the update (`shard_old_logprobs`)
        path = self._file("old")
        wire.write_batch(path, self.prompts, responses, torch.zeros(len(responses)), None)
        if self.actor_requested is None or self.actor_requested[0] is not h:
            self.actor_requested = (h, now(), ctx.ledger.first_use(h))
        try:
            ctx.workers.backend.send(h, {"op": "ppo_old", "step": self.step, "batch": str(path),
                                         **ctx.weights.state_setup()})
        except WorkerDied:
            pass

    def _values_end(self, h) -> dict | None:
        ctx = self.ctx
        try:
            ctx.workers.backend.send(h, {"op": "values_end", "step": self.step, "n_chunks": len(self.chunks),
                                 "out": str(self.values_file)})
            reply = ctx.workers.await_reply(h, "valued")
        except WorkerDied:
            reply = None
        if reply is None:
            self._critic_lost(h, dead=True)
            return None
        requested, cold = self.values_requested
        ctx.ledger.record(self.step, "values", h, requested, reply["t_start"], reply["t_end"], cold,
                          self.values_tries.number, sync_s=reply["sync_s"], compute_s=reply["compute_s"],
                          chunks=len(self.chunks))
        return reply

    # -- the update ---------------------------------------------------------------------------------------------
    def finish(self, responses: list[list[int]], rewards: torch.Tensor, ref_logp: torch.Tensor | None
               ) -> dict[str, float]:
        """The actor and the critic update, side by side; the metrics of both once both are done."""
        ctx = self.ctx
        self.rollout_end = self.rollout_end or now()
        batch, returns = self._file("batch"), self._file("returns")
        wire.write_batch(batch, self.prompts, responses, rewards, ref_logp)
        common = {"step": self.step, "batch": str(batch), "values": str(self.values_file), "returns": str(returns),
                  "seed": ctx.cfg.train.seed, "updates": ctx.weights.updates_done()}
        update = _Update(self, {**common, "op": "ppo_actor", "returns_out": str(returns), **ctx.weights.state_setup(),
                                "state_out": str(ctx.weights.next_state_path())},
                         {**common, "op": "critic_learn", **ctx.weights.critic_setup(),
                          "critic_out": str(ctx.weights.next_critic_path())})
        self.working = True
        replies = update.run()
        for path in self.files:
            path.unlink(missing_ok=True)
        ctx.ledger.count(M.RUNTIME_LEARNER_TAIL_S, now() - self.rollout_end)
        return {**replies["learner"]["metrics"], **replies["critic"]["metrics"]}


class _Update:
    """One step's actor and critic invocations over `runtime.learner_units` ranks each (`ppo_ranks`): sent, re-run
    on death, recorded, until every rank of both roles replied. A role's ranks form one data-parallel group: the
    serverful pool's (each pool worker an actor rank and a critic rank, run in turn as verl's colocated workers
    run them), or a group per role and update of serverless functions (`dist`), so a rank's death re-runs its
    whole role on fresh functions from the same files. Keys: (role, rank)."""

    def __init__(self, stream: PpoStream, actor_msg: dict, critic_msg: dict):
        self.s, self.ctx = stream, stream.ctx
        self.msgs = {"learner": actor_msg, "critic": critic_msg}
        self.W = self.ctx.config.ppo_ranks()
        self.sent: dict[tuple[str, int], tuple[object, float, bool]] = {}  # (role, rank) -> (worker, requested, cold)
        self.replies: dict[tuple[str, int], dict] = {}
        self.held: dict[str, list] = {"learner": [stream.early.get(r) for r in range(self.W)],
                                      "critic": [None] * self.W}  # serverless ranks
        self.ports: dict[str, object] = {}  # role -> its group's reserved rendezvous port (serverless, W > 1)
        self.returns_ready = False
        ahead = stream.actor_requested
        if ahead is not None and not stream._live(ahead[0]) and not self.ctx.policy.on_death("learner").whole:
            # died while the value function ran (reaped by its wait): its loss is recorded and a new actor starts
            # (a death that restarts every worker is `_send`'s, which finds it first)
            stream._actor_lost(ahead[0], dead=True)
        self.attempt = {"learner": stream.actor_tries, "critic": stream.tries("critic")}

    def _seat(self, role: str, rank: int, seat):
        """The worker of `role`'s rank where the mode seats it (`seat`, `ModePolicy.ppo_rank`); None while none can
        start (the rank waits for a unit)."""
        if seat.held:
            return self.s.held_worker(role, rank)
        return self.function(role, rank)

    def function(self, role: str, rank: int):
        """Serverless: the function of `role`'s rank (`ModePolicy.ppo_rank`). One rank: the step's actor, else a
        new one (evicting idle workers), and the value function for the critic; several: `_function`."""
        s, ctx = self.s, self.ctx
        if self.W > 1:
            return self._function(role, rank)
        if role == "learner":
            if not s._live(s.actor):
                s.actor = (ctx.workers.start_learner(prewarmed=False)
                           or self._room(lambda: ctx.workers.start_learner(False)))
            return s.actor
        return s._critic_worker(must=True)

    def _function(self, role: str, rank: int):
        """Serverless rank `rank` of `role` (W > 1): the one it holds, rank 0 the step's actor (its old log-probs
        ahead) or value function, else an idle warm function of the role's image, else a new one onto a free unit
        (idle ones evicted for it); None while every unit is busy (the critic's ranks wait for the actor's)."""
        s, w = self.s, self.ctx.workers
        held = self.held[role]
        if rank == 0 and not s._live(held[0]):
            held[0] = s.actor if role == "learner" else s.critic
        if s._live(held[rank]):
            return held[rank]
        image = CRITIC_IMAGE if role == "critic" else w.image("learner")
        taken = {x.worker for hs in self.held.values() for x in hs if s._live(x)}
        warm = [x for x in w.pool.warm_idle(image) if x.worker not in taken]
        start = (lambda: w.start_critic(must=False)) if role == "critic" else (lambda: w.start_learner(False))
        h = warm[0] if warm else start() or (w.pool.make_room(1) and start()) or None
        if h is None and role == "learner" and self._free_value_function():
            h = start()
        if h is not None:
            w.pool.busy(h)  # invoked from its start: nothing may evict it while it loads
            if rank == 0:
                s.actor, s.critic = (h, s.critic) if role == "learner" else (s.actor, h)
        held[rank] = h
        return h

    def _free_value_function(self) -> bool:
        """Every unit is busy and an actor rank must start: the value function, done and owing no critic rank
        yet, is released (critic rank 0 starts again once the actor's ranks free their units)."""
        s, h = self.s, self.s.critic
        if not s._live(h) or any(x is h for x, _, _ in self.sent.values()):
            return False
        self.ctx.workers.pool.release(h, reason="evicted")
        s.critic, self.held["critic"][0] = None, None
        return True

    def _room(self, start):
        if not self.ctx.workers.pool.make_room(1):
            raise RuntimeError("runtime: no free unit for PPO's actor after the rollout (a bug: only the critic "
                               "holds one now)")
        return start()

    def _send(self, role: str) -> None:
        """Every rank of `role` its work; serverless with several ranks, only once all of them hold a unit."""
        dead = next((x for x in self.ctx.workers.pool_workers() if not self.s._live(x)), None) \
            if self.ctx.policy.on_death(role).whole else None
        if dead is not None:  # a pool worker died since the last poll: the restart re-runs the roles still owed
            self._died(dead)
        seats = [self.ctx.policy.ppo_rank(role, r) for r in range(self.W)]
        hs = [self._seat(role, r, seat) for r, seat in enumerate(seats)]
        if any(h is None for h in hs):
            return
        dist = None
        if self.W > 1 and not any(seat.held for seat in seats):  # a group of this role's functions (held workers
            # are in the pool's group, formed when it started)
            from rlhfless.runtime.devices.dist import reserve_port

            port, self.ports[role] = reserve_port()
            dist = [self.ctx.workers.dist_spec(r, self.W, port) for r in range(self.W)]
        for r, h in enumerate(hs):
            ahead = self.s.actor_requested if role == "learner" else None
            self.sent[(role, r)] = ahead if ahead is not None and ahead[0] is h else (h, now(),
                                                                                     self.ctx.ledger.first_use(h))
            if role == "learner" and r == 0:
                self.s.actor_requested = None  # from now on a death is this update's to record
            self.ctx.workers.pool.busy(h)
            msg = {**self.msgs[role], **({"rank": r, "world": self.W} if self.W > 1 else {}),
                   **({"dist": dist[r]} if dist else {})}
            try:
                self.ctx.workers.backend.send(h, msg)
            except WorkerDied:
                return self._died(h)

    def _owed(self, role: str) -> bool:
        return not any(k[0] == role for k in self.sent) and not self._done(role)

    def _done(self, role: str) -> bool:
        return all((role, r) in self.replies for r in range(self.W))

    def run(self) -> dict[str, dict]:
        ctx = self.ctx
        t0 = now()
        pw = ctx.clock.next_decode_prewarm()
        while not (self._done("learner") and self._done("critic")):
            for role in ("learner", "critic"):
                # the critic's update needs the returns, which the actor writes first (`ppo_returns`)
                if self._owed(role) and (role == "learner" or self.returns_ready):
                    self._send(role)
            if pw is not None and now() >= t0 + pw[0]:
                ctx.workers.start_decoders(pw[1], prewarmed=True)  # into free units only
                pw = None
            watch = []
            for h in [h for h, _, _ in self.sent.values()] + [h for h in ctx.workers.pool.live() if h.ready_s is None]:
                if self.s._live(h) and h not in watch:  # a pool of one worker: the actor is the critic
                    watch.append(h)
            # wake at the decode pre-warm time, and at least every second for the timeout check below
            for h, msg in ctx.workers.poll(watch, 1.0 if pw is None else max(0.0, min(1.0, t0 + pw[0] - now()))):
                self._on(h, msg)
            for role, (h, requested, _) in list(self.sent.items()):
                if now() - requested > ctx.config.invocation_timeout_s and self.s._live(h):
                    ctx.workers.backend.kill(h)  # over time: treated as a death on the next poll
        if pw is not None:  # the update ended before the pre-warm time: the next rollout needs them now
            ctx.workers.start_decoders(pw[1], prewarmed=True)
        self._close_ports()
        return {role: self.replies[(role, 0)] for role in ("learner", "critic")}

    def _close_ports(self, role: str | None = None) -> None:
        for r in [role] if role else list(self.ports):
            held = self.ports.pop(r, None)
            if held is not None:
                held.close()

    def _on(self, h, msg: dict | None) -> None:
        ctx = self.ctx
        if msg is None:
            return self._died(h)
        op = msg["op"]
        if op == "ready":
            ctx.workers.on_ready(h, msg)
        elif msg.get("step") != self.s.step:
            return
        elif op == "ppo_returns" and self._holds(h, "learner") == 0:
            self.returns_ready = True
        elif op in REPLY_ROLES and self._holds(h, REPLY_ROLES[op]) is not None:
            role = REPLY_ROLES[op]
            key = (role, self._holds(h, role))
            _, requested, cold = self.sent.pop(key)
            self.replies[key] = msg
            extra = {"old_ahead": float(msg["old_ahead"])} if role == "learner" else {}
            ctx.ledger.record(self.s.step, role, h, requested, msg["t_start"], msg["t_end"], cold,
                              self.attempt[role].number, sync_s=msg["sync_s"], **extra)
            if self.W > 1:  # its part is done: its unit may go to the critic (`ModePolicy.no_work_now`: a function's
                ctx.workers.no_work_now(h)  # keep-alive runs; a held pool worker is held, still the other role's rank)
            if self._done(role):
                self._close_ports(role)

    def _holds(self, h, role: str) -> int | None:
        """The rank of `role` that h was sent and still owes, or None (a message polled together with a death that
        restarted the pool comes from a worker that no longer does)."""
        return next((k[1] for k, (x, _, _) in self.sent.items() if k[0] == role and x is h), None)

    def _died(self, h) -> None:
        """A worker of this update died (or another one: a pre-warmed decode function). Its role is re-run on fresh
        workers, every rank of it (its group broke); a mode whose deaths restart every worker
        (`ModePolicy.on_death`): every worker restarts and the roles still owed re-run. A role whose ranks had all
        replied keeps its results (its files are written)."""
        ctx, s = self.ctx, self.s
        whole = ctx.policy.on_death("learner").whole
        roles = {k[0] for k, (x, _, _) in self.sent.items() if x is h}
        if not roles and not whole:
            if s._live(h):
                ctx.workers.pool.dead(h)
            return
        for key in [k for k in self.sent if whole or k[0] in roles]:
            x, requested, cold = self.sent.pop(key)
            # only the role the dead worker held uses an attempt: the rest restart with it
            s._lost_attempt(key[0], x, (requested, cold), self.attempt[key[0]], dead=True, retry=False,
                            charged=x is h)
            if x is not h and not whole and s._live(x):
                ctx.workers.pool.stop(x)  # a peer in the broken group: its work is redone with the role
        for role in ("learner", "critic"):
            if not self._done(role) and (whole or role in roles):
                for r in range(self.W):
                    self.replies.pop((role, r), None)
                self._close_ports(role)
        ctx.ledger.count(M.RUNTIME_RETRIES)  # one death, one retry (whole: both roles re-run)
        if whole:  # the roles that replied keep their results (their state files are written)
            ctx.workers.restart_pool(dead=h)
            s.pool_restarted()
            return
        ctx.workers.pool.dead(h)
        s.actor = None if h is s.actor else s.actor
        s.critic = None if h is s.critic else s.critic
