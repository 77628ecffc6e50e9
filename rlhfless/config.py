"""The run configuration: one typed dataclass per part, loaded from YAML with dotted `key=value` overrides.

`load_run_config("experiments/configs/quickstart.yaml", ["algo.group_size=4"])` -> `RunConfig`. A YAML file may
name `defaults: other.yaml` (relative to itself) to inherit and override. Unknown keys, wrong types and
out-of-range values raise `ConfigError` naming the field before any work starts. Each default lives in exactly one
place: the dataclass field.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from rlhfless.algo.config import GRPOConfig
from rlhfless.core.configbase import build_config, load_yaml, merge
from rlhfless.core.devices import check_device, resolve_device, syntax_problem, wants_cuda
from rlhfless.core.errors import ConfigError, require
from rlhfless.core.outpaths import REPO_ROOT, repo_path
from rlhfless.learn.config import CriticConfig, OptimConfig
from rlhfless.plan.config import PlanConfig
from rlhfless.predictor.config import PredictorConfig
from rlhfless.runtime.config import RuntimeConfig
from rlhfless.tasks.config import TaskConfig

DEFAULT_CHECKPOINT = "data/checkpoints/sft"


@dataclass
class PolicyConfig:
    """Which weights the policy starts from."""

    checkpoint: str = DEFAULT_CHECKPOINT
    """Checkpoint folder: the shipped tiny model (byte tokenizer, from `rlhfless pretrain`) or any local Hugging
    Face causal-LM folder (config.json, safetensors, its tokenizer files); relative paths resolve against the repo
    root, then the cwd. Nothing is downloaded."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Wrap each task prompt in the tokenizer's chat template as a user turn: auto = when the checkpoint has one."""
    build: Literal["none", "tiny-bpe"] = "none"
    """When `checkpoint` does not exist: none = error; tiny-bpe = build a small random-initialised Qwen2 model with
    a BPE tokenizer trained on the task's texts there first (`rlhfless build-hf-model`), then use it."""
    build_sft_steps: int = 0
    """With policy.build=tiny-bpe: supervised warm-start steps on the train split's worked solutions before the
    folder is saved (the GSM8K task has them), so GRPO starts from a model that sometimes earns a reward."""

    def __post_init__(self) -> None:
        require(self.chat_template in ("auto", "on", "off"), "policy.chat_template",
                f"must be auto, on or off (got {self.chat_template!r})")
        require(self.build in ("none", "tiny-bpe"), "policy.build", f"must be none or tiny-bpe (got {self.build!r})")
        require(self.build_sft_steps >= 0, "policy.build_sft_steps", f"must be >= 0 (got {self.build_sft_steps})")

    def resolved(self) -> Path:
        return repo_path(self.checkpoint)


@dataclass
class RolloutConfig:
    """Sampling of B prompts x G responses per step (G is `algo.group_size`)."""

    prompts_per_step: int = 32
    """B: prompts per step."""
    max_new_tokens: int = 192
    """Response cap in tokens (EOS included); longer responses are truncated and get reward 0."""
    temperature: float = 1.0
    """Sampling temperature (> 0 for training; the eval uses it too)."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    dedup_prefill: bool = True
    """Compute each shared prompt prefix once (the paper's deduplicated prefill); False = naive prefill."""
    reuse_prefix_forward: bool = True
    """Learner and reference forward passes run each prompt once per group and reuse its KV for the G responses."""
    engine: Literal["own", "vllm"] = "own"
    """Training rollout engine: own (this project's) or vllm (the optional extra in its own venv, `make test-vllm`;
    given the learner's weights every step: inline, or in every decode worker of the runtime modes; greedy equals
    own, sampled tokens come from vLLM's random streams, and a migrated row continues from a new stream, so
    serverless and serverful samples agree only without migration). The held-out eval always uses the own engine."""

    def __post_init__(self) -> None:
        require(self.engine in ("own", "vllm"), "rollout.engine", f"must be own or vllm (got {self.engine!r})")
        require(self.prompts_per_step >= 1, "rollout.prompts_per_step", f"must be >= 1 (got {self.prompts_per_step})")
        require(self.max_new_tokens >= 1, "rollout.max_new_tokens", f"must be >= 1 (got {self.max_new_tokens})")
        require(self.temperature > 0, "rollout.temperature", f"must be > 0 (got {self.temperature})")
        require(0 < self.top_p <= 1, "rollout.top_p", f"must be in (0, 1] (got {self.top_p})")


@dataclass
class TrainConfig:
    """Length of the run, evaluation and checkpoints."""

    steps: int = 400
    """GRPO steps."""
    seed: int = 0
    """Seeds prompt order and sampling."""
    threads: int = 2
    """torch threads."""
    device: str = "cpu"
    """Where the inline loop's models run (policy, learner, reference, evaluation): cpu, cuda (= cuda:0), cuda:k,
    or auto (cuda:0 when torch sees a CUDA device, else cpu). cpu by default so a config gives the same samples on
    every machine; a CUDA setting on a machine without one fails before any work (rlhfless.core.devices)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights, KV cache and activations: float32 or bfloat16 (sampling, log-probs and the loss stay float32;
    checkpoints are written as float32 either way)."""
    eval_prompts: int | None = None
    """Held-out prompts for the initial and final evaluation: the first N of the task's held-out split (0 = skip;
    None = the whole split; more than the split holds is refused, never cut silently)."""
    eval_samples: int | None = None
    """Sampled responses per held-out prompt for eval/accuracy (>= 1); None = algo.group_size. Set it when
    comparing runs of different G (PPO's G = 1 makes a noisy estimate)."""
    eval_greedy: bool = True
    """Also report greedy accuracy on the held-out prompts."""
    eval_every: int = 0
    """Evaluate every N steps in between (0 = only at start and end)."""
    table_every: int = 50
    """Log a table of sample completions every N steps (0 = never)."""
    checkpoint_every: int = 100
    """Save the policy every N steps (0 = only at the end); the last good checkpoint survives a NaN."""
    plan: bool = True
    """Run the planner every step (predict lengths, choose N actors and the assignment) and log its decisions."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "train.steps", f"must be >= 1 (got {self.steps})")
        require(self.threads >= 1, "train.threads", f"must be >= 1 (got {self.threads})")
        problem = syntax_problem(self.device)
        require(problem is None, "train.device", problem or "")
        require(self.eval_prompts is None or self.eval_prompts >= 0, "train.eval_prompts",
                f"must be >= 0 or null (got {self.eval_prompts})")
        # seeds feed random.Random strings and torch.manual_seed, which refuses negatives only deep in a run
        require(self.seed >= 0, "train.seed", f"must be >= 0 (got {self.seed})")
        require(self.eval_samples is None or self.eval_samples >= 1, "train.eval_samples",
                f"must be >= 1 or null (got {self.eval_samples})")
        for name in ("eval_every", "table_every", "checkpoint_every"):
            require(getattr(self, name) >= 0, f"train.{name}", f"must be >= 0 (got {getattr(self, name)})")


@dataclass
class TrackingConfig:
    """Weights & Biases logging (offline by default: files under the run dir, `wandb sync` later)."""

    mode: Literal["offline", "online", "disabled"] = "offline"
    """offline (default), online, or disabled."""
    project: str = "rlhfless"
    """W&B project name."""
    name: str | None = None
    """Run name (default: the output folder's name)."""
    group: str | None = None
    """Run group, e.g. one ablation."""


@dataclass
class RunConfig:
    """Everything one `rlhfless train` run needs."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def _check_algo_variant(self) -> None:
        """The named advantage estimator and policy loss are declared variants, and the estimator fits the
        algorithm (one that needs a critic only with algo.name=ppo, and the reverse). The names come from the
        torch-free `algo.variants`, which the implementations register against: no torch for a config check."""
        from rlhfless.algo.variants import ESTIMATOR_NAMES, POLICY_LOSS_NAMES

        a = self.algo
        require(a.estimator in ESTIMATOR_NAMES, "algo.adv_estimator",
                f"must be auto or a registered estimator: {', '.join(sorted(ESTIMATOR_NAMES))} "
                f"(got {a.adv_estimator!r})")
        needs = ESTIMATOR_NAMES[a.estimator].needs_critic
        require(needs == (a.name == "ppo"), "algo.adv_estimator",
                "one that needs a critic "
                f"({', '.join(sorted(k for k, e in ESTIMATOR_NAMES.items() if e.needs_critic))}) runs with "
                f"algo.name=ppo, the others with grpo (got {a.estimator}, which "
                f"{'needs a' if needs else 'has no'} critic, with algo.name={a.name})")
        require(a.policy_loss in POLICY_LOSS_NAMES, "algo.policy_loss",
                f"must be a registered policy loss: {', '.join(sorted(POLICY_LOSS_NAMES))} (got {a.policy_loss!r})")

    def check_machine(self) -> None:
        """Reject, before any work, a setting this machine cannot run: the runtime's units and devices, and the
        inline loop's device (one line naming the field; every entry point and `--dry-run` call this).

        plan.max_actors above the units of a serverless or compare run is capped at the units, with one line
        saying so (the scaler could never start more decode functions than there are units; a config sized for
        a larger machine then still runs here as written)."""
        k = self.runtime.function_units()  # runtime.emulated_tp: a function holds k units
        units = self.runtime.resolved_units() // k if self.runtime.mode in ("serverless", "compare") else None
        cap = units if units is not None and self.plan.max_actors > units else None
        self.runtime.check_machine(self.plan.max_actors if cap is None else cap, compare_dp=self.algo.name == "grpo")
        rt = self.runtime
        if self.algo.name == "ppo" and rt.mode in ("serverful", "compare"):
            # the pool's one data-parallel group is every worker, so PPO's ranks are one worker (the actor on worker
            # 0, the critic on the last) or all of them (each worker an actor rank and a critic rank)
            require(rt.ppo_ranks() in (1, rt.workers()), "runtime.learner_units",
                    f"PPO in the serverful pool trains on one worker or on all runtime.serverful_workers="
                    f"{rt.workers()} (got {rt.learner_units}); use 0, 1 or {rt.workers()}")
        if cap is not None:  # after the runtime's own checks: a machine it refuses is named first
            self._cap_actors(cap)
        check_device(self.train.device, "train.device")
        # train.device=auto passes __post_init__'s check and may only resolve to a GPU here (cpu is cpu: no torch
        # imported to say so, for `--dry-run`)
        ppo_on_cpu = self.algo.name != "ppo" or self.train.device == "cpu" or \
            resolve_device(self.train.device).type == "cpu"
        require(ppo_on_cpu, "train.device",
                f"{self.train.device} resolves to a GPU here, and PPO runs on the CPU only for now; use "
                "train.device=cpu")
        if self.algo.name == "ppo" and self.runtime.mode in ("serverless", "compare"):
            units = self.runtime.resolved_units()
            require(units >= 2, "runtime.units", f"PPO's actor and critic functions run side by side: at least 2 "
                    f"units (got {units}); use runtime.mode=serverful or inline on one unit")

    def _cap_actors(self, units: int) -> None:
        k = self.runtime.function_units()
        require(self.plan.min_actors <= units, "plan.min_actors", f"serverless decode functions need "
                f"{'one unit' if k == 1 else f'{k} units'} each: at most {units} (got {self.plan.min_actors}); lower "
                "it or raise runtime.units")
        at = f"runtime.units={units} (one unit" if k == 1 else f"runtime.units / {k} = {units} ({k} units"
        print(f"rlhfless: plan.max_actors={self.plan.max_actors} capped at {at} per serverless decode function)",
              file=sys.stderr)
        self.plan = replace(self.plan, max_actors=units)

    def __post_init__(self) -> None:
        self._check_algo_variant()
        if self.runtime.mode in ("serverless", "compare"):
            require(self.train.plan, "train.plan", f"runtime.mode={self.runtime.mode} executes the planner's "
                    "decision, so the planner must run: set train.plan=true")
        require(self.plan.capacity >= self.algo.group_size, "plan.capacity",
                f"must hold one group: >= algo.group_size={self.algo.group_size} (got {self.plan.capacity})")
        # vLLM prefills inside its own engine (prefix cache): the prefill function's shipped KV cannot enter it
        require(self.rollout.engine == "own" or self.runtime.ship_prefix_kv != "always", "runtime.ship_prefix_kv",
                "always ships the prefill function's KV to the decode functions, which rollout.engine=vllm cannot "
                "take (vLLM prefills with its own prefix cache); use never or auto (auto never ships with vllm)")
        if self.algo.name == "ppo":
            # the critic, the values and the PPO targets are never moved to a GPU yet: refused, not a device error
            # mid-run (docs/ppo.md, "Not built yet")
            for name, spec in (("train.device", self.train.device), ("runtime.device", self.runtime.device)):
                require(not wants_cuda(spec), name, f"PPO runs on the CPU only for now (got {name}={spec}); use "
                        f"{name}=cpu")
        if self.runtime.device == "emulated" and self.runtime.executes:
            require(self.rollout.engine == "own", "rollout.engine", "must be own with runtime.device=emulated: "
                    f"no engine runs, the compute is modelled (got {self.rollout.engine!r})")
            self._check_function_tp()
        if self.algo.name == "ppo" and self.runtime.executes:
            self._check_ppo_runtime()
        if self.runtime.executes:
            # workers would hold bfloat16 replicas and all-reduce bfloat16 gradients through gloo: never run yet
            require(self.train.dtype == "float32", "train.dtype",
                    f"bfloat16 runs inline only for now (got runtime.mode={self.runtime.mode}); use train.dtype=float32")
            # the runtime's learner accumulates one pass over the step's groups (rlhfless.learn.accumulate)
            require(self.algo.inner_epochs == 1, "algo.inner_epochs",
                    f"must be 1 with runtime.mode={self.runtime.mode}: the runtime's learner takes one pass over "
                    f"the step's groups as they finish (got {self.algo.inner_epochs}); use runtime.mode=inline")
        if self.algo.max_seq_len_norm is not None:
            require(self.algo.max_seq_len_norm >= self.rollout.max_new_tokens, "algo.max_seq_len_norm",
                    f"must be >= rollout.max_new_tokens={self.rollout.max_new_tokens}")

    def _check_function_tp(self) -> None:
        """runtime.emulated_tp > 1: GRPO only (PPO's emulated actor and critic ranks hold one unit each: a TP-k PPO
        rank is not built); the
        planner prices a decode function as its TP's devices (plan.gpus_per_actor, set here when left at 1)."""
        if self.runtime.emulated_tp == 1:
            return
        require(self.algo.name == "grpo", "runtime.emulated_tp", "TP-k functions are built for GRPO only (PPO's "
                f"actor and critic ranks hold one unit each); use 1 (got {self.runtime.emulated_tp})")
        k = self.runtime.function_units()
        require(self.plan.gpus_per_actor in (1.0, float(k)), "plan.gpus_per_actor", "must be runtime.emulated_tp's "
                f"units per decode function or left at 1 (got {self.plan.gpus_per_actor} at TP {k})")
        self.plan = replace(self.plan, gpus_per_actor=float(k))

    def _check_ppo_runtime(self) -> None:
        """What the runtime's PPO (`runtime.ppo_stages`) does not do."""
        rt = self.runtime
        require(rt.overlap is not True or self.critic.values_chunk > 0, "runtime.overlap",
                "with PPO only the value forward can run while the rest decodes (its update whitens advantages "
                "over the whole batch), and only in chunks: set critic.values_chunk (e.g. 8), or runtime.overlap "
                "null (auto) or false")


def _load_with_defaults(path: Path, depth: int = 0) -> dict:
    require(depth < 8, "defaults", f"{path}: 'defaults' chain is too deep (a cycle?)")
    data = load_yaml(path)
    parent = data.pop("defaults", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'defaults' must be a file name")
    return merge(_load_with_defaults(path.parent / parent, depth + 1), data)


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Build a validated `RunConfig` from a YAML file (or the defaults) plus dotted overrides."""
    data = _load_with_defaults(Path(path)) if path else {}
    return build_config(RunConfig, data, overrides or [], source=path)
