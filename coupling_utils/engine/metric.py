"""The paper's coupling metric between two Jacobians, and coupling matrices over many.

    m_K(J1, J2) = ‖ |U_{2,K}ᵀ J1 V_{2,K}| − S_{1,K} ‖_F / ‖ s_{1,K} ‖_p

J1 is "diagonalised" with J2's top-K singular vectors; ``|·|`` is element-wise, which removes
the sign ambiguity of singular pairs. 0 means perfectly coupled, about 1 means unrelated, and
the value never exceeds √2 (for p = 2). Variants from the authors' code: the denominator
``trace(S_{1,K})`` (``normalize="trace"``) and the "vju" orientation ``V_{2,K}ᵀ J1 U_{2,K}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "SVD",
    "svd",
    "coupling",
    "coupling_tile",
    "coupling_matrix",
    "check_k",
    "k_for_width",
    "check_options",
    "bases",
    "tile_metric",
]

NORMALIZATIONS = ("norm", "trace")
ORIENTATIONS = ("ujv", "vju")


class SVD(NamedTuple):
    """A singular value decomposition ``J = U diag(S) Vh`` (columns of U, rows of Vh)."""

    U: torch.Tensor  # [..., d_out, r]
    S: torch.Tensor  # [..., r], descending
    Vh: torch.Tensor  # [..., r, d_in]


MatrixLike = torch.Tensor | np.ndarray


def _as_tensor(J: MatrixLike, name: str) -> torch.Tensor:
    if isinstance(J, np.ndarray):
        J = torch.from_numpy(J)
    if not isinstance(J, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, numpy array or SVD, got {type(J).__name__}")
    if J.ndim < 2:
        raise ValueError(f"{name} must be a matrix (or a stack of matrices), got shape {tuple(J.shape)}")
    J = J.detach()
    if not torch.is_floating_point(J):
        J = J.double()
    if J.dtype in (torch.float16, torch.bfloat16):
        J = J.float()  # the SVD is always taken in fp32 or better
    if not torch.isfinite(J).all():
        raise ValueError(f"{name} contains NaN or inf; the Jacobian it came from is not usable")
    return J


def svd(J: MatrixLike) -> SVD:
    """Full (thin) SVD in fp32 or better of ``J: Tensor  # [..., d_out, d_in]``, batched over
    leading dimensions: ``U  # [..., d_out, r]``, ``S  # [..., r]``, ``Vh  # [..., r, d_in]``."""
    J = _as_tensor(J, "J")
    U, S, Vh = torch.linalg.svd(J, full_matrices=False)
    return SVD(U, S, Vh)


def check_k(k: int, d: int) -> int:
    """Validate a top-K size against the matrix size ``d`` and return it as an int."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be a positive integer, got {k!r}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if k > d:
        raise ValueError(f"k={k} exceeds the matrix size d={d}; choose k <= {d}")
    return int(k)


def k_for_width(d_model: int, k_over_d: float) -> int:
    """K for a model of width ``d_model`` at a fixed ``K/d = k_over_d`` (at least 1, at most d).

    One rule for K at every width (``analysis.k_policy`` chooses the K/d). It does not equalise
    the chance level of ``1 − m_K²``, which still varies with the width at one K/d (even for
    Gaussian matrices): compare widths through the excess over each model's random-init twin.
    """
    if isinstance(d_model, bool) or int(d_model) != d_model or d_model < 1:
        raise ValueError(f"d_model must be a positive integer, got {d_model!r}")
    if not 0 < k_over_d <= 1:
        raise ValueError(f"k_over_d (K/d) must lie in (0, 1], got {k_over_d!r}")
    return int(min(d_model, max(1, round(k_over_d * d_model))))


def check_options(p: float, normalize: str, orientation: str) -> None:
    """Validate the metric's options: ``p`` > 0, ``normalize`` and ``orientation`` known."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    if not (isinstance(p, (int, float)) and p > 0):
        raise ValueError(f"p must be a positive number, got {p!r}")


def _split(x, name: str) -> tuple[torch.Tensor | None, SVD]:
    """Return (matrix or None, SVD) for a matrix or a precomputed SVD."""
    if isinstance(x, SVD):
        return None, SVD(*(_as_tensor(t, name) if t.ndim >= 2 else t.detach() for t in x))
    J = _as_tensor(x, name)
    return J, svd(J)


def bases(s: SVD, k: int, orientation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (left, right) K-column bases (each ``Tensor  # [..., d, K]``) of ``s`` that diagonalise
    J1 in the chosen orientation: (U_K, V_K) for "ujv", (V_K, U_K) for "vju"."""
    U = s.U[..., :, :k]
    V = s.Vh[..., :k, :].transpose(-1, -2)
    return (U, V) if orientation == "ujv" else (V, U)


def _tile(J1: torch.Tensor, s2: SVD, k: int, orientation: str) -> torch.Tensor:
    left, right = bases(s2, k, orientation)
    dtype = torch.promote_types(J1.dtype, left.dtype)
    return (left.transpose(-1, -2).to(dtype) @ J1.to(dtype) @ right.to(dtype)).abs()


def coupling_tile(J1, J2, k: int, *, orientation: str = "ujv") -> torch.Tensor:
    """``|U_{2,K}ᵀ J1 V_{2,K}|``: the K×K tile the paper draws (diagonal when coupled).

    ``J1: Tensor  # [..., d_out, d_in]`` (or its SVD), ``J2`` the same shape or its SVD;
    returns ``tile: Tensor  # [..., K, K]``.
    """
    check_options(2, "norm", orientation)
    if isinstance(J1, SVD):
        J1 = (J1.U * J1.S.unsqueeze(-2)) @ J1.Vh
    J1 = _as_tensor(J1, "J1")
    _, s2 = _split(J2, "J2")
    k = check_k(k, min(s2.S.shape[-1], *J1.shape[-2:]))
    return _tile(J1, s2, k, orientation)


def coupling(J1, J2, k: int, *, p: float = 2, normalize: str = "norm", orientation: str = "ujv") -> float:
    """The paper's coupling metric ``m_K(J1, J2)`` (lower = more coupled; 0 on itself).

    ``J1``, ``J2: Tensor  # [d_out, d_in]`` (square or rectangular, the same shape; a stack
    ``[..., d_out, d_in]`` gives a tensor of values), or precomputed
    ``SVD`` tuples (from :func:`svd`) to avoid recomputing decompositions in loops. ``J1`` is
    needed as a matrix (or its full SVD); only J2's top-K singular vectors are used.
    """
    check_options(p, normalize, orientation)
    J1m, s1 = _split(J1, "J1")
    if J1m is None:
        J1m = (s1.U * s1.S.unsqueeze(-2)) @ s1.Vh
    _, s2 = _split(J2, "J2")
    if J1m.shape[-2:] != (s2.U.shape[-2], s2.Vh.shape[-1]):
        raise ValueError(
            f"J1 and J2 must have the same shape, got {tuple(J1m.shape)} and "
            f"{(s2.U.shape[-2], s2.Vh.shape[-1])}"
        )
    if orientation == "vju" and J1m.shape[-1] != J1m.shape[-2]:
        raise ValueError("the 'vju' orientation needs square matrices")
    k = check_k(k, min(s1.S.shape[-1], s2.S.shape[-1]))
    value = tile_metric(_tile(J1m, s2, k, orientation), s1.S[..., :k], p, normalize)
    return float(value) if value.ndim == 0 else value


def tile_metric(tile: torch.Tensor, s1k: torch.Tensor, p: float, normalize: str) -> torch.Tensor:
    """``m_K  # [...]`` from ``tile: Tensor  # [..., K, K]`` (``|U_2ᵀ J1 V_2|``) and J1's top
    singular values ``s1k: Tensor  # [..., K]``."""
    s1k = s1k.to(tile.dtype)
    diff = tile - torch.diag_embed(s1k)
    num = torch.linalg.matrix_norm(diff, ord="fro")
    den = s1k.sum(-1) if normalize == "trace" else torch.linalg.vector_norm(s1k, ord=p, dim=-1)
    if (den <= 0).any():
        raise ValueError("J1 has zero top-K singular values (a zero Jacobian); coupling is undefined")
    return num / den


def coupling_matrix(
    Js: Sequence[MatrixLike] | torch.Tensor,
    k: int,
    *,
    svds: SVD | None = None,
    p: float = 2,
    normalize: str = "norm",
    orientation: str = "ujv",
) -> torch.Tensor:
    """``M[i, j] = m_K(J_i, J_j)``: ``Js: Tensor  # [N, d_out, d_in]`` -> ``M: Tensor  # [N, N]``.

    Not symmetric. Pass ``svds`` (a batched :func:`svd` of ``Js``) to reuse decompositions.
    """
    check_options(p, normalize, orientation)
    if not isinstance(Js, torch.Tensor):
        Js = torch.stack([_as_tensor(J, "Js[i]") for J in Js])
    Js = _as_tensor(Js, "Js")
    if Js.ndim != 3:
        raise ValueError(f"Js must be a stack [N, d_out, d_in], got shape {tuple(Js.shape)}")
    s = svds if svds is not None else svd(Js)
    k = check_k(k, s.S.shape[-1])
    left, right = bases(s, k, orientation)  # [N, d, k]
    dtype = torch.promote_types(Js.dtype, left.dtype)
    Js, left, right = Js.to(dtype), left.to(dtype), right.to(dtype)
    s1k = s.S[:, :k].to(dtype)
    out = torch.empty(Js.shape[0], Js.shape[0], dtype=dtype, device=Js.device)
    for j in range(Js.shape[0]):
        tiles = (left[j].T @ Js @ right[j]).abs()  # [N, k, k]: J_i in J_j's basis, all i
        out[:, j] = tile_metric(tiles, s1k, p, normalize)
    return out
