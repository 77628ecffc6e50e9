"""Calibration: fit the roofline's efficiency factors to measured profiles, and report how far it is off.

`fit_vidur(root, gpu)` fits (compute_eff, mem_eff, op_overhead_s) to Vidur's public per-operator GPU timings (read
from ../shared, never copied); `fit_cpu_decode(profile, shape)` fits a CPU core to this machine's TPOT profile;
`fit_cpu_train(rows)` fits a real run's update seconds. The rule it keeps: pure functions returning (result,
metrics), the fit's errors in the metrics. Details: docs/internals.md#simcalibratepy.

Deviations from the paper: the paper runs Vidur itself; we fit a roofline to the same measurements.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError
from rlhfless.sim.hardware import DEVICES, DeviceSpec, ModelShape
from rlhfless.sim.perf import Efficiency, PerfModel

VIDUR_GPUS = {"h100": "H100", "a100": "A100-80G", "a40": "A40"}
_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def read_vidur(root: str | Path, gpu: str) -> list[dict]:
    """Rows of every model profiled on `gpu`: num_tokens n, tp, shape (h, heads, kv, I) and the summed median
    milliseconds of the four matmuls. Missing folder: DataError naming it."""
    import pandas as pd

    base = Path(root) / "compute" / gpu
    files = sorted(base.glob("*/*/mlp.csv"))
    if not files:
        raise DataError(f"{base}: no Vidur mlp.csv profiles (expected compute/{gpu}/<org>/<model>/mlp.csv)")
    out = []
    for f in files:
        d = pd.read_csv(f)
        ms = sum(d[f"time_stats.{op}.median"] for op in _OPS)
        for r, t in zip(d.itertuples(index=False), ms):
            out.append({"model": f.parent.name, "n": int(r.num_tokens), "tp": int(r.num_tensor_parallel_workers),
                        "h": int(r.n_embd), "heads": int(r.n_head), "kv": int(r.n_kv_head),
                        "inter": int(r.n_expanded_embd), "ms": float(t)})
    return out


def _predict(rows: list[dict], dev: DeviceSpec, eff: Efficiency) -> np.ndarray:
    """Roofline seconds of each row's four matmuls (the same `PerfModel.matmul_s` the simulator uses)."""
    out = np.empty(len(rows))
    cache: dict[tuple, PerfModel] = {}
    for i, r in enumerate(rows):
        key = (r["h"], r["heads"], r["kv"], r["inter"], r["tp"])
        if key not in cache:
            shape = ModelShape("vidur", 1, r["h"], r["heads"], r["kv"], r["h"] // r["heads"], r["inter"], 32000,
                               False)
            cache[key] = PerfModel(replace(dev, mem_bytes=1e15), shape, r["tp"], eff)
        out[i] = cache[key].matmul_s(float(r["n"]))
    return out


def vidur_errors(rows: list[dict], dev: DeviceSpec, eff: Efficiency) -> np.ndarray:
    """Relative error (predicted / measured - 1) of each row."""
    return _predict(rows, dev, eff) / (np.array([r["ms"] for r in rows]) * 1e-3) - 1.0


def fit_vidur(root: str | Path, gpu: str, stride: int = 4) -> tuple[Efficiency, dict[str, float]]:
    """Least-squares fit of (compute_eff, mem_eff, op_overhead_s) on log time; every `stride`-th row (the rows
    are dense in num_tokens) keeps it to about a second. Returns (efficiency, metrics of the fit on all rows)."""
    from scipy.optimize import least_squares

    if gpu not in VIDUR_GPUS:
        raise DataError(f"gpu: Vidur profiles exist for {list(VIDUR_GPUS)} (got {gpu!r})")
    rows = read_vidur(root, gpu)
    dev = DEVICES[VIDUR_GPUS[gpu]]
    sub = rows[::stride]
    meas = np.log(np.array([r["ms"] for r in sub]) * 1e-3)

    def resid(x):
        ce, me, ov = 1 / (1 + np.exp(-x[0])), 1 / (1 + np.exp(-x[1])), np.exp(x[2])
        return np.log(_predict(sub, dev, Efficiency(ce, me, ov))) - meas

    fit = least_squares(resid, x0=[1.0, 1.0, np.log(5e-6)], method="lm")
    ce, me, ov = 1 / (1 + np.exp(-fit.x[0])), 1 / (1 + np.exp(-fit.x[1])), float(np.exp(fit.x[2]))
    eff = Efficiency(round(float(ce), 3), round(float(me), 3), float(f"{ov:.3g}"), source=f"fit_vidur {gpu}")
    err = np.abs(vidur_errors(rows, dev, eff))
    return eff, {"rows": float(len(rows)), "median_abs_rel_err": float(np.median(err)),
                 "p90_abs_rel_err": float(np.quantile(err, 0.9)), "max_abs_rel_err": float(err.max())}


# ---- this machine's CPU ------------------------------------------------------------------------------
def read_tpot(path: str | Path) -> list[dict]:
    """Rows of the engine's TPOT profile (batch_size, context, s_per_iter), via the planner's checked reader."""
    from rlhfless.plan.timemodel import check_profile_rows

    p = Path(path)
    if not p.is_file():
        raise DataError(f"TPOT profile not found: {p}")
    obj = json.loads(p.read_text())
    return check_profile_rows(obj["rows"] if isinstance(obj, dict) else obj, str(p))


def cpu_decode_model(shape: ModelShape, flops: float, bw: float, overhead_s: float) -> PerfModel:
    """A one-core PerfModel whose effective FLOP/s, bytes/s and per-iteration overhead are the given ones."""
    dev = replace(DEVICES["cpu-core"], peak_flops=flops, mem_bw=bw)
    eff = Efficiency(1.0, 1.0, 0.0, iter_overhead_s=overhead_s, allreduce_latency_s=0.0, kv_mem_frac=0.5,
                     max_num_seqs=4096, source="fit_cpu_decode")
    return PerfModel(dev, shape, 1, eff, container_start_s=0.0, engine_init_s=0.0)


def fit_cpu_decode(profile: str | Path, shape: ModelShape) -> tuple[PerfModel, dict[str, float]]:
    """Fit effective FLOP/s, bytes/s and per-iteration overhead of one core to the TPOT profile (log least
    squares, each row weighted by its iterations measured). Returns (perf model, fit metrics)."""
    from scipy.optimize import least_squares

    rows = read_tpot(profile)
    b = np.array([r["batch_size"] for r in rows], float)
    c = np.array([float(r.get("context") or 0) for r in rows])
    y = np.array([r["s_per_iter"] for r in rows])
    w = np.sqrt(np.array([r.get("n", 1) for r in rows], float))

    def model_for(x):
        return cpu_decode_model(shape, np.exp(x[0]), np.exp(x[1]), np.exp(x[2]))

    def predict(pm):
        return np.array([pm.decode_iter_s(bi, ci) for bi, ci in zip(b, c)], dtype=float)

    # bounds keep the fit physical: a core does 0.1-1000 GFLOP/s and moves 0.1-100 GB/s
    fit = least_squares(lambda x: w * (np.log(predict(model_for(x))) - np.log(y)),
                        x0=[np.log(10e9), np.log(10e9), np.log(1e-3)],
                        bounds=([np.log(1e8), np.log(1e8), np.log(1e-6)], [np.log(1e12), np.log(1e11), 0.0]))
    pm = model_for(fit.x)
    err = predict(pm) / y - 1
    return pm, {"flops": float(np.exp(fit.x[0])), "bytes_per_s": float(np.exp(fit.x[1])),
                "iter_overhead_s": float(np.exp(fit.x[2])), "max_abs_rel_err": float(np.abs(err).max()),
                "median_abs_rel_err": float(np.median(np.abs(err)))}


def fit_linear(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(intercept, slope, median |relative error|) of y ~ a + b x by least squares, a and b >= 0."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    A = np.stack([np.ones_like(x), x], axis=1)
    a, b = np.linalg.lstsq(A, y, rcond=None)[0]
    if a < 0:
        a, b = 0.0, float((x @ y) / max(x @ x, 1e-30))
    if b < 0:
        a, b = float(y.mean()), 0.0
    pred = a + b * x
    return float(a), float(b), float(np.median(np.abs(pred / np.maximum(y, 1e-12) - 1)))


# ---- collectives and the per-iteration overhead -------------------------------------------------------
def read_allreduce(root: str | Path, cluster: str = "h100_dgx") -> list[dict]:
    """Vidur's measured all-reduce times (`network/<cluster>/all_reduce.csv`): workers, message bytes (fp16
    elements x 2), median seconds, within one node. Missing file: DataError naming it."""
    import pandas as pd

    path = Path(root) / "network" / cluster / "all_reduce.csv"
    if not path.is_file():
        raise DataError(f"{path}: no Vidur all-reduce profile")
    d = pd.read_csv(path)
    d = d[d.num_workers == d.devices_per_node]
    return [{"workers": int(w), "bytes": 2.0 * float(s), "s": float(t) * 1e-3}
            for w, s, t in zip(d.num_workers, d["size"], d["time_stats.all_reduce.median"])]


def fit_allreduce_latency(rows: list[dict], dev: DeviceSpec, workers: int,
                          max_bytes: float = 32e6) -> tuple[float, dict[str, float]]:
    """The latency term of `PerfModel._allreduce_s` (seconds per all-reduce) on `workers` devices: the median of
    measured time minus the model's bandwidth term 2 (w-1)/w x bytes / link_bw, over messages up to `max_bytes`
    (a decode all-reduce is batch x hidden x 2 bytes: 16 KB-16 MB for a 70B model at batch 1-1,024). The median,
    not a least-squares intercept: small messages scatter 2x between repetitions (Vidur's min vs median)."""
    sel = [r for r in rows if r["workers"] == workers and r["bytes"] <= max_bytes]
    if not sel:
        raise DataError(f"all-reduce profile: no rows for {workers} workers up to {max_bytes:.3g} bytes")
    bw = np.array([2.0 * (workers - 1) / workers * r["bytes"] / dev.link_bw for r in sel])
    lat = np.array([r["s"] for r in sel]) - bw
    return float(np.median(lat)), {"rows": float(len(sel)), "p10_s": float(np.quantile(lat, 0.1)),
                                   "p90_s": float(np.quantile(lat, 0.9))}


def fit_iter_overhead(rows: list[dict], pm: PerfModel) -> tuple[float, dict[str, float]]:
    """The per-iteration engine overhead that makes `pm.decode_iter_s` match measured iterations: rows of a
    TPOT profile (`batch_size`, `context`, `s_per_iter`, optional `n`: the format `rlhfless profile` and
    `rollout.tpot` write, or the cited whole-iteration measurements of `perf.ITERATION_MEASUREMENTS`); the
    n-weighted mean of (measured - modelled without overhead), clipped at 0. Returns (seconds, metrics: the
    relative error of each row after the fit, worst and median)."""
    if not rows:
        raise DataError("fit_iter_overhead: no measured iterations")
    bare = replace(pm, eff=replace(pm.eff, iter_overhead_s=0.0))
    model = np.array([float(bare.decode_iter_s(r["batch_size"], float(r.get("context") or 0))) for r in rows])
    meas = np.array([r["s_per_iter"] for r in rows], float)
    w = np.array([r.get("n", 1) for r in rows], float)
    over = max(float(np.sum(w * (meas - model)) / np.sum(w)), 0.0)
    err = (model + over) / meas - 1.0
    return over, {"max_abs_rel_err": float(np.abs(err).max()), "median_abs_rel_err": float(np.median(np.abs(err)))}


def efficiency_from_profile(rows: list[dict], pm: PerfModel) -> Efficiency:
    """`pm`'s efficiency with the per-iteration overhead fitted to a GPU's measured TPOT profile (`rlhfless
    profile` on that GPU): how a measurement replaces the cited fit (docs/overheads.md). The matmul efficiencies
    (Vidur's fit) and the all-reduce latency stay: one model at one TP cannot separate them from the overhead."""
    over, m = fit_iter_overhead(rows, pm)
    return replace(pm.eff, iter_overhead_s=over,
                   source=f"{pm.eff.source}; iter_overhead_s fitted to a TPOT profile "
                          f"(median error {m['median_abs_rel_err']:.1%})")


def fit_decode_overheads(rows=None) -> tuple[float, float, dict[str, float]]:
    """(iter_overhead_s, allreduce_latency_s) fitted to whole-iteration measurements (default: the cited
    `perf.ITERATION_MEASUREMENTS`): the overhead to the TP 1 rows (`fit_iter_overhead`), then the all-reduce
    latency to the TP > 1 rows as their mean gap over 2 x layers all-reduces. Metrics: each row's relative error
    after the fit (`err/<model>/tp<tp>/b<batch>`) and the worst."""
    from rlhfless.sim.hardware import device, model
    from rlhfless.sim.perf import FITTED, ITERATION_MEASUREMENTS

    rows = ITERATION_MEASUREMENTS if rows is None else rows

    def pm_of(r, over, lat):
        eff = replace(FITTED[r[0]], iter_overhead_s=over, allreduce_latency_s=lat)
        return PerfModel(device(r[0]), model(r[1]), r[2], eff)

    def as_tpot(rs):
        return [{"batch_size": r[3], "context": r[4], "s_per_iter": r[5]} for r in rs]

    one = [r for r in rows if r[2] == 1]
    over, _ = fit_iter_overhead(as_tpot(one), pm_of(one[0], 0.0, 0.0))
    gaps = [(r[5] - float(pm_of(r, over, 0.0).decode_iter_s(r[3], r[4]))) / (2 * model(r[1]).layers)
            for r in rows if r[2] > 1]
    lat = max(float(np.mean(gaps)), 0.0) if gaps else 0.0
    err = {f"err/{r[1]}/tp{r[2]}/b{r[3]}": float(pm_of(r, over, lat).decode_iter_s(r[3], r[4])) / r[5] - 1.0
           for r in rows}
    return over, lat, {**err, "max_abs_rel_err": max(abs(v) for v in err.values())}
