"""The regime map study (issue 41 item 2): its grid, one condition end to end, the price ratio's arithmetic
against the simulator's own dollars, and the Shapley terms adding up."""

from __future__ import annotations

import math

import pytest

from rlhfless.repro import regimes as rg
from rlhfless.repro.studies import STUDIES


def test_the_full_map_has_200_conditions_and_the_quick_one_a_few():
    full, quick = rg.conditions(False), rg.conditions(True)
    assert len(full) >= 200 and len(quick) <= 20
    assert len({(m, tuple(ov)) for m, _, ov in full}) == len(full)  # no cell twice
    # every axis the issue names is swept
    keys = {k for _, at, _ in full for k in at}
    assert {"lengths.prompt_sigma", "lengths.max_response", "lengths.fit_to", "n_devices", "model",
            "engine_init_s", "container_start_s", "billing.keep_alive_s"} <= keys
    assert STUDIES["regimes"].fn is rg.regimes
    # one map alone (notebook 08 plays cluster x model)
    assert {m for m, _, _ in rg.conditions(False, ("cluster-model",))} == {"cluster-model"}
    assert len(rg.conditions(False, ("cluster-model",))) == len(rg.CLUSTERS) * len(rg.MODELS)
    assert [m for m, _, _ in rg.conditions(True, ("published-fits",))] == ["published-fits"]


@pytest.fixture(scope="module")
def cell():
    return rg._condition(("tail", {"lengths.prompt_sigma": 0.8}, ["lengths.prompt_sigma=0.8"], 2, ()))


def test_the_break_even_price_ratio_is_where_the_simulated_dollars_tie(cell):
    # the dollar cut at the catalog's ratio, from device-seconds alone, is the simulator's own dollar cut, and
    # at the break-even ratio it is zero
    r = rg.catalog_ratio()
    for base in ("paper", "tuned"):
        b = cell[base]
        ours, verl = cell["ours"]["device_s"], b["device_s"]
        assert 1 - r * ours / verl == pytest.approx(b["cost_reduction_usd"], rel=1e-9, abs=1e-9)
        assert 1 - b["break_even_ratio"] * ours / verl == pytest.approx(0.0, abs=1e-12)


def test_the_shapley_terms_make_the_headline_against_the_paper_verl(cell):
    speed = math.prod(cell["shapley_speed"].values())
    assert speed == pytest.approx(cell["paper"]["speedup"], rel=1e-9)
    assert sum(cell["shapley_cost"].values()) == pytest.approx(cell["paper"]["cost_reduction"], abs=1e-9)
    assert set(cell["shapley_speed"]) == {"baseline settings", "paper design"}


def test_regions_split_a_map_by_the_sides_of_the_paper_verl(cell):
    other = {**cell, "at": {"lengths.prompt_sigma": 1.2}, "paper": {**cell["paper"], "speedup": 2.0,
                                                                   "cost_reduction": 0.5}}
    regs = rg.regions([cell, other, {"map": "tail", "at": {}, "error": "does not fit"}])
    assert sorted((r["faster"], r["cheaper"], r["cells"]) for r in regs)[-1] == (True, True, 1)
    assert sum(r["cells"] for r in regs) == 2
    assert rg.holds([cell, other], (1.23, 0.387)) == [
        {"map": "tail", "at": other["at"], "baseline": "paper", "speedup": 2.0, "cost_reduction": 0.5}]


def test_a_map_where_nothing_runs_says_why(tmp_path):
    from rlhfless.core.errors import ConfigError
    from rlhfless.repro.studies import ReproContext

    ctx = ReproContext(out=tmp_path, quick=True, tracking="disabled", sim=("paper_verl.mem_frac=0.01",))
    with pytest.raises(ConfigError, match="^regimes: no condition ran: model: "):
        rg.regimes(ctx)
