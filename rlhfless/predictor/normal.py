"""The standard normal quantile `ndtri(p)`, value for value `scipy.special.ndtri`, without importing scipy.

Why: `scipy.special`'s import (its array-API layer pulls in numpy.ma, numpy.testing and numpy.f2py) cost every
`rlhfless simulate` about 0.2 s of CPU at start-up, for one function the simulator calls on a few thousand
values a step (`predictor.spread`, `predictor.baselines`).

How it stays equal: the same algorithm as scipy's (Cephes `ndtri`, S. L. Moshier 1984-1989, BSD-licensed, which
scipy ships): a rational function of (p - 1/2)^2 in the middle, p in (exp(-2), 1 - exp(-2)]; in the tails,
x = sqrt(-2 log p) and x - log(x)/x less a rational function of 1/x (one fit for x < 8, one beyond). Every step is
one IEEE operation done in the same order on float64: numpy's elementwise +, -, *, / and sqrt are correctly
rounded, as C's are. The logarithms are the C library's (`math.log`, the `log` scipy's C++ calls), not numpy's
(its SIMD log differs from the C library's in the last bit for about 1 value in 4,000 here).
tests/test_predictor_normal.py holds the result equal to `scipy.special.ndtri` bit for bit over a million draws of
each branch and at its boundaries. Deviation from the paper: none (the paper has no quantiles).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_S2PI = 2.50662827463100050242  # sqrt(2 pi)
_EXP_M2 = 0.13533528323661269189  # exp(-2): where the tails begin

# middle: p - 1/2 = y, x / sqrt(2 pi) = y + y^3 P0(y^2) / Q0(y^2) (Q0 monic, its leading 1 implied)
_P0 = (-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
       1.39312609387279679503E1, -1.23916583867381258016E0)
_Q0 = (1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1,
       -2.25462687854119370527E2, 2.00260212380060660359E2, -8.20372256168333339912E1,
       1.59056225126211695515E1, -1.18331621121330003142E0)
# tails, z = 1/x with x = sqrt(-2 log p) in [2, 8)
_P1 = (4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
       4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
       -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4)
_Q1 = (1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1,
       1.50425385692907503408E1, 2.50464946208309415979E0, -1.42182922854787788574E-1,
       -3.80806407691578277194E-2, -9.33259480895457427372E-4)
# far tails, x in [8, 64)
_P2 = (3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
       1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
       3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9)
_Q2 = (6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0,
       2.16236993594496635890E-1, 1.34204006088543189037E-2, 3.28014464682127739104E-4,
       2.89247864745380683936E-6, 6.79019408009981274425E-9)


def _poly(x: np.ndarray, coef: tuple[float, ...]) -> np.ndarray:
    """coef[0] x^n + ... + coef[n] by Horner's rule, one multiply and one add a coefficient."""
    out = np.full_like(x, coef[0])
    for c in coef[1:]:
        out = out * x + c
    return out


def _monic(x: np.ndarray, coef: tuple[float, ...]) -> np.ndarray:
    """x^n + coef[0] x^(n-1) + ... + coef[n-1] (the leading 1 implied), as `_poly` with it."""
    out = x + coef[0]
    for c in coef[1:]:
        out = out * x + c
    return out


def _clog(x: np.ndarray) -> np.ndarray:
    """The C library's natural log of each value (module header: numpy's differs in the last bit)."""
    return np.fromiter(map(math.log, x.tolist()), dtype=np.float64, count=len(x))


def ndtri(p) -> np.ndarray | float:
    """x with Phi(x) = p for each p (a float, or an array of any shape): -inf at 0, inf at 1, nan outside [0, 1],
    as `scipy.special.ndtri` returns them; a float for a scalar p."""
    arr = np.asarray(p, dtype=np.float64)
    y0 = arr.reshape(-1)
    out = np.full(y0.shape, np.nan)
    out[y0 == 0.0] = -np.inf
    out[y0 == 1.0] = np.inf
    inside = (y0 > 0.0) & (y0 < 1.0)
    upper = inside & (y0 > 1.0 - _EXP_M2)
    y = np.where(upper, 1.0 - y0, y0)
    mid = inside & (y > _EXP_M2)
    if mid.any():
        ym = y[mid] - 0.5
        y2 = ym * ym
        out[mid] = (ym + ym * (y2 * _poly(y2, _P0) / _monic(y2, _Q0))) * _S2PI
    tail = inside & ~mid
    if tail.any():
        x = np.sqrt(-2.0 * _clog(y[tail]))
        x0 = x - _clog(x) / x
        z = 1.0 / x
        x1 = z * _poly(z, _P1) / _monic(z, _Q1)
        far = x >= 8.0  # p below exp(-32): none of the simulator's (its levels are clipped at 1e-12)
        if far.any():
            x1[far] = z[far] * _poly(z[far], _P2) / _monic(z[far], _Q2)
        xt = x0 - x1
        out[tail] = np.where(upper[tail], xt, -xt)  # the lower tail is negative
    if arr.ndim == 0:
        return float(out[0])
    return out.reshape(arr.shape)


@lru_cache(maxsize=1024)
def ndtri_level(q: float) -> float:
    """`ndtri` of one level, remembered: a predictor asks the same few quantile levels at every step."""
    return float(ndtri(q))
