"""PPO in the runtime (issue 22): the value function, and the actor and critic updates as functions of their own.

One module-scoped set of small real runs (worker processes, 3 steps of 8 prompts, two decode functions): the
serverful control and the serverless runtime through `runtime.mode=compare`, serverless with separate images, the
inline loop on one thread, runs with workers killed at protocol events (`KillOn`: no clock), a KL run in both
modes, and a resumed run. Every run of one KL setting must produce the same samples and the same policy and
critic, bit for bit.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfless.config import load_run_config
from rlhfless.run.launch import train
from rlhfless.runtime import executor
from rlhfless.run.compare import samples_match, weights_digest
from rlhfless.runtime.config import available_cores
from rlhfless.bench.faults import KillOn, KillRule

pytestmark = pytest.mark.skipif(available_cores() < 2, reason="the runtime tests need 2 cores")

TINY = ["train.steps=3", "rollout.prompts_per_step=8", "rollout.max_new_tokens=48", "train.eval_prompts=0",
        "train.checkpoint_every=0", "tracking.mode=disabled", "runtime.gantt_every=0", "task.arith.k_max=6",
        "plan.scale=false", "plan.max_actors=2"]
KL = ["algo.kl_coef=0.01", "critic.values_chunk=1"]  # serverless streams the value chunks; the reference still runs


def _run(tmp: Path, name: str, extra: list[str], chaos: KillOn | None = None) -> Path:
    cfg = load_run_config("experiments/configs/quickstart_ppo.yaml", TINY + extra)
    if chaos is not None:
        executor.RUNTIME_HOOKS.append(chaos.attach)
    try:
        train(cfg, tmp / name, progress=False)
    finally:
        if chaos is not None:
            executor.RUNTIME_HOOKS.remove(chaos.attach)
    return tmp / name


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _critic(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "last" / "critic.safetensors"))


def _same_critic(a: Path, b: Path) -> bool:
    ta, tb = _critic(a), _critic(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runtime_ppo")
    out = {"compare": _run(tmp, "compare", ["runtime.mode=compare"])}
    out["serverful"], out["serverless"] = out["compare"] / "serverful", out["compare"] / "serverless"
    out["separate"] = _run(tmp, "separate", ["runtime.mode=serverless", "runtime.hybrid=false"])
    out["inline"] = _run(tmp, "inline", ["train.threads=1"])
    # the serverful pool's critic worker killed the moment it is sent its update (step 2), its actor the moment
    # it is sent the old log-probs (step 3, during the value forward): the pool restarts whole, never a function
    out["serverful_chaos"] = KillOn(KillRule("sent", "critic_learn", 2), KillRule("sent", "ppo_old", 3))
    out["serverful_killed"] = _run(tmp, "serverful_killed", ["runtime.mode=serverful"], out["serverful_chaos"])
    # KL in the reward (the reference function runs), functions kept warm; killed: the value function, the actor
    # and the critic function of step 2, each the moment it is sent its work
    out["kl_serverful"] = _run(tmp, "kl_serverful", ["runtime.mode=serverful"] + KL)
    out["chaos"] = KillOn(KillRule("sent", "values_end", 2), KillRule("sent", "ppo_actor", 2),
                          KillRule("sent", "critic_learn", 2))
    out["kl_killed"] = _run(tmp, "kl_killed", ["runtime.mode=serverless", "runtime.keep_alive_s=30"] + KL,
                            out["chaos"])
    # the value forward in chunks of one sequence (G = 1): streamed into the value function during decode (serverless), one
    # after the other (serverful), in one process (inline); the first streamed function killed at its first chunk
    chunked = ["critic.values_chunk=1"]
    out["chunked_serverful"] = _run(tmp, "chunked_serverful", ["runtime.mode=serverful"] + chunked)
    out["chunked_inline"] = _run(tmp, "chunked_inline", ["train.threads=1"] + chunked)
    out["chunk_chaos"] = KillOn(KillRule("sent", "values_chunk", 2))
    out["streamed"] = _run(tmp, "streamed", ["runtime.mode=serverless"] + chunked, out["chunk_chaos"])
    return out


GROUP = ("serverful", "serverless", "separate", "inline", "serverful_killed")


@pytest.mark.parametrize("name", GROUP[1:])
def test_every_mode_gives_the_same_samples_policy_and_critic(runs, name):
    """Serverless (hybrid and separate images), the killed serverful pool and the inline loop on one thread all
    equal the serverful control: samples every step, the final policy's bytes, every critic tensor (weights,
    AdamW moments). The critic's file would differ if any mode skipped or repeated a critic step."""
    base, run = runs["serverful"], runs[name]
    identical, first, n = samples_match(base, run)
    assert n == 3 and identical, f"{name}: samples differ from step {first}"
    assert weights_digest(run) == weights_digest(base) is not None
    assert _same_critic(run, base)
    metrics = [r for r in _rows(run / "metrics.jsonl") if "critic/vf_loss" in r]
    assert len(metrics) == 3 and metrics[-1]["critic/vf_loss"] == [
        r for r in _rows(base / "metrics.jsonl") if "critic/vf_loss" in r][-1]["critic/vf_loss"]


def test_compare_runs_ppo_without_an_overlap_arm(runs, capsys):
    from rlhfless.run.train_cli import _print_comparison

    result = json.loads((runs["compare"] / "comparison.json").read_text())
    assert result["arms"] == ["serverful", "serverless"] and result["overlap_only"] is None
    assert result["samples_identical"] and result["weights_identical"]
    _print_comparison(result)  # what `rlhfless train` prints for runtime.mode=compare
    err = capsys.readouterr().err
    assert "serverless / serverful: step time" in err and "serverful-overlap" not in err


def _steps(run: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for i in _rows(run / "invocations.jsonl"):
        out.setdefault(i["step"], []).append(i)
    return out


@pytest.mark.parametrize("name", ["serverless", "separate"])
def test_values_actor_and_critic_are_functions_of_their_own(runs, name):
    """Each step: one value invocation and one critic invocation on the same critic-image worker, one actor
    (learner) invocation on another; every worker released at the end (scale to zero); each function billed."""
    for step, invs in _steps(runs[name]).items():
        by = {k: [i for i in invs if i["kind"] == k and i["ok"]] for k in ("values", "critic", "learner", "decode")}
        assert [len(by[k]) for k in ("values", "critic", "learner")] == [1, 1, 1], (step, by)
        assert by["values"][0]["worker"] == by["critic"][0]["worker"] and by["values"][0]["worker"].startswith(
            "values+critic")
        assert by["learner"][0]["worker"] != by["critic"][0]["worker"]
        if name == "serverless":  # hybrid: the last decode function to reply goes on as the actor, warm
            # Its reply is the end of its reward invocation, not of its decode (a decode that ended first may score
            # longer), and it is taken only once no other decode function still works: after every other's reply.
            actor = by["learner"][0]
            replies = [i for i in invs if i["kind"] == "reward" and i["worker"] != actor["worker"]]
            assert actor["worker"] in {i["worker"] for i in by["decode"]} and not actor["cold"]
            assert all(i["finished_s"] <= actor["requested_s"] for i in replies), (step, actor, replies)
        else:
            assert by["learner"][0]["worker"].startswith("learner")
    assert all(w["released_s"] is not None and not w["killed"] for w in _rows(runs[name] / "workers.jsonl"))
    for r in [r for r in _rows(runs[name] / "metrics.jsonl") if "timing_s/step" in r]:
        assert r["function/values/billed_s"] > 0 and r["function/critic/billed_s"] > 0
        assert not any("values+critic" in k for k in r)  # the image's time is split by what it was doing


def test_the_actor_computes_the_old_log_probs_during_the_value_forward(runs):
    """Two mini-batches need the sampling policy's log-probs: the actor is sent them ahead (`ppo_old`) when the
    value function starts, in both modes; a re-run actor on a fresh worker computes them itself."""
    for name in ("serverful", "serverless", "separate"):
        actors = [i for i in _rows(runs[name] / "invocations.jsonl") if i["kind"] == "learner" and i["ok"]]
        assert len(actors) == 3 and all(i["extra"]["old_ahead"] == 1.0 for i in actors), name
    rerun = [i for i in _rows(runs["kl_killed"] / "invocations.jsonl") if i["kind"] == "learner" and i["ok"]]
    assert [i["extra"]["old_ahead"] for i in rerun] == [1.0, 0.0, 1.0]


def test_the_critic_trains_beside_the_actor(runs):
    """The critic function gets its work once the actor has written the returns, before the actor's optimiser
    steps are done: in some step of the serverless runs the two invocations overlap in time."""
    overlapping = 0
    for name in ("serverless", "separate", "kl_killed"):
        for invs in _steps(runs[name]).values():
            actor = [i for i in invs if i["kind"] == "learner" and i["ok"]][0]
            critic = [i for i in invs if i["kind"] == "critic" and i["ok"]][0]
            overlapping += critic["requested_s"] < actor["finished_s"]
    assert overlapping >= 1


def test_killed_ppo_functions_are_re_run_to_the_same_policy_and_critic(runs):
    """Value, actor and critic functions killed at step 2 (each the moment it was sent its work) are re-run on
    fresh workers from the same state files: the same samples, policy and critic as the undisturbed serverful run
    with the same KL; each kill is a failed invocation and a killed worker, nothing more."""
    run, base = runs["kl_killed"], runs["kl_serverful"]
    assert [rule.op for rule, _ in runs["chaos"].fired] == ["values_end", "ppo_actor", "critic_learn"]
    assert samples_match(base, run)[0] and weights_digest(run) == weights_digest(base)
    assert _same_critic(run, base)
    failed = sorted(i["kind"] for i in _rows(run / "invocations.jsonl") if not i["ok"])
    assert failed == ["critic", "learner", "values"]
    killed = {w["worker"] for w in _rows(run / "workers.jsonl") if w["killed"]}
    assert killed == {w for _, w in runs["chaos"].fired}
    kinds = {i["kind"] for i in _rows(run / "invocations.jsonl")}
    assert "reference" in kinds and any(r.get("critic/kl_penalty", 0) != 0 for r in _rows(run / "metrics.jsonl"))


def test_the_serverful_pool_restarts_when_its_critic_or_actor_worker_dies(runs):
    run = runs["serverful_killed"]
    assert [rule.op for rule, _ in runs["serverful_chaos"].fired] == ["critic_learn", "ppo_old"]
    failed = {(i["step"], i["kind"]) for i in _rows(run / "invocations.jsonl") if not i["ok"]}
    assert (2, "critic") in failed and (3, "learner") in failed
    workers = _rows(run / "workers.jsonl")
    assert all(w["worker"].startswith("pool") for w in workers)  # the control never starts a function
    assert sum(w["killed"] for w in workers) == 2 and len(workers) == 6  # the pool of 2, restarted twice


def test_a_resumed_serverless_ppo_run_equals_the_uninterrupted_one(runs, tmp_path):
    """The checkpoint carries the critic out of the runtime (the driver's mirror is synced) and back in."""
    cfg = load_run_config("experiments/configs/quickstart_ppo.yaml", TINY + ["runtime.mode=serverless",
                                                                             "train.checkpoint_every=1"])
    out = tmp_path / "resumed"
    train(replace(cfg, train=replace(cfg.train, steps=2)), out, progress=False)
    train(cfg, out, progress=False, resume=True)
    assert samples_match(runs["serverless"], out)[0]
    assert weights_digest(out) == weights_digest(runs["serverless"]) and _same_critic(out, runs["serverless"])


@pytest.mark.parametrize("name", ["chunked_inline", "streamed"])
def test_the_value_forward_streams_in_chunks_to_the_same_numbers(runs, name):
    """critic.values_chunk=1: serverless sends each chunk of finished groups to the value function while the rest
    decodes (even with the first such function killed at its first chunk of step 2); the serverful control and the
    inline loop compute the same chunks after the rollout. Same samples, policy and critic, bit for bit."""
    base, run = runs["chunked_serverful"], runs[name]
    assert samples_match(base, run)[0] and weights_digest(run) == weights_digest(base) is not None
    assert _same_critic(run, base)
    assert weights_digest(run) != weights_digest(runs["serverful"])  # chunks change the last bits of the values


def test_streamed_value_chunks_are_computed_during_decode_and_re_sent_after_a_death(runs):
    run = runs["streamed"]
    metrics = [r for r in _rows(run / "metrics.jsonl") if "timing_s/step" in r]
    assert all(r["runtime/values_chunks_streamed"] <= 8 for r in metrics)
    assert sum(r["runtime/values_chunks_streamed"] for r in metrics) >= 1
    assert all(r["runtime/values_chunks_streamed"] == 0 for r in _rows(runs["chunked_serverful"] / "metrics.jsonl")
               if "timing_s/step" in r)
    values = [i for i in _rows(run / "invocations.jsonl") if i["kind"] == "values"]
    assert [(i["step"], i["ok"]) for i in values] == [(1, True), (2, False), (2, True), (3, True)]
    assert all(i["extra"]["chunks"] == 8 for i in values if i["ok"])
    assert [rule.op for rule, _ in runs["chunk_chaos"].fired] == ["values_chunk"]
    killed = [w["worker"] for w in _rows(run / "workers.jsonl") if w["killed"]]
    assert killed == [runs["chunk_chaos"].fired[0][1]] and killed[0].startswith("values+critic")


def test_a_message_from_a_worker_that_no_longer_holds_a_role_is_ignored():
    """One poll can return a death that restarts the serverful pool and, after it, a reply or the returns of a
    worker of the old pool: they belong to work that is re-run, so they must neither complete a role nor let the
    critic start early (before, the reply raised KeyError and the returns counted)."""
    from types import SimpleNamespace

    from rlhfless.runtime.attempts import Attempts
    from rlhfless.runtime.modes.policy import ServerfulPolicy
    from rlhfless.runtime.ppo_stages import _Update

    records = []
    ledger = SimpleNamespace(record=lambda *a, **k: records.append(a[1]))
    from rlhfless.runtime.config import RuntimeConfig

    stream = SimpleNamespace(ctx=SimpleNamespace(ledger=ledger, policy=ServerfulPolicy(), config=RuntimeConfig()),
                             step=2, actor_requested=None, early={},
                             actor_tries=Attempts("PPO actor of step 2", 3), _live=lambda h: True,
                             tries=lambda kind: Attempts(f"{kind} of step 2", 3))
    update = _Update(stream, {"op": "ppo_actor"}, {"op": "critic_learn"})
    old, actor, critic = object(), object(), object()
    update.sent = {("learner", 0): (actor, 1.0, False), ("critic", 0): (critic, 1.5, False)}
    reply = {"step": 2, "t_start": 2.0, "t_end": 3.0, "sync_s": 0.0, "old_ahead": True, "metrics": {}}
    update._on(old, {"op": "ppo_returns", "step": 2})
    update._on(old, {**reply, "op": "critic_learned"})
    update._on(old, {**reply, "op": "ppo_learned"})
    assert not update.returns_ready and update.replies == {} and records == []
    update._on(actor, {"op": "ppo_returns", "step": 2})
    update._on(critic, {**reply, "op": "critic_learned"})
    assert update.returns_ready and list(update.replies) == [("critic", 0)] and records == ["critic"]
    assert list(update.sent) == [("learner", 0)]


def test_functions_idle_past_their_keep_alive_are_released_and_the_whole_state_still_matches(tmp_path):
    """A short keep-alive: PPO's actor and critic functions idle from their update to the next step's value stage,
    far past 0.05 s, so they are released at the lapse (issue 30: before, the check ran only at a step's start and
    the critic idled 3.1 s past a 2 s keep-alive unreleased). The comparison still finds every arm's samples and
    whole final state (policy, optimizer, critic: tensors byte for byte) identical."""
    c = json.loads((_run(tmp_path, "cmp", ["runtime.mode=compare", "runtime.keep_alive_s=0.05"])
                    / "comparison.json").read_text())
    assert c["samples_identical"] and c["weights_identical"] and c["final_state_identical"]
    assert c["final_state_files"] == ["critic.safetensors", "model.safetensors", "optimizer.safetensors"]
    assert c["released_expired"] >= 1 and 0 <= c["released_mid_step"] <= c["released_expired"]
    sl = c["serverless"]
    assert sl["released_expired"] == c["released_expired"] and sl["workers_started"] > 2
    # the released functions' held time ended at their lapse: billed per lifetime, the serverless run bills its
    # idle too, per invocation none of it
    bills = sl["cost_device_s_by_billing"]
    assert bills["invocations"] < bills["lifetime"] == pytest.approx(sl["cost_device_s"])
    assert set(sl["device_s_by_role"]) >= {"decode", "learner", "critic"}


# -- data-parallel PPO (issue 40): runtime.learner_units=2 actor and critic ranks ---------------------------------
# A harder task and 16 prompts so the actor's first step moves (the quickstart's k_max=6 batch is all correct).
DP = ["task.arith.k_max=40", "rollout.prompts_per_step=16", "runtime.units=2"]


def _state(run: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "last" / f"{name}.safetensors"))


def _max_diff(a: Path, b: Path, name: str) -> float:
    ta, tb = _state(a, name), _state(b, name)
    assert ta.keys() == tb.keys()
    return max((ta[k].double() - tb[k].double()).abs().max().item() for k in ta if ta[k].is_floating_point())


@pytest.fixture(scope="module")
def dp_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runtime_ppo_dp")
    out = {"one": _run(tmp, "one", ["runtime.mode=serverful", "train.steps=1"] + DP),
           "two": _run(tmp, "two", ["runtime.mode=serverful", "train.steps=1", "runtime.learner_units=2"] + DP),
           "compare": _run(tmp, "compare", ["runtime.mode=compare", "train.steps=2", "runtime.learner_units=2"] + DP)}
    # serverless: actor rank 0 killed the moment it is sent its update (step 2), then critic rank 0: each role's
    # surviving rank leaves its broken group, and the whole role re-runs on fresh functions
    out["chaos"] = KillOn(KillRule("sent", "ppo_actor", 2), KillRule("sent", "critic_learn", 2))
    out["killed"] = _run(tmp, "killed", ["runtime.mode=serverless", "train.steps=2", "runtime.learner_units=2"] + DP,
                         out["chaos"])
    # serverful: a pool worker killed as it is sent its critic rank (step 2): the pool restarts whole
    out["pool_chaos"] = KillOn(KillRule("sent", "critic_learn", 2))
    out["pool_killed"] = _run(tmp, "pool_killed", ["runtime.mode=serverful", "train.steps=2",
                                                   "runtime.learner_units=2"] + DP, out["pool_chaos"])
    return out


@pytest.mark.slow
def test_two_ranks_train_as_one_within_float_rounding(dp_runs):
    """One step of 16 samples on one actor and one critic rank against two of each (serverful; the same samples):
    the policy, its AdamW moments and the critic agree within 2e-5, where the step moves the policy by about 1e-4
    (AdamW's first step at lr 1e-4) and two ranks that stepped on their own halves would differ by that much
    (measured: 1.8e-6 / 1.1e-6 apart with the all-reduce). The two ranks' update is not the same bits: its
    gradients and old log-probs come from other batch shapes and are summed in another order."""
    one, two = dp_runs["one"], dp_runs["two"]
    assert samples_match(one, two)[0]
    assert len([i for i in _rows(two / "invocations.jsonl") if i["kind"] == "learner" and i["ok"]]) == 2
    start = load_file(str(Path(load_run_config(None, []).policy.checkpoint) / "model.safetensors"))
    trained = _state(one, "model")
    assert max((trained[k].double() - start[k].double()).abs().max().item() for k in start) > 5e-5
    for name in ("model", "optimizer", "critic"):
        assert _max_diff(one, two, name) < 2e-5, name


@pytest.mark.slow
def test_two_serverless_ranks_equal_two_serverful_ranks_bit_for_bit(dp_runs):
    """At two ranks the serverless functions (a gloo group per role and update) and the serverful pool (its own
    group, every worker an actor rank and a critic rank) give the same samples, policy, AdamW and critic bytes;
    each step has two actor and two critic invocations in both modes, on two workers each."""
    result = json.loads((dp_runs["compare"] / "comparison.json").read_text())
    assert result["samples_identical"] and result["weights_identical"] and result["final_state_identical"]
    base, run = dp_runs["compare"] / "serverful", dp_runs["compare"] / "serverless"
    assert _same_critic(run, base)
    for arm in (base, run):
        for step, invs in _steps(arm).items():
            for kind in ("learner", "critic"):
                ok = [i for i in invs if i["kind"] == kind and i["ok"]]
                assert len(ok) == 2 and len({i["worker"] for i in ok}) == 2, (arm.name, step, kind)


@pytest.mark.slow
def test_a_killed_rank_re_runs_its_role_to_the_same_state(dp_runs):
    """A serverless actor rank and then a critic rank killed at step 2, and a serverful pool worker killed as it is
    sent its critic rank: each role re-runs whole from the same files, to the undisturbed two-rank state, bit for
    bit; each kill is one failed invocation of the killed worker's role (its peer's is recorded as restarted)."""
    base = dp_runs["compare"] / "serverful"
    assert [rule.op for rule, _ in dp_runs["chaos"].fired] == ["ppo_actor", "critic_learn"]
    assert [rule.op for rule, _ in dp_runs["pool_chaos"].fired] == ["critic_learn"]
    for name in ("killed", "pool_killed"):
        run = dp_runs[name]
        assert samples_match(base, run)[0] and weights_digest(run) == weights_digest(base), name
        assert _same_critic(run, base), name
    failed = [i for i in _rows(dp_runs["killed"] / "invocations.jsonl") if not i["ok"]]
    killed = {w for _, w in dp_runs["chaos"].fired}
    assert sorted(i["kind"] for i in failed if i["worker"] in killed) == ["critic", "learner"]
