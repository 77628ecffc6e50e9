"""What an emulated device is (`runtime.device=emulated`): the replayed length table and the performance model.

The runtime's emulated workers (`runtime.devices.emulated`) sleep by these numbers and the simulator's validation of an
emulated run (`sim.modelled`) plays by the same ones, so both read them from here, below both. Lengths come from
the simulator's paper-testbed workload or a trace a user brings; the perf model, its time model and the KV
capacity are the simulator's for one device of the configured kind (TP 1: one unit is one device).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import ConfigError, require


@dataclass(frozen=True)
class LengthTable:
    """Replayed response lengths [step][group][sample] and rewards (same shape, or None), with the perf inputs
    every worker and the validation share: gpu, model, capacity (KV slots of one replica) and ctx (the time
    model's mean context)."""

    lengths: list
    rewards: list | None
    gpu: str
    model: str
    capacity: int
    ctx: float
    source: str
    shares: bool = False
    """The run's emulated learner ranks leave at their share (`runtime.streaming`'s serverless end), as real ones
    do; False in a table written before they did (every rank then ended with the optimiser step: `sim.modelled`
    plays such a run that way)."""

    def length(self, step: int, row: int, G: int, cap: int) -> int:
        """The response length of `row` (= group * G + sample) at run step `step` (1-based), cycling the table."""
        s = self.lengths[(step - 1) % len(self.lengths)]
        g = s[(row // G) % len(s)]
        return int(min(max(1, g[(row % G) % len(g)]), cap))

    def reward(self, step: int, row: int, G: int, seed: int) -> float:
        if self.rewards is not None:
            s = self.rewards[(step - 1) % len(self.rewards)]
            g = s[(row // G) % len(s)]
            if g:
                return float(g[(row % G) % len(g)])
        return float(mix(seed, row, 0x5EED) & 1)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__))

    @classmethod
    def load(cls, path: str | Path) -> LengthTable:
        return cls(**json.loads(Path(path).read_text()))


def mix(seed: int, row: int, salt: int) -> int:
    """A 32-bit hash of (seed, row, salt) (splitmix-like), stable across processes and Python versions."""
    x = (seed * 0x9E3779B1 + row * 0x85EBCA77 + salt * 0xC2B2AE3D) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    return x


def build_table(cfg, steps: int) -> LengthTable:
    """The run's length table: the simulator's paper-testbed workload for the run's model, batch and group size,
    or a trace a user brings (`runtime.length_trace` = a path); capacity and ctx as the simulator sizes them."""
    from rlhfless.sim.scenario import SCENARIOS, SimConfig, build_cluster, workload

    rt = cfg.runtime
    base = dict(device=rt.emulated_gpu, n_devices=rt.units, model=rt.emulated_model, tp=1, algo=cfg.algo.name,
                group_size=cfg.algo.group_size, prompts_per_step=cfg.rollout.prompts_per_step,
                steps=max(1, min(steps, 1000)))
    if rt.length_trace == "paper-testbed":
        cases = [c for c in SCENARIOS["paper-testbed"] if c["model"] == rt.emulated_model]  # this algo's first
        case = next((c for c in cases if c.get("algo", "grpo") == cfg.algo.name), cases[0] if cases else None)
        require(case is not None, "runtime.emulated_model", "the paper-testbed workload has qwen2.5-3b and "
                f"qwen2.5-7b (got {rt.emulated_model!r}); bring a trace with runtime.length_trace=PATH")
        keep = {k: v for k, v in case.items() if k not in ("name", "model", "algo", "group_size", "prompts_per_step",
                                                            "steps", "n_devices", "device")}
        keep["n_prompts"] = max(keep.get("n_prompts", 1024), cfg.rollout.prompts_per_step)
        sim = SimConfig(**{**keep, **base})
    else:
        require(Path(rt.length_trace).is_file(), "runtime.length_trace",
                f"must be paper-testbed or an existing trace file (got {rt.length_trace!r})")
        sim = SimConfig(**base, workload="trace", trace=rt.length_trace)
    work, note = workload(sim)
    cluster = build_cluster(sim, 1, work)
    lengths = [[list(g.lengths) for g in s.groups] for s in work]
    rewards = [[list(g.rewards) for g in s.groups] for s in work] if any(g.rewards for s in work for g in s.groups) \
        else None
    return LengthTable(lengths, rewards, rt.emulated_gpu, rt.emulated_model, int(cluster.capacity),
                       float(_ctx(cluster.time_model.source)), f"{rt.length_trace}: {note}", shares=True)


def _ctx(source: str) -> float:
    """The context the simulator's time model was built with (its source string ends in `ctx<N>`)."""
    return float(source.rsplit("ctx", 1)[1])


def perf_model(gpu: str, model: str):
    """One emulated unit's `PerfModel`: the simulator's fitted efficiencies and overheads, TP 1."""
    from rlhfless.sim import hardware as hw
    from rlhfless.sim.perf import FITTED, PerfModel

    try:
        return PerfModel(hw.device(gpu), hw.model(model), 1, FITTED[gpu])
    except ConfigError as exc:
        raise ConfigError(f"runtime.emulated_model: one unit is one device: {exc}") from None


def time_model(table: LengthTable):
    """The decode time model every emulated worker sleeps by and the planner prices with."""
    return perf_model(table.gpu, table.model).time_model(table.capacity, table.ctx)


def ppo_split(pm) -> tuple[float, float]:
    """(forward, training) seconds per token of one PPO model (actor or critic) on one emulated unit: the
    simulator's `learner_s_per_token("ppo")` is two of each (reference + value forwards, actor + critic training;
    `sim.perf.PPO_MODELS`), so the value function sleeps one forward, the actor one forward (its old log-probs) and
    one training pass, the critic one training pass. The critic is modelled like the actor (the policy's size)."""
    train = pm.train_s_per_token("grpo")
    return pm.learner_s_per_token("grpo") - train, train
