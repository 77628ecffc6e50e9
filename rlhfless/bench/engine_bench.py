"""Side-by-side benchmarks of deduplicated prefill and of the decode engine (behind `rlhfless bench prefill|engine`).

prefill: naive vs group dedup vs prefix dedup, plus the learner's forward+backward with and without prompt reuse;
engine: this engine vs HF `generate` (and optionally vLLM) on a long-tailed length mix, greedy and sampled, with
arms that say where the speedup comes from; the TPOT profile is saved as JSON. The rule it keeps: every
alternative runs in one process on the same batch, interleaved repeat by repeat, and medians are reported; wall
times are measured, never asserted in tests. The arms and the vLLM arm: docs/internals.md#benchengine_benchpy.

Deviation: the GSM8K workload uses a freshly initialised model of the tiny architecture with a longer context
(few-shot prompts are ~1000 byte tokens, beyond the shipped checkpoint's 512); prefill time does not depend on
the weights, and token identity is checked on that model's greedy outputs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlhfless.config import DEFAULT_CHECKPOINT
from rlhfless.core.errors import require
from rlhfless.model.tokenizer import EOS_ID, PAD_ID, ByteTokenizer
from rlhfless.runtime.config import available_cores



@dataclass
class PrefillBenchConfig:
    """Sizes of the prefill benchmark."""

    prompts: int = 16
    """B: distinct prompts per batch (arithmetic workload)."""
    group_size: int = 8
    """G: samples per prompt."""
    repeats: int = 5
    """Timed repeats per mode (medians reported)."""
    decode_tokens: int = 24
    """Greedy tokens decoded for the token-identity check."""
    forward_tokens: int = 64
    """Max response tokens sampled for the learner forward+backward comparison."""
    gsm8k_path: str = "../shared/data/gsm8k/train.jsonl"
    """GSM8K-format JSONL; the workload is skipped when it is absent."""
    gsm8k_prompts: int = 8
    """B for the GSM8K workload."""
    gsm8k_shots: int = 2
    """Worked examples in the GSM8K template."""
    checkpoint: str = DEFAULT_CHECKPOINT
    """Policy for the arithmetic workload (a fresh model when absent)."""
    threads: int = 1
    """torch threads (1: steadier timings on a shared machine)."""

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "repeats", "decode_tokens", "forward_tokens", "gsm8k_prompts",
                     "threads"):
            require(getattr(self, name) >= 1, f"bench.{name}", f"must be >= 1 (got {getattr(self, name)})")
        require(self.gsm8k_shots >= 0, "bench.gsm8k_shots", f"must be >= 0 (got {self.gsm8k_shots})")


ENGINES = ("own", "hf", "vllm")


@dataclass
class EngineBenchConfig:
    """Sizes of the engine benchmark."""

    prompts: int = 32
    """B: distinct prompts (the task's first train prompts: heavy-tailed number of terms)."""
    group_size: int = 8
    """G: samples per prompt."""
    max_new_tokens: int = 192
    """Response cap (the training default)."""
    temperature: float = 1.0
    """Sampling temperature of the sampled comparison."""
    repeats: int = 3
    """Timed repeats per engine (medians reported)."""
    seed: int = 0
    """Sampling seed (each repeat r uses seed + r, for both engines)."""
    checkpoint: str = DEFAULT_CHECKPOINT
    """Policy checkpoint; without it a fresh model is used and the result is flagged (no real length mix)."""
    threads: int = field(default_factory=available_cores)
    """torch threads (default: the cores this process may use)."""
    tpot_path: str | None = None
    """Where to save the TPOT profile (default: next to the JSON report)."""
    hf_step_ablation: bool = True
    """Also time this engine with the HF forward as its decode step (shows what the fast step adds)."""
    engines: tuple[str, ...] = ("own", "hf")
    """Engines timed side by side: own (always; every ratio is taken against it), hf (HF `generate`, and the
    HF-step ablation), vllm (`rollout.vllm_engine`; skipped with the reason where vLLM cannot be imported)."""
    gsm8k_path: str = "../shared/data/gsm8k/train.jsonl"
    """GSM8K-format JSONL for the second workload (skipped, saying why, when the file is absent)."""
    gsm8k_prompts: int = 8
    """B of the GSM8K-shaped workload: few-shot prompts of ~1,000 tokens sharing their worked examples (0 = skip)."""
    gsm8k_shots: int = 2
    """Worked examples in each GSM8K prompt."""
    gsm8k_max_new_tokens: int = 64
    """Response cap of the GSM8K workload (its random-init model rarely stops on its own)."""

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "max_new_tokens", "repeats", "threads"):
            require(getattr(self, name) >= 1, f"bench.{name}", f"must be >= 1 (got {getattr(self, name)})")
        require(self.temperature > 0, "bench.temperature", f"must be > 0 (got {self.temperature})")
        require(self.gsm8k_prompts >= 0, "bench.gsm8k_prompts", f"must be >= 0 (got {self.gsm8k_prompts})")
        require(self.gsm8k_shots >= 0, "bench.gsm8k_shots", f"must be >= 0 (got {self.gsm8k_shots})")
        require(self.gsm8k_max_new_tokens >= 1, "bench.gsm8k_max_new_tokens",
                f"must be >= 1 (got {self.gsm8k_max_new_tokens})")
        self.engines = tuple(self.engines)
        unknown = sorted(set(self.engines) - set(ENGINES))
        require(not unknown, "bench.engines", f"unknown {unknown}; choose from {', '.join(ENGINES)}")
        require("own" in self.engines, "bench.engines", "must include own (the reference of every ratio)")


@dataclass
class Timer:
    """Interleaved repeats of named callables; medians of wall seconds and of this process's CPU seconds (on a
    shared machine wall time also counts waiting for a core; CPU time counts only the work, all threads)."""

    times: dict[str, list[float]] = field(default_factory=dict)
    cpu_times: dict[str, list[float]] = field(default_factory=dict)

    def run(self, fns: dict, repeats: int, progress=None) -> dict:
        """Each fn `repeats` times, interleaved; `progress` (optional) is told when each call starts and ends."""
        results = {}
        for r in range(repeats):
            for name, fn in fns.items():
                if progress is not None:
                    progress.start(name, r, repeats)
                t0, c0 = time.perf_counter(), time.process_time()
                results[name] = fn()
                self.times.setdefault(name, []).append(time.perf_counter() - t0)
                self.cpu_times.setdefault(name, []).append(time.process_time() - c0)
                if progress is not None:
                    progress.done(name)
        return results

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def cpu_median(self, name: str) -> float:
        return statistics.median(self.cpu_times[name])


def load_policy(checkpoint: str | Path):
    """(model in eval mode, label): the checkpoint when present, else a fresh tiny model."""
    from rlhfless.model.factory import load_checkpoint

    path = Path(checkpoint)
    if (path / "model.safetensors").is_file():
        return load_checkpoint(path).eval(), f"checkpoint:{path}"
    return fresh_model(512)


def fresh_model(max_positions: int):
    """(a freshly initialised tiny model with this context, label)."""
    from rlhfless.model.factory import ModelConfig, build_model

    cfg = ModelConfig(max_positions=max_positions)
    return build_model(cfg, seed=0).eval(), f"random-init(max_positions={max_positions})"


# ---------------------------------------------------------------------------------------------------- prefill


def arith_template_prompts(n: int) -> list[list[int]]:
    """Arithmetic prompts behind a shared instruction + worked-examples template (BOS first)."""
    from rlhfless.tasks.arith import ArithTaskConfig, Problem, make_splits, solution

    shots = [Problem((3, 4, 5)), Problem((7, 1, 9, 2)), Problem((6, 6))]
    header = "Add the numbers. Write each running sum, then '#' and the total.\n" + "".join(
        f"Q: {p.text}\nA: {solution(p, check=False)}\n" for p in shots)
    train, _ = make_splits(ArithTaskConfig(num_train=max(n, 1), num_eval=1))
    tok = ByteTokenizer()
    return [tok.encode(f"{header}Q: {p.text}\nA: ", bos=True) for p in train[:n]]


def gsm8k_token_prompts(path: str, n: int, shots: int) -> list[list[int]] | None:
    from rlhfless.tasks.gsm8k import GSM8KConfig, load_prompts

    if not Path(path).is_file():
        return None
    tok = ByteTokenizer()
    return [tok.encode(p.text, bos=True) for p in load_prompts(GSM8KConfig(path=path, n_shots=shots, limit=n))]


def prefill_workload(model, prompts: list[list[int]], cfg: PrefillBenchConfig) -> dict:
    """Naive vs group vs prefix dedup prefill on one batch, token identity, and learner forward reuse."""
    from rlhfless.rollout.engine import SamplingParams, decode, prefill

    G = cfg.group_size
    modes = {"naive": dict(dedup=False), "group": dict(dedup=True, share_prefixes=False),
             "prefix": dict(dedup=True, share_prefixes=True)}
    timer = Timer()
    states = timer.run({m: (lambda kw=kw: prefill(model, prompts, G, **kw)) for m, kw in modes.items()}, cfg.repeats)
    greedy = SamplingParams(cfg.decode_tokens, temperature=0.0)
    outs = {m: decode(model, prefill(model, prompts, G, **kw), greedy).responses for m, kw in modes.items()}
    t = {m: timer.median(m) for m in modes}
    stats = {m: states[m].stats for m in modes}
    theo = stats["prefix"].dedup_ratio
    plan = stats["prefix"].plan
    return {
        "prompts": len(prompts), "group_size": G, "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "plan_mode": plan.mode, "shared_groups": [[g.length, len(g.members)] for g in plan.groups],
        "tokens_naive": stats["naive"].tokens_naive, "tokens_computed": stats["prefix"].tokens_computed,
        "tokens_computed_group_only": stats["group"].tokens_computed,
        "t_naive_s": t["naive"], "t_group_s": t["group"], "t_dedup_s": t["prefix"],
        "theoretical_ratio": theo, "prefill_time_ratio": t["naive"] / t["prefix"],
        "fraction_of_theoretical_saving": _fraction(t["prefix"], t["naive"], theo),
        "group_only_theoretical_ratio": stats["group"].dedup_ratio,
        "group_only_time_ratio": t["naive"] / t["group"],
        "group_only_fraction_of_theoretical_saving": _fraction(t["group"], t["naive"], stats["group"].dedup_ratio),
        "tokens_identical": outs["prefix"] == outs["naive"] and outs["group"] == outs["naive"],
        **forward_reuse(model, prompts, cfg),
    }


def _fraction(t_dedup: float, t_naive: float, theoretical_ratio: float) -> float:
    """Measured saving as a fraction of the theoretical one: (1 - t_dedup/t_naive) / (1 - 1/ratio)."""
    ideal = 1 - 1 / theoretical_ratio
    return (1 - t_dedup / t_naive) / ideal if ideal > 0 else float("nan")


def forward_reuse(model, prompts: list[list[int]], cfg: PrefillBenchConfig) -> dict:
    """Learner forward+backward on sampled responses, with and without running each prompt once per group."""
    from rlhfless.rollout.engine import SamplingParams, generate
    from rlhfless.rollout.forward import response_logprobs

    G = cfg.group_size
    resp = generate(model, prompts, G, SamplingParams(cfg.forward_tokens, 1.0), seed=1).responses
    model.train()

    def step(reuse: bool):
        model.zero_grad(set_to_none=True)
        out = response_logprobs(model, prompts, resp, G, reuse_prefix=reuse)
        (out.logp.sum() / out.mask.sum()).backward()
        return out.logp.detach()

    timer = Timer()
    lp = timer.run({"naive": lambda: step(False), "reuse": lambda: step(True)}, cfg.repeats)
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"forward_naive_s": timer.median("naive"), "forward_reuse_s": timer.median("reuse"),
            "forward_time_ratio": timer.median("naive") / timer.median("reuse"),
            "forward_response_tokens_mean": sum(map(len, resp)) / len(resp),
            "forward_logp_max_abs_diff": float((lp["naive"] - lp["reuse"]).abs().max())}


def bench_prefill(cfg: PrefillBenchConfig) -> dict:
    """Both workloads; the top-level keys repeat the arithmetic workload's (the one always available)."""
    torch.set_num_threads(cfg.threads)
    model, label = load_policy(cfg.checkpoint)
    arith = {"model": label, **prefill_workload(model, arith_template_prompts(cfg.prompts), cfg)}
    workloads = {"arith_template": arith}
    gsm = gsm8k_token_prompts(cfg.gsm8k_path, cfg.gsm8k_prompts, cfg.gsm8k_shots)
    if gsm is None:
        from rlhfless.tasks.gsm8k import missing_message

        workloads["gsm8k"] = {"skipped": missing_message(cfg.gsm8k_path, "--gsm8k")}
    else:
        need = max(map(len, gsm)) + cfg.forward_tokens + cfg.decode_tokens + 1
        big, big_label = fresh_model(1 << (need - 1).bit_length())
        workloads["gsm8k"] = {"model": big_label, **prefill_workload(big, gsm, cfg)}
    return {**{k: v for k, v in arith.items()}, "threads": cfg.threads, "workloads": workloads}


# ----------------------------------------------------------------------------------------------------- engine


def hf_generate(model, prompts: list[list[int]], G: int, max_new: int, temperature: float, seed: int):
    """HF `generate` on the same B*G rows (left-padded); responses cut after EOS like the engine's."""
    from rlhfless.rollout.prefix import left_pad

    ids, mask = left_pad([p for p in prompts for _ in range(G)])
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=EOS_ID,
                             pad_token_id=PAD_ID, **kw)
    rows = []
    for r in out[:, ids.shape[1]:].tolist():
        cut = r.index(EOS_ID) + 1 if EOS_ID in r else len(r)
        rows.append(r[:cut])
    return rows


def hf_generate_dedup(model, prompts: list[list[int]], G: int, max_new: int, temperature: float, seed: int):
    """HF `generate` after the engine's deduplicated prefill: each prompt's KV (all but its last token) is
    computed once and repeated G times; `generate` then feeds the last prompt token and decodes as usual.
    The cache is built anew on every call (`generate` grows it in place). Responses cut after EOS."""
    from transformers import DynamicCache

    from rlhfless.rollout.prefix import left_pad

    ids, mask = left_pad(prompts)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True, past_key_values=cache,
              position_ids=(mask[:, :-1].cumsum(-1) - 1).clamp(min=0), logits_to_keep=1)
        cache.batch_repeat_interleave(G)
        torch.manual_seed(seed)
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False)
        out = model.generate(input_ids=ids.repeat_interleave(G, 0), attention_mask=mask.repeat_interleave(G, 0),
                             past_key_values=cache, max_new_tokens=max_new, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                             **kw)
    rows = []
    for r in out[:, ids.shape[1]:].tolist():
        cut = r.index(EOS_ID) + 1 if EOS_ID in r else len(r)
        rows.append(r[:cut])
    return rows


def _tokens(responses: list[list[int]]) -> int:
    return sum(len(r) for r in responses)


def bench_engine(cfg: EngineBenchConfig, json_path: str | Path | None = None, progress: bool = False) -> dict:
    """This engine vs HF generate (and vLLM when asked), greedy (same outputs) and sampled (same batch and seed,
    each engine's own random streams); all arms of a mode interleaved in one Timer. `progress`: a bar on stderr
    (workload, mode, arm, repeat, and the remaining time estimated by `bench.engineprogress`)."""
    from rlhfless.bench.engineprogress import Progress

    bar, threads = Progress(cfg, enabled=progress), torch.get_num_threads()
    try:
        return _bench_engine(cfg, json_path, bar)
    finally:  # the caller's torch thread count back (a test process shares its cores)
        bar.close()
        torch.set_num_threads(threads)


def _bench_engine(cfg: EngineBenchConfig, json_path: str | Path | None, bar) -> dict:
    from rlhfless.rollout.tpot import profile_rows, save_profile
    from rlhfless.tasks.arith import ArithTaskConfig, make_splits

    torch.set_num_threads(cfg.threads)
    model, label = load_policy(cfg.checkpoint)
    train, _ = make_splits(ArithTaskConfig())
    tok = ByteTokenizer()
    prompts = [tok.encode(p.text, bos=True) for p in train[: cfg.prompts]]
    report: dict = {"model": label, "prompts": len(prompts), "group_size": cfg.group_size,
                    "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "threads": cfg.threads,
                    "engines": list(cfg.engines)}
    on_disk = (Path(cfg.checkpoint) / "model.safetensors").is_file()
    bar.begin_workload("arith")
    iters = _engine_workload(cfg, model, prompts, cfg.max_new_tokens, report, cfg.checkpoint if on_disk else None,
                             bar)
    report["gsm8k"] = _gsm8k_workload(cfg, bar)
    tpot = Path(cfg.tpot_path) if cfg.tpot_path else _sibling(json_path, "_tpot.json")
    keys = ("tokens_per_s", "hf_generate_tokens_per_s", "speedup_vs_hf_generate", "hf_generate_dedup_tokens_per_s",
            "speedup_vs_hf_generate_dedup", "dedup_prefill_speedup_of_hf_generate")
    report.update({k: report["sampled"][k] for k in keys if k in report["sampled"]})
    if "hf" in cfg.engines:
        report["greedy_identical"] = report["greedy"]["greedy_identical"]
        report["greedy_speedup_vs_hf_generate"] = report["greedy"]["speedup_vs_hf_generate"]
    report["tpot_profile"] = str(save_profile(profile_rows(iters), tpot))
    return report


def _engine_workload(cfg: EngineBenchConfig, model, prompts: list[list[int]], max_new: int, report: dict,
                     checkpoint: str | None, bar) -> list:
    """Greedy and sampled modes of one workload into `report` (keys greedy, sampled, vllm); the own engine's
    iteration records (for the TPOT profile). `checkpoint`: the folder `model` was loaded from (vLLM starts on it),
    or None for a model made in this process."""
    from rlhfless.bench.engineprogress import VLLM_START_S
    from rlhfless.rollout.engine import SamplingParams

    vllm = None
    if "vllm" in cfg.engines:
        with bar.untimed("starting vLLM", VLLM_START_S if "vllm" in bar.arms else 0.0):
            vllm = _start_vllm(cfg, model, report, checkpoint)
    iters = []
    try:
        for name, temp in (("greedy", 0.0), ("sampled", cfg.temperature)):
            sp = SamplingParams(max_new, temp)
            bar.begin_mode(name)
            if vllm is not None:  # its first calls at a new batch shape warm up kernels: keep them out of the timing
                with bar.untimed(f"{name} vllm warm-up", bar.estimate("vllm")):
                    vllm.generate(prompts, cfg.group_size, sp, seed=cfg.seed)
            report[name], ours = _engine_mode(cfg, model, prompts, sp, vllm, bar)
            iters += ours.iterations
    finally:
        if vllm is not None:
            report["vllm"]["prefix_cache"] = vllm.prefix_cache_stats()
            vllm.close()
    return iters


def _gsm8k_workload(cfg: EngineBenchConfig, bar) -> dict:
    """The same side-by-side arms on GSM8K few-shot prompts (long, sharing their worked examples), on a fresh model
    of the tiny architecture with a context that holds them (the shipped checkpoint's 512 does not)."""
    if cfg.gsm8k_prompts == 0:
        return {"skipped": "bench.gsm8k_prompts=0"}
    prompts = gsm8k_token_prompts(cfg.gsm8k_path, cfg.gsm8k_prompts, cfg.gsm8k_shots)
    if prompts is None:
        from rlhfless.tasks.gsm8k import missing_message

        return {"skipped": missing_message(cfg.gsm8k_path, "--gsm8k")}
    need = max(map(len, prompts)) + cfg.gsm8k_max_new_tokens
    model, label = fresh_model(1 << (need - 1).bit_length())
    part = {"model": label, "prompts": len(prompts), "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
            "max_new_tokens": cfg.gsm8k_max_new_tokens}
    bar.begin_workload("gsm8k")
    _engine_workload(cfg, model, prompts, cfg.gsm8k_max_new_tokens, part, None, bar)
    return part


def _engine_mode(cfg: EngineBenchConfig, model, prompts: list[list[int]], sp, vllm, bar) -> tuple[dict, object]:
    """One sampling mode: every requested arm timed interleaved; (report part, the own engine's output)."""
    from rlhfless.rollout.engine import generate

    G, n, temp = cfg.group_size, cfg.max_new_tokens, sp.temperature
    fns = {"engine": lambda: generate(model, prompts, G, sp, seed=cfg.seed)}
    if "hf" in cfg.engines:
        fns["hf_generate"] = lambda: hf_generate(model, prompts, G, n, temp, cfg.seed)
        fns["hf_generate_dedup"] = lambda: hf_generate_dedup(model, prompts, G, n, temp, cfg.seed)
        if cfg.hf_step_ablation:
            fns["engine_hf_step"] = lambda: generate(model, prompts, G, sp, seed=cfg.seed, impl="hf")
    if vllm is not None:
        fns["vllm"] = lambda: vllm.generate(prompts, G, sp, seed=cfg.seed)
    timer = Timer()
    res = timer.run(fns, cfg.repeats, bar)
    ours = res["engine"]
    t_e = timer.median("engine")
    part = {"engine_s": t_e, "tokens": ours.generated_tokens, "tokens_per_s": ours.generated_tokens / t_e,
            "length_mean": ours.generated_tokens / len(ours.responses), "length_max": max(ours.lengths),
            "truncated_frac": sum(ours.truncated) / len(ours.truncated),
            "cpu_s": {k: timer.cpu_median(k) for k in fns}}  # CPU seconds per arm
    if "hf" in cfg.engines:
        part.update(_hf_part(cfg, res, timer, ours, greedy=temp == 0))
    if vllm is not None:
        part.update(_vllm_part(res["vllm"], timer, ours, greedy=temp == 0))
    by_engine = {"own": part["tokens_per_s"]}
    if "hf" in cfg.engines:
        by_engine["hf"] = part["hf_generate_tokens_per_s"]
    if vllm is not None:
        by_engine["vllm"] = part["vllm_tokens_per_s"]
    part["tokens_per_s_by_engine"] = by_engine
    part["ratio_to_own"] = {k: v / by_engine["own"] for k, v in by_engine.items()}
    return part, ours


def _hf_part(cfg: EngineBenchConfig, res: dict, timer: Timer, ours, *, greedy: bool) -> dict:
    """The HF arms' keys of one mode (the report's original layout)."""
    hf, dd = res["hf_generate"], res["hf_generate_dedup"]
    t_h, t_d = timer.median("hf_generate"), timer.median("hf_generate_dedup")
    part = {"hf_generate_s": t_h, "hf_tokens": _tokens(hf), "hf_generate_tokens_per_s": _tokens(hf) / t_h,
            "hf_length_mean": _tokens(hf) / len(hf), "hf_length_max": max(map(len, hf)),
            "hf_generate_dedup_s": t_d, "hf_generate_dedup_tokens_per_s": _tokens(dd) / t_d,
            "hf_dedup_length_max": max(map(len, dd))}  # a static batch runs until its longest row ends
    own_rate = ours.generated_tokens / timer.median("engine")
    part["speedup_vs_hf_generate"] = own_rate / part["hf_generate_tokens_per_s"]
    part["speedup_vs_hf_generate_dedup"] = own_rate / part["hf_generate_dedup_tokens_per_s"]
    part["dedup_prefill_speedup_of_hf_generate"] = (part["hf_generate_dedup_tokens_per_s"]
                                                    / part["hf_generate_tokens_per_s"])
    cpu_rate = ours.generated_tokens / timer.cpu_median("engine")
    part["cpu_speedup_vs_hf_generate"] = cpu_rate / (_tokens(hf) / timer.cpu_median("hf_generate"))
    part["cpu_speedup_vs_hf_generate_dedup"] = cpu_rate / (_tokens(dd) / timer.cpu_median("hf_generate_dedup"))
    if cfg.hf_step_ablation:
        part["engine_hf_step_tokens_per_s"] = res["engine_hf_step"].generated_tokens / timer.median("engine_hf_step")
    if greedy:
        part["greedy_identical"] = ours.responses == hf
        part["greedy_identical_hf_dedup"] = dd == hf
    return part


def _vllm_part(out, timer: Timer, ours, *, greedy: bool) -> dict:
    """The vLLM arm's keys of one mode; its sampled lengths differ from ours (its own random streams)."""
    t = timer.median("vllm")
    part = {"vllm_s": t, "vllm_tokens": out.generated_tokens, "vllm_tokens_per_s": out.generated_tokens / t,
            "vllm_length_mean": out.generated_tokens / len(out.responses), "vllm_length_max": max(out.lengths),
            "vllm_prefix_cache": out.prefix_cache}
    part["speedup_vs_vllm"] = (ours.generated_tokens / timer.median("engine")) / part["vllm_tokens_per_s"]
    part["cpu_speedup_vs_vllm"] = ((ours.generated_tokens / timer.cpu_median("engine"))
                                   / (out.generated_tokens / timer.cpu_median("vllm")))
    if greedy:
        part["vllm_greedy_identical"] = out.responses == ours.responses
    return part


def _start_vllm(cfg: EngineBenchConfig, model, report: dict, checkpoint: str | None):
    """The vLLM engine on `checkpoint`, or on `model` saved to a temporary folder first when None; or None with
    the reason in report["vllm"]["skipped"]."""
    import tempfile

    from rlhfless.model.factory import save_checkpoint
    from rlhfless.rollout.vllm_engine import VLLMEngine, vllm_available

    why = vllm_available()
    if why:
        report["vllm"] = {"skipped": why}
        return None
    import vllm

    rows = max(1, min(256, max(cfg.prompts, cfg.gsm8k_prompts) * cfg.group_size))
    t0 = time.perf_counter()
    if checkpoint is not None:
        engine = VLLMEngine(checkpoint, threads=cfg.threads, max_num_seqs=rows)
    else:  # vLLM reads the folder only while it starts
        with tempfile.TemporaryDirectory(prefix="rlhfless-bench-vllm-") as tmp:
            engine = VLLMEngine(save_checkpoint(model, tmp), threads=cfg.threads, max_num_seqs=rows)
    report["vllm"] = {"start_s": time.perf_counter() - t0, "version": vllm.__version__}
    return engine


def _sibling(json_path: str | Path | None, suffix: str) -> Path:
    if json_path is None:
        return Path("tpot_profile.json")
    p = Path(json_path)
    return p.with_name(p.stem + suffix)
