"""Scenarios: typed simulator configs, the paper's settings, and the run that puts every policy side by side.

`SimConfig` (one case), `SCENARIOS` (`paper-testbed`, `paper-sim`, `quick`), `run_case(cfg)` -> per-policy step time
and cost plus RLHFless vs both baselines, `run_scenario(name, steps, overrides)` -> the CLI's JSON report. The rule
it keeps: every policy replays the same steps (same true lengths) and the case's learner, each on its own
`Timeline` of one `EventLoop`. The policies run, the ablation ladder and the reported fields:
docs/internals.md#simscenariopy.

Deviations from the paper:
1. Batch and group sizes are not stated in our sources; the defaults are assumed (testbed GRPO: 128 prompts x 8
   per step; PPO: 512 x 1; simulation: 512 x 8).
2. The three epochs the paper averages over are the default number of steps.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
import os
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import combinations
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from rlhfless.core.configbase import from_dict
from rlhfless.core.errors import ConfigError, require
from rlhfless.plan.cost import BillingRules, cost_serverful, cost_step, price
from rlhfless.plan.migrate import warm_kernel
from rlhfless.sim import MAX_SIM_STEPS
from rlhfless.sim import hardware as hw
from rlhfless.sim.events import EventLoop, Timeline
from rlhfless.sim.overheads import (
    DEFAULT,
    LARGE_MODEL_PARAMS,
    PAPER_VERL_MEM_FRAC,
    PAPER_VERL_MINIBATCHES,
    PAPER_VERL_TP,
    PAPER_VERL_TP_LARGE,
)
from rlhfless.sim.perf import FITTED, ITERATION_SOURCES, PPO_MODELS, PerfModel, iteration_efficiency, smallest_tp
from rlhfless.sim.policies import Cluster, RLHFless, RLHFuse, Switches, Verl, prime_true_jobs, share_predictor
from rlhfless.sim.shapley import EXTRAS, SUB_PLAYERS, target_players, terms
from rlhfless.sim.step import play_step
from rlhfless.sim.workload import LengthDist, StepWork, gsm8k_prompt_tokens, replay_trace, synthetic

REPO_ROOT = Path(__file__).resolve().parents[2]  # not rlhfless.config's: that module imports torch (1.3 s)
ALGOS = ("grpo", "ppo")
BASELINES = ("tuned", "paper")
WORKLOADS = ("synthetic", "gsm8k", "trace")
LADDER_ORDER = ("dedup", "assign", "scale", "migrate", "prewarm", "overlap", "hybrid", "size_learner", "wide",
                "draws")
RUNG_NAME = {"size_learner": "+sized learner", "wide": "+wide actor"}
ABLATION = tuple([("serverless-verl", Switches(**dict.fromkeys(LADDER_ORDER, False)))] + [
    (RUNG_NAME.get(m, f"+{m}"), Switches(**{k: k in LADDER_ORDER[:i + 1] for k in LADDER_ORDER}))
    for i, m in enumerate(LADDER_ORDER)])
"""The ladder from serverless verl (functions, no mechanism) to the extended design, one switch per rung, every
rung on the case's engine and learner; +prewarm is the paper's design, +draws the extended one."""


MECHANISMS = ("dedup", "assign", "migrate", "scale", "prewarm", "overlap", "hybrid", "size_learner", "wide", "draws")
"""RLHFless's switches that are config keys (`Switches`); the first five are the paper's."""
PAPER_MECHANISMS = MECHANISMS[:5]
DESIGNS = {"paper": frozenset(PAPER_MECHANISMS), "extended": frozenset(MECHANISMS)}
"""design=paper: the paper's system (separate decode and learner functions, sequential stages, the scaler on the
predicted means); design=extended: ours besides (overlap, hybrid functions, the sized learner, the wide actor, the
scaler averaging over drawn lengths)."""


@dataclass(frozen=True)
class PaperVerl:
    """verl 0.3.x as the paper ran it (`baseline=paper`); every setting's source in `rlhfless.sim.overheads`."""

    tp: int = 0
    """Rollout TP; 0 = verl's example for the model's size: 2 below 30B parameters (the yaml), 8 from it on (its
    70B practice), each raised to the smallest power of two that fits at mem_frac."""
    cuda_graphs: bool = True
    """Decode with CUDA graphs, as verl's vLLM 0.8 guidance sets it (false: eager, `eager_layer_s`)."""
    kv: Literal["sleep", "rebuild", "keep"] = "sleep"
    """Between rollouts: sleep = vLLM sleep level 1 (verl 0.3 with vLLM >= 0.7: weights out to the host and back,
    `host_gbps`); rebuild = free_cache_engine's rebuild (`kv_rebuild_s`); keep = the cache stays."""
    reshard: Literal["full", "shard"] = "full"
    """FSDP -> vLLM resharding: full = the whole model through each device's link (verl PR #116's measurement);
    shard = each device's TP shard only."""
    mem_frac: float = PAPER_VERL_MEM_FRAC
    """vLLM gpu_memory_utilization."""

    def __post_init__(self) -> None:
        require(self.tp >= 0, "paper_verl.tp", f"must be >= 0 (0 = verl's example for the size) (got {self.tp})")
        require(0 < self.mem_frac <= 1, "paper_verl.mem_frac", f"must lie in (0, 1] (got {self.mem_frac})")


@dataclass(frozen=True)
class EffOverrides:
    """Replacements of the device's fitted `perf.Efficiency` constants for every cluster of a case (None = the
    fit's; `rlhfless repro overheads` halves and doubles them)."""

    iter_overhead_s: float | None = None
    allreduce_latency_s: float | None = None
    train_fixed_s: float | None = None
    train_mfu: float | None = None
    fwd_mfu: float | None = None

    def __post_init__(self) -> None:
        for f in ("iter_overhead_s", "allreduce_latency_s", "train_fixed_s"):
            v = getattr(self, f)
            require(v is None or v >= 0, f"eff.{f}", f"must be >= 0 s (got {v})")
        for f in ("train_mfu", "fwd_mfu"):
            v = getattr(self, f)
            require(v is None or 0 < v <= 1, f"eff.{f}", f"must lie in (0, 1] (got {v})")

    def apply(self, eff):
        """`eff` with every set field replaced."""
        return replace(eff, **{k: v for k, v in vars(self).items() if v is not None})


@dataclass(frozen=True)
class SimConfig:
    """One simulated case (overridable as key=value on the CLI)."""

    name: str = "case"
    device: str = "L40S"
    """Device kind (rlhfless.sim.hardware.DEVICES)."""
    n_devices: int = 16
    """Devices in the cluster (>= tp)."""
    model: str = "qwen2.5-3b"
    """Model shape (rlhfless.sim.hardware.MODELS or tiny)."""
    tp: int = 0
    """Tensor-parallel degree of a rollout replica; 0 = the verl-tuned choice (the fastest baseline step)."""
    algo: str = "grpo"
    """grpo (reference) or ppo (reference + value forwards, critic update)."""
    group_size: int = 8
    """Samples per prompt (1 for PPO)."""
    prompts_per_step: int = 128
    n_prompts: int = 1024
    """Distinct prompts (one epoch = n_prompts / prompts_per_step steps)."""
    steps: int = 24
    workload: str = "synthetic"
    """synthetic (lognormal prompts), gsm8k (GSM8K question lengths), or trace (replay `trace`)."""
    trace: str = "data/traces/quickstart.jsonl.gz"
    gsm8k: str = ""
    """GSM8K train.jsonl for prompt lengths; "" = $RLHFLESS_GSM8K or ../shared/data/gsm8k/train.jsonl beside the
    checkout (a worktree looks one level up too); when none exists the case falls back to lognormal prompt
    lengths and says so in its report (`workload_note`)."""
    template_tokens: int = 64
    """Shared prompt prefix (system prompt + instructions) every prompt starts with; assumed."""
    lengths: LengthDist = field(default_factory=LengthDist)
    lam: float = 0.5
    """The scaler's weight of time against cost (objective=score)."""
    objective: Literal["score", "min_cost_at_deadline"] = "score"
    """The scaler's objective: score (lam) or the cheapest N whose step is at most deadline_ratio x serverful."""
    deadline_ratio: float = 1.0
    tau: float = 0.7
    design: Literal["paper", "extended"] = "paper"
    """RLHFless's mechanisms: paper (dedup, assign, migrate, scale, prewarm) or extended (all of `MECHANISMS`);
    each mechanism's key below overrides the design's choice."""
    dedup: bool | None = None
    """None = the design's (likewise assign ... draws)."""
    assign: bool | None = None
    migrate: bool | None = None
    scale: bool | None = None
    prewarm: bool | None = None
    overlap: bool | None = None
    hybrid: bool | None = None
    size_learner: bool | None = None
    wide: bool | None = None
    draws: bool | None = None
    learner: Literal["parity", "single_step"] = "parity"
    """Every system's update: parity = verl's (old log-probs recomputed, PAPER_VERL_MINIBATCHES mini-batch
    steps), the paper's comparison; single_step = ours (one optimizer step, no recompute), an algorithmic change
    applied to every system alike so that it is never counted as RLHFless's gain (reported apart)."""
    paper_verl: PaperVerl = field(default_factory=PaperVerl)
    iteration: Literal["vllm", "kernels"] = "vllm"
    """The source a decode iteration follows (`perf.ITERATION_SOURCES`): vllm = vLLM's measured whole iterations
    (kernels + per-step scheduling and sampling, in-graph all-reduce); kernels = Vidur's kernel sum (no
    per-iteration overhead, NCCL all-reduce latency). `eff.*` below still replaces either's constants."""
    eff: EffOverrides = field(default_factory=EffOverrides)
    """Per-case replacements of the fitted efficiency constants (`eff.iter_overhead_s=0.001`, ...)."""
    shapley: bool = False
    """Also report the Shapley account of RLHFless against the headline verl (`rlhfless.sim.shapley`: every
    coalition of the factors it differs in, simulated once: 4 systems for design=paper, 32 for extended)."""
    rlhfless_tp: int = 0
    """TP degree of RLHFless actors; 0 = the same as the baseline's (one engine configuration for both)."""
    prefill_actors: int = 1
    """Replicas the dedup prefill function spreads over (the paper draws one)."""
    ablation: bool = False
    """Also run the ablation ladder (`ABLATION`: serverless verl, then one mechanism per rung)."""
    baseline: str = "paper"
    """The verl the headline `speedup` / `cost_reduction` compare with: paper (verl 0.3.x as the paper ran it,
    `paper_verl`; `rlhfless.sim.overheads`) or tuned (the fastest TP, 0.9 of memory, CUDA graphs, the KV cache
    kept, shard-only resharding). Both run `learner`; both are always simulated and reported under `baselines`."""
    billing: BillingRules = field(default_factory=BillingRules)
    container_start_s: float = DEFAULT["container_start_s"]
    """Serverless container start, s (every overhead's source: rlhfless.sim.overheads, docs/overheads.md)."""
    engine_init_s: float = DEFAULT["engine_init_s"]
    """Inference-engine start of a prefill/decode function, s."""
    storage_gbps: float = DEFAULT["storage_gbps"]
    """GB/s per device reading weights at a cold start."""
    net_eff: float = DEFAULT["net_eff"]
    """Fraction of a NIC's line rate a weight broadcast or KV transfer reaches, in (0, 1]."""
    kv_rebuild_s: float = DEFAULT["kv_rebuild_s"]
    """Paper verl: seconds per step to rebuild the KV cache it frees after each rollout."""
    eager_layer_s: float = DEFAULT["eager_layer_s"]
    """Paper verl: CPU launch seconds per layer per decode iteration (eager mode)."""
    hybrid_comm_init_s: float = DEFAULT["hybrid_comm_init_s"]
    """Hybrid functions: seconds to rebuild the learner's data-parallel communicator when a released decode
    function joins it (0 = not charged)."""
    hybrid_optimizer_move: bool = True
    """Hybrid functions: a joining block first receives its share of the optimizer state (`PerfModel.
    optimizer_move_s`; False = not charged)."""
    hybrid_ref_load: bool = True
    """Hybrid functions: a joining block first loads the reference model (a decode function holds only the
    policy): the one-NIC weight broadcast of a model of the policy's size (False = not charged)."""
    host_gbps: float = DEFAULT["host_gbps"]
    """Paper verl, kv=sleep: GB/s per device moving its weights to the host and back around a rollout."""
    seed: int = 0

    def __post_init__(self) -> None:
        hw.device(self.device)
        if self.model != "tiny":
            hw.model(self.model)
        require(self.algo in ALGOS, "algo", f"must be one of {list(ALGOS)} (got {self.algo!r})")
        require(self.workload in WORKLOADS, "workload", f"must be one of {list(WORKLOADS)} (got {self.workload!r})")
        require(self.n_devices >= 1, "n_devices", f"must be >= 1 (got {self.n_devices})")
        require(self.tp >= 0, "tp", f"must be >= 0 (0 = tuned) (got {self.tp})")
        require(self.tp == 0 or self.n_devices >= self.tp, "n_devices",
                f"must be >= tp={self.tp} (got {self.n_devices})")
        require(self.group_size >= 1, "group_size", f"must be >= 1 (got {self.group_size})")
        require(1 <= self.steps <= MAX_SIM_STEPS, "steps", f"must be in 1..{MAX_SIM_STEPS:,} (got {self.steps})")
        require(self.n_prompts >= self.prompts_per_step >= 1, "prompts_per_step",
                f"must lie in 1..n_prompts={self.n_prompts} (got {self.prompts_per_step})")
        require(0 <= self.lam <= 1, "lam", f"must lie in [0, 1] (got {self.lam})")
        require(0 < self.tau <= 1, "tau", f"must lie in (0, 1] (got {self.tau})")
        require(self.template_tokens >= 0, "template_tokens", f"must be >= 0 (got {self.template_tokens})")
        require(self.rlhfless_tp >= 0, "rlhfless_tp", f"must be >= 0 (got {self.rlhfless_tp})")
        for f in ("container_start_s", "engine_init_s", "kv_rebuild_s", "eager_layer_s", "hybrid_comm_init_s"):
            require(getattr(self, f) >= 0, f, f"must be >= 0 s (got {getattr(self, f)})")
        require(self.storage_gbps > 0, "storage_gbps", f"must be > 0 (got {self.storage_gbps})")
        require(self.host_gbps > 0, "host_gbps", f"must be > 0 (got {self.host_gbps})")
        require(self.deadline_ratio > 0, "deadline_ratio", f"must be > 0 (got {self.deadline_ratio})")
        require(0 < self.net_eff <= 1, "net_eff", f"must lie in (0, 1] (got {self.net_eff})")
        require(self.iteration in ITERATION_SOURCES, "iteration",
                f"must be one of {list(ITERATION_SOURCES)} (got {self.iteration!r})")
        require(self.baseline in BASELINES, "baseline", f"must be one of {list(BASELINES)} (got {self.baseline!r})")
        require(self.prefill_actors >= 1, "prefill_actors", f"must be >= 1 (got {self.prefill_actors})")
        for f in ("hybrid_optimizer_move", "hybrid_ref_load"):
            require(isinstance(getattr(self, f), bool), f, f"must be true or false (got {getattr(self, f)!r})")

    def switches(self, oracle: bool = False) -> Switches:
        """RLHFless's switches: the design's, each mechanism key that is set overriding it."""
        on = DESIGNS[self.design]
        return Switches(oracle=oracle, **{m: (m in on) if getattr(self, m) is None else getattr(self, m)
                                          for m in MECHANISMS})


_TESTBED = dict(device="L40S", n_devices=16, workload="gsm8k", steps=24)
SCENARIOS: dict[str, list[dict]] = {
    "paper-testbed": [
        dict(_TESTBED, name="qwen2.5-3b/grpo", model="qwen2.5-3b"),
        dict(_TESTBED, name="qwen2.5-7b/grpo", model="qwen2.5-7b"),
        dict(_TESTBED, name="qwen2.5-3b/ppo", model="qwen2.5-3b", algo="ppo", group_size=1, prompts_per_step=512,
             n_prompts=2048, steps=12),
        dict(_TESTBED, name="qwen2.5-7b/ppo", model="qwen2.5-7b", algo="ppo", group_size=1, prompts_per_step=512,
             n_prompts=2048, steps=12),
    ],
    # 20 nodes x 8 H100, a 70B model (the paper's large-scale simulation); 8 steps per epoch
    "paper-sim": [dict(name="llama-70b/grpo", device="H100", n_devices=160, model="llama-70b", tp=8,
                       prompts_per_step=512, n_prompts=4096, steps=24, workload="synthetic")],
    # this machine: the tiny model on 2 CPU cores replaying the shipped quickstart trace (200 steps); cold starts
    # as the runtime measures them here with its fork server (0.08 s decode, 0.09 s learner: README, the
    # serverless-vs-serverful comparison's cold_start_s_mean), not a GPU platform's
    "local-cpu": [dict(name="tiny/grpo-cpu", device="cpu-core", n_devices=2, model="tiny", tp=1, workload="trace",
                       steps=200, template_tokens=0, container_start_s=0.08, engine_init_s=0.0)],
    # a small case for tests and the notebook
    "quick": [dict(name="qwen2.5-3b/grpo-small", device="L40S", n_devices=8, model="qwen2.5-3b", tp=1,
                   prompts_per_step=32, n_prompts=128, steps=8, workload="synthetic")],
}


def wide_cluster(cfg: SimConfig, cs: Cluster, work: list[StepWork]) -> Cluster | None:
    """RLHFless's wide engine for per-actor TP: twice its TP, when a node holds it and the model's heads divide;
    None otherwise (e.g. a 70B model already at TP 8 on 8-device nodes)."""
    dev, tp = hw.device(cfg.device), 2 * cs.perf.tp
    if tp > min(dev.devices_per_node, cfg.n_devices) or hw.model(cfg.model).heads % tp:
        return None
    try:
        return build_cluster(cfg, tp, work, whole_nodes=False)
    except ConfigError:
        return None


def build_cluster(cfg: SimConfig, tp: int, work: list[StepWork], paper: bool = False,
                  whole_nodes: bool = True) -> Cluster:
    """The shared perf model, time model and KV capacity for a TP degree (context from the workload), with the
    case's learner (`SimConfig.learner`); `paper`: the engine settings of verl as the paper ran it
    (`SimConfig.paper_verl`: memory share, CUDA graphs, the KV cache between rollouts, the resharding path)."""
    dev, shape = hw.device(cfg.device), hw.model(cfg.model)
    eff, pv = cfg.eff.apply(iteration_efficiency(FITTED[dev.name], cfg.iteration)), cfg.paper_verl
    if paper:
        eff = replace(eff, kv_mem_frac=pv.mem_frac)
    eager = cfg.eager_layer_s if paper and not pv.cuda_graphs else 0.0
    pm = PerfModel(dev, shape, tp, eff, cfg.container_start_s, cfg.engine_init_s, cfg.storage_gbps * 1e9,
                   cfg.net_eff, eager, reshard_full=paper and pv.reshard == "full")
    require(not whole_nodes or cfg.n_devices % tp == 0, "n_devices",
            f"must be a multiple of tp={tp} (got {cfg.n_devices})")
    lens = np.array([x for s in work[:4] for g in s.groups for x in g.lengths], float)
    plen = float(np.mean([g.prompt_len for s in work[:4] for g in s.groups]))
    # a running sequence holds its prompt and, on average over its life, half its response; the long ones
    # dominate the running set, so capacity is sized on prompt + mean response (assumed)
    capacity = pm.kv_capacity(plen + float(lens.mean()))
    gmax = max(max(s.group_sizes, default=0) for s in work)  # each step's sizes once, for every cluster built
    if capacity < gmax:
        raise ConfigError(f"n_devices: a {cfg.model} replica on {tp} x {cfg.device} holds {capacity} sequences of "
                          f"KV, fewer than one group of {gmax}; use larger devices or a higher tp")
    tm = pm.time_model(capacity, plen + float(lens.mean()) / 2)
    # the response cap the planner knows (the engine's max tokens); a replayed trace's is not recorded
    cap = float(cfg.lengths.max_response) if cfg.workload != "trace" else None
    parity = cfg.learner == "parity"
    return Cluster(pm, cfg.n_devices, tm, capacity, cfg.algo, cfg.template_tokens, cfg.billing,
                   "paper" if paper else "tuned", old_logprob=parity,
                   minibatches=PAPER_VERL_MINIBATCHES if parity else 1,
                   kv_rebuild_s=kv_release_s(cfg, pm) if paper else 0.0, max_response=cap,
                   hybrid_join_s=0.0 if paper else hybrid_join_s(cfg, pm))


def kv_release_s(cfg: SimConfig, pm: PerfModel) -> float:
    """Seconds per step a paper-verl replica spends on the KV cache it frees between rollouts (`PaperVerl.kv`):
    sleep level 1 moves the device's weights to the host and back; rebuild re-allocates the cache."""
    kv = cfg.paper_verl.kv
    if kv == "sleep":
        return 2.0 * pm.weight_bytes_per_device() / (cfg.host_gbps * 1e9)
    return cfg.kv_rebuild_s if kv == "rebuild" else 0.0


def hybrid_join_s(cfg: SimConfig, pm: PerfModel) -> float:
    """What a released decode function pays, besides the in-place reshard, before it works as a learner block
    (each part a switch; sources in docs/overheads.md): the data-parallel communicator rebuilt, its share of the
    optimizer state received, the reference model loaded. PPO: the critic's optimizer state and weights too
    (`PPO_MODELS` of each)."""
    n = PPO_MODELS if cfg.algo == "ppo" else 1
    return (cfg.hybrid_comm_init_s + (n * pm.optimizer_move_s(cfg.n_devices) if cfg.hybrid_optimizer_move else 0.0)
            + (n * pm.weight_sync_s(colocated=False) if cfg.hybrid_ref_load else 0.0))


def workload(cfg: SimConfig) -> tuple[list[StepWork], str]:
    """The case's steps and a note on where its lengths came from."""
    if cfg.workload == "trace":
        return replay_trace(_path(cfg.trace), cfg.steps), f"trace {cfg.trace}"
    pool, note = None, "synthetic lengths, lognormal prompts"
    if cfg.workload == "gsm8k":
        path = gsm8k_path(cfg.gsm8k)
        if path is None:
            note = "GSM8K not found (set gsm8k=PATH or RLHFLESS_GSM8K); lognormal prompts instead"
        else:
            pool, note = _gsm8k_pool(str(path), cfg.template_tokens), f"synthetic lengths, GSM8K prompts {path}"
    if cfg.lengths.fit_to:  # the responses replay a published log's cap, mean and cap share (workload module)
        note = note.replace("synthetic lengths", f"lengths fitted to {cfg.lengths.fit_to}")
    return synthetic(cfg.lengths, cfg.n_prompts, cfg.prompts_per_step, cfg.group_size, cfg.steps, cfg.seed,
                     prompt_tokens=pool, template_tokens=cfg.template_tokens), note


@lru_cache(maxsize=4)
def _gsm8k_pool(path: str, template_tokens: int):
    """GSM8K prompt lengths, read once per scenario run (every case of the testbed uses them)."""
    return gsm8k_prompt_tokens(path, template_tokens)


def gsm8k_path(given: str):
    """The GSM8K file to use: `given` when set (it must exist), else the first that exists of $RLHFLESS_GSM8K and
    ../shared beside the checkout or beside its parent (worktrees); None when there is none."""
    from rlhfless.core.errors import DataError

    if given:
        if not Path(given).is_file():
            raise DataError(f"gsm8k: file not found: {given}")
        return Path(given)
    rel = Path("shared/data/gsm8k/train.jsonl")
    for p in (os.environ.get("RLHFLESS_GSM8K"), REPO_ROOT.parent / rel, REPO_ROOT.parent.parent / rel):
        if p and Path(p).is_file():
            return Path(p)
    return None


def _path(p: str):
    q = REPO_ROOT / p
    return q if q.exists() else p


def policies(cfg: SimConfig, cb: Cluster, cs: Cluster, cp: Cluster, cw: Cluster | None = None) -> list:
    """The policies of a case: the serverful ones on the verl-tuned cluster `cb` (verl-paper on `cp`), the
    serverless ones on `cs` (the straggler may run on `cw`, the wide engine)."""
    def ours(sw: Switches, lam: float, name: str) -> RLHFless:
        return RLHFless(cs, sw, lam, cfg.tau, cfg.prefill_actors, name=name, objective=cfg.objective,
                        deadline_ratio=cfg.deadline_ratio, wide=cw)

    out = [Verl(cb), Verl(cp), Verl(cb, overlap=True), RLHFuse(cb, cfg.tau),
           ours(cfg.switches(), cfg.lam, "rlhfless"), ours(cfg.switches(oracle=True), cfg.lam, "oracle"),
           # the same system asked for time only: how fast RLHFless can go on this cluster
           ours(cfg.switches(), 1.0, "rlhfless-lam1")]
    if cfg.ablation:
        out += [ours(sw, cfg.lam, n) for n, sw in ABLATION]
    return out


def simulate_policy(policy, work: list[StepWork], c: Cluster) -> tuple[dict, Timeline, list[dict]]:
    """Play every step of `work` under `policy`; returns (summary, timeline, per-step rows)."""
    steps = _steps(policy, work, c)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def play_twins(pols: list, work: list[StepWork]) -> list[tuple[dict, Timeline, list[dict]]]:
    """`simulate_policy` of each of `pols` (`twins`: RLHFless on one cluster with the same switches, e.g.
    rlhfless and rlhfless-lam1), played in lock step, step by step, sharing each step's planned jobs, draws and
    memo where their predictions agree (`RLHFless._planned`): the second plays every placement on every draw
    from the first's plays instead of again. Twins with equal predictors learn and predict each step once
    (`policies.TwinPredictor`). Each policy's results are its own alone's, bit for bit
    (tests/test_sim_parallel.py)."""
    share: dict = {}
    for p in pols:
        p.share = share
    shared = share_predictor(pols)  # one predictor update and prediction a step for twins with equal predictors
    try:
        gens, out = [_steps(p, work, p.c) for p in pols], [None] * len(pols)
        live = list(range(len(pols)))
        while live:
            for i in list(live):
                try:
                    next(gens[i])
                except StopIteration as done:
                    out[i] = done.value
                    live.remove(i)
    finally:
        for p in pols:
            p.share = None
        for p in shared:  # each holds what its own predictor would have learnt: the shared one's state
            p.predictor, p.twin = p.twin.predictor, None
    return out


def twins(pols: list) -> list[list[int]]:
    """The policies as groups that play together (`play_twins`): RLHFless policies on the same cluster object
    with equal switches (they differ in lam, objective...: their predictions, and so their planned jobs and
    draws, are the same every step), each other policy alone; in policy order."""
    groups: list[list[int]] = []
    for i, p in enumerate(pols):
        for g in groups:
            q = pols[g[0]]
            if isinstance(p, RLHFless) and isinstance(q, RLHFless) and p.c is q.c and p.sw == q.sw:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def _steps(policy, work: list[StepWork], c: Cluster):
    """`simulate_policy` as a generator: yields after each step; returns (summary, timeline, per-step rows)."""
    loop, tl, t, rows = EventLoop(), Timeline(), 0.0, []
    dev = price(c.perf.device.price_kind)
    for k, step in enumerate(work):
        plan, metrics = policy.decide(step)
        res = play_step(loop, tl, t, plan, k)
        loop.run()
        wall = res.end_s - t
        by_kind = dict.fromkeys(BILLED_KINDS, 0.0)
        if plan.serverful:
            cost, _ = cost_serverful(c.n_devices, wall, dev)
        else:
            invs = tl.invocations(k)
            # functions kept warm into the next step are billed their gap (`plan.lifecycle`), not a keep-alive
            gaps = kept_gaps(policy, invs, res.end_s, res.rollout_end_s - t)
            cost, _ = cost_step(invs, dev, c.billing, gaps)
            by_kind = _device_s_by_kind(invs, c.billing, gaps)
        rows.append({"step": k, "step_time_s": wall, "rollout_s": res.rollout_end_s - t, **by_kind,
                     "score_s": res.score_end_s - res.rollout_end_s, "update_s": res.end_s - res.score_end_s,
                     "learner_work_device_s": res.learner_work_ds, "learner_blocks": res.blocks_joined,
                     "cost_device_s": cost.gpu_seconds, "cost_usd": cost.usd,
                     "n_actors": len(plan.actors), **{k2: v for k2, v in metrics.items() if np.isscalar(v)}})
        policy.observe(step, (rows[-1]["rollout_s"], rows[-1]["score_s"], rows[-1]["update_s"]))
        t = res.end_s
        yield
    keys = ("step_time_s", "rollout_s", "score_s", "update_s", "cost_device_s", "cost_usd", "n_actors",
            "learner_work_device_s", "learner_blocks", *BILLED_KINDS)
    summary = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    return summary, tl, rows


def kept_gaps(policy, invs, step_end: float, rollout_s: float) -> dict[tuple[str, int], float]:
    """(kind, instance) -> idle gap of each function the policy keeps warm into the next step (`RLHFless.keeps`):
    from its last span's end to its next work, the next step's start (decode, prefill) or, for a learner block,
    the next rollout's end (taken as this step's rollout). {} for a policy that keeps nothing."""
    if not hasattr(policy, "keeps"):
        return {}
    ends: dict[tuple[str, int], float] = {}
    for i in invs:
        ends[(i.kind, i.actor_id)] = max(ends.get((i.kind, i.actor_id), i.end_s), i.end_s)
    return policy.keeps({k: step_end - e + (rollout_s if k[0] == "learner" else 0.0) for k, e in ends.items()})


BILLED_KINDS = ("decode_device_s", "prefill_device_s", "learner_device_s", "cold_start_device_s")
"""Serverless device-seconds billed per step by function kind, and the cold-start seconds inside them (devices x
cold seconds of cold invocations; pre-warmed ones included): where the bill goes. Zero for serverful policies."""


def _device_s_by_kind(invs, rules: BillingRules, gaps: dict | None = None) -> dict[str, float]:
    from rlhfless.plan.cost import billed_seconds

    out = dict.fromkeys(BILLED_KINDS, 0.0)
    for inv in invs:
        out[f"{inv.kind}_device_s"] += billed_seconds(inv, rules, (gaps or {}).get((inv.kind, inv.actor_id))) * inv.gpus
        out["cold_start_device_s"] += (inv.cold_start_s if inv.cold else 0.0) * inv.gpus
    return out


def _tuned_tp(cfg: SimConfig, work: list[StepWork]) -> int:
    """verl users pick the TP with the fastest step among those that fit (tried on the first two steps)."""
    if cfg.tp:
        return cfg.tp
    dev, shape = hw.device(cfg.device), hw.model(cfg.model)
    tp, best = smallest_tp(dev, shape, FITTED[dev.name]), None
    while tp <= min(dev.devices_per_node, cfg.n_devices):
        if shape.heads % tp == 0 and cfg.n_devices % tp == 0:
            try:
                c = build_cluster(cfg, tp, work)
            except ConfigError:
                tp *= 2
                continue
            s, _, _ = simulate_policy(Verl(c), work[:2], c)
            if best is None or s["step_time_s"] < best[0]:
                best = (s["step_time_s"], tp)
        tp *= 2
    if best is None:
        raise ConfigError(f"model: {cfg.model} does not fit {cfg.n_devices} x {cfg.device} at any TP")
    return best[1]


def paper_tp(cfg: SimConfig) -> int:
    """The paper verl's rollout TP before fitting: `paper_verl.tp`, else verl's example for the model's size."""
    if cfg.paper_verl.tp:
        return cfg.paper_verl.tp
    big = cfg.model != "tiny" and hw.model(cfg.model).params >= LARGE_MODEL_PARAMS
    return PAPER_VERL_TP_LARGE if big else PAPER_VERL_TP


def _paper_tp(cfg: SimConfig, work: list[StepWork], tp: int | None = None) -> Cluster:
    """verl as the paper ran it at `tp` (default `paper_tp`), or the smallest power of two above it that holds
    the model and a group's KV at its memory share (a 70B model needs 4 on an 80 GB device)."""
    # a TP the user set is taken as given: raised silently, paper_verl.tp=2 at 70B was tp=4 under another name
    given = tp is None and cfg.paper_verl.tp > 0
    dev, tp = hw.device(cfg.device), tp or paper_tp(cfg)
    while tp <= min(dev.devices_per_node, cfg.n_devices):
        try:
            return build_cluster(cfg, tp, work, paper=True)
        except ConfigError as exc:
            if given:
                raise ConfigError(f"paper_verl.tp: {cfg.model} does not fit TP {tp} of {cfg.device} at verl's "
                                  f"memory share {cfg.paper_verl.mem_frac} (0 = verl's example for the size, "
                                  f"raised until it fits): {str(exc).split(': ', 1)[-1]}") from None
            tp *= 2
    raise ConfigError(f"model: {cfg.model} does not fit {cfg.n_devices} x {cfg.device} at verl's memory share "
                      f"{cfg.paper_verl.mem_frac} at any TP from {tp}")


def paper_range(cfg: SimConfig, work: list[StepWork]) -> dict[str, Cluster]:
    """The paper verl's range: at TP 2 (the yaml; raised until it fits), TP 8 (verl's 70B practice)
    and the fastest TP at its settings (each feasible TP tried on the first two steps); keys tp2, tp8, fastest."""
    dev = hw.device(cfg.device)
    out = {"tp2": _paper_tp(cfg, work, PAPER_VERL_TP)}
    if PAPER_VERL_TP_LARGE <= min(dev.devices_per_node, cfg.n_devices):
        try:
            out["tp8"] = build_cluster(cfg, PAPER_VERL_TP_LARGE, work, paper=True)
        except ConfigError:
            pass
    best, tp = None, 1
    while tp <= min(dev.devices_per_node, cfg.n_devices):
        if (cfg.model == "tiny" or hw.model(cfg.model).heads % tp == 0) and cfg.n_devices % tp == 0:
            try:
                c = build_cluster(cfg, tp, work, paper=True)
            except ConfigError:
                tp *= 2
                continue
            s, _, _ = simulate_policy(Verl(c), work[:2], c)
            if best is None or s["step_time_s"] < best[0]:
                best = (s["step_time_s"], c)
        tp *= 2
    if best is not None:
        out["fastest"] = best[1]
    return out


def vs(base: dict, ours: dict) -> dict:
    """Speedup and cost reductions of `ours` against `base` (policy summaries)."""
    return {"speedup": base["step_time_s"] / ours["step_time_s"],
            "cost_reduction": 1.0 - ours["cost_device_s"] / base["cost_device_s"],
            "cost_reduction_usd": 1.0 - ours["cost_usd"] / base["cost_usd"]}


def clusters(cfg: SimConfig, work: list[StepWork]) -> tuple[Cluster, Cluster, Cluster]:
    """(tuned verl's, RLHFless's, paper verl's) clusters of a case."""
    cb = build_cluster(cfg, _tuned_tp(cfg, work), work)
    cs = build_cluster(cfg, cfg.rlhfless_tp, work) if cfg.rlhfless_tp else cb
    return cb, cs, _paper_tp(cfg, work)


PARALLEL_MIN_STEPS = 10
"""Cases of fewer steps play their policies in this process (a fork costs more than such a case)."""
class Progress(Protocol):
    """What a caller of `run_case` may watch: a case's policies before they play, then each one as it finishes.
    Nothing it does reaches the report (the CLI draws a bar from it)."""

    def case(self, name: str, policies: list[str]) -> None: ...

    def played(self, policy: str) -> None: ...


_FORKED: tuple = ()
"""(policies, work, keep_timelines) for the forked children of `play_policies` (inherited, not pickled)."""


def _play_forked(group: list[int]) -> list[tuple[dict, Timeline | None, list[dict]]]:
    pols, work, keep = _FORKED
    out = []
    for summary, tl, rows in play_twins([pols[i] for i in group], work):
        if keep:
            tl.hooks = []  # live observers only: closures do not cross processes
        out.append((summary, tl if keep else None, rows))
    return out


def _play_cost(pol) -> int:
    """Rank of a policy's simulation time: RLHFless with draws plays every candidate of every step on each
    drawn outcome (the slowest, e.g. 12-15 s of 24 paper-sim steps on a loaded core), the oracle (true lengths,
    no draws) once (10 s), the baselines no planner (0.1-3 s), but RLHFuse plays cut-and-migrate on every step
    (as long as the oracle: 2.3 s each at 100 paper-sim steps, near idle; ranked with the baselines it started
    last and ended about a second after everything else)."""
    if isinstance(pol, RLHFuse):
        return 1
    if not isinstance(pol, RLHFless):
        return 0
    return 2 if pol.sw.draws and not pol.sw.oracle else 1


def _play_forked_at(group: list[int]) -> tuple[list[int], list[tuple[dict, Timeline | None, list[dict]]]]:
    return group, _play_forked(group)


def play_policies(pols: list, work: list[StepWork], keep_timelines: bool = False, jobs: int | None = None,
                  on_done: Callable[[str], None] | None = None) -> list[tuple[dict, Timeline | None, list[dict]]]:
    """`simulate_policy` of each policy, in order: in `jobs` forked processes (None: one per core of this
    process, for cases of PARALLEL_MIN_STEPS steps or more). Twins (`twins`) play together in one process
    (`play_twins`: the second reuses the first's plays of each step); otherwise the policies share no state
    (each has its own predictor, warm pool and event loop; clusters are read only), so the results are the
    sequential ones bit for bit (tests/test_sim_parallel.py). Longest first (`_play_cost`, summed over a
    group), so the last one a process picks up is short and the processes end together.
    `on_done(policy name)` is called as each policy finishes (in the order they finish: progress only)."""
    done = on_done or (lambda name: None)
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if len(work) >= PARALLEL_MIN_STEPS else 1
    groups = twins(pols)
    jobs = min(jobs, len(groups))
    out = [None] * len(pols)
    if jobs <= 1:
        for group in groups:
            for i, r in zip(group, play_twins([pols[i] for i in group], work)):
                out[i] = r
                done(pols[i].name)
        return out
    global _FORKED
    prime_true_jobs(pols, work)  # shared by the forked processes, not built in each
    warm_kernel()  # numba and the cut simulation's kernel loaded once here, not in each forked process
    _FORKED = (pols, work, keep_timelines)
    order = sorted(groups, key=lambda g: -sum(_play_cost(pols[i]) for i in g))
    try:
        # an executor, not a multiprocessing.Pool: a Pool whose worker dies (killed, out of memory) waits for its
        # result forever; the executor fails every pending result at once
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            futures = [pool.submit(_play_forked_at, g) for g in order]  # taken in this order: longest first
            # each result lands in its policy's slot, so the finishing order changes nothing but the progress
            for fut in as_completed(futures):
                group, rs = fut.result()
                for i, r in zip(group, rs):
                    out[i] = r
                    done(pols[i].name)
    except BrokenProcessPool as e:
        raise RuntimeError(f"a process playing the simulated policies died before it finished ({e}): killed or "
                           "out of memory? Rerun it; with less memory free, simulate fewer steps at a time") from e
    finally:
        _FORKED = ()
    return out


def alike(pols: list) -> list[int]:
    """For each policy, the index of the first policy that plays as it does (its own where none before it does):
    verl of the same kind on equal clusters (e.g. verl-paper and verl-paper-tp8 at a 70B model, where the paper's
    TP is 8: each builds its cluster from the same settings). verl keeps no state between steps (`Verl.observe`
    learns nothing) and its name decides nothing, so two such play the same schedule, timeline and rows."""
    first = list(range(len(pols)))
    for i, p in enumerate(pols):
        if type(p) is not Verl:
            continue
        for j in range(i):
            q = pols[j]
            if first[j] == j and type(q) is Verl and q.overlap == p.overlap and q.c == p.c:
                first[i] = j
                break
    return first


def play_alike_once(pols: list, work: list[StepWork], keep_timelines: bool = False, jobs: int | None = None,
                    on_done: Callable[[str], None] | None = None) -> list[tuple[dict, Timeline | None, list[dict]]]:
    """`play_policies` of each of `pols`, a policy that plays as one before it (`alike`) not played again: its
    results are a copy of that one's (the same values; its own objects, so nothing one changes leaks)."""
    from copy import deepcopy

    first = alike(pols)
    mine = [i for i, f in enumerate(first) if f == i]
    played = dict(zip(mine, play_policies([pols[i] for i in mine], work, keep_timelines, jobs, on_done)))
    for i, f in enumerate(first):
        if f != i:
            played[i] = deepcopy(played[f])
            if on_done is not None:
                on_done(pols[i].name)
    return [played[i] for i in range(len(pols))]


GC_THRESHOLD = (20_000, 20, 20)
"""The garbage collector's thresholds while a case plays (`fewer_collections`). At Python's (700, 10, 10) one
process ran 1,674 young and 8 full collections over 100 paper-sim steps (0.56 s of 7.8 s of CPU, gc.callbacks);
the simulation allocates millions of short-lived records and few reference cycles, and at these 27 young ones
and no full one (0.1 s). Nothing the simulator computes depends on when cycles are collected (it keeps no weak
reference and no finalizer)."""


@contextmanager
def fewer_collections():
    """`GC_THRESHOLD` inside the block (processes forked there inherit it), the caller's thresholds after."""
    old = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_case(cfg: SimConfig, keep_timelines: bool = False, only: tuple[str, ...] = (),
             jobs: int | None = None, progress: Progress | None = None) -> dict:
    """Every policy over the case's steps (`only`: just these, which must include verl, verl-paper and rlhfless;
    without the oracle there is no gap to it); returns the case's report (and timelines/rows when asked).
    `jobs`: processes that play the policies (`play_policies`; None: one per core for long enough cases).
    `progress`: told when the case's policies start and as each finishes (`Progress`). Played with
    `fewer_collections`."""
    with fewer_collections():
        return _run_case(cfg, keep_timelines, only, jobs, progress)


def _run_case(cfg: SimConfig, keep_timelines: bool, only: tuple[str, ...], jobs: int | None,
              progress: Progress | None) -> dict:
    work, note = workload(cfg)
    cb, cs, cp = clusters(cfg, work)
    out = {"name": cfg.name, "baseline": cfg.baseline, "tp": cb.perf.tp, "replicas": cb.replicas,
           "capacity": cb.capacity, "paper_tp": cp.perf.tp, "paper_capacity": cp.capacity,
           "rlhfless_tp": cs.perf.tp, "rlhfless_capacity": cs.capacity,
           "steps": len(work), "seqs_per_step": work[0].n_seqs, "workload_note": note, "policies": {}}
    out.update(design=cfg.design, learner=cfg.learner, switches={m: getattr(cfg.switches(), m) for m in MECHANISMS})
    extra = {}
    cw = wide_cluster(cfg, cs, work)
    out["rlhfless_wide_tp"] = cw.perf.tp if cw is not None else 0
    rng = paper_range(cfg, work) if not only or "verl-paper-range" in only else {}
    pols = [pol for pol in policies(cfg, cb, cs, cp, cw) if not only or pol.name in only]
    pols += [Verl(c, name=f"verl-paper-{k}") for k, c in rng.items()]
    on_done = None
    if progress is not None:
        progress.case(cfg.name, [p.name for p in pols])
        on_done = progress.played
    for pol, (summary, tl, rows) in zip(pols, play_alike_once(pols, work, keep_timelines, jobs, on_done)):
        out["policies"][pol.name] = summary
        extra[pol.name] = (tl, rows)
    p = out["policies"]
    ours = p["rlhfless"]
    out["baselines"] = {"tuned": vs(p["verl"], ours), "paper": vs(p["verl-paper"], ours)}
    out.update(out["baselines"][cfg.baseline])
    if cfg.shapley:
        out["shapley"] = attribution(cfg)
    # the paper verl's range (`paper_range`); `verl-paper` is the one at `paper_tp` (the headline's)
    out["paper_range"] = {k: {"tp": c.perf.tp, **vs(p[f"verl-paper-{k}"], ours)} for k, c in rng.items()}
    if "oracle" in p:
        out.update(gap_to_oracle_time=ours["step_time_s"] / p["oracle"]["step_time_s"] - 1.0,
                   gap_to_oracle_cost=ours["cost_device_s"] / p["oracle"]["cost_device_s"] - 1.0)
    if keep_timelines:
        out["_timelines"] = extra
    return out


def _billing(value):
    """`billing=NAME`: a platform preset's rules (`plan.billing.PRESETS`); a mapping is taken as fields."""
    from dataclasses import asdict

    from rlhfless.plan.billing import PRESETS

    if not isinstance(value, str):
        return value
    if value not in PRESETS:
        raise ConfigError(f"billing: must be a preset ({', '.join(PRESETS)}) or fields such as "
                          f"billing.granularity_s=1 (got {value!r})")
    return asdict(PRESETS[value])


def case_configs(name: str, steps: int | None, overrides: list[str]) -> list[SimConfig]:
    """The scenario's cases with --steps and key=value overrides applied (unknown scenario: ConfigError)."""
    from rlhfless.core.configbase import apply_overrides

    if name not in SCENARIOS:
        raise ConfigError(f"scenario: unknown scenario {name!r}; allowed: {', '.join(SCENARIOS)}")
    out = []
    for base in SCENARIOS[name]:
        data = apply_overrides(base, overrides, example="lam=0.7")
        if steps is not None:
            data["steps"] = steps
        data["billing"] = _billing(data.get("billing", {}))
        out.append(from_dict(SimConfig, data))
    return out


def run_scenario(name: str, steps: int | None = None, overrides: list[str] | None = None,
                 keep_timelines: bool = False, progress: Progress | None = None) -> dict:
    """The CLI's report: every case, and at the top level the case with the largest speedup (the paper reports
    "up to"), plus sim_wall_s (seconds this simulation took here). `progress`: see `run_case`."""
    t0 = time.perf_counter()
    cases = [run_case(c, keep_timelines, progress=progress) for c in case_configs(name, steps, overrides or [])]
    head = max(cases, key=lambda c: c["speedup"])
    keys = ("baseline", "baselines", "policies", "speedup", "cost_reduction", "cost_reduction_usd",
            "gap_to_oracle_time", "gap_to_oracle_cost")
    return {"scenario": name, "headline_case": head["name"], **{k: head[k] for k in keys}, "cases": cases,
            "sim_wall_s": time.perf_counter() - t0}


# -- Shapley games (the account's math is `rlhfless.sim.shapley`; the games play this module's cases) ------------
def _systems(players: Sequence[str], build) -> dict[frozenset, object]:
    """One policy per coalition (its cluster in `policy.c`): `build(coalition) -> policy`."""
    return {frozenset(c): build(frozenset(c)) for k in range(len(players) + 1) for c in combinations(players, k)}


def _play(pols: dict[frozenset, object], work, jobs: int | None = None) -> dict[frozenset, dict]:
    """Every coalition's system over the case's steps, in forked processes (`play_policies`; `jobs` its)."""
    keys = list(pols)
    played = play_policies([pols[k] for k in keys], work, jobs=jobs)
    return {k: summary for k, (summary, _, _) in zip(keys, played)}


def attribution(cfg, players: Sequence[str] | None = None, jobs: int | None = None) -> dict:
    """The Shapley account of the case's RLHFless against its verl (docs/internals.md#simscenariopy); `players` default
    `target_players(cfg)`. Every coalition plays the same steps; clusters are built once per engine and learner.
    `jobs`: processes that play the coalitions (`play_policies`; 1 inside a caller's own worker process)."""

    players = list(players if players is not None else target_players(cfg))
    work, _ = workload(cfg)
    learners = {False: replace(cfg, learner="parity" if "learner" in players else cfg.learner)}
    if "learner" in players:
        learners[True] = replace(cfg, learner="single_step")
    made = {k: clusters(c, work) for k, c in learners.items()}  # (tuned, rlhfless, paper) per learner
    sw0 = cfg.switches()
    paper_mechs = {m: getattr(sw0, m) for m in ("dedup", "assign", "migrate", "scale", "prewarm")}
    tuned_default = "baseline settings" not in players and cfg.baseline == "tuned"

    def build(s: frozenset):
        c_cfg, (cb, cs, cp) = learners["learner" in s], made["learner" in s]
        tuned = "baseline settings" in s or tuned_default
        if "paper design" not in s:
            return Verl(cb if tuned else cp, overlap="overlap" in s, name="coalition")
        c = cs if tuned else cp
        ext = "extras" in s if "extras" in players else False
        sw = replace(sw0, **paper_mechs, overlap="overlap" in s, hybrid="hybrid" in s,
                     **dict.fromkeys(EXTRAS, ext))
        cw = wide_cluster(c_cfg, c, work) if sw.wide else None
        return RLHFless(c, sw, cfg.lam, cfg.tau, cfg.prefill_actors, name="coalition", objective=cfg.objective,
                        deadline_ratio=cfg.deadline_ratio, wide=cw)

    return terms(_play(_systems(players, build), work, jobs), players)


def mechanisms(cfg, jobs: int | None = None) -> dict:
    """The paper design's split over its mechanisms (docs/internals.md#simscenariopy): a game on the tuned engine and
    the case's learner, from tuned verl to the paper design."""

    work, _ = workload(cfg)
    cb, cs, _ = clusters(cfg, work)
    off = dict.fromkeys(("overlap", "hybrid", *EXTRAS), False)

    def build(s: frozenset):
        if "serverless functions" not in s:
            return Verl(cb, name="coalition")
        sw = Switches(**{m: m in s for m in SUB_PLAYERS[1:]}, **off)
        return RLHFless(cs, sw, cfg.lam, cfg.tau, cfg.prefill_actors, name="coalition", objective=cfg.objective,
                        deadline_ratio=cfg.deadline_ratio)

    # without functions every coalition is tuned verl: play it once, not 2^5 times
    keyed = {frozenset(c): None for k in range(len(SUB_PLAYERS) + 1) for c in combinations(SUB_PLAYERS, k)}
    live = {s: build(s) for s in keyed if "serverless functions" in s}
    live[frozenset()] = build(frozenset())
    played = _play(live, work, jobs)
    summaries = {s: played[s] if s in played else played[frozenset()] for s in keyed}
    return terms(summaries, SUB_PLAYERS)
