"""From coupling matrices and tiles to tidy tables.

The chart builders in :mod:`coupling_utils.analysis.plots` take tidy long DataFrames; this module makes
them (:func:`matrix_frame`, :func:`tile_frame`). The per-model scalar is
:func:`coupling_utils.measurement.coupling_summary`; fits are :func:`coupling_utils.analysis.stats.ols`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from coupling_utils.engine.metric import check_k, coupling, coupling_tile, svd

__all__ = ["matrix_frame", "tile_frame", "coupling_tiles", "strength", "random_reference", "tile_cases"]


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


def matrix_frame(
    M,
    labels_i: Sequence | None = None,
    labels_j: Sequence | None = None,
    *,
    names: tuple[str, str] = ("layer_i", "layer_j"),
    value: str = "value",
) -> pd.DataFrame:
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
        raise ValueError(
            f"labels must match the matrix shape {M.shape}, got "
            f"{len(labels_i)} row and {len(labels_j)} column labels"
        )
    return pd.DataFrame(
        {names[0]: np.repeat(labels_i, n_j), names[1]: np.tile(labels_j, n_i), value: M.reshape(-1)}
    )


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
    rows = [
        torch.stack(
            [
                coupling_tile(Js[i], type(s)(s.U[j], s.S[j], s.Vh[j]), k, orientation=orientation)
                for j in range(n)
            ]
        )
        for i in range(n)
    ]
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
    return pd.DataFrame(
        {
            "layer_i": layers[ii.reshape(-1)],
            "layer_j": layers[jj.reshape(-1)],
            "row": rr.reshape(-1),
            "col": cc.reshape(-1),
            "value": tiles.reshape(-1),
        }
    )


def random_reference(J, *, seed: int = 0) -> torch.Tensor:
    """A Gaussian matrix shaped like ``J`` with J's Frobenius norm in expectation: an unrelated basis.

    ``R = G · ‖J‖_F / √(numel)`` with ``G`` standard normal drawn on the CPU from ``seed`` (the
    same matrix whatever the device), then moved to J's device, in J's dtype (at least fp32).
    f00 compares a Jacobian's coupling to its neighbour with its coupling to this matrix.
    """
    J = torch.as_tensor(J).detach()
    if J.ndim != 2:
        raise ValueError(f"J must be a matrix [d_out, d_in], got shape {tuple(J.shape)}")
    dtype = torch.promote_types(J.dtype, torch.float32) if J.is_floating_point() else torch.float64
    scale = float(torch.linalg.svdvals(J.to(dtype)).norm()) / J.numel() ** 0.5
    G = torch.randn(tuple(J.shape), generator=torch.Generator().manual_seed(int(seed)), dtype=dtype)
    return (G * scale).to(J.device)


def tile_cases(cases: Mapping[str, tuple], k: int) -> tuple[pd.DataFrame, pd.Series]:
    """Tiles ``|U_{B,K}ᵀ A V_{B,K}|`` and ``m_K(A, B)`` of named pairs ``{case: (A, B)}``, on the host.

    Returns ``(tiles, m_K)``: a long table (case, row, col, value) of every K×K tile, and the
    coupling of each pair as a Series indexed by case. A and B may live on any device (the same
    one); the tables are built from host copies.
    """
    frames, values = [], {}
    rows, cols = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    for name, (A, B) in cases.items():
        tile = coupling_tile(A, B, k).detach().cpu().double().numpy()  # [K, K]
        frames.append(
            pd.DataFrame({"case": name, "row": rows.ravel(), "col": cols.ravel(), "value": tile.ravel()})
        )
        values[name] = coupling(A, B, k)
    return pd.concat(frames, ignore_index=True), pd.Series(values, name="m_K")
