"""Top-K singular triplets of block Jacobians: exact, randomized, and matrix-free.

The coupling metric needs only the top K (≤ 50) singular triplets of each token Jacobian
``J_tt`` (d × d). Three ways to get them:

- ``topk_svd(J, k, "exact")``: full SVD, truncated (the oracle).
- ``topk_svd(J, k, "randomized")``: randomized range finder with power (subspace) iterations,
  Halko, Martinsson & Tropp (2011), Algorithms 4.4 and 5.1, on a formed matrix.
- :func:`matrix_free_topk`: the same algorithm, but J is never formed. Products ``J V`` are
  forward-mode JVPs and ``Jᵀ U`` reverse-mode VJPs of the block's residual function ``f`` (from
  ``blocks.block_function`` with token-diagonal attention), with a tangent/cotangent row for
  every token, so one product ("block pass") serves all T tokens at once. It costs
  ``(2·n_iter + 2)·(k + oversample)`` block passes instead of the ``d`` of the exact sweep.
  Since ``f = block(X) − X``, its Jacobian is already ``J_tt`` (identity subtracted).

The randomized methods are accurate when the spectrum has a gap after K; on trained models
their error is measured (``tests/test_spectra.py``, ``bench/bench_jacobians.py``), not assumed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from .metric import SVD, _as_tensor, check_k

__all__ = ["topk_svd", "randomized_svd", "TokenOperator", "MatrixFreeSVD", "matrix_free_topk",
           "operator_topk", "block_passes", "lapack_threads", "METHODS"]

METHODS = ("exact", "randomized")

Apply = Callable[[torch.Tensor], torch.Tensor]


def _check_randomized(oversample: int, n_iter: int) -> None:
    if isinstance(oversample, bool) or not isinstance(oversample, int) or oversample < 0:
        raise ValueError(f"oversample must be a non-negative integer, got {oversample!r}")
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 0:
        raise ValueError(f"n_iter must be a non-negative integer, got {n_iter!r}")


def block_passes(k: int, *, oversample: int = 10, n_iter: int = 2, d: int | None = None) -> int:
    """Products (block passes) the randomized method needs for rank ``k``: ``(2q + 2)·l``."""
    l = k + oversample if d is None else min(k + oversample, d)
    return (2 * n_iter + 2) * l


@contextlib.contextmanager
def lapack_threads(n: int = 1):
    """Run dense factorizations (SVD, QR) of small matrices on ``n`` threads, then restore.

    Multithreaded LAPACK on d ≈ 500 matrices gains little on a quiet machine and collapses on
    a busy one: measured here on 2 shared cores, a batch of four 576×576 fp32 SVDs took 1.5 s
    on one thread and 29 s on two (the threads spin-wait for each other).
    """
    before = torch.get_num_threads()
    if before > n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _orthonormal(Y: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of the columns of Y [..., m, l] (reduced QR)."""
    with lapack_threads():
        return torch.linalg.qr(Y, mode="reduced").Q


def randomized_svd(apply: Apply, apply_t: Apply, shape: tuple[int, ...], k: int, *,
                   oversample: int = 10, n_iter: int = 2, seed: int = 0,
                   dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                   keep: str = "k") -> tuple[SVD, int]:
    """Top-k SVD of a (batched) linear operator given only its products; returns (SVD, products).

    ``apply(V[..., n, l]) -> J V [..., m, l]`` and ``apply_t(U[..., m, l]) -> Jᵀ U [..., n, l]``;
    ``shape = (*batch, m, n)``. Halko et al. (2011): a Gaussian sketch, ``n_iter`` power
    iterations re-orthonormalised by QR after every product (their Alg. 4.4), then the SVD of
    the small ``Qᵀ J`` (Alg. 5.1). ``keep="all"`` returns all ``l = k + oversample`` computed
    triplets (a rank-l approximation of J) instead of the top k. ``products`` counts the
    columns pushed through ``apply``/``apply_t``: ``(2·n_iter + 2)·l``.
    """
    _check_randomized(oversample, n_iter)
    *batch, m, n = shape
    k = check_k(k, min(m, n))
    if keep not in ("k", "all"):
        raise ValueError(f"keep must be 'k' or 'all', got {keep!r}")
    l = min(k + oversample, m, n)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    omega = torch.randn(*batch, n, l, generator=gen, dtype=dtype).to(device or "cpu")
    Q = _orthonormal(apply(omega))
    for _ in range(n_iter):
        W = _orthonormal(apply_t(Q))
        Q = _orthonormal(apply(W))
    Bt = apply_t(Q)  # [..., n, l] = Jᵀ Q, i.e. B = Qᵀ J transposed
    with lapack_threads():
        Ub, S, Vh = torch.linalg.svd(Bt.transpose(-1, -2), full_matrices=False)
    U = Q @ Ub
    r = l if keep == "all" else k
    return SVD(U[..., :, :r], S[..., :r], Vh[..., :r, :]), (2 * n_iter + 2) * l


def topk_svd(J, k: int, method: str = "exact", *, oversample: int = 10, n_iter: int = 2,
             seed: int = 0) -> SVD:
    """Top-k singular triplets of J [..., m, n] (batched over leading dims), in fp32 or better.

    ``method="exact"``: ``torch.linalg.svd`` truncated to k. ``method="randomized"``: Halko et
    al.'s randomized SVD with ``k + oversample`` probe vectors and ``n_iter`` power iterations
    (accurate when σ_k is well separated from σ_{k+oversample}; error grows without a gap).
    Singular vectors are defined up to sign.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r} "
                         "(for products through a model block use matrix_free_topk)")
    J = _as_tensor(J, "J")
    k = check_k(k, min(J.shape[-2:]))
    if method == "exact":
        with lapack_threads():
            U, S, Vh = torch.linalg.svd(J, full_matrices=False)
        return SVD(U[..., :, :k], S[..., :k], Vh[..., :k, :])
    Jt = J.transpose(-1, -2)
    s, _ = randomized_svd(lambda V: J @ V, lambda U: Jt @ U, tuple(J.shape), k,
                          oversample=oversample, n_iter=n_iter, seed=seed, dtype=J.dtype,
                          device=J.device)
    return s


class TokenOperator:
    """The token Jacobians ``J_tt`` of a token-diagonal ``f: [T, d] -> [T, d]`` at X, as products.

    ``matmul(V[T, d, l])`` returns ``J_tt V_t`` for every token (forward-mode JVPs, one per
    column) and ``rmatmul(U[T, d, l])`` returns ``J_ttᵀ U_t`` (reverse-mode VJPs from a single
    forward graph). ``f`` must be token-diagonal in its derivatives (``block_function(...,
    token_diagonal=True)``); otherwise the products mix tokens and are not ``J_tt``.
    ``passes`` counts the products (each one is one pass through the block for all T tokens).
    """

    def __init__(self, f: Callable[[torch.Tensor], torch.Tensor], X: torch.Tensor, *,
                 chunk_size: int | None = 64):
        if X.ndim != 2:
            raise ValueError(f"X must be the block input [T, d], got shape {tuple(X.shape)}")
        self.f = f
        self.X = X.detach()
        self.chunk_size = chunk_size
        self.passes = 0
        self._vjp_fn = None

    @property
    def shape(self) -> tuple[int, int, int]:
        T, d = self.X.shape
        return (T, d, d)

    def _columns(self, fn: Callable[[torch.Tensor], torch.Tensor], M: torch.Tensor) -> torch.Tensor:
        """Apply ``fn`` ([T, d] -> [T, d]) to each of the l columns of M[T, d, l], in chunks."""
        M = M.to(self.X.dtype)
        l = M.shape[-1]
        step = self.chunk_size or l
        out = []
        for start in range(0, l, step):
            cols = M[..., start:start + step].movedim(-1, 0).contiguous()  # [c, T, d]
            res = torch.func.vmap(fn)(cols) if cols.shape[0] > 1 else fn(cols[0]).unsqueeze(0)
            out.append(res.detach())
            self.passes += cols.shape[0]
        return torch.cat(out, 0).movedim(0, -1)

    def matmul(self, V: torch.Tensor) -> torch.Tensor:
        """``J_tt V_t`` for all tokens: V [T, d, l] -> [T, d, l] (forward-mode products)."""
        X = self.X

        def jvp(v):
            return torch.func.jvp(self.f, (X,), (v,))[1]

        with torch.enable_grad():
            return self._columns(jvp, V)

    def rmatmul(self, U: torch.Tensor) -> torch.Tensor:
        """``J_ttᵀ U_t`` for all tokens: U [T, d, l] -> [T, d, l] (reverse-mode products)."""
        with torch.enable_grad():
            if self._vjp_fn is None:
                _, self._vjp_fn = torch.func.vjp(self.f, self.X)
            vjp_fn = self._vjp_fn
            return self._columns(lambda u: vjp_fn(u)[0], U)


@dataclass
class MatrixFreeSVD:
    """Top singular triplets of all T token Jacobians of one block, without forming them.

    ``svd``: batched over tokens (U [T, d, r], S [T, r], Vh [T, r, d]); ``block_passes``: the
    products used (compare with d for the exact token-diagonal sweep, T·d for the reference);
    ``rank``: the number of probe vectors l = k + oversample.
    """

    svd: SVD
    block_passes: int
    rank: int
    k: int


def operator_topk(op: TokenOperator, k: int, *, oversample: int = 10, n_iter: int = 2,
                  seed: int = 0, keep: str = "k") -> MatrixFreeSVD:
    """Randomized top-k SVD of every token Jacobian of a :class:`TokenOperator`."""
    T, d, _ = op.shape
    before = op.passes
    s, _ = randomized_svd(op.matmul, op.rmatmul, op.shape, k, oversample=oversample,
                          n_iter=n_iter, seed=seed, dtype=op.X.dtype, device=op.X.device, keep=keep)
    if not all(torch.isfinite(t).all() for t in s):
        raise ValueError("the matrix-free products returned NaN or inf; the block is not usable "
                         "at this input (check the model's dtype: use float32)")
    l = min(k + oversample, d)
    return MatrixFreeSVD(s, op.passes - before, l, k)


def matrix_free_topk(model, inputs, layer: int, k: int, *, oversample: int = 10, n_iter: int = 2,
                     seed: int = 0, chunk_size: int | None = 64, keep: str = "k") -> MatrixFreeSVD:
    """Top-k SVD of ``J^l_tt`` for all T tokens of ``inputs`` at block ``layer``, matrix-free.

    Products go through ``blocks.block_function(model, inputs, layer, token_diagonal=True)``:
    JVPs for ``J V`` and VJPs for ``Jᵀ U``, each with a row per token, so the cost is
    ``(2·n_iter + 2)·min(k + oversample, d)`` block passes for all tokens together. J is never
    formed. ``keep="all"`` keeps all k + oversample triplets (a low-rank approximation of J).
    """
    from .blocks import block_function
    from .jacobians import frozen

    with frozen(model):  # products then build no parameter gradients
        f, X = block_function(model, inputs, layer, token_diagonal=True)
        k = check_k(k, X.shape[-1])
        op = TokenOperator(f, X, chunk_size=chunk_size)
        return operator_topk(op, k, oversample=oversample, n_iter=n_iter, seed=seed, keep=keep)
