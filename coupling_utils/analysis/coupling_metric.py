"""The coupling metric, chapter f00: its tables, its reference cases and its properties.

The chart builders in :mod:`coupling_utils.analysis.plots` take tidy long DataFrames; this module makes
them (:func:`matrix_frame`, :func:`tile_frame`). Chapter f00's experiments live here too: the
share of a spectrum in its top K (:func:`energy_share`), a random matrix to compare a basis with
(:func:`random_reference`), tiles of named pairs (:func:`tile_cases`), the metric under growing
noise (:func:`noise_sweep`), its variants (:func:`metric_variants`) and its properties on toy
matrices whose answer is known (:func:`toy_properties`). The Jacobians it studies are a stored
measurement (:func:`block_jacobians`, an :class:`~coupling_utils.measurement.Extra`; read back
with :func:`jacobian_matrices`). The per-model scalar is
:func:`coupling_utils.measurement.coupling_summary`; fits are :func:`coupling_utils.analysis.stats.ols`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from coupling_utils.engine.jacobians import token_jacobians
from coupling_utils.engine.metric import check_k, coupling, coupling_tile, svd, tile_metric
from coupling_utils.measurement import inputs

__all__ = [
    "matrix_frame",
    "tile_frame",
    "coupling_tiles",
    "strength",
    "energy_share",
    "random_reference",
    "tile_cases",
    "noise_sweep",
    "noise_equivalent",
    "metric_variants",
    "ToyProperties",
    "toy_properties",
    "block_jacobians",
    "jacobian_passes",
    "jacobian_matrices",
]


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


def random_bases(J, k: int, n: int, *, seed: int = 0, singular_values=None) -> np.ndarray:
    """``m_K(J, ·)`` in ``n`` random bases unrelated to J: the null against which one neighbour's
    ``m_K`` is read (f00).

    Each basis is a pair of independent random orthonormal K-frames, left and right (the Q of a
    Gaussian ``[d, K]`` matrix's QR; draw ``i`` on the CPU from seed ``seed + i``, the left frame
    first, then the right from the same stream: one frame on both sides would compress J
    symmetrically, and a Jacobian near the identity would look coupled to it). The top-K singular vectors
    of a Gaussian matrix, as :func:`random_reference` draws it, are distributed so (Haar, whatever
    its singular values), and the metric reads only those vectors, up to their signs, which the
    tile's absolute value drops; so this is the reference's distribution at ``O(d² K)`` a draw
    instead of a full SVD (minutes for 39 draws at d = 4096 on a CPU). ``singular_values``: J's,
    where they are known already (else computed).
    """
    J = torch.as_tensor(J).detach()
    if J.ndim != 2:
        raise ValueError(f"J must be a matrix [d_out, d_in], got shape {tuple(J.shape)}")
    dtype = torch.promote_types(J.dtype, torch.float32) if J.is_floating_point() else torch.float64
    J = J.to(dtype)
    k = check_k(k, min(J.shape))
    known = singular_values is not None
    top = (torch.as_tensor(singular_values) if known else torch.linalg.svdvals(J))[:k].to(J.device, dtype)

    def frames(seed_i: int) -> tuple[torch.Tensor, torch.Tensor]:  # one draw: left then right
        g = torch.Generator().manual_seed(seed_i)
        return (torch.randn(J.shape[0], k, generator=g, dtype=dtype),
                torch.randn(J.shape[1], k, generator=g, dtype=dtype))  # fmt: skip

    drawn = [frames(int(seed) + i) for i in range(int(n))]
    left = torch.linalg.qr(torch.stack([a for a, _ in drawn])).Q.to(J.device)  # [n, d_out, K]
    right = torch.linalg.qr(torch.stack([b for _, b in drawn])).Q.to(J.device)  # [n, d_in, K]
    tile = (left.transpose(-1, -2) @ J @ right).abs()  # [n, K, K]
    return tile_metric(tile, top.expand(int(n), k), 2, "norm").cpu().double().numpy()


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


def energy_share(S, k: int) -> float:
    """The share of the squared Frobenius norm held by the top ``k`` singular values ``S[r]``.

    ``sum(S[:k]²) / sum(S²)``: 1 when the matrix has rank ≤ k; about 4k/r for k ≪ r for a
    square Gaussian matrix of size r (its spectrum is spread: the quarter-circle law).
    """
    S = torch.as_tensor(S).detach().to(device="cpu", dtype=torch.float64).flatten()
    k = check_k(k, S.numel())
    total = float((S**2).sum())
    if total <= 0:
        raise ValueError("the singular values are all zero: a zero matrix has no spectrum to share")
    return float((S[:k] ** 2).sum()) / total


def noise_sweep(J, levels: Iterable[float], k: int, *, seed: int = 0) -> pd.DataFrame:
    """``m_K(J, J + ε R)`` for each noise level ε, with R = :func:`random_reference` (J, seed).

    R has J's Frobenius norm (in expectation), so ε is the noise's size relative to J: ε = 0 gives
    0 (J in its own basis), and as ε grows J + εR's top singular vectors become R's, so the value
    tends to J's coupling with a random basis. Works on any device (R is made on J's).
    Returns (noise, m_K, coupling) with coupling = 1 − m_K².
    """
    J = torch.as_tensor(J).detach()
    levels = [float(e) for e in levels]
    if not levels or any(not np.isfinite(e) or e < 0 for e in levels):
        raise ValueError(f"levels must be finite noise levels >= 0 (at least one), got {levels}")
    R = random_reference(J, seed=seed)
    Jf = J.to(R.dtype)
    values = [coupling(Jf, Jf + e * R, k) for e in levels]
    return pd.DataFrame({"noise": levels, "m_K": values, "coupling": strength(values)})


def noise_equivalent(sweep: pd.DataFrame, m: float) -> float:
    """The smallest noise level ε at which :func:`noise_sweep`'s ``m_K`` reaches ``m``.

    Interpolated linearly between the two swept levels that bracket ``m``; NaN when no swept
    level reaches it (sweep further). Reads a coupling value as "as far from diagonal as noise
    of relative size ε".
    """
    df = sweep.sort_values("noise").reset_index(drop=True)
    above = np.flatnonzero(df["m_K"].to_numpy() >= m)
    if not len(above):
        return float("nan")
    i = int(above[0])
    if i == 0:
        return float(df["noise"].iloc[0])
    (e0, m0), (e1, m1) = df.loc[i - 1, ["noise", "m_K"]], df.loc[i, ["noise", "m_K"]]
    return float(e0 + (e1 - e0) * (m - m0) / (m1 - m0)) if m1 > m0 else float(e1)


def metric_variants(J1, J2, ks: Iterable[int]) -> pd.DataFrame:
    """``m_K(J1, J2)`` under the authors' variants: denominator ("norm" or "trace") and
    orientation ("ujv" or "vju"), for each K in ``ks``. Returns (K, normalize, orientation, m_K)."""
    s2 = svd(J2)
    return pd.DataFrame(
        [
            {"K": int(kk), "normalize": norm, "orientation": ori,
             "m_K": coupling(J1, s2, int(kk), normalize=norm, orientation=ori)}
            for kk in sorted({int(kk) for kk in ks})
            for norm in ("norm", "trace")
            for ori in ("ujv", "vju")
        ]
    )  # fmt: skip


@dataclass
class ToyProperties:
    """The metric's properties checked on random toy matrices (see :func:`toy_properties`).

    ``table``: (case, value, expected) rows; ``random_pairs``: m_K of each unrelated pair;
    ``k``: the K they were computed at.
    """

    table: pd.DataFrame
    random_pairs: pd.DataFrame
    k: int


def toy_properties(d: int, k: int, n_random: int, *, seed: int = 0) -> ToyProperties:
    """Check the definition where the answer is known, on Gaussian ``d × d`` matrices (float64, CPU).

    m(J, J) = 0; m is unchanged when the signs of singular pairs flip; unrelated random pairs give
    about 1 and never more than √2; a cyclic shift of ``diag(s)`` against ``diag(s)`` with K = d
    reaches √2, the bound (each of J1's singular directions lands on a different one of J2's).
    """
    k = check_k(k, d)
    if n_random < 1:
        raise ValueError(f"n_random must be at least 1, got {n_random}")
    gen = torch.Generator().manual_seed(int(seed))

    def gaussian():
        return torch.randn(d, d, generator=gen, dtype=torch.float64)

    A = gaussian()
    sA = svd(A)
    flip = torch.where(torch.rand(d, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
    flipped = sA._replace(U=sA.U * flip, Vh=sA.Vh * flip[:, None])  # the same matrix, other signs
    pairs = pd.DataFrame({"m_K": [coupling(gaussian(), gaussian(), k) for _ in range(n_random)]})
    shift = torch.roll(torch.eye(d, dtype=torch.float64), 1, dims=0) @ torch.diag(sA.S)
    sign_change = coupling(A, flipped, k) - coupling(A, A, k)
    bound = coupling(shift, torch.diag(sA.S), d)
    rows = [
        ("m(J, J)", coupling(A, A, k), "0"),
        ("m(J, J with flipped singular-pair signs) − m(J, J)", sign_change, "0"),
        (f"mean m over {n_random} unrelated random pairs", float(pairs.m_K.mean()), "≈ 1"),
        (f"max m over {n_random} unrelated random pairs", float(pairs.m_K.max()), "≤ √2 ≈ 1.414"),
        ("m(cyclic shift of diag(s), diag(s)), K = d", bound, "√2 (the bound)"),
    ]
    return ToyProperties(pd.DataFrame(rows, columns=["case", "value", "expected"]), pairs, k)


# --------------------------------------------------------------------------- the stored Jacobians
def block_jacobians(model, prompts: Sequence[str], *, layer: int) -> dict[str, pd.DataFrame]:
    """The last token's residual block Jacobians of blocks ``layer`` and ``layer + 1`` on one
    prompt, as storable tables (chapter f00's measurement, an
    :class:`~coupling_utils.measurement.Extra`).

    The prompt is tokenised with the model's tokenizer (and, longer than the model's context, cut
    to it with a notice, as :func:`~coupling_utils.measurement.measure` does) and each Jacobian is
    :func:`~coupling_utils.engine.jacobians.token_jacobians` of the last token (fp32, moved to
    the host). Returns ``jacobians`` (columns ``J`` and ``J_next``: the ``[d_out, d_in]``
    matrices flattened row-major, float32, so a Parquet round trip is exact) and ``facts`` (one
    row: name, n_layers, d_model, T, layer, d_out, d_in). Read back with :func:`jacobian_matrices`.
    """
    if len(prompts) != 1:
        raise ValueError(f"block_jacobians measures one prompt, got {len(prompts)}")
    # a prompt longer than the model's context is cut to it, with a notice, as measure() does
    limits = inputs.model_limits(inputs.model_info(model))
    (prompt,) = inputs.prompts(list(prompts), model.tokenizer, None, limits)
    input_ids = prompt.inputs  # [1, T]
    J = token_jacobians(model, input_ids, layer, tokens=[-1])[0]  # [d_out, d_in]
    J_next = token_jacobians(model, input_ids, layer + 1, tokens=[-1])[0]
    J, J_next = J.detach().cpu(), J_next.detach().cpu()
    jacobians = pd.DataFrame({"J": J.reshape(-1).numpy(), "J_next": J_next.reshape(-1).numpy()})
    facts = pd.DataFrame(
        [{"name": model.name, "n_layers": model.n_layers, "d_model": model.d_model,
          "T": int(input_ids.shape[1]), "layer": int(layer), "d_out": J.shape[0], "d_in": J.shape[1]}]
    )  # fmt: skip
    return {"jacobians": jacobians, "facts": facts}


def jacobian_passes(n_layers: int, d_model: int) -> int:
    """Block passes per prompt of :func:`block_jacobians` (the cost model's count): for each of
    the two blocks one forward and ``d`` vector-Jacobian products."""
    return 2 * (d_model + 1)


def jacobian_matrices(tables: Mapping[str, pd.DataFrame]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, J_next)``, the ``[d_out, d_in]`` float32 CPU tensors of :func:`block_jacobians`'
    tables (as stored, or as read back)."""
    facts = tables["facts"].iloc[0]
    shape = (int(facts["d_out"]), int(facts["d_in"]))
    flat = tables["jacobians"]
    return tuple(
        torch.from_numpy(np.array(flat[name].to_numpy(), dtype=np.float32).reshape(shape))
        for name in ("J", "J_next")
    )
