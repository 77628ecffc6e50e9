"""The order-independent account (issue 31, item 7): exact Shapley values, checked by hand on tiny games, adding up
to the total on a simulated one, and prose that never names a factor contributing nothing."""

import math

import pytest

from rlhfless.sim.shapley import check_sums, named, prose, shapley


def test_three_player_game_matches_a_hand_computation():
    v = {"": 0, "a": 1, "b": 2, "c": 0, "ab": 4, "ac": 1, "bc": 3, "abc": 6}
    calls = []

    def value(s):
        calls.append(s)
        return v["".join(sorted(s))]

    phi = shapley(["a", "b", "c"], value)
    # by hand: phi_a = 1/3 (1 - 0) + 1/6 (4 - 2) + 1/6 (1 - 0) + 1/3 (6 - 3) = 11/6, and likewise
    assert phi["a"] == pytest.approx(11 / 6) and phi["b"] == pytest.approx(10 / 3) and phi["c"] == pytest.approx(5 / 6)
    assert sum(phi.values()) == pytest.approx(v["abc"] - v[""])
    assert len(calls) == 8 and len(set(calls)) == 8  # each coalition played once


def test_two_player_game_and_a_null_player():
    phi = shapley(["a", "b"], lambda s: {frozenset(): 0, frozenset("a"): 1, frozenset("b"): 3,
                                         frozenset("ab"): 2}[s])
    assert phi == {"a": pytest.approx(0.0), "b": pytest.approx(2.0)}  # (1 + (2 - 3)) / 2, (3 + (2 - 1)) / 2
    # a player that changes no coalition's value gets exactly 0, whatever the others do
    phi = shapley(["a", "b", "z"], lambda s: 5.0 * ("a" in s) + 2.0 * ("a" in s and "b" in s))
    assert phi["z"] == 0.0 and phi["a"] == pytest.approx(6.0) and phi["b"] == pytest.approx(1.0)


def test_prose_names_only_the_factors_that_move_the_result():
    t = {"players": ["paper design", "hybrid", "overlap"], "speedup": 1.2 * 1.1, "cost_reduction": 0.3,
         "speed_factor": {"paper design": 1.2, "hybrid": 1.0, "overlap": 1.1},
         "cost_points": {"paper design": 0.3, "hybrid": 0.0, "overlap": 0.0}}
    assert named(t) == ["paper design", "overlap"]
    text = prose(t, "x")
    assert "hybrid" not in text and "paper design" in text and "overlap" in text
    assert check_sums(t) == (pytest.approx(0.0), pytest.approx(0.0))


def test_simulated_game_terms_add_up_to_the_total():
    from rlhfless.sim.scenario import case_configs, run_case

    cfg = case_configs("quick", 2, ["design=extended", "shapley=true"])[0]
    case = run_case(cfg)
    t = case["shapley"]
    assert t["players"] == ["baseline settings", "paper design", "overlap", "hybrid", "extras"]
    dt, dc = check_sums(t)
    assert dt < 1e-9 and dc < 1e-9
    # the grand coalition is the case's RLHFless, the empty one its headline verl: the totals are the headline's
    assert t["speedup"] == pytest.approx(case["speedup"]) and t["cost_reduction"] == pytest.approx(
        case["cost_reduction"])
    assert len(t["coalitions"]) == 2 ** 5
    assert all(math.isfinite(x) for x in t["speed_factor"].values())
