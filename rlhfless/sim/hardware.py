"""Catalogs of device kinds and model shapes for the simulator's performance model.

Purpose: the public numbers a roofline needs, each with its source. Devices: peak dense bf16 FLOP/s, memory
bandwidth, memory, the intra-node link and the network bandwidth a device can use for weight transfer.
Models: transformer shapes (layers, hidden, heads, KV heads, head dim, MLP width, vocabulary) from the models'
public `config.json`, and the shipped tiny model read from `data/checkpoints/sft/config.json`.

Non-goals: no MoE, no sliding-window attention, no quantised weights (bf16 everywhere).

Deviations from the paper: the paper profiles its own GPUs through Vidur; we derive times from these peaks with
efficiency factors fitted to Vidur's public measurements (`rlhfless.sim.calibrate`). The CPU core of this machine
is modelled like a device so the simulator can be validated against real local runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import ConfigError, DataError, require

GB = 1e9
TINY_CONFIG = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "sft" / "config.json"


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or one CPU core) as the roofline sees it.

    peak_flops: dense bf16 FLOP/s (tensor cores, no sparsity).  mem_bw: bytes/s of device memory.
    mem_bytes: device memory.  link_bw: bytes/s per device to its node peers (NVLink or PCIe), for TP collectives.
    net_bw: bytes/s of a node's network interfaces together (weights and KV pushed between nodes).
    devices_per_node: devices a node holds (TP never spans nodes).  source: where the numbers come from.
    price_kind: key of the price catalog (rlhfless.plan.cost.CATALOG) billing this device.
    nic_bw: bytes/s of ONE network interface (a broadcast from one sender rank runs through one); 0 = net_bw.
    """

    name: str
    peak_flops: float
    mem_bw: float
    mem_bytes: float
    link_bw: float
    net_bw: float
    devices_per_node: int
    price_kind: str
    source: str
    nic_bw: float = 0.0

    def __post_init__(self) -> None:
        for f in ("peak_flops", "mem_bw", "mem_bytes", "link_bw", "net_bw"):
            require(getattr(self, f) > 0, f"device.{f}", f"must be > 0 (got {getattr(self, f)})")
        require(self.devices_per_node >= 1, "device.devices_per_node", f"must be >= 1 (got {self.devices_per_node})")


DEVICES: dict[str, DeviceSpec] = {
    # NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s; DGX H100:
    # one 400 Gb/s ConnectX-7 NIC per GPU (8 x 50 GB/s per node).
    "H100": DeviceSpec("H100", 989e12, 3.35e12, 80 * GB, 900e9 / 2, 400e9, 8, "H100",
                       "NVIDIA H100 SXM5 datasheet; DGX H100 user guide (8 x 400 Gb/s NICs)", 400e9 / 8),
    # NVIDIA H200 SXM datasheet: 1,979 TFLOP/s BF16 with sparsity = 989 dense, 4.8 TB/s HBM3e, 141 GB, NVLink
    # 900 GB/s; NIC as H100.
    "H200": DeviceSpec("H200", 989e12, 4.8e12, 141 * GB, 900e9 / 2, 400e9, 8, "H200",
                       "NVIDIA H200 SXM datasheet; NIC assumed as DGX H100", 400e9 / 8),
    # NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s BF16, 2.039 TB/s HBM2e, NVLink 600 GB/s; DGX A100: 200 Gb/s
    # per GPU (8 x 200 Gb/s HDR NICs, 8 x 25 GB/s per node).
    "A100-80G": DeviceSpec("A100-80G", 312e12, 2.039e12, 80 * GB, 600e9 / 2, 200e9, 8, "A100-80G",
                           "NVIDIA A100 80GB SXM datasheet; DGX A100 user guide", 200e9 / 8),
    # NVIDIA L40S datasheet: 362 TFLOP/s dense BF16, 864 GB/s GDDR6, 48 GB, PCIe Gen4 x16 (64 GB/s, no NVLink;
    # 25 GB/s one way is assumed reachable); network: 100 Gb/s per node (assumed: the paper does not state its
    # testbed network).
    "L40S": DeviceSpec("L40S", 362e12, 864e9, 48 * GB, 25e9, 100e9 / 8, 8, "L40S",
                       "NVIDIA L40S datasheet; PCIe and network rates assumed"),
    # NVIDIA A40 datasheet: 149.7 TFLOP/s dense BF16, 696 GB/s GDDR6, 48 GB; only for calibration (Vidur profiles
    # it; it is the nearest profiled relative of the L40S).
    "A40": DeviceSpec("A40", 149.7e12, 696e9, 48 * GB, 25e9, 100e9 / 8, 8, "L40S",
                      "NVIDIA A40 datasheet (calibration only; priced as an L40S)"),
    # One core of this machine (AMD EPYC, 2 cores, 24 GiB). Assumed nominal: 2 x 256-bit FMA at ~2.5 GHz = 80
    # GFLOP/s fp32 (the tiny model runs fp32), ~10 GB/s of memory bandwidth per core, 12 GB per core; the
    # effective numbers come from the calibration to this machine's measurements (rlhfless.sim.calibrate).
    "cpu-core": DeviceSpec("cpu-core", 80e9, 10e9, 12 * GB, 10e9, 10e9, 2, "cpu-core",
                           "assumed nominal numbers for one AMD EPYC core; calibrated from local measurements"),
}


@dataclass(frozen=True)
class ModelShape:
    """Transformer shape (dense, gated MLP, GQA); bytes_per_param 2 for bf16, 4 for the fp32 tiny model."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    bytes_per_param: int = 2
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "bytes_per_param"):
            require(getattr(self, f) >= 1, f"model.{f}", f"must be >= 1 (got {getattr(self, f)})")
        require(self.heads % self.kv_heads == 0, "model.kv_heads", f"must divide heads={self.heads}")

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of one layer's matmuls: QKV, output projection, gate+up, down."""
        h, hd = self.hidden, self.head_dim
        return h * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * h + 3 * h * self.intermediate

    @property
    def params(self) -> int:
        """All parameters (norms and biases ignored: under 0.1%)."""
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_matmul_params + emb

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token of context over all layers (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param


def _shape(name, layers, hidden, heads, kv, inter, vocab, tied, src, bpp=2) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, kv, hidden // heads, inter, vocab, tied, bpp, src)


_HF = "config.json of the public Hugging Face checkpoint"
MODELS: dict[str, ModelShape] = {
    # the small Qwen2.5 shapes `rlhfless profile` and the GPU check build with random weights (no checkpoint is downloadable here)
    "qwen2.5-0.5b": _shape("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, True, f"Qwen/Qwen2.5-0.5B {_HF}"),
    "qwen2.5-1.5b": _shape("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, True, f"Qwen/Qwen2.5-1.5B {_HF}"),
    "qwen2.5-3b": _shape("qwen2.5-3b", 36, 2048, 16, 2, 11008, 151936, True, f"Qwen/Qwen2.5-3B {_HF}"),
    "qwen2.5-7b": _shape("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, False, f"Qwen/Qwen2.5-7B {_HF}"),
    "qwen2.5-14b": _shape("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064, False, f"Qwen/Qwen2.5-14B {_HF}"),
    "qwen2.5-32b": _shape("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, False, f"Qwen/Qwen2.5-32B {_HF}"),
    # Llama-2-70b: the 70B shape Vidur profiles (the paper's 70B model is not named in our sources)
    "llama-70b": _shape("llama-70b", 80, 8192, 64, 8, 28672, 32000, False, f"meta-llama/Llama-2-70b-hf {_HF}"),
    # Llama 3: the models of the cited vLLM whole-iteration measurements (`perf.ITERATION_MEASUREMENTS`)
    "llama-3-8b": _shape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, False,
                         f"meta-llama/Meta-Llama-3-8B-Instruct {_HF}"),
    "llama-3-70b": _shape("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, False,
                          f"meta-llama/Meta-Llama-3-70B-Instruct {_HF}"),
    "llama-2-7b": _shape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, False, f"meta-llama/Llama-2-7b-hf {_HF}"),
    "qwen-72b": _shape("qwen-72b", 80, 8192, 64, 64, 24576, 151936, False, f"Qwen/Qwen-72B {_HF}"),
}


def tiny_model(path: Path = TINY_CONFIG) -> ModelShape:
    """The shipped tiny model's shape from its config.json (fp32 on CPU)."""
    try:
        c = json.loads(Path(path).read_text())
        return _shape("tiny", c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
                      c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"],
                      bool(c.get("tie_word_embeddings", True)), str(path), bpp=4)
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"{path}: cannot read the tiny model's shape ({exc})") from None


def device(name: str) -> DeviceSpec:
    """The device called `name`; an unknown name raises ConfigError listing the known ones."""
    if name not in DEVICES:
        raise ConfigError(f"device: unknown device kind {name!r}; allowed: {', '.join(DEVICES)}")
    return DEVICES[name]


def model(name: str) -> ModelShape:
    """The model called `name` ("tiny" reads the shipped checkpoint's config); unknown names raise ConfigError."""
    if name == "tiny":
        return tiny_model()
    if name not in MODELS:
        raise ConfigError(f"model: unknown model {name!r}; allowed: {', '.join([*MODELS, 'tiny'])}")
    return MODELS[name]
