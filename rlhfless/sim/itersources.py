"""Two sources for one engine iteration: the simulator's whole-iteration fit against Vidur's per-kernel profiles.

Source A is `PerfModel.decode_iter_s` / `prefill_s`: the roofline whose matmul efficiencies are fitted to Vidur's
matmuls and whose per-iteration overhead and all-reduce latency are fitted to vLLM's measured whole iterations
(`perf.ITERATION_MEASUREMENTS`, batch 1-7). Source B is Vidur's own accounting of an iteration
(vidur/entities/execution_time.py at 7d47513): per layer, the measured kernels of `LAYER_OPS`, the attention and
two TP all-reduces, times the layers; no embedding, no LM head, and no CPU overhead (Vidur's default
`skip_cpu_overhead_modeling=True`). This module sums B from the profiles in ../shared (read, never copied) and
sets it beside A term by term, so the gap is named. Pure functions; the table is `benchmarks/bench_iteration_
sources.py` and docs/reproduction.md.

What B cannot measure here, stated in every row: Vidur's attention tables are not in the public data (the
attention term of B is A's modelled KV read or prefill FLOPs, the same number on both sides), and the A40 has no
network profile (its all-reduces, if any, are A's model).

Deviations from the paper: the paper runs Vidur itself (kernels only); the simulator follows A by default and B
as `iteration=kernels` (`perf.ITERATION_SOURCES`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError
from rlhfless.sim import hardware as hw
from rlhfless.sim.perf import FITTED, PerfModel, iteration_efficiency

LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
"""Vidur's per-layer operators in its block time (`ExecutionTime._get_block_execution_time`: `add` once)."""
MATMUL_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
PROFILED = {"h100": ("Llama-2-7b-hf", "Llama-2-70b-hf", "Qwen-72B"), "a100": ("Llama-2-7b-hf", "Llama-2-70b-hf",
            "Qwen-72B"), "a40": ("Llama-2-7b-hf", "Qwen-72B")}
"""The (GPU, model) pairs of ../shared/data/vidur-profiles/compute (its README)."""
SHAPE_OF = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-70b", "Qwen-72B": "qwen-72b"}
ORG_OF = {"Llama-2-7b-hf": "meta-llama", "Llama-2-70b-hf": "meta-llama", "Qwen-72B": "Qwen"}
DEVICE_OF = {"h100": "H100", "a100": "A100-80G", "a40": "A40"}
NETWORK_OF = {"h100": "h100_dgx", "a100": "a100_dgx"}
TP_OF = {"Llama-2-7b-hf": 1, "Llama-2-70b-hf": 8, "Qwen-72B": 8}
"""Each model's TP in the table: 1 for 7B, the paper's TP 8 for the 70B class."""


@dataclass(frozen=True)
class Point:
    """One iteration: `kind` decode (tokens = running sequences, each with `context` tokens of KV) or prefill
    (tokens = one prompt's tokens, context = mean attended keys, tokens / 2)."""

    kind: str
    tokens: int
    context: float

    @property
    def label(self) -> str:
        return f"decode b={self.tokens} ctx={self.context:.0f}" if self.kind == "decode" else \
            f"prefill {self.tokens} tokens"


POINTS = (Point("decode", 1, 1024.0), Point("decode", 64, 1024.0), Point("decode", 256, 1024.0),
          Point("prefill", 2048, 1024.0))
"""The issue's points: decode at batch 1, 64, 256 (1,024 tokens of context each: a GSM8K prompt plus a long
response; assumed) and one 2,048-token prefill."""


def read_layer_ops(path: str | Path) -> dict[tuple[int, int], dict[str, float]]:
    """Vidur's mlp.csv as {(tp, num_tokens): {op: seconds}}: each op's median, repeats of one (tp, num_tokens)
    averaged (the files hold two rows at 2,048 and 4,096 tokens), milliseconds -> seconds; plus the shape under
    "shape" keys (n_embd, n_head, n_kv_head, n_expanded_embd). Missing file or column: DataError naming it."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no Vidur mlp.csv profile")
    acc: dict[tuple[int, int], list[dict[str, float]]] = {}
    with p.open(newline="") as fh:
        for r in csv.DictReader(fh):
            try:
                key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
                row = {op: float(r[f"time_stats.{op}.median"]) * 1e-3 for op in (*LAYER_OPS, "emb")}
                row.update({k: float(r[k]) for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd")})
            except (KeyError, ValueError) as exc:
                raise DataError(f"{p}: not a Vidur mlp.csv row ({exc})") from None
            acc.setdefault(key, []).append(row)
    return {k: {op: float(np.mean([r[op] for r in rs])) for op in rs[0]} for k, rs in acc.items()}


def read_allreduce_curve(path: str | Path, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Vidur's all_reduce.csv within one node of `workers` devices: (message bytes ascending, median seconds);
    fp16 elements x 2 bytes, repeats of a size averaged. Missing file or no such rows: DataError."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no Vidur all-reduce profile")
    by: dict[float, list[float]] = {}
    with p.open(newline="") as fh:
        for r in csv.DictReader(fh):
            if int(r["num_workers"]) == workers and int(r["devices_per_node"]) == workers:
                by.setdefault(2.0 * float(r["size"]), []).append(float(r["time_stats.all_reduce.median"]) * 1e-3)
    if not by:
        raise DataError(f"{p}: no all-reduce rows for {workers} workers in one node")
    sizes = np.array(sorted(by))
    return sizes, np.array([np.mean(by[s]) for s in sizes])


@dataclass(frozen=True)
class KernelSum:
    """Source B for one iteration (seconds): `layers` x (`layer_s` + the all-reduces) + `attention_s`.

    layer_s: one layer's measured kernels (`LAYER_OPS`), of which `matmul_s` are the four matmuls.
    allreduce_s: the iteration's 2 x layers all-reduces (0 at TP 1); allreduce_source: "vidur" or "model".
    attention_s: the iteration's attention, A's model (Vidur's tables are missing). emb_s: the measured embedding
    lookup, once per iteration; listed, not summed (Vidur does not count it)."""

    layers: int
    layer_s: float
    matmul_s: float
    allreduce_s: float
    allreduce_source: str
    attention_s: float
    emb_s: float

    @property
    def total_s(self) -> float:
        return self.layers * self.layer_s + self.allreduce_s + self.attention_s


@dataclass(frozen=True)
class ModelTerms:
    """Source A for one iteration (seconds): its terms and their sum `whole_s` (= `decode_iter_s` / `prefill_s`).
    matmul_s: layers x the four matmuls; head_s: the LM head (decode only); overhead_s: the per-iteration host
    overhead (decode only)."""

    matmul_s: float
    allreduce_s: float
    attention_s: float
    head_s: float
    overhead_s: float
    whole_s: float

    @property
    def kernels_s(self) -> float:
        """The GPU part: everything but the host overhead."""
        return self.whole_s - self.overhead_s


def model_terms(pm: PerfModel, pt: Point) -> ModelTerms:
    """Source A's terms at `pt`, from the same methods the simulator schedules with."""
    n, layers = float(pt.tokens), pm.model.layers
    mm = layers * float(pm.matmul_s(n))
    ar = pm.allreduce_s(n)
    if pt.kind == "decode":
        attn, head = float(pm.decode_attention_s(n, pt.context)), float(pm.lm_head_s(n))
        return ModelTerms(mm, ar, attn, head, pm.eff.iter_overhead_s, float(pm.decode_iter_s(n, pt.context)))
    return ModelTerms(mm, ar, pm.prefill_attention_s(n, pt.context), 0.0, 0.0, pm.prefill_s(n, pt.context))


def kernel_sum(ops: dict[str, float], pm: PerfModel, pt: Point,
               allreduce: tuple[np.ndarray, np.ndarray] | None) -> KernelSum:
    """Source B at `pt` from one (tp, num_tokens) row of `read_layer_ops`; `allreduce`: the node's
    `read_allreduce_curve` for pm.tp workers (linear between its sizes), None = A's all-reduce model (no profile)."""
    layers, n = pm.model.layers, float(pt.tokens)
    mine = model_terms(pm, pt)
    if pm.tp == 1:
        ar, src = 0.0, "none"
    elif allreduce is None:
        ar, src = mine.allreduce_s, "model"
    else:
        msg = n * pm.model.hidden * 2.0  # one token's hidden state in fp16 per all-reduce, as Vidur sizes it
        ar, src = 2 * layers * float(np.interp(msg, allreduce[0], allreduce[1])), "vidur"
    return KernelSum(layers, sum(ops[o] for o in LAYER_OPS), sum(ops[o] for o in MATMUL_OPS), ar, src,
                     mine.attention_s, ops["emb"])


@dataclass(frozen=True)
class Row:
    """One (GPU, model, TP, point) of the comparison: source A's terms beside source B's, and A under
    `iteration=kernels` (`a_kernels`: A's roofline with Vidur's accounting, what the switch simulates)."""

    gpu: str
    model: str
    tp: int
    point: Point
    a: ModelTerms
    b: KernelSum
    a_kernels: ModelTerms

    @property
    def ratio(self) -> float:
        """A's whole iteration over B's kernel sum."""
        return self.a.whole_s / self.b.total_s

    def gap_terms(self) -> dict[str, float]:
        """A - B (seconds) split into the terms that make it; they sum to a.whole_s - b.total_s exactly:
        host (A's per-iteration overhead), head (A's LM head: Vidur does not count it), matmul (A's four matmuls
        minus B's measured ones), elementwise (minus B's norms, RoPE, activation, add: A has none),
        allreduce (A's in-graph all-reduces minus B's NCCL ones). The attention is the same term on both sides."""
        b = self.b
        return {"host": self.a.overhead_s, "head": self.a.head_s, "matmul": self.a.matmul_s - b.layers * b.matmul_s,
                "elementwise": -b.layers * (b.layer_s - b.matmul_s), "allreduce": self.a.allreduce_s - b.allreduce_s}


def perf_for(gpu: str, vidur_model: str, tp: int) -> PerfModel:
    """The simulator's PerfModel of a profiled (GPU, model) at `tp`, with the fitted efficiency (memory
    unbounded: the table compares times, not whether the weights fit)."""
    dev = replace(hw.device(DEVICE_OF[gpu]), mem_bytes=1e15)
    return PerfModel(dev, hw.model(SHAPE_OF[vidur_model]), tp, FITTED[DEVICE_OF[gpu]])


def check_shape(ops: dict[str, float], pm: PerfModel, where: str) -> None:
    """The profile's shape columns must be the catalog shape's: else the comparison compares two models."""
    m = pm.model
    want = {"n_embd": m.hidden, "n_head": m.heads, "n_kv_head": m.kv_heads, "n_expanded_embd": m.intermediate}
    bad = {k: (ops[k], v) for k, v in want.items() if int(ops[k]) != v}
    if bad:
        raise DataError(f"{where}: profile shape differs from {m.name}: {bad}")


def compare(root: str | Path, gpu: str, vidur_model: str, tp: int, points=POINTS) -> list[Row]:
    """Rows of one profiled (GPU, model) at `tp`, one per point. Missing profile: DataError naming it."""
    root = Path(root)
    path = root / "compute" / gpu / ORG_OF[vidur_model] / vidur_model / "mlp.csv"
    prof, pm = read_layer_ops(path), perf_for(gpu, vidur_model, tp)
    curve = None
    if tp > 1 and gpu in NETWORK_OF:
        curve = read_allreduce_curve(root / "network" / NETWORK_OF[gpu] / "all_reduce.csv", tp)
    out = []
    for pt in points:
        if (tp, pt.tokens) not in prof:
            raise DataError(f"{path}: no row at tp={tp}, num_tokens={pt.tokens}")
        ops = prof[(tp, pt.tokens)]
        check_shape(ops, pm, str(path))
        kern = replace(pm, eff=iteration_efficiency(pm.eff, "kernels"))
        out.append(Row(gpu, SHAPE_OF[vidur_model], tp, pt, model_terms(pm, pt), kernel_sum(ops, pm, pt, curve),
                       model_terms(kern, pt)))
    return out


def compare_all(root: str | Path, points=POINTS) -> list[Row]:
    """Every profiled (GPU, model) at its `TP_OF`, every point."""
    return [r for gpu, models in PROFILED.items() for vm in models for r in compare(root, gpu, vm, TP_OF[vm], points)]


def table(rows: list[Row]) -> str:
    """The rows as a fixed-width text table in milliseconds: A (whole iteration), B (kernel sum), A/B, A/B
    without the attention both share, A under `iteration=kernels` over B, then A - B split (`Row.gap_terms`).
    An all-reduce marked * is A's model on both sides (no network profile for that GPU)."""
    head = (f"{'gpu':5s} {'model':10s} {'tp':>2s} {'point':24s} {'A':>8s} {'B':>8s} {'A/B':>6s} {'-attn':>6s} "
            f"{'Akern/B':>7s} | {'host':>6s} {'head':>6s} {'matmul':>7s} {'elem':>7s} {'allred':>8s}")
    lines = [head]
    for r in rows:
        g, attn = r.gap_terms(), r.a.attention_s
        star = "*" if r.b.allreduce_source == "model" else " "
        lines.append(
            f"{r.gpu:5s} {r.model:10s} {r.tp:2d} {r.point.label:24s} {r.a.whole_s * 1e3:8.3f} {r.b.total_s * 1e3:8.3f}"
            f" {r.ratio:6.3f} {(r.a.whole_s - attn) / (r.b.total_s - attn):6.3f} "
            f"{r.a_kernels.whole_s / r.b.total_s:7.3f} | {g['host'] * 1e3:6.3f} {g['head'] * 1e3:6.3f} "
            f"{g['matmul'] * 1e3:7.3f} {g['elementwise'] * 1e3:7.3f} {g['allreduce'] * 1e3:7.3f}{star}")
    return "\n".join(lines)
