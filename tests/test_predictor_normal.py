"""`predictor.normal.ndtri` is `scipy.special.ndtri` bit for bit (the simulator's drawn outcomes and quantiles
depend on every bit of it), on each branch of the algorithm and at the branches' boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtri as scipy_ndtri

from rlhfless.predictor.normal import ndtri, ndtri_level

EXP_M2, EXP_M32 = 0.13533528323661269189, np.exp(-32.0)


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("name", ["uniform", "lower tail", "upper tail", "far tail", "far upper tail"])
def test_equal_to_scipy_bit_for_bit_on_each_branch(name):
    rng = np.random.default_rng(list(b"ndtri") + [len(name)])
    u = {"uniform": lambda: rng.random(1_000_000),
         "lower tail": lambda: rng.random(500_000) * EXP_M2,
         "upper tail": lambda: 1.0 - rng.random(500_000) * EXP_M2,
         "far tail": lambda: np.exp(-32.0 - rng.random(200_000) * 650.0),
         "far upper tail": lambda: 1.0 - np.exp(-rng.random(100_000) * 36.0)}[name]()
    assert np.array_equal(_bits(ndtri(u)), _bits(scipy_ndtri(u)))


def test_equal_to_scipy_at_the_boundaries_and_outside():
    edges = [EXP_M2, 1.0 - EXP_M2, EXP_M32, 0.5, 1e-12, 1.0 - 1e-12, 5e-324, 1e-300]
    near = [np.nextafter(e, d) for e in edges for d in (0.0, 1.0)]
    p = np.array(edges + near + [0.0, 1.0, -0.5, 1.5, np.nan])
    got, want = ndtri(p), scipy_ndtri(p)
    assert np.array_equal(_bits(got[~np.isnan(want)]), _bits(want[~np.isnan(want)]))
    assert np.isnan(got[np.isnan(want)]).all()
    assert ndtri(p[:28].reshape(4, 7)).shape == (4, 7)


@pytest.mark.parametrize("q", [0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
def test_a_level_is_a_float_equal_to_scipy(q):
    assert isinstance(ndtri(q), float) and ndtri(q) == float(scipy_ndtri(q)) == ndtri_level(q)
