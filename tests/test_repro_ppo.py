"""`rlhfless repro ppo-vs-grpo`: the study's gains, verdict and stage split against hand computations, its
what-ifs against the testbed scenario, and a quick run through the CLI (simulated cases, two real inline runs,
the figure and the report's rows)."""

from __future__ import annotations

import json

import pytest

from rlhfless.cli import main
from rlhfless.repro import algo_study as A

PNG = b"\x89PNG\r\n\x1a\n"


def _case(algo: str, G: int, speedup: float, cost_reduction: float, step: float = 10.0, score: float = 1.0,
          update: float = 1.0) -> dict:
    pol = {"step_time_s": step, "rollout_s": step - score - update, "score_s": score, "update_s": update,
           "cost_device_s": 100.0}
    return {"algo": algo, "G": G, "policies": {p: dict(pol) for p in A.SIM_POLICIES},
            "baselines": {b: {"speedup": speedup, "cost_reduction": cost_reduction} for b in ("paper", "tuned")}}


def test_gains_are_means_over_cases_and_the_verdict_names_each_metric():
    grpo = [_case("grpo", 8, 1.2, 0.30), _case("grpo", 8, 1.4, 0.10)]
    ppo = [_case("ppo", 1, 1.5, 0.10), _case("ppo", 1, 1.5, 0.12)]
    assert A.mean_gain(grpo, "paper", "speedup") == pytest.approx(1.3)
    assert A.mean_gain(ppo, "tuned", "cost_reduction") == pytest.approx(0.11)
    assert A.verdict(grpo, ppo, "paper") == ("GRPO 1.30x / 20.0%, PPO 1.50x / 11.0% "
                                             "(speed: PPO gains more; cost: GRPO gains more)")
    ppo_alike = [_case("ppo", 1, 1.3 + A.TIE / 2, 0.20 - A.TIE / 2)]
    assert A.verdict(grpo, ppo_alike, "paper").endswith("(speed: alike; cost: alike)")


def test_after_rollout_share_is_score_plus_update_over_the_step():
    cases = [_case("ppo", 1, 1, 0, step=10.0, score=1.0, update=2.0), _case("ppo", 1, 1, 0, step=4.0, score=0.0,
                                                                              update=1.0)]
    assert A.after_rollout_share(cases) == pytest.approx((0.3 + 0.25) / 2)
    assert A.mean_stage(cases, "verl", "update_s") == pytest.approx(1.5)


def test_step_split_totals_only_step_rows(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.5},
            {"step": 1, "timing_s/step": 2.0, "timing_s/rollout": 0.5, "timing_s/values": 0.25,
             "timing_s/update": 1.0, "response_length/mean": 40.0},
            {"step": 2, "timing_s/step": 3.0, "timing_s/rollout": 1.5, "timing_s/values": 0.25,
             "timing_s/update": 1.0, "response_length/mean": 60.0, "actor/groups_skipped_frac": 0.5}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = A.step_split(path, seqs_per_step=4)
    assert (s["steps"], s["sequences"], s["tokens"]) == (2, 8, pytest.approx(400.0))
    assert s["after_rollout_share"] == pytest.approx(1 - 2.0 / 5.0)
    assert s["groups_skipped"] == pytest.approx(0.25)  # a step without the metric skipped none
    assert s["ms_per_token"] == {"rollout": pytest.approx(5.0), "values": pytest.approx(1.25),
                                 "update": pytest.approx(5.0), "step": pytest.approx(12.5)}


@pytest.mark.parametrize("quick", [True, False])
def test_real_runs_generate_the_same_number_of_sequences(quick):
    sizes = A.real_sizes(quick)
    assert sizes["ppo"]["G"] == 1 and sizes["grpo"]["G"] == 8
    seqs = {a: s["steps"] * s["prompts"] * s["G"] for a, s in sizes.items()}
    assert seqs["ppo"] == seqs["grpo"]


def test_what_ifs_swap_samples_per_prompt_and_keep_sequences_and_epochs():
    from rlhfless.sim.scenario import case_configs

    base = case_configs("paper-testbed", 2, [])
    for i, c in enumerate(base):
        w = case_configs("paper-testbed", 2, A.WHAT_IFS[c.algo])[i]
        assert (w.algo, w.model) == (c.algo, c.model)
        assert w.group_size == (8 if c.algo == "ppo" else 1) != c.group_size
        assert w.prompts_per_step * w.group_size == c.prompts_per_step * c.group_size
        assert w.n_prompts // w.prompts_per_step == c.n_prompts // c.prompts_per_step


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro_ppo")
    assert main(["repro", "ppo-vs-grpo", "--out", str(out), "--quick", "--tracking", "disabled"]) == 0
    return out


def test_quick_study_lands_its_figure_rows_and_both_real_runs(quick_run):
    st = json.loads((quick_run / "results.json").read_text())["studies"]["ppo-vs-grpo"]
    assert st["figures"] == ["ppo-vs-grpo/ppo_vs_grpo.png"]
    assert (quick_run / st["figures"][0]).read_bytes().startswith(PNG)
    assert [r["kind"] for r in st["rows"]] == ["simulated", "measured", "measured"]
    report = (quick_run / "report.md").read_text()
    assert "| ppo-vs-grpo | GRPO gains more than PPO" in report
    cases = st["numbers"]["cases"]
    assert sorted((c["algo"], c["G"], c["what_if"]) for c in cases) == sorted(
        [("grpo", 8, False), ("ppo", 1, False), ("grpo", 1, True), ("ppo", 8, True)] * 2)
    measured = st["numbers"]["measured"]
    assert measured["ppo"]["sequences"] == measured["grpo"]["sequences"] == 64
    assert measured["ppo"]["values_s"] > 0 and measured["grpo"]["values_s"] == 0  # only PPO has a critic
    for algo in ("ppo", "grpo"):
        run = quick_run / "ppo-vs-grpo" / "runs" / f"{algo}-quick-seed0"
        assert json.loads((run / "summary.json").read_text())["steps"] == A.real_sizes(True)[algo]["steps"]
    # the runtime half: each algorithm in both modes on the same samples, the ratios from the two summaries
    runtime = st["numbers"]["runtime"]
    for algo in ("ppo", "grpo"):
        g = runtime[algo]
        assert g["samples_identical"] and g["steps"] == A.real_sizes(True)[algo]["steps"]
        assert g["step_time_ratio"] == pytest.approx(g["serverless_step_s"] / g["serverful_step_s"])
        modes = {m: json.loads((quick_run / "ppo-vs-grpo" / "runs" / f"{algo}-{m}-quick-seed0" / "summary.json")
                               .read_text())["runtime"]["mode"] for m in A.MODES}
        assert modes == {m: m for m in A.MODES}
    assert st["rows"][2]["ours"].startswith("serverless / serverful")
