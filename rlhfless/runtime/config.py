"""`RuntimeConfig`: how a run's stages execute (the `runtime:` section of a run config).

Modes: `inline` (one process runs every stage: the debugging path and the math's reference), `serverless` (every
stage a function on its own worker process, started on demand, pre-warmed, released when idle; only lifetimes
billed), `serverful` (the verl-like control: W workers held for the run, billed W x wall) and `compare` (the
serverful arms then serverless, `rlhfless.run.compare`). A device unit is one CPU core, one GPU (or 1/k of one,
`runtime.devices.gpus`) or one emulated GPU (`runtime.devices.emulated`); backends `local` (OS processes) and `ray`
(Ray actors, `rlhfless.runtime.platform.raybackend`). The rule it keeps: every field is checked in one line naming
it. Modes and units in full: docs/internals.md#runtimeconfigpy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlhfless.core.devices import check_device
from rlhfless.core.errors import require
from rlhfless.plan.billing import PRESETS, RULE_SETS, BillingRules, rule_set

MODES = ("inline", "serverless", "serverful", "compare")
BACKENDS = ("local", "ray")
START_METHODS = ("forkserver", "spawn")
DEVICES = ("cpu", "cuda", "emulated")
DESIGNS = ("custom", "paper", "extended")
EMULATED_GPUS = ("L40S", "A100-80G", "H100", "H200")
"""Device kinds an emulated unit may be (`rlhfless.sim.hardware.DEVICES`, GPUs only)."""
ENGINES = ("tuned", "paper")
"""runtime.emulated_engine: the serverful pool's engine on emulated devices (`sim.devicemodel.engine_of`)."""
SHIP_KV = ("auto", "always", "never")
MIGRATE = ("plan", "always", "never")


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def _host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()


@dataclass(frozen=True)
class RuntimeConfig:
    """Execution of the step's stages (the `runtime:` section)."""

    mode: str = "inline"
    """inline | serverless | serverful | compare (serverful, serverful + overlap, serverless, same seed; writes
    comparison.json)."""
    backend: str = "local"
    """Worker mechanism: local (OS processes on this machine) | ray (Ray actors on a Ray cluster; extra `.[ray]`)."""
    ray_address: str = ""
    """With backend=ray: "" starts a single-node Ray cluster for this run (stopped at its end); "auto" joins the
    cluster this machine already belongs to (`ray start` was run here); "host:port" joins that cluster's head."""
    device: str = "cpu"
    """What a unit is: cpu (one core), cuda (one GPU per function, from a free list: `runtime.devices.gpus`) or
    emulated (one emulated GPU: the worker sleeps the performance model's time and replays lengths;
    `runtime.devices.emulated`)."""
    emulated_gpu: str = "L40S"
    """With device=emulated: the device kind each unit emulates (`rlhfless.sim.hardware.DEVICES`)."""
    emulated_model: str = "qwen2.5-7b"
    """With device=emulated: the model whose compute is modelled (`rlhfless.sim.hardware.MODELS`); the run's own
    policy checkpoint only supplies the tokenizer and prompts, and no worker loads it."""
    time_scale: float = 1.0
    """With device=emulated: real seconds slept per modelled second, in (0, 1]; 0.1 runs ten times faster. Records
    stay in real seconds; `sim.modelled.modelled_report` divides by it (docs/emulated.md: what it distorts)."""
    length_trace: str = "paper-testbed"
    """With device=emulated: the response lengths replayed, by (step, group, sample): paper-testbed (the
    simulator's testbed workload for runtime.emulated_model) or the path of a length trace (`rlhfless.core.traces`)."""
    emulated_engine: str = "tuned"
    """With device=emulated and mode=serverful: the pool's engine (`sim.devicemodel.engine_of`). tuned: TP
    runtime.emulated_tp (1 by default), CUDA graphs, the KV cache kept between rollouts, each device's shard resharded
    in place (verl's tuned engine);
    paper: verl as the paper ran it, with the simulator's `paper_verl` settings (verl's example TP for the model's size,
    each pool worker holding TP units; vLLM's memory share; the KV cache slept and woken every step; the whole model
    resharded through each device's link). `compare` runs both as its two verl arms."""
    emulated_tp: int = 1
    """With device=emulated: the tensor-parallel degree of the tuned engine, the units each of its replicas holds: every
    serverless function (decode, learner, reference: billed its k units, its compute the simulator's TP-k model,
    `sim.devicemodel.engine_of`) and every pool worker of the tuned verl; the learner's data-parallel ranks are then
    units / k. 0 = auto: the TP the simulator's tuned verl picks for runtime.emulated_model on runtime.units x
    runtime.emulated_gpu (the fastest step that fits, `sim.devicemodel.tuned_tp`). The paper-settings engine keeps
    its own TP (runtime.emulated_engine=paper). GRPO only; a real unit (cpu, cuda) is one device, TP 1."""
    emulated_container_start_s: float | None = None
    """With device=emulated: a function's container start, modelled s (None: the simulator's, `sim.overheads`)."""
    emulated_engine_init_s: float | None = None
    """With device=emulated: a decoding function's inference-engine start, modelled s (None: the simulator's)."""
    emulated_storage_gbps: float | None = None
    """With device=emulated: GB/s per device reading weights (and a learner's optimiser shard) at a cold start
    (None: the simulator's)."""
    design: str = "custom"
    """The serverless arm's design: paper (the paper's RLHFless: separate functions per stage, synchronous
    stages: runtime.hybrid=false, runtime.overlap=false), extended (ours: overlap + hybrid functions), custom
    (runtime.overlap and runtime.hybrid as given). A contradicting explicit switch is refused; the serverful
    control ignores it."""
    functions_per_gpu: int = 1
    """With device=cuda: functions sharing one GPU (k > 1 is for one-GPU development boxes; each function may then
    use 1/k of the GPU's memory). 1 = never two functions on one GPU."""
    units: int = 0
    """Device units the runtime may use (CPU cores, or GPUs x functions_per_gpu with device=cuda); 0 = all this
    process may use."""
    serverful_workers: int = 0
    """W: workers the serverful control holds for the whole run; 0 = units / the units a pool worker holds
    (`pool_worker_units`: 1, or on emulated devices its engine's TP)."""
    learner_units: int = 0
    """Data-parallel ranks of the learner function (one function each, of runtime.emulated_tp units on emulated
    devices, else one unit); 0 = units / runtime.emulated_tp. Equal in both modes, so the two modes learn
    identically (the same all-reduce). PPO: the ranks of the actor and of the critic each; 0 = one rank each;
    serverful, 1 or runtime.serverful_workers (every pool worker an actor rank and a critic rank)."""
    scratch_dir: str = ""
    """Where workers exchange tensor files (weights, batches, KV): "" = a tmpfs folder under /dev/shm (one
    machine, or several Ray nodes on one machine); a Ray cluster of several machines needs a folder every node
    mounts at the same path (NFS, a parallel filesystem)."""
    start_method: str = "forkserver"
    """forkserver: workers fork from a process that imported torch and transformers once (a snapshot-restored
    cold start, like memory snapshots on serverless platforms); spawn: every cold start imports everything.
    With backend=ray: forkserver = one fork server per node, booted with the run; spawn = each actor imports."""
    keep_alive_s: float = 0.0
    """Seconds an idle serverless worker stays warm (billed) before it is released (scale to zero)."""
    prewarm: bool = True
    """Start the next stage's workers ahead of need from the invocation history, so cold starts leave the
    critical path (the paper's pre-warming)."""
    prewarm_from: str = "plan"
    """Expected end of the rollout for the learner's pre-warm: plan = the planner's calibrated prediction for this
    step; history = the shortest recent rollout (the paper's rule). See rlhfless.runtime.modes.policy."""
    prewarm_buffer_s: float = 0.05
    """Safety margin: a pre-warmed worker is started this much earlier than the measured cold start requires."""
    ship_prefix_kv: str = "never"
    """never: each decode function prefills its own groups (shared prompt computed once per group); always: a
    prefill function computes the deduplicated prefix KV once and ships each decode function its rows;
    auto: ship when the time model says shipping is cheaper than recomputing (logged as runtime/ship_kv)."""
    migrate: str = "plan"
    """Live cut-and-migrate in serverless decode: plan = when the planner kept cuts at tau in its decision
    (balancer/migrate_used); always = whenever an actor reaches plan.tau (the paper's rule, for ablations);
    never = no cuts."""
    progress_every: int = 8
    """Decode iterations between a decode function's progress reports (cut-and-migrate decisions)."""
    overlap: bool | None = None
    """Stream the tail: each finished group (all G samples scored) goes to its learner rank, which runs its
    reference forward (algo.kl_coef > 0) and forward/backward while the rest of the step decodes; one optimiser
    step once every group is in (bitwise the same update either way: rlhfless.learn.accumulate). true | false | null
    (auto: true for serverless, false for the serverful control as verl does not overlap). PPO streams only its
    value forward, in chunks (critic.values_chunk > 0; without a chunk size nothing streams)."""
    hybrid: bool | None = None
    """Serverless: decode and learner are handlers of one function image (null = true unless runtime.design=paper;
    resolved to true or false when the config is built), so a decode function whose rows are done continues as a
    learner rank of the same step (warm: no cold start, the policy already in memory), and a learner kept warm
    (keep_alive_s) decodes the next step with the weights it just computed (no weight load).
    false = separate images: every rank is a new function that loads the learner state (the paper's figure)."""
    learner_microbatch_groups: int = 1
    """Groups per learner micro-batch (fixed by group index: chunk k = groups k*m .. k*m+m-1). Larger chunks run
    fewer, wider forwards but wait for more groups before computing."""
    measure_profile: bool = True
    """The planner prices with a decode-time profile measured on this machine with the workers' own thread count
    (at start-up, about a second, cached per CPU model, threads, model config and torch version:
    rlhfless.runtime.devices.profile); false = plan.time_profile as given (the shipped profile). Inline runs always use
    plan.time_profile; rollout.engine=vllm too (not measured yet)."""
    profile_cache: str = ""
    """Folder of measured time profiles; "" = $XDG_CACHE_HOME/rlhfless/profiles, else ~/.cache/rlhfless/profiles."""
    invocation_timeout_s: float = 600.0
    """An invocation that takes longer is treated as a failed worker: killed and re-run."""
    max_attempts: int = 3
    """Attempts of one piece of a step's work (a decode function's rows, a learner rank's groups, the serverful
    pool's start) before the run stops with its last good checkpoint; a killed worker's work is re-run from the
    same streams. Only consecutive failures of that work while it runs use them: a restart because another
    worker died uses none, and deaths before the work could run count on a separate budget of this size
    (`runtime/attempts.py`)."""
    billing_granularity_s: float = 0.001
    """Billed worker time is rounded up to this (1 ms, as per-millisecond serverless billing); GPU platforms
    that round to 1 s set 1.0."""
    billing: str = "lifetime"
    """What a serverless run is billed for (`rlhfless.plan.billing`): lifetime = each worker from start to release,
    idle included (commercial platforms); invocations = GPU-seconds summed over invocations (the paper's cost
    proxy); runpod | modal = that platform's preset (lifetime, 1 s, its documented idle timeout, which is then
    the keep-alive: leave runtime.keep_alive_s and runtime.billing_granularity_s unset or equal to it). The
    serverful control is always billed its pool's lifetime (a VM)."""
    gantt_every: int = 50
    """Draw the per-function timeline of step 1 and every N steps (0 = step 1 only)."""

    def __post_init__(self) -> None:
        require(self.mode in MODES, "runtime.mode", f"must be one of {list(MODES)} (got {self.mode!r})")
        require(self.backend in BACKENDS, "runtime.backend", f"must be one of {list(BACKENDS)} (got {self.backend!r})")
        require(isinstance(self.ray_address, str), "runtime.ray_address",
                f"must be a string: '', 'auto' or 'host:port' (got {self.ray_address!r})")
        require(not self.ray_address or self.backend == "ray", "runtime.ray_address",
                f"is only used with runtime.backend=ray (got backend={self.backend!r}, "
                f"ray_address={self.ray_address!r})")
        require(not self.ray_address or self.ray_address == "auto" or _host_port(self.ray_address),
                "runtime.ray_address", f"must be '', 'auto' or 'host:port' (got {self.ray_address!r})")
        require(self.device in DEVICES, "runtime.device", f"must be one of {list(DEVICES)} (got {self.device!r})")
        require(isinstance(self.functions_per_gpu, int) and self.functions_per_gpu >= 1, "runtime.functions_per_gpu",
                f"must be an integer >= 1 (got {self.functions_per_gpu!r})")
        require(self.functions_per_gpu == 1 or self.device == "cuda", "runtime.functions_per_gpu",
                f"only applies with runtime.device=cuda (got device={self.device!r}, "
                f"functions_per_gpu={self.functions_per_gpu})")
        for name in ("units", "serverful_workers", "learner_units"):
            v = getattr(self, name)
            require(isinstance(v, int) and v >= 0, f"runtime.{name}", f"must be an integer >= 0 (got {v!r})")
        require(self.start_method in START_METHODS, "runtime.start_method",
                f"must be one of {list(START_METHODS)} (got {self.start_method!r})")
        require(self.keep_alive_s >= 0, "runtime.keep_alive_s", f"must be >= 0 s (got {self.keep_alive_s})")
        require(self.prewarm_from in ("plan", "history"), "runtime.prewarm_from",
                f"must be plan or history (got {self.prewarm_from!r})")
        require(self.prewarm_buffer_s >= 0, "runtime.prewarm_buffer_s", f"must be >= 0 s (got {self.prewarm_buffer_s})")
        require(self.ship_prefix_kv in SHIP_KV, "runtime.ship_prefix_kv",
                f"must be one of {list(SHIP_KV)} (got {self.ship_prefix_kv!r})")
        require(self.migrate in MIGRATE, "runtime.migrate", f"must be one of {list(MIGRATE)} (got {self.migrate!r})")
        require(self.progress_every >= 1, "runtime.progress_every", f"must be >= 1 (got {self.progress_every})")
        require(self.overlap in (None, True, False), "runtime.overlap",
                f"must be true, false or null (auto) (got {self.overlap!r})")
        require(self.hybrid in (None, True, False), "runtime.hybrid",
                f"must be true, false or null (got {self.hybrid!r})")
        self._resolve_design()
        self._check_emulated()
        require(isinstance(self.learner_microbatch_groups, int) and self.learner_microbatch_groups >= 1,
                "runtime.learner_microbatch_groups", f"must be an integer >= 1 (got {self.learner_microbatch_groups!r})")
        require(self.invocation_timeout_s > 0, "runtime.invocation_timeout_s",
                f"must be > 0 s (got {self.invocation_timeout_s})")
        require(self.max_attempts >= 1, "runtime.max_attempts", f"must be >= 1 (got {self.max_attempts})")
        require(self.billing_granularity_s > 0, "runtime.billing_granularity_s",
                f"must be > 0 s (got {self.billing_granularity_s})")
        require(self.billing in RULE_SETS, "runtime.billing",
                f"must be one of {list(RULE_SETS)} (got {self.billing!r})")
        if self.billing in PRESETS:
            p = PRESETS[self.billing]
            require(self.keep_alive_s in (0.0, p.keep_alive_s), "runtime.keep_alive_s",
                    "a runtime.billing preset fixes the idle timeout ("
                    f"{', '.join(f'{k}: {v.keep_alive_s:g} s' for k, v in PRESETS.items())}) (got "
                    f"{self.keep_alive_s} with runtime.billing={self.billing}, which fixes {p.keep_alive_s} s)")
            require(self.billing_granularity_s in (0.001, p.granularity_s), "runtime.billing_granularity_s",
                    "a runtime.billing preset fixes the granularity ("
                    f"{', '.join(f'{k}: {v.granularity_s:g} s' for k, v in PRESETS.items())}) (got "
                    f"{self.billing_granularity_s} with runtime.billing={self.billing}, which fixes "
                    f"{p.granularity_s} s)")
        require(self.gantt_every >= 0, "runtime.gantt_every", f"must be >= 0 (got {self.gantt_every})")

    def billing_rules(self) -> BillingRules:
        """The rules this run bills with (`runtime.billing`); the serverful control bills its pool's lifetime."""
        if self.mode == "serverful":
            return BillingRules.metered(self.billing_granularity_s, self.keep_alive_s, "lifetime")
        return rule_set(self.billing, self.billing_granularity_s, self.keep_alive_s)

    def idle_timeout_s(self) -> float:
        """Seconds an idle serverless function stays warm before it is released: runtime.keep_alive_s, or the
        idle timeout of the platform preset named by runtime.billing."""
        return self.billing_rules().keep_alive_s

    def _resolve_design(self) -> None:
        """runtime.design as a preset over runtime.overlap and runtime.hybrid (frozen: set once, here)."""
        require(self.design in DESIGNS, "runtime.design", f"must be one of {list(DESIGNS)} (got {self.design!r})")
        serverless = self.mode in ("serverless", "compare")
        if self.design == "paper" and serverless:
            require(self.overlap is not True, "runtime.overlap", "must be false or null with runtime.design=paper "
                    "(the paper's stages run in sequence: nothing streams into the learner)")
            require(self.hybrid is not True, "runtime.hybrid", "must be false or null with runtime.design=paper "
                    "(the paper runs separate functions per stage)")
            object.__setattr__(self, "overlap", False)
        if self.design == "extended" and serverless:
            require(self.overlap is not False, "runtime.overlap", "must be true or null with "
                    "runtime.design=extended (ours streams finished groups into the learner)")
            require(self.hybrid is not False, "runtime.hybrid", "must be true or null with runtime.design=extended "
                    "(ours runs decode and learner as one function image)")
        if self.hybrid is None:
            object.__setattr__(self, "hybrid", self.design != "paper")

    def _check_emulated(self) -> None:
        require(0 < self.time_scale <= 1, "runtime.time_scale", f"must lie in (0, 1] (got {self.time_scale})")
        require(isinstance(self.length_trace, str) and bool(self.length_trace), "runtime.length_trace",
                f"must be paper-testbed or a trace path (got {self.length_trace!r})")
        require(self.emulated_gpu in EMULATED_GPUS, "runtime.emulated_gpu",
                f"must be one of {list(EMULATED_GPUS)} (got {self.emulated_gpu!r})")
        require(self.emulated_engine in ENGINES, "runtime.emulated_engine",
                f"must be one of {list(ENGINES)} (got {self.emulated_engine!r})")
        for k in ("emulated_container_start_s", "emulated_engine_init_s"):
            v = getattr(self, k)
            require(v is None or v >= 0, f"runtime.{k}", f"must be >= 0 s or null (got {v})")
        v = self.emulated_storage_gbps
        require(v is None or v > 0, "runtime.emulated_storage_gbps", f"must be > 0 GB/s or null (got {v})")
        require(isinstance(self.emulated_tp, int) and not isinstance(self.emulated_tp, bool) and self.emulated_tp >= 0,
                "runtime.emulated_tp", f"must be an integer >= 0 (0 = auto) (got {self.emulated_tp!r})")
        if self.device != "emulated":
            require(self.emulated_engine == "tuned", "runtime.emulated_engine",
                    f"applies to runtime.device=emulated only (got {self.emulated_engine!r} on {self.device})")
            require(self.emulated_tp == 1, "runtime.emulated_tp", "applies to runtime.device=emulated only: a cpu "
                    f"or cuda unit runs one function on one device (got {self.emulated_tp} on {self.device})")
            return
        from rlhfless.sim.hardware import MODELS

        require(self.emulated_model in MODELS, "runtime.emulated_model",
                f"must be one of {list(MODELS)} (got {self.emulated_model!r})")
        require(self.units >= 1, "runtime.units", "must be set to the emulated device count with "
                f"runtime.device=emulated (got {self.units})")
        require(self.backend == "local", "runtime.backend", "emulated devices run on the local backend "
                f"(got {self.backend!r})")
        require(self.mode != "inline", "runtime.mode", "runtime.device=emulated needs a runtime mode (serverless, "
                "serverful or compare); inline runs every stage in the driver, where the emulated keys go unused")
        require(self.ship_prefix_kv == "never", "runtime.ship_prefix_kv", "must be never with "
                "runtime.device=emulated (an emulated prefill function is not built)")
        if self.emulated_engine == "paper":
            self._check_paper_engine()
        self._check_function_tp()

    def _check_function_tp(self) -> None:
        """runtime.emulated_tp: functions of k units fill the units; the learner's ranks are units / k."""
        k = self.function_units()
        require(self.units % k == 0, "runtime.emulated_tp", "must divide runtime.units (a function holds TP "
                f"units) (got TP {k} for {self.units} units)")
        require(self.learner_units <= self.units // k, "runtime.learner_units", "must be <= runtime.units / "
                f"runtime.emulated_tp (each learner rank holds TP units) (got {self.learner_units}, at most "
                f"{self.units // k} at TP {k})")

    def _check_paper_engine(self) -> None:
        """runtime.emulated_engine=paper is the serverful pool's, in replicas of TP units that fill the units."""
        require(self.mode == "serverful", "runtime.emulated_engine", "paper is the serverful pool's engine (compare "
                f"runs it as its own verl arm); got runtime.mode={self.mode}")
        tp = self.pool_worker_units()
        require(self.units % tp == 0, "runtime.units", "must be a multiple of the paper engine's TP with "
                f"runtime.emulated_engine=paper (got {self.units}, TP {tp})")
        require(self.serverful_workers in (0, self.units // tp), "runtime.serverful_workers",
                "must be 0 or runtime.units / TP (one pool worker per replica) with runtime.emulated_engine=paper "
                f"(got {self.serverful_workers}, units / TP = {self.units // tp})")

    @property
    def executes(self) -> bool:
        """True when stages run on worker processes (every mode but inline)."""
        return self.mode != "inline"

    def machine_units(self) -> int:
        """Units this machine offers: cores in the affinity mask, visible GPUs x functions_per_gpu, or the emulated
        device count (runtime.units)."""
        if self.device == "emulated":
            return self.units
        if self.device == "cuda":
            from rlhfless.runtime.devices.gpus import visible_gpus

            return len(visible_gpus()) * self.functions_per_gpu
        return available_cores()

    def resolved_units(self) -> int:
        return self.units or self.machine_units()

    def workers(self) -> int:
        """W of the serverful control (a pool worker holds `pool_worker_units` units)."""
        return self.serverful_workers or self.resolved_units() // self.pool_worker_units()

    def pool_worker_units(self) -> int:
        """Units each serverful pool worker holds: the tuned engine's TP (`function_units`), or with
        runtime.emulated_engine=paper one paper-settings replica's TP."""
        if self.emulated_engine != "paper":
            return self.function_units()
        from rlhfless.sim.devicemodel import paper_tp

        return paper_tp(self.emulated_model)

    def function_units(self) -> int:
        """Units each function (and each tuned pool worker) holds: runtime.emulated_tp resolved (auto: the
        simulator's tuned TP, `sim.devicemodel.tuned_tp`); 1 off emulated devices."""
        if self.device != "emulated" or self.emulated_tp == 1:
            return 1
        if self.emulated_tp:
            return self.emulated_tp
        from rlhfless.sim.devicemodel import tuned_tp

        return tuned_tp(self.emulated_gpu, self.emulated_model, self.units)

    def learners(self) -> int:
        """The learner's data-parallel ranks: runtime.learner_units, or one per function of `function_units`."""
        return self.learner_units or self.resolved_units() // self.function_units()

    def ppo_ranks(self) -> int:
        """PPO's data-parallel ranks of the actor and of the critic (`runtime.ppo_stages`): learner_units, and 0 is
        one rank each (PPO's default before its update was data-parallel; GRPO's 0 is every unit)."""
        return self.learner_units or 1

    def check_machine(self, max_actors: int, compare_dp: bool = True) -> None:
        """Reject, before any work, a setting this machine cannot run (names the field). compare_dp: compare must
        train with the same data-parallel degree in both modes (GRPO; PPO's serverful ranks are checked in
        `RunConfig.check_machine`)."""
        if self.device == "cuda":
            check_device("cuda", "runtime.device")
            require(self.backend == "local", "runtime.backend",
                    "ray with runtime.device=cuda is not built yet (actors ask for num_cpus only); use local")
        cores = self.machine_units()
        what = "GPU function slots" if self.device == "cuda" else "cores"
        # a Ray cluster's units live on its nodes, not in this driver's affinity mask
        require(self.backend == "ray" or self.resolved_units() <= cores, "runtime.units",
                f"this process may use {cores} {what}, so at most {cores} units (got {self.units})")
        require(not self.scratch_dir or os.path.isdir(self.scratch_dir) and os.access(self.scratch_dir, os.W_OK),
                "runtime.scratch_dir", f"must be an existing writable folder (got {self.scratch_dir!r})")
        units = self.resolved_units()
        require(self.workers() <= units, "runtime.serverful_workers",
                f"must be <= runtime.units={units} (got {self.serverful_workers})")
        require(self.learners() <= units, "runtime.learner_units",
                f"must be <= runtime.units={units} (got {self.learner_units})")
        if self.mode in ("serverless", "compare"):
            k = self.function_units()
            require(max_actors <= units // k, "plan.max_actors",
                    f"serverless decode functions need {k} unit{'s' if k > 1 else ''} each: at most "
                    f"runtime.units / {k} = {units // k} (got {max_actors}); lower plan.max_actors or raise "
                    "runtime.units")
        if self.mode == "compare" and compare_dp:
            require(self.learners() == self.workers(), "runtime.learner_units",
                    f"compare needs the same data-parallel degree in both modes (learner_units="
                    f"{self.learners()}, serverful_workers={self.workers()}), or the two modes would not learn "
                    "identically")
