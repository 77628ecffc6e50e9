"""Fitted gradient-boosted trees as plain numeric arrays: export from scikit-learn, predict in numpy, check on load.

Why: a learned predictor is a file people share, and unpickling a scikit-learn model runs whatever code the file
holds. A `Forest` is only numbers: it saves to ``.npz`` without object arrays, loads with ``allow_pickle=False``
and predicts without scikit-learn. The rule it keeps: predictions equal the estimator's bit for bit (same node
tests, ``x <= threshold`` with NaN following ``missing_left``; the same float64 sums in the same order; identity
link). `Forest.from_arrays` refuses any other key, dtype or shape, an out-of-range index (children always come
after their parent, so every walk ends) or a non-finite value, with a `DataError` naming the file.
The arrays: docs/internals.md#predictortreespy. Non-goals: categorical splits and multi-output models (refused
at export). Deviation from the paper: none (the paper has no learned predictor).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlhfless.core.errors import DataError

FIELDS = {"baseline": np.float64, "tree_start": np.int64, "feature": np.int64, "threshold": np.float64,
          "left": np.int64, "right": np.int64, "missing_left": np.bool_, "is_leaf": np.bool_, "value": np.float64}
_NODE_FIELDS = ("feature", "threshold", "left", "right", "missing_left", "is_leaf", "value")


@dataclass(frozen=True, eq=False)
class Forest:
    """One boosted-tree regressor as arrays (see the module header for each array's meaning and shape)."""

    baseline: np.ndarray
    tree_start: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    missing_left: np.ndarray
    is_leaf: np.ndarray
    value: np.ndarray

    @property
    def n_trees(self) -> int:
        return len(self.tree_start) - 1

    def predict(self, X: np.ndarray) -> np.ndarray:
        """(n,) predictions for float64 features X of shape (n, n_features); equal to the source estimator's."""
        X = np.asarray(X, dtype=np.float64)
        n, n_trees = X.shape[0], self.n_trees
        node = np.tile(self.tree_start[:-1], n)  # (n * T,) every (row, tree) walk starts at its tree's root
        row_offset = np.repeat(np.arange(n) * X.shape[1], n_trees)
        flat_x = X.ravel()
        children = np.stack([self.right, self.left], axis=1)  # children[i, go_left]
        walking = np.flatnonzero(~self.is_leaf[node])
        for _ in range(int(np.diff(self.tree_start).max(initial=0))):  # a walk visits at most a tree's size
            if walking.size == 0:
                break
            at = node[walking]
            x = flat_x[row_offset[walking] + self.feature[at]]
            go_left = x <= self.threshold[at]  # False for NaN, which follows missing_left instead
            missing = np.isnan(x)
            if missing.any():
                go_left[missing] = self.missing_left[at[missing]]
            at = children[at, go_left.astype(np.intp)]
            node[walking] = at
            walking = walking[~self.is_leaf[at]]  # only walks still at a split go on: work ~ mean depth, not max
        leaf_values = self.value[node].reshape(n, n_trees)
        raw = np.full(n, float(self.baseline))
        for t in range(n_trees):  # sequential, as scikit-learn adds them: the sums are bit-identical
            raw += leaf_values[:, t]
        return raw

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """``{prefix.field: array}`` for `numpy.savez`."""
        return {f"{prefix}.{name}": getattr(self, name) for name in FIELDS}

    @classmethod
    def from_arrays(cls, arrays, prefix: str, n_features: int, where: Path | str) -> Forest:
        """Rebuild and check the forest saved under `prefix`; anything malformed raises `DataError` naming `where`."""
        got = {}
        for name, dtype in FIELDS.items():
            key = f"{prefix}.{name}"
            if key not in arrays:
                raise DataError(f"{where}: array '{key}' is missing")
            a = arrays[key]
            if a.dtype != dtype:
                raise DataError(f"{where}: array '{key}' has dtype {a.dtype}, expected {np.dtype(dtype)}")
            got[name] = a
        forest = cls(**got)
        forest.check(n_features, f"{where}: forest '{prefix}'")
        return forest

    def check(self, n_features: int, where: str) -> None:
        """Shapes, index ranges and finiteness; raises `DataError` starting with `where`."""
        if self.baseline.shape != () or not np.isfinite(self.baseline):
            raise DataError(f"{where}: baseline must be one finite number (shape {self.baseline.shape})")
        ts = self.tree_start
        n = len(self.value)
        if ts.ndim != 1 or len(ts) < 2 or ts[0] != 0 or ts[-1] != n or np.any(np.diff(ts) < 1):
            raise DataError(f"{where}: tree_start must rise from 0 to the node count {n}, one node or more per tree")
        for name in _NODE_FIELDS:
            if getattr(self, name).shape != (n,):
                raise DataError(f"{where}: '{name}' has shape {getattr(self, name).shape}, expected ({n},)")
        if np.any((self.feature < 0) | (self.feature >= n_features)):
            raise DataError(f"{where}: a feature index is outside [0, {n_features})")
        if np.isnan(self.threshold).any() or not np.isfinite(self.value).all():
            raise DataError(f"{where}: a threshold is NaN or a leaf value is not finite")
        self._check_children(where)

    def _check_children(self, where: str) -> None:
        idx = np.arange(len(self.value))
        end = np.repeat(self.tree_start[1:], np.diff(self.tree_start))  # end of each node's tree
        inner = ~self.is_leaf
        for name in ("left", "right"):
            child = getattr(self, name)[inner]
            if np.any((child <= idx[inner]) | (child >= end[inner])):
                raise DataError(f"{where}: a split node's {name} child is not a later node of its own tree")


def from_sklearn(est) -> Forest:
    """Export a fitted `HistGradientBoostingRegressor` (numeric features, identity link) to a `Forest`."""
    link = type(est._loss.link).__name__
    if est.n_trees_per_iteration_ != 1 or link != "IdentityLink" or est._preprocessor is not None:
        raise ValueError(f"from_sklearn: only single-output numeric models with an identity link (got {link})")
    trees = [it[0].nodes for it in est._predictors]
    if any(t["is_categorical"].any() for t in trees):
        raise ValueError("from_sklearn: categorical splits are not supported")
    sizes = [len(t) for t in trees]
    start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    nodes = np.concatenate(trees)
    offset = np.repeat(start[:-1], sizes)
    leaf = nodes["is_leaf"].astype(bool)
    baseline = np.asarray(est._baseline_prediction, dtype=np.float64).reshape(-1)
    return Forest(
        baseline=np.array(baseline[0]),
        tree_start=start,
        feature=np.where(leaf, 0, nodes["feature_idx"]).astype(np.int64),
        threshold=np.where(leaf, 0.0, nodes["num_threshold"]).astype(np.float64),
        left=np.where(leaf, 0, nodes["left"].astype(np.int64) + offset),
        right=np.where(leaf, 0, nodes["right"].astype(np.int64) + offset),
        missing_left=nodes["missing_go_to_left"].astype(bool),
        is_leaf=leaf,
        value=nodes["value"].astype(np.float64),
    )
