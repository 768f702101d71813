"""The exact top-K singular triplets of formed Jacobians, from the Gram matrix ``JᵀJ``.

The coupling metric needs the top K ≤ 50 triplets of each d × d Jacobian, not all d. On a CPU
(:func:`gram_chosen`) :func:`exact_topk` takes them from a partial symmetric eigensolver on
``JᵀJ`` (:func:`gram_topk`): the top eigenvectors of the float32 Gram, refined in float64 by a
power step and a Rayleigh–Ritz step, equal the full SVD to rounding and cost a fraction of it.
Elsewhere it takes the full SVD. :func:`gram_topk_batched` is the same refinement in torch alone
(a full ``eigh``), for GPUs, where ``bench/gpu_check.py`` times it before anything chooses it.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

# scipy's LAPACK is loaded here, not at the first call: the thread limit (in gram_topk) reaches
# only the BLAS libraries loaded when threadpoolctl first looks (it looks once: get_cached_controller;
# a fresh look at every call cost 4 ms, more than the eigensolver on a small model's Jacobian), and
# a first call on more threads rounds differently
from scipy.linalg import cython_blas, cython_lapack
from threadpoolctl import get_cached_controller

from coupling_utils.engine.metric import SVD, _as_tensor, check_k
from coupling_utils.engine.spectra import lapack_threads

__all__ = [
    "exact_topk",
    "gram_topk",
    "gram_topk_batched",
    "gram_wins",
    "gram_chosen",
    "MIXED_FLOOR",
]

# gram_topk refines a float32 Gram where σ_r ≥ MIXED_FLOOR·σ_1: float32's rounding of JᵀJ (about
# ε·σ_1², ε = 6e-8) is then at most 6e-4 of σ_r², and one float64 power step and a float64
# Rayleigh–Ritz bring every metric value within 5e-6 of a float64 SVD on flat, outlier-over-flat
# and geometric spectra, where a float32 full SVD is off by up to 8e-6 (tests/test_one_token.py).
MIXED_FLOOR = 1e-2
GRAM_OVERSAMPLE = 10  # extra eigenvectors of the float32 Gram: room for the refinement
GRAM_POWER_STEPS = 1  # float64 power steps JᵀJ Q before the Rayleigh–Ritz


def gram_wins(J: torch.Tensor, r: int) -> bool:
    """Whether :func:`gram_topk` is cheaper than a full SVD for the top ``r`` triplets of ``J``
    (:func:`gram_chosen` for J's device and shape)."""
    return gram_chosen(J.device.type, min(J.shape[-2:]), r)


def gram_chosen(device: str, size: int, r: int) -> bool:
    """The rule :func:`exact_topk` follows: :func:`gram_topk` on a CPU for ``r ≤ size / 4``
    (``size = min(m, n)``), where the partial symmetric eigensolver (LAPACK ``syevr``) skips most
    eigenvectors: measured faster than ``torch.linalg.svd`` for r = 50 of 576 on one thread
    (``bench/bench_engine.py``). On other devices the full SVD is kept."""
    return device == "cpu" and 4 * r <= size


def gram_topk(J: torch.Tensor, r: int, *, mixed: bool = True, workers: int | None = None) -> SVD:
    """Top-``r`` singular triplets of ``J: Tensor  # [..., m, n]`` from the Gram matrix ``JᵀJ``.

    For each matrix, in float32 or lower (``mixed=True``): the top ``r + 10`` eigenvectors of the
    float32 Gram (LAPACK ``ssyevr``, ``subset_by_index``; cheaper than in float64) span
    a subspace Q; one power step ``Q = orth(JᵀJ Q)`` and the SVD of ``J Q`` (Rayleigh–Ritz), both
    in float64, give the triplets: ``S``, ``U``, and ``V = Q Vb``. Where that leaves
    ``σ_r < MIXED_FLOOR·σ_1`` (float32's rounding of JᵀJ is then no longer small against σ_r²),
    and for float64 input or ``mixed=False``: the top r eigenpairs of the float64 Gram, ``V``
    its eigenvectors, ``S = sqrt(λ)``, ``U = J V / S``; where σ_r < 1e-6·σ₁ (``U = J V / S``
    loses accuracy) a full SVD instead. Returns an :class:`SVD` in J's dtype (fp32 or better),
    values descending.

    Each matrix's factorizations run on one thread (torch's and scipy's BLAS alike), and the
    matrices are shared among ``workers`` threads (default: torch's thread count): LAPACK on one
    576 × 576 matrix gains nothing from a second thread and loses under load (scipy's ``ssyevr``
    took 13.5 ms on one thread, 16.8 ms on two, on 2 busy cores), while separate matrices
    run side by side: BLAS and LAPACK are called without Python's GIL (:func:`_syevr_top`).
    """
    J = _as_tensor(J, "J")
    *batch, m, n = J.shape
    r = check_k(r, min(m, n))
    flat = J.reshape(-1, m, n)
    mixed = mixed and flat.dtype != torch.float64
    workers = max(1, min(len(flat), torch.get_num_threads() if workers is None else int(workers)))

    def one(A: torch.Tensor) -> tuple[torch.Tensor, ...]:
        found = _float32_gram_topk(A, r) if mixed else None
        found = found or _float64_gram_topk(A, r)
        if found is None:
            U_, S_, Vh_ = torch.linalg.svd(A, full_matrices=False)
            found = U_[:, :r], S_[:r], Vh_[:r]
        return tuple(t.to(J.dtype) for t in found)

    with lapack_threads(), get_cached_controller().limit(limits=1, user_api="blas"):
        if workers == 1:
            found = [one(A) for A in flat]
        else:
            # torch's thread count is per OpenMP thread: each worker sets its own to one
            with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
                found = list(pool.map(one, flat))
    Us, Ss, Vhs = zip(*found)
    shape = tuple(batch)
    return SVD(
        torch.stack(Us).reshape(*shape, m, r),
        torch.stack(Ss).reshape(*shape, r),
        torch.stack(Vhs).reshape(*shape, r, n),
    )


def _float32_gram_topk(A: torch.Tensor, r: int) -> tuple[torch.Tensor, ...] | None:
    """(U, S, Vh) in float64 from the float32 Gram refined in float64, or None where σ_r is
    below ``MIXED_FLOOR·σ_1`` (or the float32 Gram overflows)."""
    n = A.shape[-1]
    l = min(n, r + GRAM_OVERSAMPLE)
    G = _gram_upper(A.detach().float().cpu().numpy())
    if not np.isfinite(G).all():
        return None
    _, W = _syevr_top(G, l, b"U")
    U, S, Vh = _refined(A.double(), torch.from_numpy(W).double(), r, GRAM_POWER_STEPS)
    if not S[r - 1] > MIXED_FLOOR * S[0]:
        return None
    return U, S, Vh


def _refined(A64: torch.Tensor, Q: torch.Tensor, r: int, steps: int) -> tuple[torch.Tensor, ...]:
    """The top r triplets of ``A64: Tensor  # [..., m, n]`` (float64) from an approximate basis
    ``Q  # [..., n, l]`` of its top right singular vectors: ``steps`` power steps
    ``Q = orth(AᵀA Q)``, then the SVD of ``A Q`` (Rayleigh–Ritz in span(Q)); (U, S, Vh)."""
    for _ in range(steps):
        Q = torch.linalg.qr(A64.mT @ (A64 @ Q)).Q
    Ub, S, Vbh = torch.linalg.svd(A64 @ Q, full_matrices=False)
    return Ub[..., :r], S[..., :r], Vbh[..., :r, :] @ Q.mT


def _float64_gram_topk(A: torch.Tensor, r: int) -> tuple[torch.Tensor, ...] | None:
    """(U, S, Vh) in float64 from the top r eigenpairs of the float64 Gram, or None where
    σ_r < 1e-6·σ_1."""
    A64 = A.double()
    G = np.asfortranarray((A64.T @ A64).numpy())  # column-major, for LAPACK
    w, V = _syevr_top(G, r, b"L")
    # copies, not ascontiguousarray: a reversed (n, 1) view counts as contiguous in numpy
    # yet keeps its negative stride, which torch.from_numpy refuses (K = 1)
    w, V = w[::-1].copy(), V[:, ::-1].copy()
    S = torch.from_numpy(np.sqrt(np.clip(w, 0, None)))
    if not S[-1] > 1e-6 * S[0]:
        return None
    V = torch.from_numpy(V)
    return (A64 @ V) / S, S, V.T


# ---------------------------------------------------------------- LAPACK without the GIL
# scipy's own wrappers (scipy.linalg.eigh, scipy.linalg.blas) hold Python's GIL while LAPACK runs,
# so threads sharing the matrices ran one at a time (1.04x on 2 threads, measured). The same
# routines, from scipy's table of BLAS and LAPACK function pointers for Cython, called through
# ctypes, release it, and give the same bits (same library, same workspace query).
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _routine(table, name: str, n_args: int):
    """The Fortran routine ``name`` of scipy's ``cython_blas`` or ``cython_lapack``, every argument a
    pointer; ctypes releases the GIL for the call."""
    capsule = table.__pyx_capi__[name]
    address = _capsule_pointer(capsule, _capsule_name(capsule))
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * n_args)(address)


_SYRK = {np.float32: _routine(cython_blas, "ssyrk", 10)}
_SYEVR = {
    np.float32: _routine(cython_lapack, "ssyevr", 21),
    np.float64: _routine(cython_lapack, "dsyevr", 21),
}


def _by_reference(routine, *args) -> None:
    """Call a Fortran routine: bytes as they are, ints as one-element int arrays, arrays by address
    (every array referenced here, so alive until the call returns)."""
    held = [np.array([a], dtype=np.intc) if isinstance(a, int) else a for a in args]
    routine(*[a if isinstance(a, bytes) else a.ctypes.data for a in held])


def _gram_upper(a: np.ndarray) -> np.ndarray:
    """The upper triangle of ``aᵀa`` (``a`` float32, m × n, C-ordered), Fortran-ordered n × n
    (BLAS ``ssyrk``)."""
    m, n = a.shape
    a = np.ascontiguousarray(a, dtype=np.float32)  # column-major, this is aᵀ: n × m, leading dimension n
    G = np.zeros((n, n), dtype=np.float32, order="F")
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    _by_reference(_SYRK[np.float32], b"U", b"N", n, m, one, a, n, zero, G, n)
    return G


def _syevr_top(G: np.ndarray, l: int, uplo: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The top ``l`` eigenpairs of the symmetric ``G`` (n × n, float32 or float64; its ``uplo``
    triangle as LAPACK reads the buffer, column-major), from ``?syevr``: eigenvalues ascending,
    eigenvectors n × l. Overwrites G."""
    n = G.shape[0]
    dtype = G.dtype.type
    w, Z = np.empty(n, dtype), np.empty((n, l), dtype, order="F")
    found, info, support = np.zeros(1, np.intc), np.zeros(1, np.intc), np.empty(2 * max(1, l), np.intc)
    unused = np.zeros(1, dtype)  # vl, vu (the range is by index) and abstol (0: LAPACK's default)
    head = (b"V", b"I", uplo, n, G, n, unused, unused, n - l + 1, n, unused, found, w, Z, n, support)
    best_work, best_iwork = np.empty(1, dtype), np.empty(1, np.intc)
    _by_reference(_SYEVR[dtype], *head, best_work, -1, best_iwork, -1, info)  # workspace query
    lwork, liwork = int(best_work[0]), int(best_iwork[0])
    work, iwork = np.empty(lwork, dtype), np.empty(liwork, np.intc)
    _by_reference(_SYEVR[dtype], *head, work, lwork, iwork, liwork, info)
    if info[0] != 0:
        raise np.linalg.LinAlgError(f"LAPACK ?syevr failed on an {n} × {n} Gram matrix, info {int(info[0])}")
    return w[: found[0]], Z[:, : found[0]]


def gram_topk_batched(J: torch.Tensor, r: int) -> SVD:
    """:func:`gram_topk`'s float32-Gram path in torch alone, batched, on any device.

    ``J: Tensor  # [..., m, n]``. The top ``2·(r + 10)`` eigenvectors of the float32 Gram come
    from a full ``torch.linalg.eigh`` (torch has no partial symmetric eigensolver; on a GPU,
    cuSOLVER's ``syevd``), then two float64 power steps and a float64 Rayleigh–Ritz, as in
    :func:`gram_topk`; matrices whose ``σ_r ≤ MIXED_FLOOR·σ_1`` get a full SVD. The wider
    subspace and the second step cost little beside a full eigh, and are needed: with ``r + 10``
    vectors and one step, syevd's eigenvectors left a coupling value 1.5e-5 off on an outlier
    over a flat spectrum (``tests/test_one_token.py``; ``gram_topk``: 2.1e-6). On a CPU the
    partial LAPACK solver of :func:`gram_topk` is faster; on a GPU ``bench/gpu_check.py`` times
    this against the full SVD (not measured yet, so :func:`exact_topk` does not choose it).
    """
    J = _as_tensor(J, "J")
    *batch, m, n = J.shape
    r = check_k(r, min(m, n))
    l = min(n, 2 * (r + GRAM_OVERSAMPLE))
    A = J.reshape(-1, m, n)
    A32 = A.float()
    _, W = torch.linalg.eigh(A32.mT @ A32)  # ascending
    A64 = A.double()
    U, S, Vh = _refined(A64, W[..., -l:].double(), r, 2)
    low = ~(S[:, r - 1] > MIXED_FLOOR * S[:, 0])
    if bool(low.any()):
        Uf, Sf, Vhf = torch.linalg.svd(A64[low], full_matrices=False)
        U, S, Vh = U.clone(), S.clone(), Vh.clone()
        U[low], S[low], Vh[low] = Uf[..., :r], Sf[..., :r], Vhf[..., :r, :]
    dtype = torch.promote_types(J.dtype, torch.float32)
    return SVD(
        U.to(dtype).reshape(*batch, m, r), S.to(dtype).reshape(*batch, r), Vh.to(dtype).reshape(*batch, r, n)
    )


def exact_topk(J: torch.Tensor, r: int) -> tuple[SVD, str]:
    """``(top-r triplets, how)``: :func:`gram_topk` where :func:`gram_wins`, else the full SVD
    (``torch.linalg.svd``) truncated; ``how`` is "gram_topk" or "full_svd", for provenance."""
    if gram_wins(J, r):
        return gram_topk(J, r), "gram_topk"
    with lapack_threads():
        U, S, Vh = torch.linalg.svd(J, full_matrices=False)
    return SVD(U[..., :, :r].contiguous(), S[..., :r].contiguous(), Vh[..., :r, :].contiguous()), "full_svd"
