"""The worker set: the run's workers on the platform, started, kept and released as the mode decides.

It owns the pool (`platform.pool`: every worker's life and the units budget) and what outlives a step: the
serverful pool's workers, the learner functions kept warm, the reference function kept warm, and the step's
learner stream while it may be preempted for a unit. The rule it keeps: units are a budget, so a function starts
only on a free unit; work that must start evicts idle workers first, then a learner rank that only waits for
groups (it restarts later from the same inputs). It is where the mode's decisions are carried out: a mode returns
each as data (`modes.policy`: `Keep`, `DecodePick`, `AfterDecode`, `LearnerSeats`, `ReferencePick`), and the
methods at the end of `WorkerSet` act on them.
"""

from __future__ import annotations

from rlhfless.runtime.platform.backend import WorkerDied
from rlhfless.runtime.platform.pool import Pool
from rlhfless.runtime.attempts import Attempts
from rlhfless.runtime.modes.policy import Keep, LearnerSeats
from rlhfless.runtime.records import CRITIC_IMAGE, HYBRID, KINDS_ALL, now, role


class WorkerSet:
    """Placement and start / keep / release of the run's functions, on `backend`'s units."""

    def __init__(self, cfg, policy, backend, setup: dict, units: int, t0: float, clock, weights, prefix: str = ""):
        self.cfg, self.rt, self.policy, self.backend, self.units = cfg, cfg.runtime, policy, backend, units
        self.hybrid = policy.hybrid_image(self.rt.hybrid)
        self.fn_units = self.rt.function_units()
        """Units each function holds (`runtime.emulated_tp`: a TP-k function, billed k devices; 1 otherwise)."""
        self.keep_alive_s = self.rt.idle_timeout_s()
        """Idle seconds before a serverless function is released (runtime.keep_alive_s or the billing preset's)."""
        # prefix: the run segment's (`core.rundir.Segment`): worker names unique across resumes
        self.pool = Pool(backend, setup, t0, units, policy.keep_alive(self.keep_alive_s), prefix)
        self.clock, self.weights = clock, weights
        self.ppo = cfg.algo.name == "ppo"
        self.pool_handles: list = []
        self.learners: list = []
        self.reference_worker = None
        self.stream = None  # this step's learner stream (runtime.streaming), from the rollout to the update

    def poll(self, handles: list, timeout: float | None):
        """`backend.poll`, its timeout capped at the next keep-alive lapse, then the lapsed idle workers released:
        keep-alive is an event inside every stage's wait, mid-step included (`Pool.expire`)."""
        lapse = self.pool.next_lapse()
        if lapse is not None:
            wait = max(0.0, lapse - now())
            timeout = wait if timeout is None else min(timeout, wait)
        out = self.backend.poll(handles, timeout)
        self.pool.expire()
        return out

    def await_reply(self, h, op: str) -> dict | None:
        """The reply `op` from h (None if it died or the invocation timed out); other workers' ready messages are
        handled meanwhile."""
        t0 = now()
        while now() - t0 < self.rt.invocation_timeout_s:
            watch = [h] + [x for x in self.pool.live() if x.ready_s is None and x is not h]
            for x, msg in self.poll(watch, 1.0):  # 1 s at most: the invocation timeout is checked without a message
                if msg is None:
                    if x is h:
                        return None
                    self.pool.dead(x)  # a worker still starting (pre-warmed) died: reaped; its stage starts another
                elif msg["op"] == "ready":
                    self.on_ready(x, msg)
                elif x is h and msg["op"] == op:
                    return msg
        return None

    # -- starting functions -------------------------------------------------------------------------------------
    def claim(self, must: bool) -> tuple[int, ...] | None:
        """Free units for a new function (`fn_units` of them). `must` (work is waiting for it): idle workers are
        evicted first, then a learner rank that only waits for groups (it restarts later from the same inputs);
        otherwise None."""
        k = self.fn_units
        cores = self.pool.claim(k)
        if cores is None and must:
            self.pool.make_room(k)
            cores = self.pool.claim(k)
            if cores is None and self.stream is not None and self.stream.preempt():
                cores = self.pool.claim(k)
            if cores is None:
                raise RuntimeError(f"runtime: all {self.units} units are busy and a function must start "
                                   "(a bug: the runtime never holds more functions than runtime.units)")
        return cores

    def image(self, kind: str) -> tuple[str, ...]:
        """The kinds a new decode or learner function can run: both with the hybrid image (runtime.hybrid)."""
        return HYBRID if self.hybrid else (kind,)

    def start_learner(self, prewarmed: bool):
        """One learner rank onto free units (not pre-warmed: work waits for it, so idle workers kept alive are
        released to make room), or None when every unit is busy (it waits for one)."""
        cores = self.claim(must=False)
        if cores is None and not prewarmed and self.pool.make_room(self.fn_units):  # work waits: idle capacity yields
            cores = self.claim(must=False)
        if cores is None:
            return None
        return self.pool.start(self.image("learner"), cores, {**self.weights.state_setup(), "role": "learner"},
                               prewarmed)

    def start_decoders(self, n: int, prewarmed: bool) -> list:
        """n decode functions; pre-warmed ones only into free units (as many as fit)."""
        out = []
        for _ in range(n):
            cores = self.claim(must=not prewarmed)
            if cores is None:
                break
            out.append(self.pool.start(self.image("decode"), cores, {**self.weights.state_setup(), "role": "decode"},
                                       prewarmed))
        return out

    def start_critic(self, must: bool, prewarmed: bool = False):
        """PPO's critic image onto a free unit (must: evicting idle workers if none is free), or None."""
        cores = self.claim(must)
        return None if cores is None else self.pool.start(CRITIC_IMAGE, cores, self.weights.critic_setup(),
                                                          prewarmed)

    def start_single(self, kind: str):
        """A prefill or reference function onto a free unit (evicting idle workers when none is free)."""
        return self.pool.start((kind,), self.claim(must=True),
                               {} if kind == "reference" else self.weights.state_setup())

    def on_ready(self, h, msg: dict) -> None:
        self.pool.mark_ready(h, msg)
        cold = self.pool.records[h.worker].cold_start_s
        for kind in h.kinds if h.kinds == HYBRID else (role(h.kinds),):  # a hybrid start is either kind's
            self.clock.history.add_cold(kind, cold)

    def warm_decoders(self) -> int:
        """Serverless: ready workers that can decode and are idle (kept warm); the serverful pool is not planned."""
        if not self.policy.traits.plans_decode:
            return 0
        return sum(1 for h in self.pool.warm(self.image("decode"))
                   if h.ready_s is not None and h.worker in self.pool.idle_since)

    # -- the serverful pool -------------------------------------------------------------------------------------
    def start_pool(self) -> None:
        """Serverful: W colocated workers, one core each, one data-parallel group, held until close(). The
        rendezvous port is reserved until the group has formed (`dist.reserve_port`); a worker that dies while
        starting anyway fails the start: the others are stopped and the group forms again on a new port. The start
        has its own `runtime.max_attempts` consecutive attempts (`runtime.attempts`): a death while the pool
        restarts is never charged to the step's work."""
        from rlhfless.runtime.devices.dist import reserve_port

        W, k = self.rt.workers(), self.rt.pool_worker_units()
        tries = Attempts("the serverful pool's start", self.rt.max_attempts)
        while True:
            port, held = reserve_port()
            # W x k <= units (check_machine): k units each (an emulated paper-engine replica holds its TP);
            # PPO's critic lives on the last worker, or on every worker when each is a critic rank (`ppo_stages`)
            critic = [self.ppo and (r == W - 1 or self.rt.ppo_ranks() > 1) for r in range(W)]
            hs = [self.pool.start(KINDS_ALL, tuple(range(r * k, r * k + k)),
                                  {**self.weights.state_setup(), "dist": self.dist_spec(r, W, port),
                                                    **(self._critic_holder() if critic[r] else {})})
                  for r in range(W)]
            try:
                self.pool.await_ready(hs)
                self._roll_call(hs)
            except WorkerDied as died:
                for h in hs:  # a worker already gone died too (killed, or left the broken rendezvous)
                    self.pool.dead(h) if h is died.handle or not h.alive else self.pool.stop(h)
                tries.failed(was_running=True)
                continue
            finally:
                held.close()
            self.pool_handles = hs
            return

    def _roll_call(self, hs: list) -> None:
        """Every pool worker answers once all are ready (a `cut` for no step: an idle worker replies at once that
        it has no rows), so a worker killed while the pool was (re)starting is found here, failing the start, and
        never later as a death of the step's work (`runtime.attempts`). WorkerDied for a death or no answer."""
        for h in hs:
            self.backend.send(h, {"op": "cut", "step": None})
        waiting, other, t0 = {h.worker: h for h in hs}, [], now()
        while waiting:
            for h, msg in self.backend.poll(list(waiting.values()), 1.0):
                if msg is None:
                    raise WorkerDied(h)
                if msg["op"] == "cut_rows":
                    waiting.pop(h.worker, None)
                else:
                    other.append((h, msg))
            if waiting and now() - t0 > self.rt.invocation_timeout_s:
                raise WorkerDied(next(iter(waiting.values())))
        for h, msg in other:  # read after the roll call, in order
            h.pending.append(msg)

    def _critic_holder(self) -> dict:
        return {"holds_critic": True, **self.weights.critic_setup()}

    def dist_spec(self, rank: int, world: int, port: int) -> dict:
        return {"rank": rank, "world": world, "port": port, "timeout_s": min(60.0, self.rt.invocation_timeout_s)}

    def restart_pool(self, dead=None) -> None:
        """Serverful recovery: a pool worker (`dead`, if the caller has not reaped it yet) died, so the whole
        data-parallel pool restarts from the last state. The survivors are stopped at once, not asked to shut down:
        their work is redone anyway, and a busy one would read `shutdown` only after its decode (or, inside the
        broken all-reduce, only at gloo's timeout) while holding the unit its replacement needs. The caller
        counts the retry (one per death)."""
        for h in self.pool_handles:
            if h.worker in self.pool.handles:
                self.pool.dead(h) if h is dead or not h.alive else self.pool.stop(h)
        self.start_pool()

    def pool_workers(self) -> list:
        """The held pool's workers in rank order (a policy that holds a pool)."""
        return self.pool_handles

    # -- what outlives a step -----------------------------------------------------------------------------------
    def kept_reference(self):
        """The reference function kept warm from an earlier step, if it is still in the pool."""
        h = self.reference_worker
        return h if h and h.worker in self.pool.handles else None

    def keep_reference(self, h) -> None:
        """Remember h as the reference function to reuse (None: none is kept)."""
        self.reference_worker = h

    def kept_learners(self) -> list:
        """Learner functions of the last step still in the pool (their data-parallel group may be reused)."""
        return [h for h in self.learners if h.worker in self.pool.handles]

    def add_learner(self, h) -> None:
        self.learners.append(h)

    def drop_learner(self, h) -> None:
        self.learners = [x for x in self.learners if x is not h]

    def forget_learners(self) -> None:
        self.learners = []

    # -- carrying out what the mode decides (`modes.policy`: each method there returns data; this is where it acts)
    def settle(self, h, keep: Keep) -> None:
        """Carry out `keep` for h: its keep-alive runs from now, and / or it is released."""
        if keep.idle:
            self.pool.idle(h)
        if keep.release is not None:
            self.pool.release(h, reason=keep.release)

    def no_work_now(self, h) -> None:
        """h's invocation ended and the plan gives it no work now: kept for its keep-alive, released, or held."""
        self.settle(h, self.policy.no_work_now(self.keep_alive_s))

    def no_rows(self, h) -> None:
        """h was given no rows by this step's split (it may still take cut rows)."""
        self.settle(h, self.policy.no_rows())

    def decoders(self, n: int) -> list:
        """The n functions that take the decode role this step, in the split's order (`ModePolicy.decoders`)."""
        pick = self.policy.decoders(n, self.pool.warm(self.image("decode")), self.pool_handles)
        for h in pick.warm:  # taken: the cold starts below may evict idle workers, never these
            self.pool.busy(h)
        for h in pick.spare:
            self.pool.unwait(h)
        return [*pick.held, *pick.warm, *self.start_decoders(pick.cold, prewarmed=False)]

    def decoder_done(self, h, stream) -> bool:
        """A decode function whose rows are all done: True when it goes on now as a learner rank of `stream`;
        otherwise it is kept, released or held as the mode decides (`ModePolicy.decoder_done`)."""
        after = self.policy.decoder_done(self.hybrid, self.keep_alive_s, self.clock.next_decode_work_after_done(),
                                         self.clock.cold_start("decode", self.cfg.plan.cold_start_s))
        if after.to_learner and stream.take(h):
            return True
        self.settle(h, after.keep)
        if after.release is not None and h.worker in self.pool.handles:
            self.pool.release(h, reason=after.release)
        if after.pump:
            stream.pump()
        return False

    def seat_learners(self, n: int) -> LearnerSeats:
        """Carry out the mode's choice of the workers that hold the n learner ranks as the step starts
        (`ModePolicy.learner_ranks`): kept functions that do not form a whole group are released, warm ones are
        invoked. Returns the choice: the caller seats its ranks on `handles`."""
        seats = self.policy.learner_ranks(n, self.kept_learners(), self.pool_handles)
        for h in seats.release:
            self.pool.release(h, reason="regroup")
        if seats.forget:
            self.forget_learners()
        for h in seats.handles if seats.warm else ():
            self.pool.busy(h)
        return seats

    def reference_function(self):
        """The worker that runs this step's reference forward (`ModePolicy.reference_function`): started if the
        mode names none, remembered if the mode keeps it."""
        pick = self.policy.reference_function(self.kept_reference(), self.pool_handles)
        h = pick.handle or self.start_single("reference")
        self.keep_reference(h if pick.keep else None)
        return h
