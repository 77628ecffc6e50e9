"""What an emulated device is (`runtime.device=emulated`): the replayed length table and the performance model.

The runtime's emulated workers (`runtime.devices.emulated`) sleep by these numbers and the simulator's validation of an
emulated run (`sim.modelled`) plays by the same ones, so both read them from here, below both. Lengths come from
the simulator's paper-testbed workload or a trace a user brings; the perf model, its time model and the KV
capacity are the simulator's for one device of the configured kind (TP 1: one unit is one device).

Replay is keyed by prompt, across epochs (`LengthTable.prompts`): the run's train prompt i replays the trace's
prompt i (the i-th by the number its id ends in), and its visit in run epoch e replays that prompt's trace epoch e,
so a length predictor sees each prompt's history as the paper's does (lengths that move a little from epoch to
epoch), whatever order the run draws its prompts in. The run's epoch of a group is its position in the prompt
stream over the train split's size (`run.runner.PromptStream`: every epoch visits every train prompt once, `batch`
prompts a step). A table written before (no `prompts`) replays by (step, group, sample) as it did.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import ConfigError, require


@dataclass(frozen=True)
class LengthTable:
    """Replayed response lengths and rewards, with the perf inputs every worker and the validation share: gpu,
    model, capacity (KV slots of one replica) and ctx (the time model's mean context).

    prompts: [trace prompt][trace epoch][sample] lengths, replayed by prompt id (module header); prompt_rewards the
    same shape, or None (a seeded coin). lengths / rewards: [step][group][sample], read only by a table without
    `prompts` (written before replay was keyed by prompt). n_train, batch: the run's train prompts and prompts per
    step, which place a group in its epoch."""

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
    exchange: bool = False
    """The run's emulated learner ranks spend the gradient exchange per rank (`PerfModel.grad_exchange_s`); False
    in a table written before they did (`sim.modelled` then plays the exchange as free, as it was)."""
    prompts: list | None = None
    prompt_rewards: list | None = None
    n_train: int = 0
    batch: int = 0

    def slot(self, step: int, group: int, prompt_id: str) -> tuple[int, int]:
        """(trace prompt, trace epoch) that the run's `prompt_id`, drawn as group `group` of step `step` (1-based),
        replays: the run's epoch of that draw, cycling the prompt's recorded epochs."""
        i = prompt_index(prompt_id) % len(self.prompts)
        epoch = ((step - 1) * self.batch + group) // self.n_train
        return i, epoch % len(self.prompts[i])

    def length(self, step: int, row: int, G: int, cap: int, prompt_id: str | None = None) -> int:
        """The response length of `row` (= group * G + sample) at run step `step` (1-based): by prompt id when the
        table is keyed by prompt and the id is given, else by (step, group, sample), cycling the table."""
        if self.prompts is not None and prompt_id is not None:
            i, e = self.slot(step, row // G, prompt_id)
            g = self.prompts[i][e]
        else:
            s = self.lengths[(step - 1) % len(self.lengths)]
            g = s[(row // G) % len(s)]
        return int(min(max(1, g[(row % G) % len(g)]), cap))

    def reward(self, step: int, row: int, G: int, seed: int, prompt_id: str | None = None) -> float:
        g = None
        if self.prompts is not None and prompt_id is not None:
            if self.prompt_rewards is not None:
                i, e = self.slot(step, row // G, prompt_id)
                g = self.prompt_rewards[i][e]
        elif self.rewards is not None:
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


def prompt_index(prompt_id: str) -> int:
    """The number a prompt id ends in (every task's ids do: `train-00017`, `gsm8k-00017`, `syn-17`), else a stable
    hash of the id."""
    m = re.search(r"(\d+)$", prompt_id)
    return int(m.group(1)) if m else zlib.crc32(prompt_id.encode())


def by_prompt(work) -> tuple[list, list | None]:
    """A workload's (lengths, rewards) as [prompt][epoch][sample], prompts ordered by `prompt_index`, each
    prompt's epochs in the order the trace visits them; rewards None when the trace has none."""
    hist: dict[str, list] = {}
    for s in work:
        for g in s.groups:
            hist.setdefault(g.prompt_id, []).append((list(g.lengths), list(g.rewards)))
    ids = sorted(hist, key=lambda p: (prompt_index(p), p))
    lengths = [[ls for ls, _ in hist[p]] for p in ids]
    has = any(rw for p in ids for _, rw in hist[p])
    return lengths, ([[rw for _, rw in hist[p]] for p in ids] if has else None)


def mix(seed: int, row: int, salt: int) -> int:
    """A 32-bit hash of (seed, row, salt) (splitmix-like), stable across processes and Python versions."""
    x = (seed * 0x9E3779B1 + row * 0x85EBCA77 + salt * 0xC2B2AE3D) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    return x


def build_table(cfg, steps: int, n_train: int = 0) -> LengthTable:
    """The run's length table, keyed by prompt (module header): the simulator's paper-testbed workload for the
    run's model, batch and group size, over `n_train` prompts (the run's train split; 0 = the case's own count)
    and every epoch a `steps`-step run reaches, or a trace a user brings (`runtime.length_trace` = a path), whole;
    capacity and ctx as the simulator sizes them."""
    from rlhfless.sim import MAX_SIM_STEPS
    from rlhfless.sim.scenario import SCENARIOS, SimConfig, build_cluster, workload

    rt, batch = cfg.runtime, cfg.rollout.prompts_per_step
    base = dict(device=rt.emulated_gpu, n_devices=rt.units, model=rt.emulated_model, tp=1, algo=cfg.algo.name,
                group_size=cfg.algo.group_size, prompts_per_step=batch)
    if rt.length_trace == "paper-testbed":
        cases = [c for c in SCENARIOS["paper-testbed"] if c["model"] == rt.emulated_model]  # this algo's first
        case = next((c for c in cases if c.get("algo", "grpo") == cfg.algo.name), cases[0] if cases else None)
        require(case is not None, "runtime.emulated_model", "the paper-testbed workload has qwen2.5-3b and "
                f"qwen2.5-7b (got {rt.emulated_model!r}); bring a trace with runtime.length_trace=PATH")
        keep = {k: v for k, v in case.items() if k not in ("name", "model", "algo", "group_size", "prompts_per_step",
                                                            "steps", "n_devices", "device")}
        n = max(n_train or keep.get("n_prompts", 1024), batch)
        epochs = -(-max(1, steps) * batch // (n_train or n)) + 1  # the epochs the run reaches, and one more
        sim = SimConfig(**{**keep, **base, "n_prompts": n, "steps": min(epochs * -(-n // batch), MAX_SIM_STEPS)})
    else:
        trace = Path(rt.length_trace)
        require(not trace.is_dir(), "runtime.length_trace",
                f"{rt.length_trace!r} is a folder; give a trace file (a run's traces/rollouts.jsonl) or paper-testbed")
        require(trace.is_file(), "runtime.length_trace",
                f"must be paper-testbed or an existing trace file ({rt.length_trace!r} does not exist)")
        sim = SimConfig(**base, steps=MAX_SIM_STEPS, workload="trace", trace=rt.length_trace)
    work, note = workload(sim)
    cluster = build_cluster(sim, 1, work)
    lengths, rewards = by_prompt(work)
    return LengthTable([], None, rt.emulated_gpu, rt.emulated_model, int(cluster.capacity),
                       float(_ctx(cluster.time_model.source)), f"{rt.length_trace}: {note}", shares=True, exchange=True,
                       prompts=lengths, prompt_rewards=rewards, n_train=n_train or len(lengths), batch=batch)


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
