"""Policy: how a step's work is split over workers, which workers exist, and when they start and go.

`ModePolicy` answers what the mode decides (keep-alive, the split, migration, shipping KV, pre-warm, overlap, idle
functions, billing rules, the learner's degree): `ServerlessPolicy` (the planner's assignment, functions released
after `keep_alive_s` idle, pre-warmed) and `ServerfulPolicy` (verl-like: W pool workers held all run, prompts split
evenly, no migration). The rule it keeps: the serverful control is a policy, not a second code path. A stage is
pre-warmed at its expected start - measured cold start - buffer. Details: docs/internals.md#runtimemodespolicypy.

Deviations from the paper:
1. The learner's expected start is this step's planned makespan x the recent measured/planned ratio
   (`runtime.prewarm_from=plan`), not the shortest recent rollout ("history": learners start early, idle billed).
2. Separate images: a decode function whose rows are done is let go at once when the lifecycle says holding it to
   the next rollout buys nothing (`plan.lifecycle.let_go`), so a learner rank's pre-warm takes
   its unit; the paper's platform keeps each function its few seconds of keep-alive.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rlhfless.plan import lifecycle  # a function's life: the one model the simulator calls too
from rlhfless.plan.lifecycle import PREWARM_HISTORY as HISTORY  # shared with the simulator
from rlhfless.plan.lifecycle import planned_start_s
from rlhfless.rollout.prefix import plan_prefill
from rlhfless.runtime.records import now
from rlhfless.step.planner import StepPlan


@dataclass
class History:
    """Recent stage durations and measured cold starts (seconds), kept by the runtime."""

    rollout_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    learn_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    rollout_vs_plan: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Measured rollout seconds over the plan's predicted makespan, per recent step."""
    between_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    share_tail_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Serverless learner: from the first rank's share to the update's end (`plan.ranks.next_work_after_share`)."""
    """From the end of the learner to the start of the next rollout (driver work: logging, planning)."""
    cold_s: dict[str, deque] = field(default_factory=dict)

    def cold(self, kind: str, default: float) -> float:
        """The mean of the recent measured cold starts of `kind` (`default` before any)."""
        c = self.cold_s.get(kind)
        return sum(c) / len(c) if c else default

    def add_cold(self, kind: str, seconds: float) -> None:
        self.cold_s.setdefault(kind, deque(maxlen=HISTORY)).append(seconds)


def split_by_count(n_groups: int, workers: int) -> list[list[int]]:
    """verl's dispatch: contiguous chunks whose sizes differ by at most one (empty chunks for extra workers)."""
    return [list(map(int, c)) for c in np.array_split(np.arange(n_groups), workers)]


def plan_split(plan: StepPlan) -> list[list[int]]:
    """The planner's assignment as group indices per active decode actor (in the plan's admission order)."""
    index = {id(j): i for i, j in enumerate(plan.jobs)}
    return [[index[id(j)] for j in jobs] for jobs in plan.decision.plan.actor_jobs if jobs]


@dataclass(frozen=True)
class Prewarm:
    """Seconds after a stage's start at which to start the next stage's workers (None: do not pre-warm)."""

    after_s: float | None


def prewarm_learner(history: History, predicted_makespan_s: float, cold_default: float, buffer_s: float,
                    source: str = "plan") -> Prewarm:
    """When to start the learner group, in seconds after the rollout started
    (docs/internals.md#runtimemodespolicypy)."""
    if source == "plan" and history.rollout_vs_plan:
        expected = planned_start_s(predicted_makespan_s, history.rollout_vs_plan)
    elif history.rollout_s:
        expected = min(history.rollout_s)  # the paper's rule ("history"), or "plan" before a ratio is measured
    else:
        expected = predicted_makespan_s  # step 1: nothing measured yet
    return Prewarm(lifecycle.prewarm_start_s(expected, history.cold("learner", cold_default), buffer_s))


def prewarm_decode(history: History, cold_default: float, buffer_s: float) -> Prewarm:
    if not history.learn_s:
        return Prewarm(None)  # no update measured yet: decode is pre-warmed from step 2 on
    # the shortest recent update, plus the driver's gap between steps
    expected = min(history.learn_s) + (min(history.between_s) if history.between_s else 0.0)
    return Prewarm(lifecycle.prewarm_start_s(expected, history.cold("decode", cold_default), buffer_s))


def ship_saves_tokens(prompts: list[list[int]], split: list[list[int]], group_size: int, dedup: bool) -> int:
    """Prompt tokens a prefill function computing every prefix once saves over actors prefilling their own groups
    (each actor still computes each of its prompts once: only prefixes shared ACROSS actors are saved)."""
    local = sum(plan_prefill([prompts[g] for g in gs], group_size, dedup=dedup).tokens_computed
                for gs in split if gs)
    return local - plan_prefill(prompts, group_size, dedup=dedup).tokens_computed


def should_ship(mode: str, saved_tokens: int, prefill_s_per_token: float, cold_start_s: float) -> bool:
    """never / always / auto: ship when the recompute it saves outweighs starting a prefill function (its cold
    start sits on the critical path: the decode functions wait for its KV)."""
    if mode != "auto":
        return mode == "always"
    return saved_tokens * prefill_s_per_token > cold_start_s


@dataclass(frozen=True)
class ModeTraits:
    """What a mode is, as data: the facts about it the stages read (each a field, not a method to call)."""

    holds_pool: bool
    """W workers started with the run and held to its end, each decoding and learning (verl's colocated pool)."""
    may_ship_kv: bool
    """Whether a prefill function may ship deduplicated prefix KV to the decode functions."""
    plans_decode: bool
    """Whether the planner's decision runs (and is calibrated by what ran)."""
    overlap_default: bool
    """`runtime.overlap` when left to auto: stream finished groups into the learner during decode."""
    roles_change_hands: bool
    """Whether a function goes from one role to another within a step (a finished decode function becomes a learner
    rank: its messages and its death are the learner's from then on). False: each worker holds every role at once,
    so a decode worker is watched and handled as one thing."""
    starts_functions: bool
    """Whether a role's function is started when its work comes (the value function, PPO's actor, a pre-warmed
    critic). False: every role has its held worker for the whole run."""
    ranks_leave_at_share: bool
    """Whether a learner rank writes its share and goes (the last one in reduces) instead of all ranks ending
    together in one group (`streaming._finish_shares`)."""
    forms_learner_group: bool
    """Whether ranks that end together form their data-parallel group per step (False: the group formed when the
    workers started and lasts the run)."""
    restarts_whole: bool
    """Whether one worker's death restarts every worker (they share one data-parallel group) and re-runs what each
    still owed, instead of replacing only the dead function."""
    preempts_learners: bool
    """Whether a learner function that has not reached its optimiser step may be let go to free a unit for decode
    work that must start (it restarts later from the same inputs)."""
    bills_held_pool: bool
    """Whether the bill is a held pool's (a VM: its lifetime at the on-demand price, whatever `runtime.billing`
    says) rather than functions' (`runtime.meter`)."""


# -- the mode as a policy object: every decision that differs by mode, behind one interface ----------------------
class ModePolicy(ABC):
    """What differs between the serverless runtime and the serverful control, asked by the stages instead of
    branching on the mode. What the mode is, as data: `traits` (one frozen `ModeTraits`: holds a pool, ships KV,
    starts functions, what a death restarts, what is billed, ...). What it decides, from the step's inputs: when
    functions start (`prewarms`), how a step's groups are split (`decode_split`, `migrates`), which function takes
    which role (`decoders`, `learner_ranks`, `decoder_done`, `reference_function`), what a function with no work
    now does (`no_work_now`), and what is billed (`keep_alive`, `billing_name`). A new platform policy is a
    subclass, registered under its name (`register_policy`): `Runtime(cfg, name, ...)` runs with it."""

    name = ""
    traits: ModeTraits
    """What the mode is, as data (`ModeTraits`): each subclass sets its record."""

    @abstractmethod
    def keep_alive(self, keep_alive_s: float) -> float | None:
        """Idle seconds before an idle function is released (None: never)."""

    @abstractmethod
    def decode_split(self, n_groups: int, plan, workers: int) -> list[list[int]]:
        """Group indices per decode function of this step."""

    @abstractmethod
    def migrates(self, setting: str, plan) -> bool:
        """Whether rows are cut and migrated live (`runtime.migrate`: always / plan / never)."""

    @abstractmethod
    def prewarms(self, enabled: bool) -> bool:
        """Whether functions are started ahead of need from the invocation history (`runtime.prewarm`)."""

    @abstractmethod
    def no_work_now(self, pool, h, keep_alive_s: float) -> None:
        """A function whose invocation ended and that the plan gives no work now."""

    @abstractmethod
    def billing_name(self, configured: str) -> str:
        """The billing rule set the bill is read under (`runtime.billing`, or the pool's lifetime)."""

    @abstractmethod
    def decoders(self, ctx, n: int) -> list:
        """Which functions take the decode role this step (n of them): handles, in the split's order (ctx: the
        step's `runtime.context.StepContext`)."""

    @abstractmethod
    def learner_ranks(self, ctx, ranks: list) -> None:
        """Which functions hold the learner ranks when the step starts (`streaming._Rank.handle`; None: a rank
        starts later, when it has work)."""

    @abstractmethod
    def ppo_rank(self, update, role: str, rank: int):
        """Which function holds rank `rank` of PPO's `role` ("learner": the actor; "critic") in this update
        (`ppo_stages._Update`): a handle, or None while none can start (the rank waits for a unit)."""

    @abstractmethod
    def learner_world(self, rt_cfg) -> int:
        """The learner's data-parallel degree (equal in both modes when compared: the same sum of shares)."""

    # -- which function takes which role --------------------------------------------------------------------------
    @abstractmethod
    def hybrid_image(self, setting: bool) -> bool:
        """Whether new decode and learner functions share one image (`runtime.hybrid`, resolved)."""

    @abstractmethod
    def decoder_done(self, ctx, stream, h) -> bool:
        """A decode function whose rows are all done: True when it goes on now as a learner rank of `stream`;
        otherwise it is kept, released or held as the policy says."""

    @abstractmethod
    def no_rows(self, pool, h) -> None:
        """A decode function the split gave no rows this step (it may still take cut rows)."""

    @abstractmethod
    def reference_function(self, ctx):
        """The worker that runs this step's reference forward (and whether it is kept for the next step)."""

class ServerlessPolicy(ModePolicy):
    name = "serverless"
    traits = ModeTraits(holds_pool=False, may_ship_kv=True, plans_decode=True, overlap_default=True,
                        roles_change_hands=True, starts_functions=True, ranks_leave_at_share=True,
                        forms_learner_group=True, restarts_whole=False, preempts_learners=True,
                        bills_held_pool=False)

    def keep_alive(self, keep_alive_s: float) -> float | None:
        return keep_alive_s

    def decode_split(self, n_groups: int, plan, workers: int) -> list[list[int]]:
        return plan_split(plan)

    def migrates(self, setting: str, plan) -> bool:
        return setting == "always" or setting == "plan" and plan.decision.migration is not None

    def prewarms(self, enabled: bool) -> bool:
        return enabled

    def no_work_now(self, pool, h, keep_alive_s: float) -> None:
        pool.idle(h)  # its keep-alive runs from now: released at the lapse unless work comes first
        if keep_alive_s == 0:
            pool.release(h, reason="lapse")  # scale to zero: a keep-alive of 0 lapses at once

    def billing_name(self, configured: str) -> str:
        return configured

    def learner_world(self, rt_cfg) -> int:
        return rt_cfg.learners()

    def decoders(self, ctx, n: int) -> list:
        """Warm idle functions of the decode image first (no cold start), then new ones."""
        available = ctx.workers.pool.warm(ctx.workers.image("decode"))
        warm = available[:n]
        for h in warm:  # taken: the cold starts below may evict idle workers, never these
            ctx.workers.pool.busy(h)
        for h in available[n:]:  # beyond this step's decode need: no work for it now, so its keep-alive runs
            ctx.workers.pool.unwait(h)  # (a learner rank with groups waiting may take it warm: `LearnerStream._start`)
        cold = ctx.workers.start_decoders(n - len(warm), prewarmed=False)
        return warm + cold

    def hybrid_image(self, setting: bool) -> bool:
        return setting

    def decoder_done(self, ctx, stream, h) -> bool:
        if ctx.hybrid and stream.take(h):
            return True  # a rank has work now: warm, at this step's weights, the function goes on as it
        self.no_work_now(ctx.workers.pool, h, ctx.keep_alive_s)  # no work now: kept for its keep-alive, or gone
        nxt = ctx.clock.next_decode_work_after_done()
        if not ctx.hybrid and h.worker in ctx.workers.pool.handles and lifecycle.let_go(
                nxt, ctx.clock.cold_start("decode", ctx.cfg.plan.cold_start_s), ctx.keep_alive_s):
            # a separate decode image's next work is the next step's rollout: past its keep-alive (kept, it would
            # bill the keep-alive and lapse first), or a gap that bills more than the cold start a pre-warm hides;
            # let go now, its unit takes a learner rank's pre-warm
            ctx.workers.pool.release(h, reason="plan")
        stream.pump()  # its unit may now host a learner rank with finished groups waiting
        return False

    def no_rows(self, pool, h) -> None:
        pool.idle(h)  # its keep-alive runs (idle, never released here: it may take cut rows)

    def reference_function(self, ctx):
        h = ctx.workers.kept_reference() or ctx.workers.start_single("reference")  # kept: not evicted since
        ctx.workers.keep_reference(h)
        return h

    def learner_ranks(self, ctx, ranks: list) -> None:
        """Learner workers kept warm from the last step are this step's ranks when every rank is there (their
        data-parallel group is whole); a partial set is released (a new group forms with new workers)."""
        live = ctx.workers.kept_learners()
        if len(live) == len(ranks):
            for r, h in zip(ranks, live):
                r.handle, r.requested, r.cold = h, now(), ctx.ledger.first_use(h)
                ctx.workers.pool.busy(h)
        else:
            for h in live:
                ctx.workers.pool.release(h, reason="regroup")
            ctx.workers.forget_learners()

    def ppo_rank(self, update, role: str, rank: int):
        return update.function(role, rank)  # the step's actor or value function, a warm one, else a new one


class ServerfulPolicy(ModePolicy):
    name = "serverful"
    # holds_pool: verl's colocated pool
    # may_ship_kv: each pool worker prefills its own groups once
    # overlap_default: verl: the update starts after the rollout
    # roles_change_hands: pool worker r decodes and is learner rank r at once
    # starts_functions: the control never starts functions: PPO's actor is pool worker 0, its critic the last
    # ranks_leave_at_share: the pool's ranks end together in their gloo group
    # forms_learner_group: formed once, when the pool started (`WorkerSet.start_pool`)
    # restarts_whole: a dead pool worker breaks the pool's data-parallel group
    # preempts_learners: nothing ever needs a unit: the pool holds them all
    traits = ModeTraits(holds_pool=True, may_ship_kv=False, plans_decode=False, overlap_default=False,
                        roles_change_hands=False, starts_functions=False, ranks_leave_at_share=False,
                        forms_learner_group=False, restarts_whole=True, preempts_learners=False,
                        bills_held_pool=True)

    def keep_alive(self, keep_alive_s: float) -> float | None:
        return None  # the pool is a VM: held from the run's start to its end

    def decode_split(self, n_groups: int, plan, workers: int) -> list[list[int]]:
        return split_by_count(n_groups, workers)

    def migrates(self, setting: str, plan) -> bool:
        return False

    def prewarms(self, enabled: bool) -> bool:
        return False

    def no_work_now(self, pool, h, keep_alive_s: float) -> None:
        return None  # held by the pool: never idle-released nor evicted

    def billing_name(self, configured: str) -> str:
        return "lifetime"

    def learner_world(self, rt_cfg) -> int:
        return rt_cfg.workers()  # every pool worker is a rank

    def decoders(self, ctx, n: int) -> list:
        return ctx.workers.pool_workers()  # every pool worker decodes its chunk

    def hybrid_image(self, setting: bool) -> bool:
        return False  # a pool worker runs every kind already

    def decoder_done(self, ctx, stream, h) -> bool:
        return False  # held: it is a learner rank already

    def no_rows(self, pool, h) -> None:
        return None  # held by the pool: never idle

    def reference_function(self, ctx):
        ctx.workers.keep_reference(None)
        return ctx.workers.pool_workers()[0]  # pool worker 0's reference replica

    def learner_ranks(self, ctx, ranks: list) -> None:
        workers = ctx.workers.pool_workers()
        for r in ranks:  # pool worker r is rank r for the whole run
            r.handle = workers[r.rank]

    def ppo_rank(self, update, role: str, rank: int):
        return update.s.held_worker(role, rank)  # one rank: the actor on worker 0, the critic on the last


MODE_POLICIES: dict[str, type[ModePolicy]] = {}
"""Platform policies by name (`register_policy`): a new platform is a subclass registered under its name."""


def register_policy(cls: type[ModePolicy]) -> type[ModePolicy]:
    """Class decorator: make `cls` the policy of runtime mode `cls.name`."""
    MODE_POLICIES[cls.name] = cls
    return cls


register_policy(ServerlessPolicy)
register_policy(ServerfulPolicy)


def policy_for(mode: str) -> ModePolicy:
    """The policy of a runtime mode (a registered name; any other mode, e.g. inline, runs serverless)."""
    return MODE_POLICIES.get(mode, ServerlessPolicy)()
