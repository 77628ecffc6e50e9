"""Every overhead constant of the simulator in one place, each with its value, unit and source.

Purpose: the numbers that decide the serverless-vs-serverful comparison besides the roofline (cold-start parts,
weight transfer, KV transfer, resharding, billing) and the settings of the paper's verl baseline (verl 0.3.x as
its example scripts and defaults run it). `OVERHEADS` is the table docs/overheads.md prints; `SimConfig` takes
its defaults from here, so a reader changes a constant in one place (or overrides it per run: `key=value`), and
`rlhfless repro sensitivity-overheads` halves and doubles each one.

Non-goals: no measurement code (our own measurements name their command in `source`).

Deviations from the paper: the paper measures its platform; we take public measurements where we found them and
mark the rest `assumed` (the sensitivity figure shows how far each moves the headline).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfless.plan.billing import PAPER_PLATFORM


@dataclass(frozen=True)
class Overhead:
    """One constant: its SimConfig key (None: a fixed setting of the paper's verl baseline), value, unit, and
    where the value comes from (a public measurement, a vendor's documentation, a default, or `assumed`)."""

    key: str | None
    value: float
    unit: str
    source: str
    what: str


OPTIM_BYTES_PER_PARAM = 12
"""Optimizer-state bytes per parameter of mixed-precision Adam (ZeRO's K; source in OVERHEADS)."""
_VERL_YAML = ("verl/trainer/config/ppo_trainer.yaml (v0.3-v0.4: rollout.tensor_model_parallel_size 2, "
              "gpu_memory_utilization 0.5, enforce_eager True, free_cache_engine True, train_batch_size 1024, "
              "ppo_mini_batch_size 256)")
_VERL_GRPO = ("verl examples/grpo_trainer/run_qwen2-7b.sh (rollout TP 2, gpu_memory_utilization 0.6, mini-batch "
              "256 of 1024)")
_PR116 = ("verl PR #116 (github.com/volcengine/verl/pull/116), weight sync on 8 x L20 at TP 4: FSDP->vLLM "
          "resharding 0.24 s (Qwen2.5-3B), 0.55 s (Qwen2.5-7B); cross-process NCCL broadcast of Qwen2.5-7B 0.79 s")

_VERL_70B = ("verl's large-model example scripts (examples/grpo_trainer and ppo_trainer, Qwen2.5-72B / Llama-70B "
             "class: rollout tensor_model_parallel_size 8-16); the paper states no TP; not re-checked here, as "
             "cited by the review that asked for this range")
_VERL_VLLM08 = ("verl docs 'Upgrading to vLLM >= 0.8' (docs/README_vllm0.8.md; the paper ran vLLM 0.8.3): CUDA "
                "graphs on with actor_rollout_ref.rollout.enforce_eager=False together with free_cache_engine=True "
                "(read in a third-party copy of the page found by this session's search, not the page itself)")
_VERL_SLEEP = ("verl docs 'Readme for verl(vllm>=0.7) version' (verl.readthedocs.io, v0.2.x/README_vllm0.7): the "
               "SPMD rollout with vLLM >= 0.7, whose sharding manager wakes the engine before a rollout and puts it "
               "to sleep (level 1) after; vLLM docs 'Sleep Mode': level 1 offloads the weights to CPU memory and "
               "discards the KV cache; cost = the device's weights out and back over `host_gbps`")

OVERHEADS: dict[str, Overhead] = {o.key or o.what: o for o in (
    Overhead("container_start_s", 2.4, "s",
             "public benchmark of serverless GPU cold starts (server-rentals blog, 'Cold start times: Runpod vs "
             "Modal vs Replicate', 1,000 invocations of a Llama-3-8B container: p50 2.4 s Runpod, 3.1 s Modal); "
             "the smaller p50 taken (its image load is inside it, so this slightly overstates our container part)",
             "a serverless container start (image cached on the host)"),
    Overhead("engine_init_s", 13.8, "s",
             "Modal's published production data (byteiota.com summary, 2026: mean vLLM boot 95.7 s without, "
             "13.8 s with GPU memory snapshots); vLLM issue #20264 logs 34 s of 'init engine' (profiling, KV "
             "cache, 17 s CUDA-graph capture) without snapshots",
             "inference-engine start of a prefill/decode function (snapshot-restored, as a tuned platform does)"),
    Overhead("storage_gbps", 2.5, "GB/s per device",
             "assumed: a node's local NVMe read shared by its 8 devices (~20-25 GB/s for a DGX H100's RAID); vLLM "
             "issue #20264 logs 3.4 GiB loaded in 0.69 s (5.3 GB/s) by a single device alone",
             "weights read at a cold start"),
    Overhead("net_eff", 0.8, "fraction of NIC line rate",
             "assumed NCCL efficiency; with one sender rank per broadcast (OpenRLHF/verl send each gathered "
             "tensor from rank 0), a cross-node weight sync runs through ONE NIC: 70B bf16 over a 400 Gb/s NIC "
             "at 0.8 = 3.5 s (the former model used all 8 NICs of a node: 0.38 s); cross-check " + _PR116,
             "weight sync across nodes (learner -> decode function) and KV transfer (prefill -> decode)"),
    Overhead("kv_rebuild_s", 1.0, "s per step",
             "assumed (no public measurement found): verl's free_cache_engine frees vLLM's KV cache after each "
             "rollout and re-allocates and re-initialises it before the next; it also forces eager mode "
             "(verl issue #995: 'disable CUDA graph (enforce_eager = False) if free cache engine')",
             "paper verl, kv=rebuild: KV cache freed and rebuilt each step (verl before vLLM sleep mode)"),
    Overhead("eager_layer_s", 60e-6, "s per layer per decode iteration",
             "assumed: ~12 kernel launches per transformer layer at ~5 us of CPU launch each without CUDA graphs "
             "(PyTorch blog 'Accelerating PyTorch with CUDA Graphs'); an iteration takes max(GPU time, launch "
             "time); NeMo-RL PR #498 measured ~3% generation throughput from CUDA graphs on Llama-8B",
             "paper verl, cuda_graphs=false: eager decode (enforce_eager True)"),
    Overhead("hybrid_comm_init_s", 2.0, "s per join",
             "NCCL issue #534 (github.com/NVIDIA/nccl/issues/534): 8 communicators of 8 ranks created in 16.3 s "
             "(2.0 s each; V100, InfiniBand); NCCL issue #587 measured 4.5 s for the first all-reduce of a new "
             "8-GPU group (topology detection), so 2.0 s is the lower of the two",
             "hybrid functions: the learner's data-parallel communicator rebuilt when a released decode function "
             "joins it (0 = not charged)"),
    Overhead(None, OPTIM_BYTES_PER_PARAM, "bytes per parameter",
             "ZeRO (Rajbhandari et al., SC'20), Section 3.1: mixed-precision Adam keeps K = 12 bytes per parameter "
             "(fp32 master weights, momentum, variance)",
             "hybrid functions: optimizer state a joining block receives (its share over every device's NIC; "
             "switch `hybrid_optimizer_move`)"),
    Overhead("billing.granularity_s", PAPER_PLATFORM.granularity_s, "s",
             "the paper's platform text ('rounded up to 1 s'; PAPER.md)", "billing granularity"),
    Overhead("billing.keep_alive_s", PAPER_PLATFORM.keep_alive_s, "s",
             "the paper's platform text ('a few seconds of idle'; 2 s assumed; PAPER.md)", "billed keep-alive"),
    Overhead("host_gbps", 25.0, "GB/s per device, host <-> device",
             "assumed effective pinned PCIe copy rate of one device (PCIe Gen4 x16: 32 GB/s nominal one way, Gen5 "
             "64); cross-check: the vLLM blog 'Zero-Reload Model Switching with vLLM Sleep Mode' (2025-10-26) "
             "reports level-1 wake-ups of 0.1-6 s for 0.6B-235B models, consistent with ~20 GB/s per device "
             "(not re-derived)", "paper verl, kv=sleep: the weights offloaded and restored around each rollout"),
    Overhead(None, 2, "TP degree (smallest that fits when 2 does not)", f"{_VERL_YAML}; {_VERL_GRPO}",
             "paper verl, tp=2 (the yaml, verl's small-model examples): rollout tensor parallelism up to 13B"),
    Overhead(None, 8, "TP degree", _VERL_70B,
             "paper verl, its 70B practice: rollout tensor parallelism from 30B parameters on"),
    Overhead(None, 0.6, "fraction of device memory", _VERL_GRPO + " (the yaml default is 0.5)",
             "paper verl: vLLM gpu_memory_utilization"),
    Overhead(None, 1, "CUDA graphs on (enforce_eager False)", _VERL_VLLM08,
             "paper verl, cuda_graphs=true: decode as verl's vLLM 0.8 guidance sets it"),
    Overhead(None, 1, "sleep level 1 per step (weights offloaded to the host and restored, KV discarded)",
             _VERL_SLEEP, "paper verl, kv=sleep: the KV cache freed between rollouts as verl 0.3 does it with "
             "vLLM >= 0.7 (kv=rebuild: the older free_cache_engine rebuild, `kv_rebuild_s`)"),
    Overhead(None, 4, "optimizer steps per batch", _VERL_YAML + ": 1024 / 256",
             "learner=parity (both systems): mini-batch updates per step"),
    Overhead(None, 1, "extra actor forward per token", "verl ray_trainer (v0.3): compute_log_prob recomputes the "
             "old log-probs with the actor before the update, every step",
             "learner=parity (both systems): old-log-prob recomputation"),
    Overhead(None, 1, "full model per device", _PR116 + ": 0.55 s for 15 GB over PCIe Gen4 is the whole model "
             "through each device's link (an all-gather of every FSDP shard), not only its TP shard",
             "paper verl, reshard=full: resharding time = model bytes / intra-node link"),
)}

PAPER_VERL_TP = 2
PAPER_VERL_TP_LARGE = 8
LARGE_MODEL_PARAMS = 30e9
"""verl's examples run models from this size on at PAPER_VERL_TP_LARGE (its 70B practice), smaller ones at 2."""
PAPER_VERL_MEM_FRAC = 0.6
PAPER_VERL_MINIBATCHES = 4
DEFAULT = {k: o.value for k, o in OVERHEADS.items() if o.key and "." not in o.key}
"""SimConfig defaults of the overridable constants (billing ones live in `BillingRules`)."""


def markdown_table() -> str:
    """The table docs/overheads.md carries (a test keeps the two equal)."""
    rows = ["| constant | value | unit | what | source |", "|---|---|---|---|---|"]
    for o in OVERHEADS.values():
        key = f"`{o.key}`" if o.key else "(paper verl setting)"
        rows.append(f"| {key} | {o.value:g} | {o.unit} | {o.what} | {o.source} |")
    return "\n".join(rows)
