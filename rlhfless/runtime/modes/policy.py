"""Policy: how a step's work is split over workers, which workers exist, and when they start and go.

`ModePolicy` answers what the mode decides (keep-alive, the split, migration, shipping KV, pre-warm, overlap, idle
functions, what a death restarts, billing rules, the learner's degree), each decision returned as a frozen record that
the worker set carries out (a mode never acts): `ServerlessPolicy` (the planner's assignment, functions released
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
    ranks_leave_at_share: bool
    """Whether a learner rank writes its share and goes (the last one in reduces) instead of all ranks ending
    together in one group (`streaming._finish_shares`)."""
    forms_learner_group: bool
    """Whether ranks that end together form their data-parallel group per step (False: the group formed when the
    workers started and lasts the run)."""
    preempts_learners: bool
    """Whether a learner function that has not reached its optimiser step may be let go to free a unit for decode
    work that must start (it restarts later from the same inputs)."""
    bills_held_pool: bool
    """Whether the bill is a held pool's (a VM: its lifetime at the on-demand price, whatever `runtime.billing`
    says) rather than functions' (`runtime.meter`)."""


# -- what a mode decides, as data: the worker set (`runtime.workerset`) carries each one out ---------------------
@dataclass(frozen=True)
class Keep:
    """What becomes of a function with no work now."""

    idle: bool = False
    """Its keep-alive runs from now (False: held, as a pool's worker, never idle)."""
    release: str | None = None
    """Released now, for this reason (`records.RELEASE_REASONS`); None: not released."""


HOLD = Keep()
"""A held worker: neither idle nor released."""


@dataclass(frozen=True)
class DecodePick:
    """Which functions take the decode role this step, in the split's order: `held` ones, then `warm` ones, then
    `cold` new ones."""

    held: tuple = ()
    """Workers held for the whole run (the pool's, in rank order): taken as they are."""
    warm: tuple = ()
    """Idle functions of the decode image taken warm: marked busy before any cold start (which may evict idle
    workers, never these)."""
    spare: tuple = ()
    """Warm functions beyond the step's need: no work for them now, so their keep-alive runs (a learner rank with
    groups waiting may still take one warm: `LearnerStream._start`)."""
    cold: int = 0
    """New functions to start (not pre-warmed: work waits for them)."""


@dataclass(frozen=True)
class AfterDecode:
    """What becomes of a decode function whose rows are all done."""

    to_learner: bool = False
    """Offered to the learner stream first: it goes on as a rank with work now, if one has (the hybrid image)."""
    keep: Keep = HOLD
    """Otherwise: kept for its keep-alive, or released."""
    release: str | None = None
    """Then, if still in the pool, released now for this reason (None: kept as `keep` says)."""
    pump: bool = False
    """Then the learner stream is pumped (its unit may now host a rank with finished groups waiting)."""


@dataclass(frozen=True)
class LearnerSeats:
    """Which functions hold the learner ranks when the step starts."""

    handles: tuple = ()
    """Per rank, its worker (empty: every rank starts later, when it has work)."""
    warm: bool = False
    """The handles are functions kept warm from the last step: each is invoked now (busy, its request time and
    cold start recorded); False: the pool's held workers, already the ranks."""
    release: tuple = ()
    """Kept learner functions released (reason "regroup": a new data-parallel group forms with new workers)."""
    forget: bool = False
    """The kept learner functions are forgotten (none is reused as a group)."""


@dataclass(frozen=True)
class ReferencePick:
    """The worker that runs this step's reference forward."""

    handle: object = None
    """This worker (None: start a reference function)."""
    keep: bool = False
    """Kept for the next step's reference (False: none is kept)."""


@dataclass(frozen=True)
class Death:
    """What a worker's death restarts."""

    whole: bool
    """Every worker restarts from the last state (they share one data-parallel group) and re-runs what each still
    owed; False: only the dead function is replaced, and only its work re-runs."""
    rollout_over: bool = False
    """The step's rollout starts over from its start on the new workers (a death during decode, `whole`)."""


@dataclass(frozen=True)
class PpoSeat:
    """Who holds a rank of PPO's actor or critic in an update."""

    held: bool
    """True: the pool worker that holds the rank for the whole run (`ppo_stages.PpoStream.held_worker`), seated
    when the stream starts, in the pool's group; False: a function of the role's own, taken warm or started when
    the rank has work (`ppo_stages._Update.function`; the actor's rank 0 with the value forward, so its cold start
    overlaps it), the role's ranks forming their group per update."""


# -- the mode as a policy object: every decision that differs by mode, behind one interface ----------------------
class ModePolicy(ABC):
    """What differs between the serverless runtime and the serverful control, asked by the stages instead of
    branching on the mode. What the mode is, as data: `traits` (one frozen `ModeTraits`: holds a pool, ships KV,
    plans decode, what is billed, ...). What it decides, from the step's inputs: when functions start
    (`prewarms`), how a step's groups are split (`decode_split`, `migrates`), which function takes which role
    (`decoders`, `learner_ranks`, `decoder_done`, `reference_function`, `ppo_rank`), what a function with no work
    now does (`no_work_now`, `no_rows`), what a death restarts (`on_death`), and what is billed (`keep_alive`,
    `billing_name`). A mode decides and never acts: each method returns its decision as data (`Keep`, `DecodePick`,
    `AfterDecode`, `LearnerSeats`, `ReferencePick`, `PpoSeat`, `Death`), which the worker set (or, for PPO's
    seats, `ppo_stages`) carries out. A new platform
    policy is a subclass, registered under its name (`register_policy`): `Runtime(cfg, name, ...)` runs with it."""

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
    def no_work_now(self, keep_alive_s: float) -> Keep:
        """A function whose invocation ended and that the plan gives no work now."""

    @abstractmethod
    def billing_name(self, configured: str) -> str:
        """The billing rule set the bill is read under (`runtime.billing`, or the pool's lifetime)."""

    @abstractmethod
    def decoders(self, n: int, warm: list, held: list) -> DecodePick:
        """Which functions take the decode role this step (n of them). warm: live functions of the decode image,
        idle ones first; held: the pool's workers in rank order (empty without a pool)."""

    @abstractmethod
    def learner_ranks(self, n: int, kept: list, held: list) -> LearnerSeats:
        """Which functions hold the n learner ranks when the step starts. kept: the last step's learner functions
        still in the pool; held: the pool's workers in rank order."""

    @abstractmethod
    def ppo_rank(self, role: str, rank: int) -> PpoSeat:
        """Who holds rank `rank` of PPO's `role` ("learner": the actor; "critic") in an update (`ppo_stages._Update`
        carries it out)."""

    @abstractmethod
    def learner_world(self, rt_cfg) -> int:
        """The learner's data-parallel degree (equal in both modes when compared: the same sum of shares)."""

    # -- which function takes which role --------------------------------------------------------------------------
    @abstractmethod
    def hybrid_image(self, setting: bool) -> bool:
        """Whether new decode and learner functions share one image (`runtime.hybrid`, resolved)."""

    @abstractmethod
    def decoder_done(self, hybrid: bool, keep_alive_s: float, next_work_s: float | None,
                     cold_s: float) -> AfterDecode:
        """A decode function whose rows are all done. next_work_s: predicted seconds to its image's next work
        (`StepClock.next_decode_work_after_done`); cold_s: the decode image's recent cold start."""

    @abstractmethod
    def no_rows(self) -> Keep:
        """A decode function the split gave no rows this step (it may still take cut rows)."""

    @abstractmethod
    def reference_function(self, kept, held: list) -> ReferencePick:
        """The worker that runs this step's reference forward, and whether it is kept for the next step. kept: the
        reference function kept from an earlier step and still in the pool (None if none)."""

    # -- faults -------------------------------------------------------------------------------------------------
    @abstractmethod
    def on_death(self, role: str) -> Death:
        """What the death of a worker holding `role` (decode, reference, learner, critic) restarts."""


class ServerlessPolicy(ModePolicy):
    name = "serverless"
    traits = ModeTraits(holds_pool=False, may_ship_kv=True, plans_decode=True, overlap_default=True,
                        roles_change_hands=True, ranks_leave_at_share=True,
                        forms_learner_group=True, preempts_learners=True,
                        bills_held_pool=False)

    def keep_alive(self, keep_alive_s: float) -> float | None:
        return keep_alive_s

    def decode_split(self, n_groups: int, plan, workers: int) -> list[list[int]]:
        return plan_split(plan)

    def migrates(self, setting: str, plan) -> bool:
        return setting == "always" or setting == "plan" and plan.decision.migration is not None

    def prewarms(self, enabled: bool) -> bool:
        return enabled

    def no_work_now(self, keep_alive_s: float) -> Keep:
        # its keep-alive runs from now: released at the lapse unless work comes first; a keep-alive of 0 lapses at
        # once (scale to zero)
        return Keep(idle=True, release="lapse" if keep_alive_s == 0 else None)

    def billing_name(self, configured: str) -> str:
        return configured

    def learner_world(self, rt_cfg) -> int:
        return rt_cfg.learners()

    def decoders(self, n: int, warm: list, held: list) -> DecodePick:
        """Warm idle functions of the decode image first (no cold start), then new ones."""
        return DecodePick(warm=tuple(warm[:n]), spare=tuple(warm[n:]), cold=n - len(warm[:n]))

    def hybrid_image(self, setting: bool) -> bool:
        return setting

    def decoder_done(self, hybrid: bool, keep_alive_s: float, next_work_s: float | None,
                     cold_s: float) -> AfterDecode:
        # hybrid: a rank with work now takes it warm, at this step's weights. A separate decode image's next work is
        # the next step's rollout: past its keep-alive (kept, it would bill the keep-alive and lapse first), or a
        # gap that bills more than the cold start a pre-warm hides, it is let go now and its unit takes a learner
        # rank's pre-warm
        let_go = not hybrid and lifecycle.let_go(next_work_s, cold_s, keep_alive_s)
        return AfterDecode(to_learner=hybrid, keep=self.no_work_now(keep_alive_s),
                           release="plan" if let_go else None, pump=True)

    def no_rows(self) -> Keep:
        return Keep(idle=True)  # its keep-alive runs (idle, never released here: it may take cut rows)

    def reference_function(self, kept, held: list) -> ReferencePick:
        return ReferencePick(handle=kept, keep=True)  # kept: not evicted since; else a new one, kept

    def learner_ranks(self, n: int, kept: list, held: list) -> LearnerSeats:
        """Learner workers kept warm from the last step are this step's ranks when every rank is there (their
        data-parallel group is whole); a partial set is released (a new group forms with new workers)."""
        if len(kept) == n:
            return LearnerSeats(handles=tuple(kept), warm=True)
        return LearnerSeats(release=tuple(kept), forget=True)

    def on_death(self, role: str) -> Death:
        return Death(whole=False)  # functions share nothing a death breaks: the dead one is replaced

    def ppo_rank(self, role: str, rank: int) -> PpoSeat:
        return PpoSeat(held=False)  # the step's actor or value function, a warm one, else a new one


class ServerfulPolicy(ModePolicy):
    name = "serverful"
    # holds_pool: verl's colocated pool
    # may_ship_kv: each pool worker prefills its own groups once
    # overlap_default: verl: the update starts after the rollout
    # roles_change_hands: pool worker r decodes and is learner rank r at once
    # ranks_leave_at_share: the pool's ranks end together in their gloo group
    # forms_learner_group: formed once, when the pool started (`WorkerSet.start_pool`)
    # preempts_learners: nothing ever needs a unit: the pool holds them all
    traits = ModeTraits(holds_pool=True, may_ship_kv=False, plans_decode=False, overlap_default=False,
                        roles_change_hands=False, ranks_leave_at_share=False,
                        forms_learner_group=False, preempts_learners=False,
                        bills_held_pool=True)

    def keep_alive(self, keep_alive_s: float) -> float | None:
        return None  # the pool is a VM: held from the run's start to its end

    def decode_split(self, n_groups: int, plan, workers: int) -> list[list[int]]:
        return split_by_count(n_groups, workers)

    def migrates(self, setting: str, plan) -> bool:
        return False

    def prewarms(self, enabled: bool) -> bool:
        return False

    def no_work_now(self, keep_alive_s: float) -> Keep:
        return HOLD  # held by the pool: never idle-released nor evicted

    def billing_name(self, configured: str) -> str:
        return "lifetime"

    def learner_world(self, rt_cfg) -> int:
        return rt_cfg.workers()  # every pool worker is a rank

    def decoders(self, n: int, warm: list, held: list) -> DecodePick:
        return DecodePick(held=tuple(held))  # every pool worker decodes its chunk

    def hybrid_image(self, setting: bool) -> bool:
        return False  # a pool worker runs every kind already

    def decoder_done(self, hybrid: bool, keep_alive_s: float, next_work_s: float | None,
                     cold_s: float) -> AfterDecode:
        return AfterDecode()  # held: it is a learner rank already

    def no_rows(self) -> Keep:
        return HOLD  # held by the pool: never idle

    def reference_function(self, kept, held: list) -> ReferencePick:
        return ReferencePick(handle=held[0])  # pool worker 0's reference replica; no function is kept

    def learner_ranks(self, n: int, kept: list, held: list) -> LearnerSeats:
        return LearnerSeats(handles=tuple(held[:n]))  # pool worker r is rank r for the whole run

    def on_death(self, role: str) -> Death:
        # a dead pool worker breaks the pool's data-parallel group; a death during decode re-runs the rollout from
        # the step's start, as a verl job resumed from the step's checkpoint would
        return Death(whole=True, rollout_over=role == "decode")

    def ppo_rank(self, role: str, rank: int) -> PpoSeat:
        return PpoSeat(held=True)  # one rank: the actor on worker 0, the critic on the last; W: pool worker r


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
