"""What an emulated device is (`runtime.device=emulated`): the replayed length table and the performance model.

The runtime's emulated workers (`runtime.devices.emulated`) sleep by these numbers and the simulator's validation of an
emulated run (`sim.modelled`) plays by the same ones, so both read them from here, below both. Lengths come from
the simulator's paper-testbed workload or a trace a user brings; the perf model, its time model and the KV
capacity are the simulator's for one replica of the configured kind at the tuned engine's TP (`runtime.emulated_tp`,
`LengthTable.tp`: a function of k units is one TP-k replica; 1 by default: one unit is one device).

Replay is keyed by prompt, across epochs (`LengthTable.prompts`): the run's train prompt i replays the trace's
prompt i (the i-th by the number its id ends in), and its visit in run epoch e replays that prompt's trace epoch e,
so a length predictor sees each prompt's history as the paper's does (lengths that move a little from epoch to
epoch), whatever order the run draws its prompts in. The run's epoch of a group is its position in the prompt
stream over the train split's size (`run.runner.PromptStream`: every epoch visits every train prompt once, `batch`
prompts a step). A table written before (no `prompts`) replays by (step, group, sample) as it did.

The engine (`engine_of`): tuned (TP k = `runtime.emulated_tp`, 1 by default; 0 = `tuned_tp`, the TP the simulator's
tuned verl picks; CUDA graphs, the KV cache kept between rollouts, each device's shard resharded in place) for every
function and tuned pool worker, or, for a serverful pool with `runtime.emulated_engine=paper`, verl as the paper ran it, with
the simulator's `paper_verl` settings (`sim.scenario.PaperVerl`, sources in `sim.overheads`): verl's example TP for the
model's size (a replica holds TP units), vLLM's memory share (its KV slots), CUDA graphs, the KV cache slept and woken
every step (weights to the host and back) and the whole model resharded through each device's link. The learner is the
same in both (one optimiser step, no old log-prob recompute): the algorithm is every arm's, as
`SimConfig.learner=single_step` applies it to every system. Cold starts (`cold_start_s`): container, engine, weights
from storage (`runtime.emulated_*` may replace the simulator's constants, for the sensitivity study) and, for a GRPO
learner rank that resumes a trained policy, its ZeRO shard of the optimiser state from storage (12 bytes a parameter
over the learner's ranks: 2.3 s at 7B over 16 L40S). Deviation: a hybrid decode function that joins the learner pays no
optimiser shard (the simulator's `hybrid_join_s` moves it), nor does a PPO actor or critic rank. PPO's actor and critic
are data-parallel over `runtime.learner_units` ranks each (`ppo_update_s`: a rank's share of the tokens plus the
exchange per optimiser step); the actor's old log-prob forward is split across its ranks, the value forward is not
(one value function).
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from dataclasses import dataclass, replace
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
    paper: dict | None = None
    """With runtime.emulated_engine=paper, verl's engine as the paper ran it (`engine_of`): tp, capacity (KV slots
    at its memory share), mem_frac, eager_layer_s (0: CUDA graphs), reshard_full, kv_s (seconds a step the KV
    cache's sleep and wake take); None: the tuned engine."""
    overheads: dict | None = None
    """The cold-start constants the run set (`OVERHEAD_KEYS`: runtime.emulated_*); None or a missing key: the
    simulator's default (`sim.overheads.DEFAULT`)."""
    tp: int = 1
    """The tuned engine's TP (`runtime.emulated_tp` resolved): the units each serverless function and tuned pool
    worker holds; capacity is one such replica's KV slots. 1 in a table written before TP-k functions existed."""

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


OVERHEAD_KEYS = ("container_start_s", "engine_init_s", "storage_gbps")
"""The cold-start constants an emulated run may set (`runtime.emulated_<key>`; the sensitivity study sweeps them)."""


def overheads_of(rt) -> dict:
    """The runtime config's cold-start constants that are set (`OVERHEAD_KEYS`)."""
    return {k: getattr(rt, f"emulated_{k}") for k in OVERHEAD_KEYS if getattr(rt, f"emulated_{k}") is not None}


def build_table(cfg, steps: int, n_train: int = 0) -> LengthTable:
    """The run's length table, keyed by prompt (module header): the simulator's paper-testbed workload for the
    run's model, batch and group size, over `n_train` prompts (the run's train split; 0 = the case's own count)
    and every epoch a `steps`-step run reaches, or a trace a user brings (`runtime.length_trace` = a path), whole;
    capacity and ctx as the simulator sizes them."""
    from rlhfless.sim import MAX_SIM_STEPS
    from rlhfless.sim.scenario import SCENARIOS, SimConfig, workload

    rt, batch = cfg.runtime, cfg.rollout.prompts_per_step
    over = overheads_of(rt)
    tp = rt.function_units()
    base = dict(device=rt.emulated_gpu, n_devices=rt.units, model=rt.emulated_model, tp=tp, algo=cfg.algo.name,
                group_size=cfg.algo.group_size, prompts_per_step=batch, **over)
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
    cluster = tuned_cluster(sim, tp, work)
    lengths, rewards = by_prompt(work)
    paper = paper_engine(sim, work) if rt.emulated_engine == "paper" else None
    return LengthTable([], None, rt.emulated_gpu, rt.emulated_model, int(cluster.capacity),
                       float(_ctx(cluster.time_model.source)), f"{rt.length_trace}: {note}", shares=True,
                       exchange=True,
                       prompts=lengths, prompt_rewards=rewards, n_train=n_train or len(lengths), batch=batch,
                       paper=paper, overheads=over or None, tp=tp)


def tuned_cluster(sim, tp: int, work):
    """The simulator's tuned-engine cluster at TP `tp` (`runtime.emulated_tp`): a ConfigError naming the field when
    the model does not fit (or its heads do not split) at that TP."""
    from rlhfless.sim import hardware as hw
    from rlhfless.sim.scenario import build_cluster

    heads = hw.model(sim.model).heads
    require(heads % tp == 0, "runtime.emulated_tp", f"must divide {sim.model}'s {heads} attention heads (got {tp})")
    try:
        return build_cluster(sim, tp, work)
    except ConfigError as exc:
        raise ConfigError(f"runtime.emulated_tp: {sim.model} on {sim.device} at TP {tp}: {exc}") from None


@functools.lru_cache(maxsize=16)
def tuned_tp(gpu: str, model: str, units: int) -> int:
    """`runtime.emulated_tp=0` (auto): the TP the simulator's tuned verl picks for `model` on `units` x `gpu`
    (`sim.scenario._tuned_tp`: the fastest of the first two steps among the TPs that fit) on the paper-testbed
    workload's case for the model (its GRPO case; the defaults for a model it has none of)."""
    from rlhfless.sim.scenario import SCENARIOS, SimConfig, _tuned_tp, workload

    case = next((c for c in SCENARIOS["paper-testbed"] if c["model"] == model and c.get("algo", "grpo") == "grpo"),
                {})
    keep = {k: v for k, v in case.items() if k not in ("name", "model", "n_devices", "device")}
    sim = SimConfig(**{**keep, "device": gpu, "model": model, "n_devices": units, "tp": 0})
    return _tuned_tp(sim, workload(sim)[0])


def paper_engine(sim, work) -> dict:
    """verl's engine as the paper ran it for this workload (`LengthTable.paper`): the simulator's paper-verl
    cluster at `paper_tp` (verl's example TP for the model's size), which must fit (a ConfigError otherwise)."""
    from rlhfless.sim.scenario import build_cluster, kv_release_s

    tp = paper_tp(sim.model)
    try:
        c = build_cluster(sim, tp, work, paper=True, whole_nodes=False)
    except ConfigError as exc:
        raise ConfigError(f"runtime.emulated_engine: verl's engine as the paper ran it (TP {tp}): {exc}") from None
    return {"tp": tp, "capacity": int(c.capacity), "mem_frac": c.perf.eff.kv_mem_frac,
            "eager_layer_s": c.perf.eager_layer_s, "reshard_full": c.perf.reshard_full,
            "kv_s": kv_release_s(sim, c.perf)}


def paper_tp(model: str) -> int:
    """verl's example rollout TP for `model` (`sim.scenario.paper_tp` at the simulator's paper-verl defaults): the
    units one replica of the paper-settings engine holds."""
    from rlhfless.sim.scenario import SimConfig, paper_tp as sim_paper_tp

    return sim_paper_tp(SimConfig(model=model))


def _ctx(source: str) -> float:
    """The context the simulator's time model was built with (its source string ends in `ctx<N>`)."""
    return float(source.rsplit("ctx", 1)[1])


def perf_model(gpu: str, model: str, overheads: dict | None = None, tp: int = 1, **engine):
    """One emulated replica's `PerfModel`: the simulator's fitted efficiencies, its overheads (or `overheads`:
    `OVERHEAD_KEYS`), TP `tp` (1: one unit is one device); `engine`: kv_mem_frac, eager_layer_s, reshard_full
    (`engine_of`'s paper engine)."""
    from rlhfless.sim import hardware as hw
    from rlhfless.sim.overheads import DEFAULT
    from rlhfless.sim.perf import FITTED, PerfModel

    ov = {**{k: DEFAULT[k] for k in OVERHEAD_KEYS}, **(overheads or {})}
    eff = FITTED[gpu]
    if "kv_mem_frac" in engine:
        eff = replace(eff, kv_mem_frac=engine.pop("kv_mem_frac"))
    try:
        return PerfModel(hw.device(gpu), hw.model(model), tp, eff, ov["container_start_s"], ov["engine_init_s"],
                         ov["storage_gbps"] * 1e9, **engine)
    except ConfigError as exc:
        raise ConfigError(f"runtime.emulated_model: {model} on {tp} x {gpu}: {exc}") from None


@dataclass(frozen=True)
class Engine:
    """What an emulated replica runs (module header): its perf model and decode time model, KV slots, units (TP),
    and the seconds a step its KV cache's sleep and wake take (paper engine; 0 tuned)."""

    pm: object
    tm: object
    capacity: int
    tp: int
    kv_s: float
    name: str


def engine_of(table: LengthTable, paper: bool = False) -> Engine:
    """The engine of a function of this run: the tuned one, or with `paper` (a pool worker of a run whose table
    has `paper`) verl's as the paper ran it."""
    if paper and table.paper is not None:
        p = table.paper
        pm = perf_model(table.gpu, table.model, table.overheads, p["tp"], kv_mem_frac=p["mem_frac"],
                        eager_layer_s=p["eager_layer_s"], reshard_full=p["reshard_full"])
        return Engine(pm, pm.time_model(p["capacity"], table.ctx), p["capacity"], p["tp"], p["kv_s"], "paper")
    pm = perf_model(table.gpu, table.model, table.overheads, table.tp)
    return Engine(pm, pm.time_model(table.capacity, table.ctx), table.capacity, table.tp, 0.0, "tuned")


def time_model(table: LengthTable):
    """The decode time model every emulated worker sleeps by and the planner prices with (the tuned engine's: the
    serverful pool does not plan)."""
    return engine_of(table).tm


def optimizer_shard_s(pm, learner_ranks: int) -> float:
    """Seconds a learner rank reads its ZeRO shard of the optimiser state (`OPTIM_BYTES_PER_PARAM` a parameter,
    over `learner_ranks` ranks of pm.tp devices each) from storage at pm's per-device bandwidth."""
    from rlhfless.sim.overheads import OPTIM_BYTES_PER_PARAM

    return OPTIM_BYTES_PER_PARAM * pm.model.params / (max(learner_ranks, 1) * pm.tp * pm.storage_bw)


def cold_start_s(pm, kinds, learner_ranks: int = 0) -> float:
    """A fresh emulated function's modelled cold start (module header): container, inference engine (an image
    that decodes), weights from storage, and with `learner_ranks` > 0 (a GRPO learner rank resuming a trained
    policy) its optimiser shard."""
    base = pm.cold_start_s(engine=bool({"decode", "prefill"} & set(kinds)))
    return base + (optimizer_shard_s(pm, learner_ranks) if learner_ranks > 0 else 0.0)


def ppo_update_s(pm, tokens: int, world: int, epochs: int, steps: int) -> float:
    """One data-parallel rank's part of a PPO model's update (the actor's or the critic's) over `world` ranks: its
    share of `epochs` training passes over the batch's `tokens` (`ppo_update.rank_rows` balances each mini-batch by
    tokens), the `steps` optimiser steps' fixed cost, and each step's gradient all-reduce
    (`PerfModel.grad_exchange_s`, charged per rank; 0 for one rank). Every rank ends at the same instant (the
    all-reduce is a barrier), so this is the role's time once its slowest rank starts."""
    train = ppo_split(pm)[1]
    return train * epochs * tokens / world + pm.update_fixed_s("grpo", steps) + steps * pm.grad_exchange_s(world)


def ppo_split(pm) -> tuple[float, float]:
    """(forward, training) seconds per token of one PPO model (actor or critic) on one emulated unit: the
    simulator's `learner_s_per_token("ppo")` is two of each (reference + value forwards, actor + critic training;
    `sim.perf.PPO_MODELS`), so the value function sleeps one forward, the actor one forward (its old log-probs) and
    one training pass, the critic one training pass. The critic is modelled like the actor (the policy's size)."""
    train = pm.train_s_per_token("grpo")
    return pm.learner_s_per_token("grpo") - train, train
