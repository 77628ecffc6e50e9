"""`rlhfless profile`: measured times of one model shape on one device, as a time profile the planner and the
simulator read, with the simulator's own prediction beside every measured figure.

Measures (random weights of a public shape, built locally, nothing downloaded) decode iterations of this
project's engine step over batch x context, prefill seconds per token, the cold start of a fresh interpreter and
host/device weight copies; `save` writes the planner's `rows`, `prefill_s_per_token`, and a `profile` with every
measurement, the machine, and the roofline's prediction and measured / predicted ratio per point. The rule it
keeps: decode and prefill figures are medians of timed runs after untimed warmup, each ended by a device sync.
What each part times and the file's layout: docs/internals.md#benchdevice_profilepy.

Deviations: 1. The decode grid times a batch that does not shrink (the planner interpolates between batch sizes).
2. Cold start excludes an inference-engine init (the simulator's `engine_init_s` is vLLM's; reported without it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlhfless.core.errors import ConfigError, require

SHAPES = ("tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
GRIDS = {  # (batch sizes, contexts, prefill tokens) by device type: seconds on a CPU, a minute or so on a GPU
    "cpu": ((1, 2, 4, 8, 16), (32, 128), (64, 256)),
    "cuda": ((1, 4, 16, 64, 256), (256, 1024, 2048), (512, 2048, 8192)),
}
GPU_KINDS = (("H200", "H200"), ("H100", "H100"), ("A100", "A100-80G"), ("L40S", "L40S"), ("A40", "A40"))


@dataclass
class ProfileConfig:
    """What `rlhfless profile` measures (empty grids: the device type's defaults in `GRIDS`)."""

    model: str = "tiny"
    """Shape: tiny (the shipped checkpoint's config) or a Qwen2.5 shape: qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b."""
    device: str = "cpu"
    """cpu, cuda or cuda:k (checked before any work: `devices.check_device`)."""
    dtype: str = "auto"
    """float32, bfloat16, or auto (bfloat16 on CUDA, float32 on the CPU)."""
    batch_sizes: tuple[int, ...] = ()
    contexts: tuple[int, ...] = ()
    prefill_tokens: tuple[int, ...] = ()
    prefill_row: int = 512
    """Prompt tokens per prefill row (a prefill of T tokens runs ceil(T / prefill_row) rows)."""
    iters: int = 8
    """Timed decode iterations per grid point (median kept)."""
    warmup: int = 2
    """Untimed iterations before (kernel selection, allocator growth)."""
    repeats: int = 3
    """Timed prefills per size (median kept)."""
    cold_start: bool = True
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        from rlhfless.core.devices import syntax_problem

        require(self.model in SHAPES, "--model", f"must be one of {', '.join(SHAPES)} (got {self.model!r})")
        problem = syntax_problem(self.device)
        require(problem is None and self.device != "auto", "--device",
                problem or "must be cpu, cuda or cuda:k (got 'auto')")
        require(self.dtype in ("auto", "float32", "bfloat16"), "--dtype",
                f"must be auto, float32 or bfloat16 (got {self.dtype!r})")
        for name in ("batch_sizes", "contexts", "prefill_tokens"):
            require(all(isinstance(v, int) and v >= 1 for v in getattr(self, name)), f"--{name.replace('_', '-')}",
                    f"must be integers >= 1 (got {getattr(self, name)})")
        for name in ("prefill_row", "iters", "repeats", "threads"):
            require(getattr(self, name) >= 1, f"--{name.replace('_', '-')}", f"must be >= 1 (got {getattr(self, name)})")
        require(self.warmup >= 0, "--warmup", f"must be >= 0 (got {self.warmup})")
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        b, c, p = GRIDS[kind]
        self.batch_sizes = tuple(self.batch_sizes) or b
        self.contexts = tuple(self.contexts) or c
        self.prefill_tokens = tuple(self.prefill_tokens) or p

    @property
    def torch_dtype(self):
        import torch

        name = self.dtype if self.dtype != "auto" else ("bfloat16" if self.device.startswith("cuda") else "float32")
        return getattr(torch, name)


# --- the model ----------------------------------------------------------------------------------------------
def hf_config(shape_name: str, max_positions: int):
    """A Qwen2 config of the named shape (attention through SDPA, as the engine's fast step needs)."""
    from transformers import Qwen2Config

    from rlhfless.sim.hardware import model as model_shape

    s = model_shape(shape_name)
    return Qwen2Config(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                       num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate,
                       max_position_embeddings=max_positions, tie_word_embeddings=s.tied_embeddings,
                       attn_implementation="sdpa")


def random_model(config, device, dtype, seed: int = 0):
    """A model of `config` with transformers' random initialisation, made directly on `device` (no CPU copy of a
    large model)."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=dtype).eval().requires_grad_(False)


# --- measurements -------------------------------------------------------------------------------------------
def _timed(fn, device, n: int) -> list[float]:
    from rlhfless.core.devices import synchronize

    out = []
    for _ in range(n):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def decode_rows(model, cfg: ProfileConfig, progress=None) -> list[dict]:
    """Median seconds per decode iteration at every (batch size, context) of the grid."""
    import torch

    from rlhfless.rollout.state import dynamic_cache
    from rlhfless.rollout.stepper import make_stepper

    mc, dev, dt = model.config, next(model.parameters()).device, next(model.parameters()).dtype
    head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
    rows = []
    for c in cfg.contexts:
        for b in cfg.batch_sizes:
            shape = (b, mc.num_key_value_heads, c, head_dim)
            # random keys and values: an iteration's time does not depend on them, only on the context
            cache = dynamic_cache([(torch.randn(shape, device=dev, dtype=dt), torch.randn(shape, device=dev, dtype=dt))
                                   for _ in range(mc.num_hidden_layers)])
            stepper = make_stepper(model, cache, torch.ones(b, c, dtype=torch.long, device=dev),
                                   cfg.warmup + cfg.iters + 1)
            del cache
            tok = torch.randint(0, mc.vocab_size, (b,), device=dev)
            live = torch.ones(b, dtype=torch.bool, device=dev)  # no row finishes: the planner interpolates batches
            pos = torch.full((b,), c, dtype=torch.long, device=dev)

            def one():
                nonlocal pos
                stepper.step(tok, pos, live)
                pos = pos + 1

            with torch.no_grad():
                _timed(one, dev, cfg.warmup)
                secs = _timed(one, dev, cfg.iters)
            rows.append({"batch_size": b, "context": c + cfg.warmup + cfg.iters // 2,
                         "s_per_iter": statistics.median(secs), "n": cfg.iters})
            del stepper
            if progress:
                progress(f"decode b={b} c={c}: {1e3 * rows[-1]['s_per_iter']:.2f} ms")
    return rows


def prefill_rows(model, cfg: ProfileConfig, progress=None) -> list[dict]:
    """Median seconds of a naive prefill of each token count in the grid (rows of `prefill_row` tokens)."""
    import torch

    from rlhfless.rollout.state import prefill

    dev, vocab = next(model.parameters()).device, model.config.vocab_size
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for tokens in cfg.prefill_tokens:
        width = min(tokens, cfg.prefill_row, model.config.max_position_embeddings - 1)
        n_rows = -(-tokens // width)
        prompts = torch.randint(0, vocab, (n_rows, width), generator=g).tolist()
        with torch.no_grad():
            _timed(lambda: prefill(model, prompts, 1, dedup=False), dev, 1)
            secs = _timed(lambda: prefill(model, prompts, 1, dedup=False), dev, cfg.repeats)
        rows.append({"tokens": n_rows * width, "rows": n_rows, "row_tokens": width,
                     "seconds": statistics.median(secs), "n": cfg.repeats})
        if progress:
            progress(f"prefill {n_rows * width} tokens: {1e3 * rows[-1]['seconds']:.1f} ms")
    return rows


def transfer(model) -> dict | None:
    """Host <-> device copy bandwidth of the model's weights (GB/s), pinned host memory; None on the CPU."""
    import torch

    dev = next(model.parameters()).device
    if dev.type != "cuda":
        return None
    params = [p.detach() for p in model.parameters()]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
    d2h = min(_timed(lambda: [h.copy_(p, non_blocking=True) for h, p in zip(host, params)], dev, 3))
    h2d = min(_timed(lambda: [p.copy_(h, non_blocking=True) for h, p in zip(host, params)], dev, 3))
    return {"bytes": nbytes, "h2d_gbps": nbytes / h2d / 1e9, "d2h_gbps": nbytes / d2h / 1e9,
            "h2d_s": h2d, "d2h_s": d2h}


COLD_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM  # the modeling module too (transformers imports lazily)
t_imp = time.perf_counter()
folder, device, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = Qwen2Config.from_pretrained(folder)
with torch.device("meta"):  # shapes only: the weights come from the file
    model = Qwen2ForCausalLM(cfg)
model.load_state_dict(load_file(folder + "/model.safetensors", device=device), assign=True, strict=False)
model.tie_weights()
with torch.device(device):  # the rotary table is computed, not stored: rebuild it on the device
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
model.to(device=device, dtype=getattr(torch, dtype))
if device.startswith("cuda"):
    torch.cuda.synchronize()
t_load = time.perf_counter()
print(json.dumps({"imports_s": t_imp - t0, "load_s": t_load - t_imp}))
"""


def cold_start(model, cfg: ProfileConfig) -> dict:
    """A fresh interpreter: start + imports + the model built and its weights loaded onto the device."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="rlhfless-profile-") as tmp:
        model.config.save_pretrained(tmp)
        seen, tensors = set(), {}
        for name, t in model.state_dict().items():
            if t.data_ptr() not in seen:  # tied embedding stored once
                seen.add(t.data_ptr())
                tensors[name] = t.detach().cpu().contiguous()
        save_file(tensors, os.path.join(tmp, "model.safetensors"))
        size = os.path.getsize(os.path.join(tmp, "model.safetensors"))
        del tensors
        dtype = str(cfg.torch_dtype).removeprefix("torch.")
        env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "HF_HUB_OFFLINE": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", COLD_CHILD, tmp, cfg.device, dtype], capture_output=True,
                              text=True, env=env, timeout=600)
        total = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:300] if proc.stderr.strip() else "failed"}
    inner = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"total_s": total, "process_start_s": total - inner["imports_s"] - inner["load_s"], **inner,
            "weight_bytes": size, "load_gbps": size / inner["load_s"] / 1e9}


# --- the simulator beside ----------------------------------------------------------------------------------
def device_kind(device_name: str, device_type: str) -> str | None:
    """The simulator's device kind for a torch device name (None: not in the catalog)."""
    if device_type == "cpu":
        return "cpu-core"
    for key, kind in GPU_KINDS:
        if key in device_name.upper():
            return kind
    return None


def simulator_beside(doc: dict) -> dict:
    """The roofline's decode-iteration and prefill seconds for the profiled points, with measured / predicted."""
    from rlhfless.sim.hardware import device, model as model_shape
    from rlhfless.sim.perf import FITTED, PerfModel

    prof = doc["profile"]
    kind = prof["device_kind"]
    if kind is None:
        return {"skipped": f"no simulator device kind for {prof['device_name']!r}"}
    shape = replace(model_shape(prof["model"]), bytes_per_param=2 if prof["dtype"] == "bfloat16" else 4)
    try:
        pm = PerfModel(device(kind), shape, 1, FITTED[kind])
    except ConfigError as exc:
        return {"skipped": str(exc)}
    dec = [{"batch_size": r["batch_size"], "context": r["context"], "measured_s": r["s_per_iter"],
            "predicted_s": float(pm.decode_iter_s(r["batch_size"], r["context"]))} for r in doc["rows"]]
    # one batched pass: the matmuls see every token at once, each token attends half its row on average
    pre = [{"tokens": r["tokens"], "measured_s": r["seconds"], "predicted_s": pm.prefill_s(r["tokens"], r["row_tokens"] / 2)}
           for r in prof["prefill"]]
    for r in dec + pre:
        r["ratio"] = r["measured_s"] / r["predicted_s"] if r["predicted_s"] > 0 else None
    out = {"device_kind": kind, "efficiency": FITTED[kind].source, "decode": dec, "prefill": pre,
           "decode_ratio_median": statistics.median(r["ratio"] for r in dec),
           "prefill_ratio_median": statistics.median(r["ratio"] for r in pre)}
    cs = prof.get("cold_start") or {}
    if "total_s" in cs:
        out["cold_start"] = {"measured_s": cs["total_s"], "predicted_s": pm.cold_start_s(engine=False),
                             "note": "predicted = assumed container start + weights from storage, no engine init"}
    return out


# --- the command --------------------------------------------------------------------------------------------
def run_profile(cfg: ProfileConfig, progress=None) -> dict:
    """Measure everything `cfg` asks for; returns the profile document (see the module docstring)."""
    import platform

    import torch
    import transformers

    from rlhfless.core.devices import check_device, resolve_device

    check_device(cfg.device, "--device")
    torch.set_num_threads(cfg.threads)
    dev = resolve_device(cfg.device)
    need = max(cfg.contexts) + cfg.warmup + cfg.iters + 2
    if cfg.model == "tiny":
        from rlhfless.sim.hardware import TINY_CONFIG

        max_pos = json.loads(Path(TINY_CONFIG).read_text())["max_position_embeddings"]
        require(need <= max_pos, "--contexts", f"the tiny model's context is {max_pos} tokens: keep contexts <= "
                f"{max_pos - cfg.warmup - cfg.iters - 2}")
    else:
        max_pos = max(need, max(cfg.prefill_row, 1) + 1, 4096)
    t0 = time.perf_counter()
    model = random_model(hf_config(cfg.model, max_pos), dev, cfg.torch_dtype, cfg.seed)
    build_s = time.perf_counter() - t0
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine())
    rows = decode_rows(model, cfg, progress)
    pre = prefill_rows(model, cfg, progress)
    prof = {"format": "rlhfless.profile", "version": 1, "model": cfg.model, "device": str(dev),
            "device_name": name, "device_kind": device_kind(name, dev.type), "dtype": str(cfg.torch_dtype)[6:],
            "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__, "threads": cfg.threads,
            "config": {k: v for k, v in asdict(cfg).items()}, "build_s": build_s, "decode": rows, "prefill": pre,
            "transfer": transfer(model)}
    if cfg.cold_start:
        if progress:
            progress("cold start")
        prof["cold_start"] = cold_start(model, cfg)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    big = max(pre, key=lambda r: r["tokens"])
    doc = {"rows": rows, "prefill_s_per_token": big["seconds"] / big["tokens"], "profile": prof}
    prof["simulator"] = simulator_beside(doc)
    return doc


def save(doc: dict, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return out


def summary_lines(doc: dict) -> list[str]:
    """A short printed table: decode and prefill, measured beside predicted."""
    prof, sim = doc["profile"], doc["profile"]["simulator"]
    lines = [f"{prof['model']} on {prof['device']} ({prof['device_name']}, {prof['dtype']}), "
             f"{prof['params'] / 1e6:.1f} M params"]
    pred = {(r["batch_size"], r["context"]): r for r in sim.get("decode", [])}
    lines.append(f"{'batch':>6s} {'context':>8s} {'ms/iter':>9s} {'sim ms':>9s} {'ratio':>6s}")
    for r in doc["rows"]:
        p = pred.get((r["batch_size"], r["context"]))
        extra = f"{1e3 * p['predicted_s']:9.3f} {p['ratio']:6.2f}" if p else ""
        lines.append(f"{r['batch_size']:6d} {r['context']:8d} {1e3 * r['s_per_iter']:9.3f} {extra}")
    for r, p in zip(prof["prefill"], sim.get("prefill", [None] * len(prof["prefill"]))):
        extra = f", sim {1e3 * p['predicted_s']:.1f} ms (ratio {p['ratio']:.2f})" if p else ""
        lines.append(f"prefill {r['tokens']} tokens: {1e3 * r['seconds']:.1f} ms{extra}")
    cs = prof.get("cold_start")
    if cs and "total_s" in cs:
        lines.append(f"cold start {cs['total_s']:.2f} s (process + imports {cs['process_start_s'] + cs['imports_s']:.2f}"
                     f" s, weights {cs['load_s']:.2f} s)")
    if "skipped" in sim:
        lines.append(f"simulator: {sim['skipped']}")
    return lines


__all__ = ["ProfileConfig", "run_profile", "save", "simulator_beside", "summary_lines", "SHAPES"]
