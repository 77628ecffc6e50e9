"""PPO's handlers on a worker: the value forward, the actor's update and the critic's update (algo.name=ppo).

    values_chunk  the critic's V(s_t) of one chunk of the batch, before any update (no reply: chunks stream in
                  while the rest decodes with runtime.overlap and critic.values_chunk)
    values_end    the step's values from its chunks, written to one file                 -> `valued`
    ppo_old       the sampling policy's log-probs, ahead, while the value function runs (no reply)
    ppo_actor     old log-probs (unless ahead), advantages and returns (`ppo.ppo_targets`); the returns file is written and
                  announced (`ppo_returns`) before the policy's optimiser steps, so the critic function can start
                  its own steps while the actor still runs; then the next policy state      -> `ppo_learned`
    critic_learn  the critic's steps on the same mini-batches; then the next critic state   -> `critic_learned`

The critic's weights and AdamW move between steps as `critic-v<k>.safetensors` in the scratch tmpfs (k = updates
done), written by the worker that ran the critic update, as the policy moves as `learner-v<k>`. A worker holding
the critic at another version loads it first (timed: `sync_s`).
"""

from __future__ import annotations

from pathlib import Path

from rlhfless.runtime import wire
from rlhfless.runtime.records import now


def load_critic_model(worker, setup: dict) -> None:
    """Build the critic on the critic checkpoint's trunk and bring it to the runtime's version (cold start)."""
    from rlhfless.learn.critic import Critic, load_critic

    built = load_critic(worker.cfg.critic, Path(setup["checkpoint"]))
    worker.critic = Critic(worker._placed(built.model), worker.cfg.critic)  # AdamW made after placing
    worker.critic_version = -1  # always loaded from the runtime's state file, as the policy is (`Worker._sync`)
    if setup.get("critic_state"):
        sync_critic(worker, setup["critic_state"], setup["critic_version"])


def sync_critic(worker, path: str, version: int) -> float:
    """The critic at `version` (weights, AdamW, counters) from its state file; returns the seconds it took."""
    from rlhfless.learn.critic import load_critic_state

    if version == worker.critic_version:
        return 0.0
    t0 = now()
    load_critic_state(worker.critic, Path(path))
    worker.critic_version = version
    return now() - t0


def values_chunk(worker, msg: dict) -> None:
    """One chunk of the value forward (`critic.value_chunks`), kept until `values_end`; no reply, so chunks can
    stream in while the rest of the step decodes."""
    t0 = now()
    st = worker.values_step
    if st is None or st["step"] != msg["step"]:  # a new step (a re-run starts over on a fresh worker)
        st = worker.values_step = {"step": msg["step"], "parts": {}, "t_start": t0, "sync_s": 0.0, "compute_s": 0.0}
    st["sync_s"] += sync_critic(worker, msg["critic_state"], msg["critic_version"])
    prompts, responses, _, _ = wire.read_batch(Path(msg["batch"]))
    st["parts"][msg["k"]] = worker.critic.chunk_values(prompts, responses, worker.G).cpu()
    st["compute_s"] += now() - t0


def values_end(worker, msg: dict) -> dict:
    """The step's values, [B*G, T], from its chunks in index order, written to msg["out"]."""
    from rlhfless.learn.critic import join_chunks

    st, n = worker.values_step, msg["n_chunks"]
    if st is None or st["step"] != msg["step"] or sorted(st["parts"]) != list(range(n)):
        got = [] if st is None or st["step"] != msg["step"] else sorted(st["parts"])
        raise RuntimeError(f"values_end of step {msg['step']}: chunks {got} of {n} are here (the driver sends "
                           "every chunk before values_end)")
    wire.write_tensors(msg["out"], {"values": join_chunks([st["parts"][k] for k in range(n)])})
    worker.values_step = None
    return {"op": "valued", "step": msg["step"], "t_start": st["t_start"], "t_end": now(), "sync_s": st["sync_s"],
            "compute_s": st["compute_s"]}


def ppo_old(worker, msg: dict) -> None:
    """The sampling policy's log-probs of the step's batch, computed while the value function runs (both are
    forwards before the update); kept for `ppo_actor`, no reply."""
    from rlhfless.learn.ppo_update import old_logprobs

    t0 = now()
    sync_s = worker._sync(msg["state_path"], msg["version"])
    prompts, responses, _, _ = wire.read_batch(Path(msg["batch"]))
    worker.ppo_old = {"step": msg["step"], "old": old_logprobs(worker.learner, prompts, responses), "t_start": t0,
                      "sync_s": sync_s}


class GroupBroken(Exception):
    """A peer of this PPO rank died in its group's rendezvous or all-reduce: the worker leaves (`worker.op_ppo`:
    `leave_broken_group`), and the driver re-runs the role. args: (the error, where)."""


def _rank_shard(worker, msg: dict):
    """This rank's `Shard` of a data-parallel PPO role (msg "rank" of "world"; None for one rank): the pool's group
    (serverful: every pool worker is a rank), or a group of this update's functions joined now (msg "dist",
    serverless: left again by `_leave`). A peer that dies in the rendezvous: GroupBroken; a rendezvous port this
    rank 0 cannot bind (`PortTaken`) is its own death."""
    from rlhfless.runtime.devices.dist import PortTaken

    if msg.get("world", 1) <= 1:
        return None
    if msg.get("dist"):
        try:
            worker._join(msg["dist"])
        except PortTaken:
            raise
        except RuntimeError as exc:  # `worker.GroupNotFormed`
            raise GroupBroken(exc.__cause__ or exc, "PPO's rank group rendezvous") from exc
    if worker.shard is None or worker.shard.world != msg["world"] or worker.shard.rank != msg["rank"]:
        raise RuntimeError(f"PPO rank {msg.get('rank')} of {msg['world']}: this worker is not that rank of a group")
    return worker.shard


def _leave(worker, msg: dict) -> None:
    """A serverless rank leaves its update's group (the pool's stays for the run)."""
    if msg.get("dist"):
        from rlhfless.runtime.devices.dist import destroy_group

        destroy_group()
        worker.shard = None


def _steps(worker, msg: dict, conn, run):
    """run(shard) inside this rank's group: a peer dead in the all-reduce raises GroupBroken (this rank leaves)."""
    shard = _rank_shard(worker, msg)
    try:
        out = run(shard)
    except RuntimeError as exc:
        if shard is None:
            raise
        raise GroupBroken(exc, "PPO's all-reduce") from exc
    _leave(worker, msg)
    return out


def ppo_actor(worker, msg: dict, conn) -> dict:
    """The actor's update; rank 0 of several (msg "rank" of "world") writes the returns and the next state (every
    rank ends with the same weights: the gradients are all-reduced before each step)."""
    from rlhfless.learn.learner import save_learner_state
    from rlhfless.learn.ppo_update import (actor_steps, needs_old_logprobs, ppo_schedule, ppo_targets,
                                           shard_old_logprobs)

    pre, worker.ppo_old = worker.ppo_old, None
    pre = pre if pre is not None and pre["step"] == msg["step"] else None
    t0 = pre["t_start"] if pre else now()
    sync_s = (pre["sync_s"] if pre else 0.0) + worker._sync(msg["state_path"], msg["version"])
    learner, lead = worker.learner, msg.get("rank", 0) == 0
    prompts, responses, rewards, ref = wire.read_batch(Path(msg["batch"]))
    vals = wire.read_tensors(msg["values"])["values"]

    def update(shard):
        old = pre["old"] if pre else None
        if old is None and shard is not None and needs_old_logprobs(learner.algo, len(responses)):
            old = shard_old_logprobs(learner, prompts, responses, shard)  # the forward split across the ranks
        t = ppo_targets(learner, prompts, responses, rewards, vals, ref, old=old)
        if lead:
            wire.write_tensors(msg["returns_out"], {"returns": t.returns})
            wire.send(conn, {"op": "ppo_returns", "step": msg["step"], "returns": msg["returns_out"]})
        schedule = ppo_schedule(learner.algo, len(responses), msg["seed"], msg["updates"])
        return {**t.metrics, **actor_steps(learner, t, responses, ref, schedule, shard)}

    metrics = _steps(worker, msg, conn, update)
    if lead:
        save_learner_state(learner, msg["state_out"])
    worker.version = msg["version"] + 1
    return {"op": "ppo_learned", "step": msg["step"], "t_start": t0, "t_end": now(), "sync_s": sync_s,
            "old_ahead": pre is not None, "metrics": {k: v for k, v in metrics.items() if v is not None}}


def critic_learn(worker, msg: dict, conn=None) -> dict:
    from rlhfless.learn.critic import save_critic_state
    from rlhfless.learn.ppo_update import critic_steps, ppo_schedule, row_prompts

    t0 = now()
    sync_s = sync_critic(worker, msg["critic_state"], msg["critic_version"])
    prompts, responses, _, _ = wire.read_batch(Path(msg["batch"]))
    rows_prompts = row_prompts(prompts, len(responses), worker.G)
    vals = wire.read_tensors(msg["values"])["values"]
    returns = wire.read_tensors(msg["returns"])["returns"]
    cfg = worker.cfg.algo
    schedule = ppo_schedule(cfg, len(responses), msg["seed"], msg["updates"])
    metrics = _steps(worker, msg, conn, lambda shard: critic_steps(worker.critic, cfg, rows_prompts, responses, vals,
                                                                   returns, schedule, shard))
    if msg.get("rank", 0) == 0:
        save_critic_state(worker.critic, Path(msg["critic_out"]))
    worker.critic_version = msg["critic_version"] + 1
    return {"op": "critic_learned", "step": msg["step"], "t_start": t0, "t_end": now(), "sync_s": sync_s,
            "metrics": metrics}
