"""Roofline performance model: published shapes, hand-computed rooflines, fit to measured profiles."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rlhfless.core.errors import ConfigError
from rlhfless.sim import hardware as hw
from rlhfless.sim.calibrate import VIDUR_GPUS, fit_cpu_decode, read_vidur, vidur_errors
from rlhfless.sim.perf import FITTED, Efficiency, PerfModel, smallest_tp

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the checkout; a git worktree sits one level deeper
VIDUR = next((p / "shared/data/vidur-profiles" for p in (REPO.parent, REPO.parent.parent)
              if (p / "shared/data/vidur-profiles").is_dir()), REPO.parent / "shared/data/vidur-profiles")


@pytest.mark.parametrize("name, billions", [("qwen2.5-3b", 3.09), ("qwen2.5-7b", 7.62), ("qwen2.5-14b", 14.77),
                                            ("qwen2.5-32b", 32.76), ("llama-70b", 68.98)])
def test_parameter_counts_match_the_published_sizes(name, billions):
    # published: Qwen2.5 model cards 3.09B / 7.61B / 14.7B / 32.5B (norms and biases excluded here), Llama-2 69B
    assert hw.model(name).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_tiny_model_is_read_from_the_shipped_checkpoint():
    m = hw.model("tiny")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.vocab, m.bytes_per_param) == (2, 128, 4, 2, 259, 4)
    assert m.params == pytest.approx(524_672)


def test_decode_at_batch_one_is_weight_bandwidth_plus_overheads_by_hand():
    dev, m = hw.device("H100"), hw.model("llama-70b")
    eff = Efficiency(0.5, 0.8, 1e-5, iter_overhead_s=0.002, allreduce_latency_s=2e-5)
    pm = PerfModel(dev, m, 8, eff)
    # per layer: 4 matmuls; at n=1 each is memory bound: 2 bytes x (K N / 8 + K + N/8); overhead 1e-5 each
    dims = [(8192, 80 * 128 // 8), (64 * 128 // 8, 8192), (8192, 2 * 28672 // 8), (28672 // 8, 8192)]
    mm = sum(2 * (k * n + k + n) / (3.35e12 * 0.8) + 1e-5 for k, n in dims)
    ar = 2 * (2e-5 + 2 * 7 / 8 * 8192 * 2 / 450e9)
    kv = 1000 * m.kv_bytes_per_token / 8 / (3.35e12 * 0.8)
    head = 2 * 8192 * 32000 / 8 / (989e12 * 0.5)
    assert pm.decode_iter_s(1, 1000.0) == pytest.approx(80 * (mm + ar) + kv + head + 0.002, rel=1e-9)
    assert pm.decode_iter_s(0, 1000.0) == 0.0


def test_decode_grows_with_batch_and_context_and_the_time_model_follows():
    pm = PerfModel(hw.device("L40S"), hw.model("qwen2.5-7b"), 1, FITTED["L40S"])
    b = np.arange(1, 600)
    t = pm.decode_iter_s(b, 500.0)
    assert np.all(np.diff(t) > 0) and pm.decode_iter_s(64, 2000.0) > pm.decode_iter_s(64, 500.0)
    tm = pm.time_model(512, 500.0)
    assert tm.iter_seconds(np.array(tm.batch_sizes)) == pytest.approx(pm.decode_iter_s(np.array(tm.batch_sizes),
                                                                                       500.0))
    # per-token cost falls with batch (memory-bound decode amortises the weight read)
    assert t[-1] / b[-1] < t[0] / 5


def test_capacity_training_and_cold_start():
    pm = PerfModel(hw.device("L40S"), hw.model("qwen2.5-3b"), 1, FITTED["L40S"])
    free = 48e9 * 0.9 - pm.weight_bytes_per_device()
    assert pm.kv_capacity(400) == min(1024, int(free // (36864 * 400)))
    assert pm.kv_capacity(40000) < pm.kv_capacity(400)
    # 6 N T / (devices peak mfu) + fixed
    assert pm.train_s(1e6, 16) == pytest.approx(1.0 + 6 * pm.model.params * 1e6 / (16 * 362e12 * 0.35))
    assert pm.cold_start_s() == pytest.approx(2.4 + 13.8 + pm.weight_bytes_per_device() / 2.5e9)
    assert pm.cold_start_s(engine=False) == pytest.approx(pm.cold_start_s() - 13.8)
    assert pm.weight_sync_s(colocated=False) > pm.weight_sync_s(colocated=True)


def test_weight_transfer_goes_through_one_nic_and_paper_resharding_moves_the_whole_model():
    # 70B bf16 on H100 (issue 20): one sender rank broadcasts through one 400 Gb/s NIC at 0.8 of line rate,
    # then each device gets its TP shard over NVLink; the former model used a node's 8 NICs (0.38 s)
    shape, dev = hw.model("llama-70b"), hw.device("H100")
    pm = PerfModel(dev, shape, 8, FITTED["H100"])
    model_bytes = shape.params * 2
    assert pm.weight_sync_s(colocated=False) == pytest.approx(model_bytes / (50e9 * 0.8) + model_bytes / 8 / 450e9)
    assert 3.0 < pm.weight_sync_s(colocated=False) < 4.0
    # tuned verl reshards a device's shard; verl's FSDP -> vLLM path gathers the whole model per device
    assert pm.weight_sync_s(colocated=True) == pytest.approx(model_bytes / 8 / 450e9)
    full = PerfModel(dev, shape, 8, FITTED["H100"], reshard_full=True)
    assert full.weight_sync_s(colocated=True) == pytest.approx(model_bytes / 450e9)
    # cross-check with the public measurement it is sourced on (verl PR #116: Qwen2.5-7B, 8 x L20 PCIe, TP 4:
    # 0.55 s): the same model on L40S (PCIe Gen4) within a factor of 1.5
    q7 = PerfModel(hw.device("L40S"), hw.model("qwen2.5-7b"), 4, FITTED["L40S"], reshard_full=True)
    assert 0.55 / 1.5 < q7.weight_sync_s(colocated=True) < 0.55 * 1.5


def test_eager_decode_is_bounded_by_kernel_launches():
    shape, dev = hw.model("qwen2.5-3b"), hw.device("H100")
    graphs = PerfModel(dev, shape, 1, FITTED["H100"])
    eager = PerfModel(dev, shape, 1, FITTED["H100"], eager_layer_s=1e-3)
    b = np.array([1.0, 64.0])
    assert eager.decode_iter_s(b, 500.0) == pytest.approx(np.maximum(graphs.decode_iter_s(b, 500.0),
                                                                     36 * 1e-3 + FITTED["H100"].iter_overhead_s))
    assert np.all(eager.decode_iter_s(b, 500.0) > graphs.decode_iter_s(b, 500.0))
    assert eager.decode_iter_s(np.array([0.0]), 500.0)[0] == 0.0


def test_models_that_do_not_fit_name_the_field():
    with pytest.raises(ConfigError, match="^model: llama-70b needs"):
        PerfModel(hw.device("L40S"), hw.model("llama-70b"), 1, FITTED["L40S"])
    with pytest.raises(ConfigError, match="^model: llama-70b .* does not fit"):
        smallest_tp(replace(hw.device("L40S"), devices_per_node=2), hw.model("llama-70b"), FITTED["L40S"])
    with pytest.raises(ConfigError, match="^tp:"):
        PerfModel(hw.device("H100"), hw.model("qwen2.5-3b"), 16, FITTED["H100"])
    with pytest.raises(ConfigError, match="^device: unknown"):
        hw.device("TPU")
    with pytest.raises(ConfigError, match="^model: unknown"):
        hw.model("gpt-5")
    assert smallest_tp(hw.device("H100"), hw.model("llama-70b"), FITTED["H100"]) == 4


@pytest.mark.parametrize("gpu", sorted(VIDUR_GPUS))
def test_roofline_is_within_tolerance_of_vidur_measurements(gpu):
    """The fitted constants in perf.FITTED reproduce Vidur's measured matmul times (stated tolerance: median
    |error| <= 10%, 90th percentile <= 25%)."""
    from conftest import require_shared_file

    require_shared_file(VIDUR / "LICENSE")
    rows = read_vidur(VIDUR, gpu)
    err = np.abs(vidur_errors(rows, hw.DEVICES[VIDUR_GPUS[gpu]], FITTED[VIDUR_GPUS[gpu]]))
    assert np.median(err) <= 0.10 and np.quantile(err, 0.9) <= 0.25
    # and a roofline without the fitted efficiencies (peaks reached, no overhead) is far off: the fit matters
    naive = np.abs(vidur_errors(rows, hw.DEVICES[VIDUR_GPUS[gpu]], Efficiency(1.0, 1.0, 0.0)))
    assert np.median(naive) > 2 * np.median(err)


def test_cpu_decode_fit_to_the_engines_tpot_profile():
    pm, fit = fit_cpu_decode(REPO / "data/profiles/tpot_tiny_cpu.json", hw.model("tiny"))
    assert fit["median_abs_rel_err"] <= 0.10 and fit["max_abs_rel_err"] <= 0.20
    assert 1e-4 < fit["iter_overhead_s"] < 1e-2 and pm.decode_iter_s(256, 30) > pm.decode_iter_s(1, 200)


def test_docs_table_of_overheads_is_the_code_table():
    from pathlib import Path

    from rlhfless.sim.overheads import OVERHEADS, markdown_table
    from rlhfless.sim.scenario import SimConfig

    doc = (Path(__file__).resolve().parents[1] / "docs" / "overheads.md").read_text()
    assert markdown_table() in doc
    cfg = SimConfig()
    for o in OVERHEADS.values():  # every keyed constant is a SimConfig default, with the value the docs give
        if o.key and "." not in o.key:
            assert getattr(cfg, o.key) == o.value
        elif o.key:
            section, name = o.key.split(".")
            assert getattr(getattr(cfg, section), name) == o.value
        assert o.source


def test_decode_iteration_is_within_15_percent_of_the_cited_vllm_measurements():
    """perf.ITERATION_MEASUREMENTS (vLLM, Llama-3-8B on one H100 and Llama-3-70B at TP 8; batch 1, 2 and 7):
    refitting the per-iteration overhead and the all-reduce latency gives the shipped defaults, and the model
    with them is within 15% of every cited row; the old assumed constants (3 ms, 10 us) are not."""
    from rlhfless.sim.calibrate import fit_decode_overheads
    from rlhfless.sim.perf import ITERATION_MEASUREMENTS

    over, lat, fit = fit_decode_overheads()
    eff = FITTED["H100"]
    assert over == pytest.approx(eff.iter_overhead_s, rel=0.01) and lat == pytest.approx(eff.allreduce_latency_s,
                                                                                        rel=0.01)
    for dev, name, tp, batch, ctx, measured in ITERATION_MEASUREMENTS:
        pm = PerfModel(hw.device(dev), hw.model(name), tp, FITTED[dev])
        assert float(pm.decode_iter_s(batch, ctx)) == pytest.approx(measured, rel=0.15), (name, tp, batch)
    assert fit["max_abs_rel_err"] <= 0.15
    old = replace(eff, iter_overhead_s=3e-3, allreduce_latency_s=10e-6)
    worst = max(abs(float(PerfModel(hw.device(d), hw.model(n), t, old).decode_iter_s(b, c)) / m - 1)
                for d, n, t, b, c, m in ITERATION_MEASUREMENTS)
    assert worst > 0.15


def test_vidur_allreduce_profile_gives_the_nccl_latency_the_fit_is_compared_with():
    """Vidur's H100 DGX all-reduce (8 GPUs, messages up to 2 MB): 20-40 us per NCCL all-reduce, about 3x the
    latency fitted to vLLM's whole iterations (its own one-shot kernel in the CUDA graph; perf module note)."""
    from conftest import require_shared_file
    from rlhfless.sim.calibrate import fit_allreduce_latency, read_allreduce

    require_shared_file(VIDUR / "network/h100_dgx/all_reduce.csv")
    lat, m = fit_allreduce_latency(read_allreduce(VIDUR, "h100_dgx"), hw.device("H100"), 8, max_bytes=2e6)
    assert 20e-6 <= lat <= 40e-6 and m["rows"] > 100
    assert lat > 2 * FITTED["H100"].allreduce_latency_s


def test_a_measured_tpot_profile_replaces_the_fitted_overhead():
    """`calibrate.efficiency_from_profile`: rows in `rlhfless profile`'s format (batch_size, context, s_per_iter,
    n), measured by a GPU whose engine costs 2.5 ms per iteration more than the roofline, give back that
    overhead, and the perf model built from it reproduces the rows."""
    from rlhfless.sim.calibrate import efficiency_from_profile

    pm = PerfModel(hw.device("H100"), hw.model("qwen2.5-7b"), 1, FITTED["H100"])
    truth = replace(pm, eff=replace(pm.eff, iter_overhead_s=2.5e-3))
    rows = [{"batch_size": b, "context": c, "s_per_iter": float(truth.decode_iter_s(b, c)), "n": 20}
            for b, c in ((1, 200), (8, 300), (64, 400), (256, 600))]
    eff = efficiency_from_profile(rows, pm)
    assert eff.iter_overhead_s == pytest.approx(2.5e-3, rel=1e-6) and "TPOT profile" in eff.source
    fitted = replace(pm, eff=eff)
    for r in rows:
        assert float(fitted.decode_iter_s(r["batch_size"], r["context"])) == pytest.approx(r["s_per_iter"])


LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


@pytest.mark.parametrize("gpu, vidur_model, shape, tp", [("h100", "Llama-2-7b-hf", "llama-2-7b", 1),
                                                         ("h100", "Llama-2-70b-hf", "llama-70b", 8),
                                                         ("a100", "Llama-2-7b-hf", "llama-2-7b", 1),
                                                         ("a100", "Llama-2-70b-hf", "llama-70b", 8)])
def test_layer_time_at_batch_64_and_2048_tokens_is_within_15_percent_of_vidurs_measured_layer(gpu, vidur_model,
                                                                                               shape, tp):
    """Issue 31 item 4 at batch 64 (a decode iteration's tokens) and 2,048 tokens (a prefill): Vidur's measured
    CUDA time of every operator of one layer (norms, QKV, RoPE, output projection, gate+up, activation, down,
    residual add; median of its repeats) against the model's layer time (its four matmuls; the elementwise
    operators are not modelled and are what the matmul fit's slack covers). No whole-engine vLLM measurement at
    these sizes was found clean enough to cite (docs/overheads.md lists what was tried and why not)."""
    import csv

    from conftest import require_shared_file

    path = require_shared_file(VIDUR / f"compute/{gpu}/meta-llama/{vidur_model}/mlp.csv")
    rows = list(csv.DictReader(path.open()))
    dev = VIDUR_GPUS[gpu]
    pm = PerfModel(hw.device(dev), hw.model(shape), tp, FITTED[dev])
    for n in (64, 2048):
        row = next(r for r in rows if int(r["num_tokens"]) == n and int(r["num_tensor_parallel_workers"]) == tp)
        measured = sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPS) * 1e-3  # ms -> s
        assert float(pm.matmul_s(n)) == pytest.approx(measured, rel=0.15), (gpu, shape, tp, n)
    # the matmuls alone are a large part of the layer but not all of it: the check compares like with like
    assert float(pm.matmul_s(2048)) > 0.5 * measured


def test_the_h100_fitted_overhead_holds_on_a100_whole_iterations_held_out_of_the_fit():
    """perf.HELD_OUT_MEASUREMENTS (vLLM, Llama-3-8B on one A100, batch 1 and 7; not in the fit): the decode model
    with the H100-fitted overhead is within 15% of each (the overhead is host-side, so it transfers across GPU
    kinds; the H200 relies on that); without the overhead it is not."""
    from rlhfless.sim.perf import HELD_OUT_MEASUREMENTS

    for dev, name, tp, batch, ctx, measured in HELD_OUT_MEASUREMENTS:
        pm = PerfModel(hw.device(dev), hw.model(name), tp, FITTED[dev])
        assert float(pm.decode_iter_s(batch, ctx)) == pytest.approx(measured, rel=0.15), (dev, batch)
        bare = replace(pm, eff=replace(pm.eff, iter_overhead_s=0.0))
        assert float(bare.decode_iter_s(batch, ctx)) < 0.9 * measured
    assert FITTED["H200"].iter_overhead_s == FITTED["H100"].iter_overhead_s
    assert hw.device("H200").mem_bw == 4.8e12 and hw.device("H200").mem_bw > hw.device("H100").mem_bw
