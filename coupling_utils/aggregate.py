"""From coupling matrices and tiles to tidy tables, per-model scalars and fits.

The chart builders in :mod:`coupling_utils.plots` take tidy long DataFrames; this module makes
them (:func:`matrix_frame`, :func:`tile_frame`), condenses a coupling matrix into one number
per model (:func:`coupling_scalar`; the paper's aggregation is not published, so the
candidates are parameters), and fits the ordinary least-squares lines of the paper's
correlation plots (:func:`ols_fit`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from .metric import check_k, coupling_tile, svd

__all__ = ["matrix_frame", "tile_frame", "coupling_tiles", "coupling_scalar", "strength",
           "ols_fit", "SCALAR_METHODS"]

SCALAR_METHODS = ("offdiag", "adjacent")


def _as_matrix(M, name: str = "M") -> np.ndarray:
    if isinstance(M, torch.Tensor):
        M = M.detach().cpu().double().numpy()
    M = np.asarray(M, dtype=float)
    if M.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {M.shape}")
    return M


def strength(m):
    """``1 − m²``: the paper's display of a coupling value (1 = coupled, about 0 = unrelated)."""
    out = 1 - np.square(np.asarray(m, dtype=float))
    return float(out) if out.ndim == 0 else out


def matrix_frame(M, labels_i: Sequence | None = None, labels_j: Sequence | None = None, *,
                 names: tuple[str, str] = ("layer_i", "layer_j"), value: str = "value") -> pd.DataFrame:
    """A matrix ``M[i, j]`` (tensor or array) as a long table (names[0], names[1], value).

    ``labels_i`` / ``labels_j`` name the rows and columns (default 0..N-1; for a square
    matrix ``labels_j`` defaults to ``labels_i``), e.g. the layer indices of a window.
    """
    M = _as_matrix(M)
    n_i, n_j = M.shape
    labels_i = np.arange(n_i) if labels_i is None else np.asarray(labels_i)
    if labels_j is None:  # a square matrix compares a set of things with itself
        labels_j = labels_i if n_i == n_j else np.arange(n_j)
    labels_j = np.asarray(labels_j)
    if len(labels_i) != n_i or len(labels_j) != n_j:
        raise ValueError(f"labels must match the matrix shape {M.shape}, got "
                         f"{len(labels_i)} row and {len(labels_j)} column labels")
    return pd.DataFrame({names[0]: np.repeat(labels_i, n_j), names[1]: np.tile(labels_j, n_i),
                         value: M.reshape(-1)})


def coupling_tiles(Js, k: int, *, orientation: str = "ujv") -> torch.Tensor:
    """All K×K tiles ``|U_{j,K}ᵀ J_i V_{j,K}|`` of a stack ``Js[N, d, d]`` -> ``Tensor[N, N, K, K]``.

    ``tiles[i, j]`` is J_i seen in J_j's top-K singular bases: diagonal (≈ S_i) when coupled.
    """
    if not isinstance(Js, torch.Tensor):
        Js = torch.stack([torch.as_tensor(J) for J in Js])
    if Js.ndim != 3:
        raise ValueError(f"Js must be a stack [N, d, d], got shape {tuple(Js.shape)}")
    k = check_k(k, min(Js.shape[-2:]))
    s = svd(Js)
    n = Js.shape[0]
    rows = [torch.stack([coupling_tile(Js[i], type(s)(s.U[j], s.S[j], s.Vh[j]), k,
                                       orientation=orientation) for j in range(n)])
            for i in range(n)]
    return torch.stack(rows)


def tile_frame(tiles, layers: Sequence | None = None) -> pd.DataFrame:
    """Tiles ``[N, N, K, K]`` (see :func:`coupling_tiles`) as a long table.

    Columns: layer_i (the Jacobian), layer_j (whose singular vectors), row, col, value.
    ``layers`` labels the N Jacobians (default 0..N-1).
    """
    if isinstance(tiles, torch.Tensor):
        tiles = tiles.detach().cpu().double().numpy()
    tiles = np.asarray(tiles, dtype=float)
    if tiles.ndim != 4 or tiles.shape[0] != tiles.shape[1] or tiles.shape[2] != tiles.shape[3]:
        raise ValueError(f"tiles must have shape [N, N, K, K], got {tiles.shape}")
    n, _, k, _ = tiles.shape
    layers = np.arange(n) if layers is None else np.asarray(layers)
    if len(layers) != n:
        raise ValueError(f"layers has {len(layers)} labels for {n} Jacobians")
    ii, jj, rr, cc = np.meshgrid(np.arange(n), np.arange(n), np.arange(k), np.arange(k), indexing="ij")
    return pd.DataFrame({"layer_i": layers[ii.reshape(-1)], "layer_j": layers[jj.reshape(-1)],
                         "row": rr.reshape(-1), "col": cc.reshape(-1), "value": tiles.reshape(-1)})


def coupling_scalar(M, how: str = "offdiag", *, as_strength: bool = True) -> float:
    """One number for a coupling matrix ``M[i, j] = m_K(J_i, J_j)`` (e.g. depth-wise).

    The paper's per-model aggregation is not published; the candidates (a parameter):
    ``"offdiag"`` averages over all pairs i ≠ j, ``"adjacent"`` over neighbours |i − j| = 1.
    With ``as_strength`` (default) it averages ``1 − m²`` (higher = more coupled), the
    quantity the authors plot; otherwise ``m`` itself.
    """
    M = _as_matrix(M)
    if how not in SCALAR_METHODS:
        raise ValueError(f"how must be one of {SCALAR_METHODS}, got {how!r}")
    if M.shape[0] != M.shape[1] or M.shape[0] < 2:
        raise ValueError(f"M must be a square matrix of at least 2×2, got shape {M.shape}")
    if not np.isfinite(M).all():
        raise ValueError("M contains NaN or inf; recompute the coupling matrix")
    i, j = np.indices(M.shape)
    mask = (i != j) if how == "offdiag" else (np.abs(i - j) == 1)
    values = M[mask]
    return float(np.mean(strength(values) if as_strength else values))


def ols_fit(x, y) -> dict:
    """Ordinary least squares ``y ≈ intercept + slope·x``: slope, intercept, r2, p_value, n.

    ``p_value`` is the two-sided t-test of zero slope (n − 2 degrees of freedom), as
    ``scipy.stats.linregress`` reports it.
    """
    from scipy.special import stdtr  # Student t CDF (lighter to import than scipy.stats)

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 3:
        raise ValueError(f"an OLS fit needs at least 3 finite points, got {n}")
    if np.ptp(x) == 0:
        raise ValueError("x is constant; the OLS slope is undefined")
    xc, yc = x - x.mean(), y - y.mean()
    sxx, syy, sxy = float(xc @ xc), float(yc @ yc), float(xc @ yc)
    slope = sxy / sxx
    r2 = 1.0 if syy == 0 else min(1.0, sxy * sxy / (sxx * syy))
    if r2 >= 1.0:
        p_value = 0.0
    else:
        t = np.sqrt(r2 * (n - 2) / (1 - r2))
        p_value = float(2 * stdtr(n - 2, -t))
    return {"slope": float(slope), "intercept": float(y.mean() - slope * x.mean()),
            "r2": float(r2), "p_value": p_value, "n": int(n)}
