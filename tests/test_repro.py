"""`rlhfless repro`: the report's math (ablation gains, prefill savings, between-epoch changes) against hand
computations, the CLI's errors, and a real run of two studies into one folder (figures, report, W&B runs)."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from rlhfless.cli import main
from rlhfless.predictor.data import LengthRow
from rlhfless.repro import cli as repro_cli
from rlhfless.repro import studies
from rlhfless.repro.real_studies import epoch_diffs, random_prompts, saving_row
from rlhfless.repro.records import PaperRow, StudyResult, config_hash
from rlhfless.repro.sim_studies import LADDER, ablation_steps

PNG = b"\x89PNG\r\n\x1a\n"


def test_ablation_gains_are_relative_to_the_rung_before():
    # verl-paper, verl (tuned engine), serverless-verl, +dedup, +assign, +scale, +migrate, +prewarm, +overlap,
    # +hybrid, +sized learner, +wide actor, +draws, oracle
    times = dict(zip(LADDER, [14.0, 10.0, 12.0, 11.0, 11.0, 10.0, 8.0, 7.0, 6.0, 5.8, 5.8, 5.5, 5.4, 5.0],
                     strict=True))
    costs = dict(zip(LADDER, [140.0, 100.0, 80.0, 60.0, 30.0, 30.0, 27.0, 26.0, 27.0, 26.0, 24.0, 24.0, 23.0, 20.0],
                     strict=True))
    case = {"policies": {k: {"step_time_s": times[k], "cost_device_s": costs[k]} for k in LADDER}}
    rows = {r["rung"]: r for r in ablation_steps(case)}
    assert [r["rung"] for r in ablation_steps(case)][:3] == ["paper verl", "tuned engine", "serverless"]
    assert rows["tuned engine"]["time_gain"] == pytest.approx(1 - 10 / 14)  # the baseline settings alone
    assert rows["serverless"]["cost_gain"] == pytest.approx(1 - 80 / 100)  # against the tuned engine's verl
    assert rows["+assign"]["cost_gain"] == pytest.approx(1 - 30 / 60)
    assert rows["+migrate"]["time_gain"] == pytest.approx(1 - 8 / 10)
    assert rows["+overlap"]["time_gain"] == pytest.approx(1 - 6 / 7)
    assert rows["+hybrid"]["time_gain"] == pytest.approx(1 - 5.8 / 6)
    assert rows["+sized learner"]["cost_gain"] == pytest.approx(1 - 24 / 26)
    assert rows["+wide actor"]["time_gain"] == pytest.approx(1 - 5.5 / 5.8)
    assert rows["+draws"]["cost_gain"] == pytest.approx(1 - 23 / 24)
    assert "cost_gain" not in rows["paper verl"] and "cost_gain" not in rows["oracle"]  # the ends are references


def test_prefill_saving_measured_from_seconds_theoretical_from_tokens():
    t = {"naive": {"t_s": 2.0, "computed": 300}, "dedup": {"t_s": 1.5, "computed": 100}}
    assert saving_row(t, "naive", "dedup") == {"measured": pytest.approx(0.25), "theoretical": pytest.approx(2 / 3)}


def test_random_prompts_share_exactly_the_prefix():
    ps = random_prompts(4, 10, 5, seed=1)
    assert all(len(p) == 16 for p in ps)
    assert len({tuple(p[:11]) for p in ps}) == 1 and len({tuple(p[11:]) for p in ps}) == 4
    assert random_prompts(4, 10, 5, seed=1) == ps


def test_epoch_diffs_compare_each_prompts_mean_across_consecutive_epochs():
    rows = [LengthRow("a", "", n, epoch=e) for n, e in ((10, 0), (20, 0), (40, 1), (44, 2))] + \
        [LengthRow("b", "", 7, epoch=0)]  # b has one epoch: no change to report
    assert sorted(epoch_diffs(rows)) == [pytest.approx(4.0), pytest.approx(25.0)]


def test_records_reject_an_unknown_kind_and_hash_configs_stably():
    with pytest.raises(ValueError, match="kind"):
        PaperRow("m", "1", "2", "guessed", "why")
    assert config_hash({"a": 1, "b": [2]}) == config_hash({"b": [2], "a": 1}) != config_hash({"a": 2, "b": [2]})


def test_cli_errors_name_the_problem(capsys):
    assert main(["repro", "nope", "--out", "x"]) == 2
    assert "unknown nope; choose from headline" in capsys.readouterr().err
    assert main(["repro", "ablation"]) == 2
    assert "--out DIR" in capsys.readouterr().err
    assert main(["repro", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in studies.STUDIES)


def test_chosen_keeps_registry_order():
    assert repro_cli.chosen(["predictor", "headline"]) == ["headline", "predictor"]
    assert repro_cli.chosen([]) == list(studies.STUDIES)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """ablation, then predictor in a second command into the same folder (the report keeps both)."""
    out = tmp_path_factory.mktemp("repro")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("WANDB_MODE", raising=False)  # the suite disables W&B; these runs must write offline files
        assert main(["repro", "ablation", "--out", str(out), "--quick"]) == 0
        assert main(["repro", "predictor", "--out", str(out), "--quick"]) == 0
    return out


def test_a_second_command_adds_its_study_to_the_same_report(two_runs):
    data = json.loads((two_runs / "results.json").read_text())
    assert list(data["studies"]) == ["ablation", "predictor"] and data["quick"] is True
    report = (two_runs / "report.md").read_text()
    for name, st in data["studies"].items():
        assert f"`rlhfless repro {name} --out {two_runs} --quick`" in report
        assert st["config_hash"] in report
        for fig in st["figures"]:
            assert (two_runs / fig).read_bytes().startswith(PNG) and f"]({fig})" in report
        for row in st["rows"]:
            assert f"| {name} | {row['metric']} | {row['paper']} |" in report
    assert "| ablation | largest cost gain | prompt assignment |" in report
    assert (two_runs / "ablation" / "ladder.png").read_bytes().startswith(PNG)
    assert (two_runs / "ablation" / "shapley.png").read_bytes().startswith(PNG)
    assert "| ablation | where the gain comes from, " in report and "(Shapley, order-independent)" in report
    ladders = json.loads((two_runs / "ablation" / "waterfall.json").read_text())
    assert len(ladders) == 2 and all([r["policy"] for r in rows] == list(LADDER) for rows in ladders.values())


def test_each_study_is_a_wandb_run_grouped_by_study_with_its_table_and_artifact(two_runs):
    from rlhfless.run.tracking import read_offline_run

    for name in ("ablation", "predictor"):
        (run_dir,) = glob.glob(str(two_runs / name / "wandb" / "offline-run-*"))
        run = read_offline_run(run_dir)
        assert (run.group, run.job_type) == (name, "repro")
        rows = json.loads((two_runs / "results.json").read_text())["studies"][name]["rows"]
        assert run.table("paper_vs_ours", 0)["data"] == [[name, r["metric"], r["paper"], r["ours"],
                                                          r["ours_tuned"], r["kind"], r["why"]] for r in rows]
        (art,) = [a for a in run.artifacts if a["name"] == f"repro-{name}"]
        assert f"{name}/numbers.json" in art["paths"] and any(p.endswith(".png") for p in art["paths"])


def test_a_failing_study_is_reported_and_the_others_still_land(tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("boom")

    monkeypatch.setitem(studies.STUDIES, "headline", studies.Study("headline", broken, "sim", "broken"))
    assert main(["repro", "headline", "predictor", "--out", str(tmp_path), "--quick", "--tracking", "disabled"]) == 1
    assert "RuntimeError: boom" in (tmp_path / "headline" / "error.txt").read_text()
    assert list(json.loads((tmp_path / "results.json").read_text())["studies"]) == ["predictor"]


def test_study_results_need_figures_under_the_output_folder(tmp_path):
    r = StudyResult("x", "t", {}, figures=[tmp_path / "x" / "a.png"])
    from rlhfless.repro.report import study_json

    assert study_json(r, tmp_path)["figures"] == ["x/a.png"]
    assert isinstance(Path(study_json(r, tmp_path)["figures"][0]), Path)


def test_the_comparison_run_is_reused_only_for_the_same_config():
    """The timeline and sim-vs-real studies share one comparison run per repro folder; an edited comparison
    config must run again (a stale run from the old config was reported once)."""
    from rlhfless.config import load_run_config
    from rlhfless.repro.real_studies import COMPARE_CONFIG, config_key

    a = load_run_config(str(COMPARE_CONFIG), ["train.steps=6"])
    assert config_key(a) == config_key(load_run_config(str(COMPARE_CONFIG), ["train.steps=6"]))
    assert config_key(a) != config_key(load_run_config(str(COMPARE_CONFIG), ["train.steps=6", "runtime.keep_alive_s=0"]))


def test_the_sensitivity_study_names_a_non_monotone_response_with_the_scalers_actors():
    """Issue 31 item 10: a constant whose halving and doubling both lower the cost cut is named with RLHFless's
    decode actors at each end (the old 70B storage_gbps response: 5.6% / 8.3% / 7.7%, actors 5.2 / 5.3 / 6.0);
    a one-way response is not named."""
    import pandas as pd

    from rlhfless.repro.sim_studies import _non_monotone_row

    def rows(key, cuts, actors):
        return [{"case": "llama-70b/grpo", "constant": key, "factor": f, "baseline": "paper", "cost_reduction": c,
                 "base_cost_reduction": cuts[1], "actors": a, "base_actors": actors[1],
                 "rlhfless_device_s": r, "verl_paper_device_s": 9488, "base_rlhfless_device_s": 8700,
                 "base_verl_paper_device_s": 9488}
                for f, c, a, r in ((0.5, cuts[0], actors[0], 8955), (2.0, cuts[2], actors[2], 8756))]

    df = pd.DataFrame(rows("storage_gbps", (0.056, 0.083, 0.077), (5.2, 5.3, 6.0))
                      + rows("engine_init_s", (0.09, 0.083, 0.07), (5.3, 5.3, 5.3)))
    row = _non_monotone_row(df)
    assert "storage_gbps: cost cut 5.6% / 8.3% / 7.7%" in row.ours and "5.2 / 5.3 / 6.0" in row.ours
    assert "device-s RLHFless 8,955 / 8,700 / 8,756 (not one way), paper verl 9,488 / 9,488 / 9,488 (one way)" \
        in row.ours
    assert "engine_init_s" not in row.ours and "unchanged" not in row.ours
    one_way = _non_monotone_row(pd.DataFrame(rows("engine_init_s", (0.09, 0.083, 0.07), (5.3, 5.3, 5.3))))
    assert one_way.ours.startswith("none")
