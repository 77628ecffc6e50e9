"""The mode is a policy object, not branches: the stages never name a mode, they ask `ModePolicy`, and a third
platform policy is a registered subclass of a few lines that a `Runtime` of its mode runs with."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import fields, replace
from pathlib import Path

import pytest

from rlhfless.runtime.config import MODES, available_cores
from rlhfless.runtime.modes.policy import MODE_POLICIES, Keep, ModeTraits, ServerlessPolicy, register_policy

RUNTIME = Path(__file__).resolve().parents[1] / "rlhfless" / "runtime"
STAGE_FILES = ("stages.py", "streaming.py", "ppo_stages.py", "executor.py", "workerset.py", "ledger.py", "weights.py",
               "clock.py")
"""Where a step's work is run: every decision in them that differs by mode must be the policy's."""


def mode_branches(source: str) -> list[str]:
    """Code in `source` that names a mode: an identifier containing one (`rt.serverful`, `_restart_serverful`)
    or a string literal that is one (`mode == "serverful"`). Comments and prose in docstrings may name them."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and any(m in tok.string for m in MODES if m != "inline"):
            found.append(f"line {tok.start[0]}: {tok.line.strip()}")
        elif tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string: not a plain mode name
                continue
            if value in MODES:
                found.append(f"line {tok.start[0]}: {tok.line.strip()}")
    return found


def test_no_stage_branches_on_the_mode():
    for name in STAGE_FILES:
        assert mode_branches((RUNTIME / name).read_text()) == [], f"runtime/{name} branches on the mode"


def test_the_check_finds_a_branch_on_the_mode():
    """The check above is not vacuous: the branches the stages had, in each spelling, are found."""
    assert mode_branches("if rt.serverful:\n    pass\n") == ["line 1: if rt.serverful:"]
    assert mode_branches("x = 1 if mode == 'serverful' else 2\n") != []
    assert mode_branches("def _restart_serverful(a):\n    pass\n") != []
    assert mode_branches('def f():\n    """The serverful pool restarts."""\n    # serverless: kept\n') == []


@pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")
def test_a_third_platform_policy_is_a_registered_subclass_that_the_stages_ask(tmp_path):
    """A platform that never lets a learner function go to free a unit for decode work: four lines. A Runtime of
    its mode runs with it, and the learner stream's preemption follows it on the same worker where the
    serverless policy lets the rank go."""
    from rlhfless.config import load_run_config
    from rlhfless.learn.learner import Learner
    from rlhfless.model.factory import load_policy
    from rlhfless.run.runner import ensure_policy
    from rlhfless.runtime.executor import Runtime
    from rlhfless.runtime.streaming import LearnerStream

    @register_policy
    class Pinned(ServerlessPolicy):
        name = "test-pinned"
        traits = replace(ServerlessPolicy.traits, preempts_learners=False)

        def no_work_now(self, keep_alive_s: float) -> Keep:
            return Keep(release="plan")  # the worker set carries out this mode's rule, not serverless's

    cfg = load_run_config("experiments/configs/quickstart.yaml",
                          ["train.steps=1", "rollout.prompts_per_step=2", "algo.group_size=2",
                           "tracking.mode=disabled", "runtime.mode=serverless", "runtime.prewarm=false"])
    ensure_policy(cfg, progress=False)
    rt = None
    try:
        rt = Runtime(cfg, "test-pinned", Learner(load_policy(cfg.policy.resolved()), cfg.optim, cfg.algo), tmp_path)
        assert isinstance(rt.policy, Pinned)
        h = rt.workers.start_learner(prewarmed=False)
        rt.workers.pool.await_ready([h])
        for policy, lets_go in ((rt.policy, False), (ServerlessPolicy(), True)):
            stream = LearnerStream(replace(rt.context(1), policy=policy), [[1, 2, 3], [4, 5]], seed=0, overlap=False)
            stream._assign(stream.ranks[0], h)  # rank 0 holds the worker, its groups not in yet
            assert stream.preempt() is lets_go, policy.name
            assert (stream.ranks[0].handle is None) is lets_go
            assert (h.worker in rt.workers.pool.handles) is not lets_go, "the pinned rank keeps its worker"
        # a mode decides, the worker set acts: with no work now, serverless keeps a function for its keep-alive,
        # this mode releases it at once, and the worker set does what the mode returned
        h = rt.workers.start_learner(prewarmed=False)
        rt.workers.pool.await_ready([h])
        rt.workers.no_work_now(h)
        assert h.worker not in rt.workers.pool.handles
        assert rt.workers.pool.records[h.worker].release_reason == "plan"
    finally:
        MODE_POLICIES.pop("test-pinned", None)
        if rt is not None:
            rt.cleanup()


ACTS = {"idle", "release", "busy", "unwait", "dead", "stop", "start", "start_decoders", "start_single",
        "start_learner", "start_critic", "keep_reference", "forget_learners", "drop_learner", "add_learner", "take",
        "pump", "restart_pool", "make_room", "claim", "send"}
"""What changes a worker's life or the worker set's state: only the worker set (and the stages) call these."""


def mode_acts(source: str) -> list[str]:
    """Calls in `source` of a method that acts on workers (`ACTS`), as `line N: name`, in source order."""

    calls = [n for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ACTS]
    return [f"line {n.lineno}: {n.func.attr}" for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]


def test_a_mode_decides_and_never_acts():
    """runtime/modes/ starts, keeps and releases nothing itself: its methods return decisions as data, and the worker
    set carries them out (`WorkerSet.settle`, `decoders`, `decoder_done`, `seat_learners`, `reference_function`)."""
    for path in sorted((RUNTIME / "modes").glob("*.py")):
        assert mode_acts(path.read_text()) == [], f"runtime/modes/{path.name} acts on workers"


def test_the_check_finds_a_mode_that_acts():
    """Not vacuous: the policy as it was before its decisions became data (it idled, released, marked busy,
    unwaited and started workers itself) is caught."""
    acted = ("def no_work_now(self, pool, h, keep_alive_s):\n    pool.idle(h)\n"
             "    if keep_alive_s == 0:\n        pool.release(h, reason='lapse')\n"
             "def decoders(self, ctx, n):\n    ctx.workers.pool.busy(h)\n"
             "    return ctx.workers.start_decoders(n, prewarmed=False)\n")
    assert [x.split(": ")[1] for x in mode_acts(acted)] == ["idle", "release", "busy", "start_decoders"]


DRIVER_STAGES = ("stages.py", "streaming.py", "ppo_stages.py", "loop_stages.py")
"""The stage files whose branches on a mode's flags issue 38 counts (24 at its filing, 16 before PPO's seats)."""
MAX_FLAG_SITES = 10
"""Issue 38's target: what is left of them once each other decision is the mode's, returned as data."""


def trait_reads(source: str) -> list[str]:
    """Reads of a mode's flag in `source` (`<x>.traits.<field>`, or `traits.<field>` off a local), as
    `line N: field`, in source order."""
    def on_traits(n) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "traits" or isinstance(n, ast.Name) and n.id == "traits"

    reads = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and on_traits(n.value)]
    return [f"line {n.lineno}: {n.attr}" for n in sorted(reads, key=lambda n: (n.lineno, n.col_offset))]


def test_the_stages_branch_on_few_mode_flags():
    """The stages ask the mode for its decisions (`ppo_rank`, `on_death`, `no_work_now`, ...) rather than branch on
    its flags: at most `MAX_FLAG_SITES` flag reads are left in them."""
    sites = {name: trait_reads((RUNTIME / name).read_text()) for name in DRIVER_STAGES}
    assert sum(map(len, sites.values())) <= MAX_FLAG_SITES, sites


def test_every_mode_flag_is_read():
    """A flag no module reads any more is gone from `ModeTraits` (its decision became a method)."""
    read = {r.split(": ")[1] for path in RUNTIME.rglob("*.py") for r in trait_reads(path.read_text())}
    assert {f.name for f in fields(ModeTraits)} <= read


def test_the_flag_count_finds_flag_reads():
    """Not vacuous: PPO's stream as it branched on `starts_functions` before its seats were `ModePolicy.ppo_rank`'s."""
    old = ("if not ctx.policy.traits.starts_functions:\n    pass\n"
           "x = self.ctx.policy.traits.preempts_learners or self.working\n")
    assert trait_reads(old) == ["line 1: starts_functions", "line 3: preempts_learners"]
    cached = "traits = ctx.policy.traits\nx = traits.plans_decode and ctx.policy.name\n"
    assert trait_reads(cached) == ["line 2: plans_decode"]  # a flag read off a local is still a flag read
