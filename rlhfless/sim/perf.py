"""Roofline performance model: seconds of every RLHF stage for a device kind, a model shape and a TP degree.

Turns `hardware` numbers into the times the simulator schedules (decode iterations, prefill, forwards, training,
weight sync, cold start) and into a `plan.TimeModel`, so the planner and the simulator share one engine model. The
rule it keeps: every constant is sourced (`rlhfless.sim.overheads`) or marked assumed. The formulas:
docs/internals.md#simperfpy.

Deviations from the paper:
1. The paper uses Vidur's measured operator tables directly; we fit the roofline's efficiency factors to those
   tables (`calibrate.fit_vidur`, fitted values below with their error), so any catalog device or model can be
   simulated, including ones Vidur never profiled (L40S: A40's fitted efficiencies on L40S peaks, an assumption).
2. A decode iteration is vLLM's whole iteration (per-step host work, in-graph all-reduce: `ITERATION_MEASUREMENTS`),
   where the paper's Vidur counts only the kernels (no CPU overhead, NCCL all-reduces); `ITERATION_SOURCES` makes
   Vidur's accounting a switch, and `rlhfless.sim.itersources` sets the two side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rlhfless.core.errors import ConfigError, require
from rlhfless.plan.timemodel import TimeModel
from rlhfless.sim.hardware import DeviceSpec, ModelShape
from rlhfless.sim.overheads import DEFAULT, OPTIM_BYTES_PER_PARAM

PPO_MODELS = 2
"""Models PPO's learner runs per model GRPO's runs (assumed: the critic is the policy's size, as verl's default
critic from the actor's checkpoint): one value forward beside the reference forward, one critic training pass and
optimiser step beside the actor's. `rlhfless simulate --validate` sets the measured ratios beside it."""


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak a real engine reaches, and fixed overheads (seconds).

    compute_eff, mem_eff: of peak FLOP/s and of memory bandwidth in matmuls, in (0, 1].
    op_overhead_s: per matmul kernel (launch + tail).  iter_overhead_s: per decode iteration (engine scheduling,
    sampling, logits).  allreduce_latency_s: per TP all-reduce.  train_mfu, fwd_mfu: model-FLOPs utilisation of
    training and of scoring forwards, in (0, 1].  train_fixed_s: per training step (optimizer, gradient sync).
    kv_mem_frac: share of device memory the engine may use (vLLM gpu_memory_utilization), in (0, 1].
    max_num_seqs: the engine's cap on concurrent sequences.  source: where the numbers come from.
    """

    compute_eff: float
    mem_eff: float
    op_overhead_s: float
    iter_overhead_s: float = 1.24e-3  # fitted: ITERATION_MEASUREMENTS (vLLM, Llama-3-8B, 1 x H100), below
    allreduce_latency_s: float = 8.6e-6  # fitted: ITERATION_MEASUREMENTS (vLLM, Llama-3-70B, TP 8 on H100)
    train_mfu: float = 0.35  # assumed: FSDP bf16 training of dense LLMs is reported at 30-45% MFU
    fwd_mfu: float = 0.45  # assumed: forward-only scoring, no backward, large batches
    train_fixed_s: float = 1.0  # assumed: optimizer step + gradient reduce-scatter per update
    kv_mem_frac: float = 0.9  # vLLM's default gpu_memory_utilization (vLLM docs, EngineArgs)
    max_num_seqs: int = 1024  # verl's rollout default max_num_seqs (verl ppo_trainer.yaml)
    source: str = "assumed"

    def __post_init__(self) -> None:
        for f in ("compute_eff", "mem_eff", "train_mfu", "fwd_mfu", "kv_mem_frac"):
            v = getattr(self, f)
            require(0 < v <= 1, f"efficiency.{f}", f"must lie in (0, 1] (got {v})")
        for f in ("op_overhead_s", "iter_overhead_s", "allreduce_latency_s", "train_fixed_s"):
            require(getattr(self, f) >= 0, f"efficiency.{f}", f"must be >= 0 s (got {getattr(self, f)})")
        require(self.max_num_seqs >= 1, "efficiency.max_num_seqs", f"must be >= 1 (got {self.max_num_seqs})")


ITERATION_MEASUREMENTS = (
    # (device, model, tp, batch, mean context tokens, measured seconds per decode iteration); one source for all:
    # LambdaLabsML/vllm-benchmark, results/prompt_10/<1|8>xH100-80GB-SXM/Meta-Llama-3-{8B,70B}-Instruct_tp{1,8}_
    # len2048.json (vLLM 0.6, bf16, CUDA graphs, 10 ShareGPT prompts at once, 10-step multi-step scheduling: each
    # `itls` entry is 10 iterations). Read off each request's `itls` where `batch` requests were still running:
    # batch 1 = the 741-token request alone at its end (its last 30 entries for 8B, 12 for 70B), batch 2 = it
    # and the 624-token request (70B), batch 7 = the entries after the first, before the 35-token request ended.
    ("H100", "llama-3-8b", 1, 1, 615.0, 7.05e-3),
    ("H100", "llama-3-8b", 1, 7, 106.0, 7.35e-3),
    ("H100", "llama-3-70b", 8, 1, 709.0, 11.23e-3),
    ("H100", "llama-3-70b", 8, 2, 455.0, 11.32e-3),
    ("H100", "llama-3-70b", 8, 7, 110.0, 11.95e-3),
)
"""Published whole-iteration times of vLLM at small batch (source above). `calibrate.fit_decode_overheads` fits
the per-iteration overhead to the TP 1 rows (no all-reduce there), then the all-reduce latency to the TP 8 rows;
tests/test_sim_perf.py refits both and checks every row within 15%. Vidur's NCCL all-reduce profile
(../shared/data/vidur-profiles/network/h100_dgx, 8 GPUs, messages up to 2 MB: median 26 us,
`calibrate.fit_allreduce_latency`) is 3x the fitted 8.6 us: vLLM reduces small decode messages with its own
one-shot kernel inside the CUDA graph, not NCCL, so the NCCL profile bounds eager engines, not this one."""

HELD_OUT_MEASUREMENTS = (
    # the same source and reading on another GPU kind, NOT used by the fit: LambdaLabsML/vllm-benchmark,
    # results/prompt_10/1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json (same 10 prompts, vLLM 0.6,
    # 10-step scheduling): batch 1 = the 741-token request alone (its last 24 `itls` entries, 11.41 ms per
    # iteration), batch 7 = entries 2-3 of the seven requests still running (11.69 ms)
    ("A100-80G", "llama-3-8b", 1, 1, 655.0, 11.41e-3),
    ("A100-80G", "llama-3-8b", 1, 7, 106.0, 11.69e-3),
)
"""Whole-iteration times on the A100 that check the H100-fitted overhead on another GPU kind (tests/test_sim_perf.py:
within 15%; it is within 2%): the overhead is host-side (scheduling, sampling), which is why the H200 takes it too.
No whole-iteration measurement at batch ~64 or a clean prefill at ~2,048 tokens was found (docs/overheads.md lists
what was tried); the layer time there is checked against Vidur's measured layers instead."""

ITERATION_SOURCES = ("vllm", "kernels")
"""Which source a decode iteration follows (`iteration_efficiency`, `SimConfig.iteration`; the two side by side:
`rlhfless.sim.itersources`, docs/reproduction.md). vllm (default): vLLM's measured whole iterations
(`ITERATION_MEASUREMENTS`: CUDA graphs, per-step scheduling, input preparation, logits and sampling), what a
vLLM 0.8 decode step costs. kernels: Vidur's accounting, the sum of the GPU kernels only: no per-iteration
overhead (Vidur's default `skip_cpu_overhead_modeling`) and NCCL's all-reduce latency (eager NCCL, not vLLM's
in-graph custom all-reduce); the LM head stays (GPU work Vidur leaves out)."""

NCCL_ALLREDUCE_LATENCY_S = 26e-6
"""NCCL all-reduce latency on 8 H100s in one node: `calibrate.fit_allreduce_latency(..., max_bytes=2e6)` on
../shared/data/vidur-profiles/network/h100_dgx/all_reduce.csv (the median after the bandwidth term; A100 DGX 35 us,
not applied: one constant, as the fitted one)."""


def iteration_efficiency(eff: Efficiency, source: str) -> Efficiency:
    """`eff` for a decode iteration from `source` (`ITERATION_SOURCES`): vllm keeps the whole-iteration fit;
    kernels drops the per-iteration overhead and takes NCCL's all-reduce latency."""
    require(source in ITERATION_SOURCES, "iteration", f"must be one of {list(ITERATION_SOURCES)} (got {source!r})")
    if source == "vllm":
        return eff
    return replace(eff, iter_overhead_s=0.0, allreduce_latency_s=NCCL_ALLREDUCE_LATENCY_S,
                   source=f"{eff.source}; kernels only (Vidur's accounting)")


# Fitted by `rlhfless.sim.calibrate.fit_vidur` on ../shared/data/vidur-profiles (Vidur commit 7d47513, MIT): the
# four matmuls of every layer, every model, TP 1/2/4/8, num_tokens 1..4096 of that GPU; median |relative error|
# and p90 of the fit are in the comment (tests/test_sim_perf.py refits and checks the tolerance).
FITTED = {
    "H100": Efficiency(0.668, 0.889, 9.62e-6, source="fit_vidur h100: median 8.5%, p90 19.4% over 3,132 rows"),
    "A100-80G": Efficiency(0.701, 0.793, 1.15e-5, source="fit_vidur a100: median 5.2%, p90 14.0% over 3,132 rows"),
    "A40": Efficiency(0.724, 0.716, 1.52e-5, source="fit_vidur a40: median 5.9%, p90 16.8% over 2,088 rows"),
}
# the H200's own peak and bandwidth are its DeviceSpec (NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s
# dense BF16); its fractions of them are the H100's (the same GH100 compute die, HBM3e instead of HBM3; no H200
# profile in Vidur's data and no published vLLM H200 iteration time found: assumed), and the per-iteration
# overhead is the host's (HELD_OUT_MEASUREMENTS: the H100's fit holds on an A100 within 2%)
FITTED["H200"] = replace(FITTED["H100"], source="H100's fitted fractions of the H200 datasheet peaks (assumed)")
FITTED["L40S"] = replace(FITTED["A40"], source="A40's fit applied to L40S peaks (nearest profiled relative; assumed)")
# This machine's core running the tiny fp32 model. Decode: calibrate.fit_cpu_decode on
# data/profiles/tpot_tiny_cpu.json gives 2.63 GB/s effective (0.263 of the nominal 10 GB/s) and 0.94 ms per
# iteration (median error 5.6%); the profile never reaches the compute roof, so compute_eff stays 1.0 (not
# identifiable). Training: validate.calibrate on runs/qs_seed0 steps 1-100 gives 1.37e-4 s per trained token on 2
# cores = 6 x 524,672 / 1.37e-4 / 2 = 11.5 GFLOP/s per core = 0.144 of the nominal 80 (scoring assumed the same).
FITTED["cpu-core"] = Efficiency(1.0, 0.263, 0.0, iter_overhead_s=9.4e-4, allreduce_latency_s=0.0, train_mfu=0.144,
                                fwd_mfu=0.144, train_fixed_s=0.0, kv_mem_frac=0.5, max_num_seqs=4096,
                                source="fit_cpu_decode on the TPOT profile; update time of runs/qs_seed0")


@dataclass(frozen=True)
class PerfModel:
    """Times of one model on replicas of `tp` devices of one kind (docs/internals.md#simperfpy)."""

    device: DeviceSpec
    model: ModelShape
    tp: int
    eff: Efficiency
    container_start_s: float = DEFAULT["container_start_s"]  # sources: rlhfless.sim.overheads
    engine_init_s: float = DEFAULT["engine_init_s"]
    storage_bw: float = DEFAULT["storage_gbps"] * 1e9  # bytes/s per device reading weights at a cold start
    net_eff: float = DEFAULT["net_eff"]  # of one NIC's line rate (weight sync) and of a NIC share (KV)
    eager_layer_s: float = 0.0  # CPU launch seconds per layer per decode iteration; 0 = CUDA graphs
    reshard_full: bool = False  # colocated resharding moves the whole model per device (verl FSDP -> vLLM)

    def __post_init__(self) -> None:
        require(self.tp >= 1 and self.tp <= self.device.devices_per_node, "tp",
                f"tensor-parallel degree must lie in 1..{self.device.devices_per_node} for {self.device.name} "
                f"(got {self.tp})")
        require(self.model.heads % self.tp == 0, "tp", f"must divide the model's {self.model.heads} heads "
                f"(got {self.tp})")
        if self.weight_bytes_per_device() >= self.usable_bytes():
            raise ConfigError(
                f"model: {self.model.name} needs {self.weight_bytes_per_device() / 1e9:.1f} GB of weights per "
                f"device at tp={self.tp}, more than the {self.usable_bytes() / 1e9:.1f} GB usable on a "
                f"{self.device.name}; raise tp or pick a larger device")

    # ---- memory ---------------------------------------------------------------------------------------
    def usable_bytes(self) -> float:
        return self.device.mem_bytes * self.eff.kv_mem_frac

    def weight_bytes_per_device(self) -> float:
        return self.model.params * self.model.bytes_per_param / self.tp

    def kv_capacity(self, context_tokens: float) -> int:
        """Concurrent sequences a replica holds at `context_tokens` of KV each (capped at max_num_seqs)."""
        free = (self.usable_bytes() - self.weight_bytes_per_device()) * self.tp
        per_seq = self.model.kv_bytes_per_token * max(context_tokens, 1.0)
        return int(min(self.eff.max_num_seqs, free // per_seq))

    # ---- kernels --------------------------------------------------------------------------------------
    def _matmul_dims(self) -> list[tuple[int, int]]:
        """(K, N) per device of a layer's four matmuls under TP (column- then row-parallel)."""
        m, t = self.model, self.tp
        return [(m.hidden, (m.heads + 2 * m.kv_heads) * m.head_dim // t), (m.heads * m.head_dim // t, m.hidden),
                (m.hidden, 2 * m.intermediate // t), (m.intermediate // t, m.hidden)]

    def matmul_s(self, n_tokens: np.ndarray | float) -> np.ndarray:
        """Seconds of one layer's four matmuls on n_tokens tokens (array in, array out)."""
        n = np.asarray(n_tokens, dtype=np.float64)
        b = self.model.bytes_per_param
        out = np.zeros_like(n)
        for k, nn in self._matmul_dims():
            flops = 2.0 * n * k * nn
            by = b * (k * nn + n * k + n * nn)
            out = out + np.maximum(flops / (self.device.peak_flops * self.eff.compute_eff),
                                   by / (self.device.mem_bw * self.eff.mem_eff)) + self.eff.op_overhead_s
        return out

    def _allreduce_s(self, n_tokens: np.ndarray) -> np.ndarray:
        if self.tp == 1:
            return np.zeros_like(n_tokens)
        by = n_tokens * self.model.hidden * self.model.bytes_per_param
        return self.eff.allreduce_latency_s + 2.0 * (self.tp - 1) / self.tp * by / self.device.link_bw

    def decode_iter_s(self, batch: np.ndarray | float, context: float) -> np.ndarray:
        """Seconds of one decode iteration at `batch` running sequences of mean `context` tokens (0 at batch 0)."""
        b = np.asarray(batch, dtype=np.float64)
        m = self.model
        t = (m.layers * (self.matmul_s(b) + 2 * self._allreduce_s(b)) + self.decode_attention_s(b, context)
             + self.lm_head_s(b) + self.eff.iter_overhead_s)
        if self.eager_layer_s > 0:  # without CUDA graphs the CPU launches every kernel; the GPU waits for it
            t = np.maximum(t, m.layers * self.eager_layer_s + self.eff.iter_overhead_s)
        return np.where(b > 0, t, 0.0)

    def allreduce_s(self, n_tokens: float) -> float:
        """Seconds of one iteration's TP all-reduces over all layers (two a layer) on `n_tokens` tokens."""
        return self.model.layers * 2 * float(self._allreduce_s(np.array([float(n_tokens)]))[0])

    def decode_attention_s(self, batch: np.ndarray | float, context: float) -> np.ndarray:
        """Seconds of one decode iteration's attention over all layers: reading `batch` x `context` tokens of KV
        at the matmuls' memory efficiency (the attention kernel's own profile is not in Vidur's public data)."""
        b = np.asarray(batch, dtype=np.float64)
        return b * context * self.model.kv_bytes_per_token / self.tp / (self.device.mem_bw * self.eff.mem_eff)

    def lm_head_s(self, batch: np.ndarray | float) -> np.ndarray:
        """Seconds of the logits of `batch` sequences (hidden x vocab per token, split over TP)."""
        b, m = np.asarray(batch, dtype=np.float64), self.model
        return 2.0 * b * m.hidden * m.vocab / self.tp / (self.device.peak_flops * self.eff.compute_eff)

    def prefill_attention_s(self, tokens: float, context: float | None = None) -> float:
        """Seconds of a prefill's attention over all layers: 4 x tokens x context x heads x head_dim FLOPs
        (QK^T and PV) at the matmuls' compute efficiency (context: mean attended keys, default tokens/2)."""
        m, c = self.model, tokens / 2 if context is None else context
        return 4.0 * tokens * c * m.heads * m.head_dim / self.tp / (self.device.peak_flops * self.eff.compute_eff)

    def prefill_s(self, tokens: float, context: float | None = None) -> float:
        """Seconds to prefill `tokens` prompt tokens in one pass (context: mean attended keys, default tokens/2)."""
        if tokens <= 0:
            return 0.0
        n, layers = np.array([float(tokens)]), self.model.layers
        attn = self.prefill_attention_s(tokens, context)
        return float(layers * (self.matmul_s(n)[0] + 2 * self._allreduce_s(n)[0] + attn / layers))

    # ---- whole stages ---------------------------------------------------------------------------------
    def forward_s(self, tokens: float, n_devices: float) -> float:
        """A scoring forward (reference, reward or value model of this size) over `tokens` on n_devices."""
        return 2.0 * self.model.params * tokens / (n_devices * self.device.peak_flops * self.eff.fwd_mfu)

    def train_s(self, tokens: float, n_devices: float) -> float:
        """One update over `tokens` (prompt + response) on n_devices: 6 x params x tokens at train_mfu."""
        flops = 6.0 * self.model.params * tokens
        return self.eff.train_fixed_s + flops / (n_devices * self.device.peak_flops * self.eff.train_mfu)

    def learner_s_per_token(self, algo: str, old_logprob: bool = False) -> float:
        """Device-seconds of the learner's work per token (prompt + response): the reference forward (PPO: and
        the value forward) at fwd_mfu, the policy's forward/backward (PPO: and the critic's) at train_mfu; the
        same formulas as `forward_s` and `train_s`, without the per-update constant (`update_fixed_s`).
        old_logprob: plus one actor forward recomputing the old log-probs (verl does it every step)."""
        n = PPO_MODELS if algo == "ppo" else 1
        fwd = 2.0 * self.model.params / (self.device.peak_flops * self.eff.fwd_mfu)
        train = 6.0 * self.model.params / (self.device.peak_flops * self.eff.train_mfu)
        return (n + int(old_logprob)) * fwd + n * train

    def train_s_per_token(self, algo: str) -> float:
        """The training part of `learner_s_per_token`: the policy's (PPO: and the critic's) forward/backward."""
        return (PPO_MODELS if algo == "ppo" else 1) * 6.0 * self.model.params / (self.device.peak_flops *
                                                                                 self.eff.train_mfu)

    def update_fixed_s(self, algo: str, minibatches: int = 1) -> float:
        """The optimizer step(s) of one step: policy (PPO: and critic), once per mini-batch."""
        return self.eff.train_fixed_s * (PPO_MODELS if algo == "ppo" else 1) * minibatches

    def grad_exchange_s(self, world: int) -> float:
        """One optimizer step's gradient exchange between `world` data-parallel ranks of TP 1, as each rank spends
        it (the emulated runtime charges it per rank: `runtime.devices.emulated`): an all-reduce of the bf16
        gradients (the model's bytes), hierarchical as NCCL runs it across nodes: a ring reduce-scatter and
        all-gather inside each node over the link (2 (k-1)/k of the bytes, k ranks a node), and the node's
        1/k slice all-reduced between the n nodes through each device's NIC share (2 (n-1)/n of bytes/k) at
        net_eff. FSDP's reduce-scatter + all-gather moves the same bytes. 0 for one rank. The simulator's arms
        still fold it into `train_fixed_s` (assumed)."""
        if world <= 1:
            return 0.0
        per_node = min(world, self.device.devices_per_node)
        nodes = -(-world // per_node)
        grads = self.model.params * self.model.bytes_per_param
        intra = 2.0 * (per_node - 1) / per_node * grads / self.device.link_bw
        nic = (self.device.nic_bw or self.device.net_bw / self.device.devices_per_node) * self.net_eff
        inter = 2.0 * (nodes - 1) / nodes * grads / per_node / nic if nodes > 1 else 0.0
        return intra + inter

    def weight_sync_s(self, colocated: bool) -> float:
        """New weights into a rollout replica: resharding over the node link (colocated: each device's TP shard,
        or with `reshard_full` the whole model gathered through every device's link, as verl's FSDP -> vLLM
        path measures), or the model broadcast from one sender rank through ONE NIC at `net_eff` of its line
        rate, then fanned out to the replica's devices over the link (serverless; sources in `overheads`)."""
        per_dev = self.weight_bytes_per_device() / self.device.link_bw
        model_bytes = self.weight_bytes_per_device() * self.tp
        if colocated:
            return model_bytes / self.device.link_bw if self.reshard_full else per_dev
        return model_bytes / ((self.device.nic_bw or self.device.net_bw) * self.net_eff) + per_dev

    def optimizer_move_s(self, learner_devices: float) -> float:
        """A block joining a learner sharded over `learner_devices` receives its share of the optimizer state
        (`OPTIM_BYTES_PER_PARAM` per parameter, ZeRO's K) from the others, each of its devices through its own
        NIC at net_eff: 12 P x (d / N) bytes over d NICs = 12 P / (N x NIC x net_eff)."""
        nic = (self.device.nic_bw or self.device.net_bw / self.device.devices_per_node) * self.net_eff
        return OPTIM_BYTES_PER_PARAM * self.model.params / (max(learner_devices, 1.0) * nic)

    def cold_start_s(self, engine: bool = True) -> float:
        """A fresh serverless function: container start (+ inference-engine init for prefill/decode actors) +
        weights from storage."""
        init = self.engine_init_s if engine else 0.0
        return self.container_start_s + init + self.weight_bytes_per_device() / self.storage_bw

    def learner_join_s(self) -> float:
        """A learner block starting on devices a decode function just freed: container start + the current
        weights from a running learner block over the network (device to device, as `weight_sync_s`), not from
        storage: the learner already holds them (an assumption: a peer block is running, true once the first
        group has arrived, and the pre-warmed spare blocks load theirs ahead)."""
        return self.container_start_s + self.weight_sync_s(colocated=False)

    def kv_transfer_s_per_token(self) -> float:
        """Seconds to move one context token's KV to a replica on another node (its share of the node NIC)."""
        share = self.device.net_bw * self.tp / self.device.devices_per_node * self.net_eff
        return self.model.kv_bytes_per_token / share

    def time_model(self, capacity: int, context: float, prefill_s_per_token: float | None = None) -> TimeModel:
        """The planner's TimeModel for one replica: decode iteration seconds at batch 1..capacity (a few points,
        linear between), prefill per prompt token, KV transfer per token; actor_fixed_s 0 (the simulator
        schedules weight sync and cold start itself)."""
        # sorted distinct batch sizes (np.unique's, without its import of numpy.ma: 8 ms of every start-up)
        pts = np.array(sorted(set(np.round(np.geomspace(1, max(capacity, 1), num=24)).astype(int).tolist())))
        s = self.decode_iter_s(pts, context)
        pre = self.prefill_s(1024.0) / 1024.0 if prefill_s_per_token is None else prefill_s_per_token
        return TimeModel(batch_sizes=tuple(int(x) for x in pts), s_per_iter=tuple(float(x) for x in s),
                         prefill_s_per_token=pre, actor_fixed_s=0.0,
                         kv_transfer_s_per_token=self.kv_transfer_s_per_token(),
                         source=f"roofline {self.device.name}/{self.model.name}/tp{self.tp} ctx{context:.0f}")


def smallest_tp(device: DeviceSpec, model: ModelShape, eff: Efficiency, headroom: float = 0.6) -> int:
    """The smallest power-of-two TP whose weights take at most `headroom` of usable memory (the rest is KV);
    raises ConfigError naming `model` when no TP within a node fits."""
    tp = 1
    while tp <= device.devices_per_node:
        if model.heads % tp == 0 and model.params * model.bytes_per_param / tp <= headroom * device.mem_bytes * \
                eff.kv_mem_frac:
            return tp
        tp *= 2
    raise ConfigError(f"model: {model.name} ({model.params / 1e9:.1f} B params) does not fit on "
                      f"{device.devices_per_node} x {device.name} (one node); pick a smaller model or larger device")
