"""Top-K singular triplets of block Jacobians: exact, randomized, block Lanczos, matrix-free.

The coupling metric needs only the top K (≤ 50) singular triplets of each token Jacobian
``J_tt`` (d × d). Ways to get them:

- ``topk_svd(J, k, "exact")``: full SVD, truncated (the oracle). What ``measure()`` uses on formed
  Jacobians, the top triplets from the Gram matrix ``JᵀJ``, is in :mod:`coupling_utils.engine.gram`.
- ``topk_svd(J, k, "randomized")``: randomized range finder with power (subspace) iterations,
  Halko, Martinsson & Tropp (2011), Algorithms 4.4 and 5.1, on a formed matrix:
  ``(2·n_iter + 2)·(k + oversample)`` products.
- ``topk_svd(J, k, "lanczos")``: :func:`block_lanczos_svd`, a randomized block
  Golub–Kahan–Lanczos bidiagonalisation with full reorthogonalisation (Golub & Kahan 1965;
  Musco & Musco 2015 for the randomized block Krylov view): ``steps`` blocks of ``block``
  vectors, ``(2·steps − 1)·block`` products. Every product enlarges the Krylov space instead of
  being thrown away as in subspace iteration, so on the flat spectra of trained blocks it reaches
  the same accuracy with several times fewer products.
- :func:`matrix_free_topk` / :func:`operator_topk`: either solver (``solver="lanczos"``, the
  default, or ``"subspace"``), but J is never formed. Products ``J V`` are forward-mode JVPs and
  ``Jᵀ U`` reverse-mode VJPs of the block's residual function ``f`` (from
  ``blocks.block_function`` with token-diagonal attention), with a tangent/cotangent row for
  every token, so one product ("block pass") serves all T tokens at once; compare the cost
  :func:`solver_passes` with the ``d`` passes of the exact sweep. Since ``f = block(X) − X``,
  its Jacobian is already ``J_tt`` (identity subtracted).

The randomized methods are accurate when the spectrum has a gap after K; on trained models
their error is measured (``tests/test_spectra.py``, ``bench/bench_jacobians.py``), not assumed.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from coupling_utils.engine.metric import SVD, _as_tensor, check_k

__all__ = [
    "topk_svd",
    "randomized_svd",
    "block_lanczos_svd",
    "lanczos_plan",
    "TokenOperator",
    "MatrixFreeSVD",
    "matrix_free_topk",
    "operator_topk",
    "block_passes",
    "solver_passes",
    "lapack_threads",
    "check_randomized",
    "METHODS",
    "SOLVERS",
    "Solver",
    "LANCZOS_STEPS",
]

METHODS = ("exact", "randomized", "lanczos")
SOLVERS = ("lanczos", "subspace")  # top-K solvers that need only products
# Default Lanczos plan: blocks of ceil(K/10) vectors, 45 steps (a Krylov space of about 4.5K).
# On the flat spectra of trained SmolLM2-135M (σ_{K+1}/σ_K ≈ 0.98-0.99) this kept every depth-wise
# coupling value within 0.0003 of exact for K = 10, 30, 50 (3 seeds), where ceil(K/2) x 6 steps,
# about as many passes at K = 10, was off by 0.02: small blocks and many steps win on flat spectra.
LANCZOS_STEPS = 45
LANCZOS_BLOCK_DIVISOR = 10

Apply = Callable[[torch.Tensor], torch.Tensor]


def check_randomized(oversample: int, n_iter: int) -> None:
    """Validate subspace iteration's settings: non-negative integers."""
    if isinstance(oversample, bool) or not isinstance(oversample, int) or oversample < 0:
        raise ValueError(f"oversample must be a non-negative integer, got {oversample!r}")
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 0:
        raise ValueError(f"n_iter must be a non-negative integer, got {n_iter!r}")


def block_passes(k: int, *, oversample: int = 10, n_iter: int = 2, d: int | None = None) -> int:
    """Products (block passes) the subspace-iteration solver needs for rank ``k``: ``(2q + 2)·l``."""
    l = k + oversample if d is None else min(k + oversample, d)
    return (2 * n_iter + 2) * l


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_solver(solver: str) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")


@dataclass(frozen=True)
class Solver:
    """A top-K solver that needs only products, and its settings (checked when made).

    ``name="lanczos"``: block Lanczos with ``block`` columns for ``steps`` steps (defaults
    ``ceil(k/10)`` and 45, see :func:`lanczos_plan`); ``name="subspace"``: subspace iteration
    with ``oversample`` extra columns and ``n_iter`` power iterations. ``seed``: the random
    start.
    """

    name: str = "lanczos"
    block: int | None = None
    steps: int | None = None
    oversample: int = 10
    n_iter: int = 2
    seed: int = 0

    def __post_init__(self):
        _check_solver(self.name)
        check_randomized(self.oversample, self.n_iter)


def lanczos_plan(
    k: int, size: int | None = None, *, block: int | None = None, steps: int | None = None
) -> tuple[int, int]:
    """The (block, steps) block Lanczos uses for rank ``k`` on a matrix with ``min(m, n) = size``.

    Defaults: ``block = ceil(k / 10)``, ``steps = 45`` (see ``LANCZOS_STEPS``). The Krylov space
    (``block·steps`` vectors on each side) cannot be larger than the matrix, so ``steps`` is
    capped at ``size // block``; a plan that then holds fewer than ``k`` vectors is refused.
    ``size=None``: no cap.
    """
    k = check_k(k, size) if size is not None else _positive_int(k, "k")
    block = -(-k // LANCZOS_BLOCK_DIVISOR) if block is None else _positive_int(block, "block")
    steps = LANCZOS_STEPS if steps is None else _positive_int(steps, "steps")
    if size is not None:
        if block > size:
            raise ValueError(f"block={block} exceeds the matrix size {size}; choose block <= {size}")
        steps = min(steps, size // block)
    if block * steps < k:
        capped = (
            f" (steps capped at {size} // {block} = {steps} by the matrix size)" if size is not None else ""
        )
        raise ValueError(
            f"block·steps = {block}·{steps} = {block * steps} Lanczos vectors{capped} cannot "
            f"give k={k} triplets; choose block·steps >= k"
        )
    return block, steps


def solver_passes(
    k: int,
    *,
    solver: str = "lanczos",
    block: int | None = None,
    steps: int | None = None,
    oversample: int = 10,
    n_iter: int = 2,
    d: int | None = None,
) -> int:
    """Products (block passes) a top-``k`` solver needs on a d × d operator.

    ``solver="lanczos"``: ``(2·steps − 1)·block`` (:func:`lanczos_plan`'s block and steps);
    ``solver="subspace"``: ``(2·n_iter + 2)·min(k + oversample, d)`` (:func:`block_passes`).
    """
    _check_solver(solver)
    if solver == "subspace":
        check_randomized(oversample, n_iter)
        return block_passes(k, oversample=oversample, n_iter=n_iter, d=d)
    b, s = lanczos_plan(k, d, block=block, steps=steps)
    return (2 * s - 1) * b


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


def _orthonormal_complement(Y: torch.Tensor, blocks: list[torch.Tensor]) -> torch.Tensor:
    """An orthonormal basis of Y [..., m, b] with its components in ``span(blocks)`` removed.

    The projection is done twice ("twice is enough" for full reorthogonalisation), then once
    more after normalising: if Y lay (almost) inside the span, its QR is rounding noise that is
    no longer orthogonal to it, and the last pass restores orthogonality.
    """
    if not blocks:
        return _orthonormal(Y)
    Q = torch.cat(blocks, -1)
    for _ in range(2):
        Y = Y - Q @ (Q.transpose(-1, -2) @ Y)
    Y = _orthonormal(Y)
    Y = Y - Q @ (Q.transpose(-1, -2) @ Y)
    return _orthonormal(Y)


def block_lanczos_svd(
    apply: Apply,
    apply_t: Apply,
    shape: tuple[int, ...],
    k: int,
    solver: Solver | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    keep: str = "k",
) -> tuple[SVD, int]:
    """Top-k SVD of a (batched) linear operator by block Lanczos; returns (SVD, products).

    ``apply``, ``apply_t`` and ``shape = (*batch, m, n)`` as in :func:`randomized_svd`;
    ``solver``'s ``block``, ``steps`` and ``seed`` (its name is not read). Block
    Golub–Kahan–Lanczos bidiagonalisation with full reorthogonalisation, from a random
    orthonormal start block V_1 [n, block]: for j = 1..steps, ``U_j = orth(J V_j ⊥ U_<j)`` and
    (but the last) ``V_{j+1} = orth(Jᵀ U_j ⊥ V_≤j)``. The projected matrix
    ``B = Uᵀ [J V_1 … J V_steps]`` (block·steps square) is formed from the stored products, so
    the Ritz triplets of its SVD cost no further products, and ``Uᵀ J V`` in the returned bases
    is exactly ``diag(S)``. ``block``/``steps`` default to ``ceil(k/10)`` and 45 and are checked
    and capped by :func:`lanczos_plan`. ``keep="all"`` returns all ``block·steps`` Ritz triplets
    instead of the top k. ``products`` counts the columns pushed through ``apply``/``apply_t``:
    ``(2·steps − 1)·block``.
    """
    solver = solver or Solver()
    *batch, m, n = shape
    block, steps = lanczos_plan(k, min(m, n), block=solver.block, steps=solver.steps)
    seed = solver.seed
    k = int(k)
    if keep not in ("k", "all"):
        raise ValueError(f"keep must be 'k' or 'all', got {keep!r}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    start = torch.randn(*batch, n, block, generator=gen, dtype=dtype).to(device or "cpu")
    V_blocks, U_blocks, JV_blocks = [_orthonormal(start)], [], []
    products = 0
    for j in range(steps):
        JV = apply(V_blocks[j])  # [..., m, block]
        products += block
        JV_blocks.append(JV)
        U_blocks.append(_orthonormal_complement(JV, U_blocks))
        if j < steps - 1:
            JtU = apply_t(U_blocks[j])  # [..., n, block]
            products += block
            V_blocks.append(_orthonormal_complement(JtU, V_blocks))
    U, V = torch.cat(U_blocks, -1), torch.cat(V_blocks, -1)
    B = U.transpose(-1, -2) @ torch.cat(JV_blocks, -1)  # [..., sb, sb] = Uᵀ J V (U has JV's dtype)
    with lapack_threads():
        Ub, S, Vbh = torch.linalg.svd(B, full_matrices=False)
    r = block * steps if keep == "all" else k
    U_r = U @ Ub[..., :, :r]
    Vh_r = Vbh[..., :r, :] @ V.transpose(-1, -2)
    return SVD(U_r, S[..., :r], Vh_r), products


def randomized_svd(
    apply: Apply,
    apply_t: Apply,
    shape: tuple[int, ...],
    k: int,
    solver: Solver | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    keep: str = "k",
) -> tuple[SVD, int]:
    """Top-k SVD of a (batched) linear operator given only its products; returns (SVD, products).

    ``apply(V: Tensor  # [..., n, l]) -> Tensor  # [..., m, l]`` (``J V``) and
    ``apply_t(U: Tensor  # [..., m, l]) -> Tensor  # [..., n, l]`` (``Jᵀ U``);
    ``shape = (*batch, m, n)``. Halko et al. (2011): a Gaussian sketch, ``n_iter`` power
    iterations re-orthonormalised by QR after every product (their Alg. 4.4), then the SVD of
    the small ``Qᵀ J`` (Alg. 5.1). ``keep="all"`` returns all ``l = k + oversample`` computed
    triplets (a rank-l approximation of J) instead of the top k. ``products`` counts the
    columns pushed through ``apply``/``apply_t``: ``(2·n_iter + 2)·l``. ``solver``: its
    ``oversample``, ``n_iter`` and ``seed`` (its name is not read).
    """
    solver = solver or Solver("subspace")
    oversample, n_iter, seed = solver.oversample, solver.n_iter, solver.seed
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


def topk_svd(
    J,
    k: int,
    method: str = "exact",
    *,
    oversample: int = 10,
    n_iter: int = 2,
    block: int | None = None,
    steps: int | None = None,
    seed: int = 0,
) -> SVD:
    """Top-k singular triplets of ``J: Tensor  # [..., m, n]`` (batched over leading dims), in fp32
    or better: an :class:`~coupling_utils.engine.metric.SVD` with ``U  # [..., m, K]``,
    ``S  # [..., K]``, ``Vh  # [..., K, n]``.

    ``method="exact"``: ``torch.linalg.svd`` truncated to k. ``method="randomized"``: Halko et
    al.'s randomized SVD with ``k + oversample`` probe vectors and ``n_iter`` power iterations
    (accurate when σ_k is well separated from σ_{k+oversample}; error grows without a gap).
    ``method="lanczos"``: :func:`block_lanczos_svd` with ``block`` and ``steps``.
    Singular vectors are defined up to sign.
    """
    if method not in METHODS:
        raise ValueError(
            f"method must be one of {METHODS}, got {method!r} "
            "(for products through a model block use matrix_free_topk)"
        )
    J = _as_tensor(J, "J")
    k = check_k(k, min(J.shape[-2:]))
    if method == "exact":
        with lapack_threads():
            U, S, Vh = torch.linalg.svd(J, full_matrices=False)
        return SVD(U[..., :, :k], S[..., :k], Vh[..., :k, :])
    Jt = J.transpose(-1, -2)
    if method == "lanczos":
        solver = Solver("lanczos", block=block, steps=steps, seed=seed)
        s, _ = block_lanczos_svd(
            lambda V: J @ V, lambda U: Jt @ U, tuple(J.shape), k, solver, dtype=J.dtype, device=J.device
        )
        return s
    solver = Solver("subspace", oversample=oversample, n_iter=n_iter, seed=seed)
    s, _ = randomized_svd(
        lambda V: J @ V, lambda U: Jt @ U, tuple(J.shape), k, solver, dtype=J.dtype, device=J.device
    )
    return s


class TokenOperator:
    """The token Jacobians ``J_tt`` of a token-diagonal ``f: [T, d] -> [T, d]`` at X, as products.

    ``matmul(V: Tensor  # [T, d, l])`` returns ``J_tt V_t  # [T, d, l]`` for every token
    (forward-mode JVPs, one per column) and ``rmatmul(U: Tensor  # [T, d, l])`` returns
    ``J_ttᵀ U_t  # [T, d, l]`` (reverse-mode VJPs from a single
    forward graph). ``f`` must be token-diagonal in its derivatives (``block_function(...,
    token_diagonal=True)``); otherwise the products mix tokens and are not ``J_tt``.
    ``passes`` counts the products (each one is one pass through the block for all T tokens).
    """

    def __init__(
        self, f: Callable[[torch.Tensor], torch.Tensor], X: torch.Tensor, *, chunk_size: int | None = 64
    ):
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

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the products and of the solver: the block's dtype, at least fp32."""
        return torch.promote_types(self.X.dtype, torch.float32)

    def _columns(self, fn: Callable[[torch.Tensor], torch.Tensor], M: torch.Tensor) -> torch.Tensor:
        """Apply ``fn`` ([T, d] -> [T, d]) to each of the l columns of M[T, d, l], in chunks.

        The block runs in its own dtype (bf16/fp16 weights: the products are rounded there);
        the results come back in :attr:`dtype` (fp32 or better) for the solver.
        """
        M = M.to(self.X.dtype)
        l = M.shape[-1]
        step = self.chunk_size or l
        out = []
        for start in range(0, l, step):
            cols = M[..., start : start + step].movedim(-1, 0).contiguous()  # [c, T, d]
            res = torch.func.vmap(fn)(cols) if cols.shape[0] > 1 else fn(cols[0]).unsqueeze(0)
            out.append(res.detach().to(self.dtype))
            self.passes += cols.shape[0]
        return torch.cat(out, 0).movedim(0, -1)

    def matmul(self, V: torch.Tensor) -> torch.Tensor:
        """``J_tt V_t`` for all tokens: ``V: Tensor  # [T, d, l]`` -> ``Tensor  # [T, d, l]`` (JVPs)."""
        X = self.X

        def jvp(v):
            return torch.func.jvp(self.f, (X,), (v,))[1]

        with torch.enable_grad():
            return self._columns(jvp, V)

    def rmatmul(self, U: torch.Tensor) -> torch.Tensor:
        """``J_ttᵀ U_t`` for all tokens: ``U: Tensor  # [T, d, l]`` -> ``Tensor  # [T, d, l]`` (VJPs)."""
        with torch.enable_grad():
            if self._vjp_fn is None:
                _, self._vjp_fn = torch.func.vjp(self.f, self.X)
            vjp_fn = self._vjp_fn
            return self._columns(lambda u: vjp_fn(u)[0], U)


@dataclass
class MatrixFreeSVD:
    """Top singular triplets of all T token Jacobians of one block, without forming them.

    ``svd``: batched over tokens (``U  # [T, d, r]``, ``S  # [T, r]``, ``Vh  # [T, r, d]``);
    ``block_passes``: the products used (compare with d for the exact token-diagonal sweep, T·d for
    the reference); ``rank``: the number of triplets computed (block·steps for Lanczos, k +
    oversample for subspace iteration); ``solver`` and ``settings`` say how (the resolved block and
    steps, or oversample and n_iter).
    """

    svd: SVD
    block_passes: int
    rank: int
    k: int
    solver: str = "lanczos"
    settings: dict = field(default_factory=dict)


def _check_finite(tensors: Iterable[torch.Tensor]) -> None:
    """Refuse NaN or inf in the products, or in the solver's result built from them."""
    if not all(torch.isfinite(t).all() for t in tensors):
        raise ValueError(
            "the matrix-free products returned NaN or inf; the block is not usable "
            "at this input (check the model's dtype: use float32)"
        )


def _finite_products(fn: Apply) -> Apply:
    def checked(M: torch.Tensor) -> torch.Tensor:
        out = fn(M)
        _check_finite([out])
        return out

    return checked


def operator_topk(
    op: TokenOperator, k: int, solver: Solver | None = None, *, keep: str = "k"
) -> MatrixFreeSVD:
    """Top-k SVD of every token Jacobian of a :class:`TokenOperator`, from products only.

    ``solver`` (default ``Solver()``, block Lanczos): "lanczos" runs :func:`block_lanczos_svd`
    with its ``block``/``steps``; "subspace" runs :func:`randomized_svd` with its
    ``oversample``/``n_iter``. The products counted in ``block_passes`` equal
    :func:`solver_passes` for the same settings.
    """
    solver = solver or Solver()
    T, d, _ = op.shape
    before = op.passes
    apply, apply_t = _finite_products(op.matmul), _finite_products(op.rmatmul)
    common = dict(dtype=op.dtype, device=op.X.device, keep=keep)
    if solver.name == "lanczos":
        b, st = lanczos_plan(k, d, block=solver.block, steps=solver.steps)
        s, _ = block_lanczos_svd(apply, apply_t, op.shape, k, solver, **common)  # plans the same b, st
        rank, settings = b * st, {"block": b, "steps": st}
    else:
        k = check_k(k, d)
        s, _ = randomized_svd(apply, apply_t, op.shape, k, solver, **common)
        rank, settings = (
            min(k + solver.oversample, d),
            {"oversample": solver.oversample, "n_iter": solver.n_iter},
        )
    _check_finite(s)
    return MatrixFreeSVD(s, op.passes - before, rank, int(k), solver.name, settings)


def matrix_free_topk(
    model,
    inputs,
    layer: int,
    k: int,
    solver: Solver | None = None,
    *,
    chunk_size: int | None = 64,
    keep: str = "k",
    last_block: str = "block",
) -> MatrixFreeSVD:
    """Top-k SVD of ``J^l_tt`` for all T tokens of ``inputs`` at block ``layer``, matrix-free.

    Products go through ``blocks.block_function(model, inputs, layer, token_diagonal=True)``:
    JVPs for ``J V`` and VJPs for ``Jᵀ U``, each with a row per token, so the cost is
    :func:`solver_passes` block passes for all tokens together: ``(2·steps − 1)·block`` for
    a "lanczos" :class:`Solver` (default), ``(2·n_iter + 2)·min(k + oversample, d)`` for
    "subspace". J is never formed. ``keep="all"`` keeps all computed triplets (a
    low-rank approximation of J). ``last_block``: what the last block's map is
    (``blocks.LAST_BLOCKS``).
    """
    from coupling_utils.engine.blocks import block_function
    from coupling_utils.engine.jacobians import frozen

    solver = solver or Solver()
    with frozen(model):  # products then build no parameter gradients
        f, X = block_function(model, inputs, layer, token_diagonal=True, last_block=last_block)
        k = check_k(k, X.shape[-1])
        op = TokenOperator(f, X, chunk_size=chunk_size)
        return operator_topk(op, k, solver, keep=keep)
