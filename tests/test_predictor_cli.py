"""`rlhfless predictor ...` and `rlhfless data ...`: end to end on small files, and user-error messages."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rlhfless.core.errors import ConfigError, DataError, UserError
from rlhfless.predictor import cli
from rlhfless.predictor.commands import (
    compare_predictors,
    eval_predictor,
    synthetic_trace_file,
    train_predictor,
)
from rlhfless.predictor.config import PredictorConfig
from rlhfless.predictor.data import read_lengths


SMALL = ["--set", "n_prompts=24", "--set", "n_epochs=3", "--set", "prompts_per_step=8", "--set", "group_size=4"]


def run(argv: list[str]) -> int:
    """Parse with only this package's commands registered (so other packages cannot break these tests)."""
    parser = argparse.ArgumentParser(prog="rlhfless")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub, sub.add_parser("bench").add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "syn.jsonl"
    assert run(["data", "synthetic-trace", "--out", str(out), "--seed", "2", *SMALL]) == 0
    return out


def test_train_eval_round_trip(tmp_path, trace):
    assert run(["predictor", "train", "--data", str(trace), "--model", "ewma", "--out", str(tmp_path / "m"),
                "--set", "alpha=0.7"]) == 0
    assert json.loads((tmp_path / "m" / "training.json").read_text())["test_epoch"] == 2
    assert run(["predictor", "eval", "--model", str(tmp_path / "m"), "--data", str(trace),
                "--json", str(tmp_path / "e.json")]) == 0
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["predictor"] == "ewma" and out["split"] == "epoch" and out["n_groups"] == 24
    assert out["kendall_tau"] > 0.5 and out["mae"] > 0
    assert out == pytest.approx(eval_predictor(tmp_path / "m", trace))


def test_compare_writes_json_and_figure(tmp_path, trace):
    assert run(["predictor", "compare", "--data", str(trace), "--json", str(tmp_path / "c.json"),
                "--set", "learned_max_iter=10", "--set", "learned_hash_features=8"]) == 0
    out = json.loads((tmp_path / "c.json").read_text())
    assert set(out["predictors"]) == {"ewma", "sibling", "learned", "global_mean", "prompt_length"}
    assert out["predictors"]["global_mean"]["kendall_tau"] is None  # constant prediction: undefined, not NaN
    assert out["best_by_kendall_tau"] in {"ewma", "sibling", "learned"}
    assert set(out["sibling_refinement"]) == {"1", "2", "3"}
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_gsm8k_lengths_command(tmp_path):
    src = tmp_path / "g.jsonl"
    src.write_text(json.dumps({"question": "How many?", "answer": "2 + 2 = 4\n#### 4"}) + "\n")
    assert run(["data", "gsm8k-lengths", "--in", str(src), "--out", str(tmp_path / "l.jsonl")]) == 0
    assert read_lengths(tmp_path / "l.jsonl")[0].response_length == len("2 + 2 = 4\n#### 4") + 1


def test_user_errors(tmp_path, trace):
    with pytest.raises(ConfigError, match="must be one of .*got 'nope'"):
        run(["predictor", "train", "--data", str(trace), "--model", "nope", "--out", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="--models: unknown predictor 'nope'"):
        run(["predictor", "compare", "--data", str(trace), "--json", str(tmp_path / "c.json"), "--models", "ewma,nope"])
    with pytest.raises(DataError, match="no saved predictor"):
        run(["predictor", "eval", "--model", str(tmp_path / "none"), "--data", str(trace)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": "a", "prompt": "x", "response_length": 3}\n{"prompt_id": "a"}\n')
    with pytest.raises(DataError, match="bad.jsonl:2: "):
        run(["predictor", "train", "--data", str(bad), "--model", "ewma", "--out", str(tmp_path / "y")])
    with pytest.raises(ConfigError, match="unknown config key 'synthetic.bogus'"):
        synthetic_trace_file(tmp_path / "s.jsonl", bogus=1)


def test_main_entry_point_reports_user_errors(tmp_path, capsys):
    try:
        from rlhfless.cli import build_parser, main

        build_parser()
    except ImportError as exc:  # another package's CLI is mid-rewrite; this package's own tests cover the rest
        pytest.skip(f"rlhfless.cli not importable: {exc}")
    assert main(["predictor", "train", "--data", str(tmp_path / "missing.jsonl"), "--model", "ewma",
                 "--out", str(tmp_path / "m")]) == 2
    assert "length data file not found" in capsys.readouterr().err
    assert issubclass(DataError, UserError)


@pytest.mark.slow
def test_gsm8k_learned_beats_prompt_length(tmp_path, gsm8k_file):
    """Issue target: on held-out GSM8K prompts, learned beats the prompt-length-only baseline (MAE and tau)."""
    from rlhfless.predictor.data import gsm8k_lengths

    gsm8k_lengths(gsm8k_file, tmp_path / "gsm.jsonl")
    comp = compare_predictors(read_lengths(tmp_path / "gsm.jsonl"), names=("learned", "prompt_length"))
    learned, base = comp.metrics["learned"], comp.metrics["prompt_length"]
    assert learned["mae"] < base["mae"] and learned["kendall_tau"] > base["kendall_tau"]


def test_train_on_all_rows_warns_on_eval(tmp_path, trace, capsys):
    train_predictor(trace, PredictorConfig(name="global_mean"), tmp_path / "g", use_all=True)
    eval_predictor(tmp_path / "g", trace)
    assert "not held out" in capsys.readouterr().err
