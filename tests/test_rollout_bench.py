"""The benchmark functions run end to end at toy sizes and report the documented keys (timings not asserted)."""

from __future__ import annotations

import json
import os

import pytest

from rlhfless.cli import build_parser, main
from rlhfless.bench.engine_bench import PrefillBenchConfig, bench_prefill
from rlhfless.rollout.tpot import load_profile


def test_bench_prefill_reports_ratios_and_skips_missing_gsm8k(tmp_path):
    cfg = PrefillBenchConfig(prompts=3, group_size=2, repeats=1, decode_tokens=3, forward_tokens=3,
                             gsm8k_path=str(tmp_path / "absent.jsonl"), checkpoint=str(tmp_path / "none"))
    r = bench_prefill(cfg)
    for key in ("prefill_time_ratio", "theoretical_ratio", "tokens_identical", "fraction_of_theoretical_saving",
                "forward_time_ratio"):
        assert key in r
    assert r["tokens_identical"] is True and r["theoretical_ratio"] > 2
    assert "skipped" in r["workloads"]["gsm8k"]


def test_bench_engine_cli_writes_report_and_tpot_profile(tmp_path, tiny_checkpoint):
    out = tmp_path / "engine.json"
    rc = main(["bench", "engine", "--json", str(out), "--prompts", "2", "--group-size", "2",
               "--max-new-tokens", "4", "--repeats", "1", "--no-hf-step", "--checkpoint", str(tiny_checkpoint),
               "--gsm8k-prompts", "0"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["gsm8k"] == {"skipped": "bench.gsm8k_prompts=0"}
    for key in ("tokens_per_s", "hf_generate_tokens_per_s", "speedup_vs_hf_generate", "greedy_identical",
                "hf_generate_dedup_tokens_per_s", "speedup_vs_hf_generate_dedup"):
        assert key in r
    assert r["greedy_identical"] is True and r["greedy"]["greedy_identical_hf_dedup"] is True
    rows = load_profile(r["tpot_profile"])
    assert rows and {"batch_size", "context", "s_per_iter"} <= rows[0].keys()
    assert build_parser().parse_args(["bench", "prefill", "--json", "x.json"]).func.__name__ == "_prefill"


def test_bench_engine_runs_the_chosen_engines_and_says_why_vllm_was_skipped(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    import rlhfless.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: "no vLLM in this test")
    out = tmp_path / "engine.json"
    rc = main(["bench", "engine", "--json", str(out), "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4",
               "--repeats", "1", "--engines", "own,vllm", "--checkpoint", str(tiny_checkpoint),
               "--gsm8k-prompts", "2", "--gsm8k-max-new-tokens", "3"])
    assert rc == 0
    r, printed = json.loads(out.read_text()), capsys.readouterr().out
    assert r["vllm"] == {"skipped": "no vLLM in this test"}
    g = r["gsm8k"]
    if "skipped" in g:
        assert "GSM8K file not found" in g["skipped"] and not os.environ.get("RLHFLESS_REQUIRE_SHARED")
    else:  # the second workload: long few-shot prompts on a model whose context holds them
        assert g["prompts"] == 2 and g["prompt_tokens_mean"] > 500 and g["vllm"] == {"skipped": "no vLLM in this test"}
        assert set(g["sampled"]["tokens_per_s_by_engine"]) == {"own"}
        assert "gsm8k workload: random-init" in printed
    assert "vllm: skipped: no vLLM in this test" in printed
    assert set(r["sampled"]["tokens_per_s_by_engine"]) == {"own"} and "hf_generate_tokens_per_s" not in r
    for bad in ("hf", "own,foo"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "engine", "--json", "x.json", "--engines", bad])


def test_cli_docstring_lists_only_commands_that_exist():
    import re

    import rlhfless.cli as cli

    def choices(parser):
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        return action.choices

    top = choices(build_parser())
    listed = re.findall(r"`([a-z0-9-]+)(?: ([a-z0-9|-]+))?`", cli.__doc__.split("dispatcher:")[1].split("Heavy")[0])
    assert {name for name, _ in listed} == set(top)  # every command, and nothing that does not exist
    for name, subs in listed:
        if subs:
            assert set(subs.split("|")) == set(choices(top[name])), name


def test_bench_loop_runs_both_arms_on_the_same_prompts_and_finds_identical_curves(tmp_path, capsys):
    out = tmp_path / "loop.json"
    rc = main(["bench", "loop", "--feature", "dedup_prefill", "--steps", "3", "--threads", "1", "--no-progress",
               "--json", str(out), "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=24",
               "train.eval_prompts=0", "tracking.mode=disabled"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["identical_lengths"] and r["identical_rewards"] and len(r["reward_curve_on"]) == 3
    assert r["step_time_ratio_off_over_on"] > 0 and "rollout" in r["stage_ratio_off_over_on"]
    assert "s on vs" in capsys.readouterr().out


def test_bench_engine_says_what_runs_and_shows_progress_per_workload_and_arm(tmp_path, tiny_checkpoint, capsys):
    from rlhfless.runtime.config import available_cores

    gsm = tmp_path / "gsm.jsonl"  # a tiny GSM8K-format file: the second workload runs without ../shared
    gsm.write_text("".join(json.dumps({"question": f"Tom has {i} apples and buys {i + 1}. How many?",
                                       "answer": f"{i}+{i + 1}={2 * i + 1}\n#### {2 * i + 1}"}) + "\n"
                           for i in range(8)))
    args = ["bench", "engine", "--json", str(tmp_path / "engine.json"), "--prompts", "2", "--group-size", "2",
            "--max-new-tokens", "4", "--repeats", "2", "--no-hf-step", "--checkpoint", str(tiny_checkpoint),
            "--gsm8k", str(gsm), "--gsm8k-prompts", "1", "--gsm8k-max-new-tokens", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    plan = err.splitlines()[:2]  # printed before the first call
    assert plan[0].startswith("bench engine: workloads arith (B=2 x G=2, cap 4 tokens); gsm8k (B=1 x G=2, cap 2")
    assert "arms own, hf generate, hf generate+dedup;" in plan[0] and "2 repeat(s)" in plan[0]
    assert f"{available_cores()} thread(s)" in plan[0]  # the default: every core this process may use
    assert plan[1].startswith("bench engine: roughly ") and "of compute" in plan[1]
    for label in ("arith/greedy own 1/2", "arith/sampled hf generate 2/2", "gsm8k/greedy hf generate+dedup 1/2",
                  "gsm8k/sampled own 2/2"):
        assert label in err, label
    assert "100%" in err  # the bar's estimated seconds add up to its total
    assert json.loads((tmp_path / "engine.json").read_text())["threads"] == available_cores()

    assert main(args + ["--no-progress", "--gsm8k-prompts", "0", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert "gsm8k skipped (--gsm8k-prompts 0)" in err and "1 thread(s)" in err and "arith/greedy own" not in err


def test_bench_engine_estimate_grows_with_the_work_and_shrinks_with_threads(tmp_path):
    from rlhfless.bench.engine_bench import EngineBenchConfig
    from rlhfless.bench.engineprogress import engine_workloads, total_estimate_s

    base = dict(gsm8k_path=str(tmp_path / "absent.jsonl"), threads=1)
    one = total_estimate_s(EngineBenchConfig(**base))
    assert total_estimate_s(EngineBenchConfig(**{**base, "repeats": 6})) == pytest.approx(2 * one)
    assert total_estimate_s(EngineBenchConfig(**{**base, "prompts": 64})) == pytest.approx(2 * one)
    assert total_estimate_s(EngineBenchConfig(**{**base, "threads": 2})) < one
    assert total_estimate_s(EngineBenchConfig(**{**base, "engines": ("own",)})) < one / 3
    runs, skipped = engine_workloads(EngineBenchConfig(**base))
    assert [w.name for w in runs] == ["arith"] and skipped["gsm8k"].startswith("no file at ")


def test_bench_engine_progress_counts_the_vllm_start_and_warm_up(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    """With the vLLM arm on (a stand-in engine here: the own engine behind vLLM's interface), the bar still adds up
    to its total and names the untimed start and warm-up calls."""
    import rlhfless.bench.engine_bench as bench
    import rlhfless.rollout.vllm_engine as vllm_engine
    from rlhfless.rollout.engine import generate

    class StandIn:
        def __init__(self, model):
            self.model = model

        def generate(self, prompts, G, sp, seed):
            out = generate(self.model, prompts, G, sp, seed=seed)
            out.prefix_cache = {"hits": 0, "queries": 0}
            return out

        def prefix_cache_stats(self):
            return {"hits": 0, "queries": 0}

        def close(self):
            pass

    def start(cfg, model, report, checkpoint):
        report["vllm"] = {"start_s": 0.0, "version": "stand-in"}
        return StandIn(model)

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: None)
    monkeypatch.setattr(bench, "_start_vllm", start)
    rc = main(["bench", "engine", "--json", str(tmp_path / "engine.json"), "--prompts", "2", "--group-size", "2",
               "--max-new-tokens", "4", "--repeats", "1", "--engines", "own,vllm", "--checkpoint",
               str(tiny_checkpoint), "--gsm8k-prompts", "0", "--threads", "1"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "arms own, vllm;" in err and "arith starting vLLM" in err and "arith greedy vllm warm-up" in err
    assert "arith/sampled vllm 1/1" in err and "100%" in err
