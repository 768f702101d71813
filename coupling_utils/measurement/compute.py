"""The computation behind measure(): per (prompt, layer) Jacobians or matrix-free spectra, the
matrix-free cross products between layers, and context Jacobians.

Work happens on the model's device; what is stored or tabulated leaves it through ``host()``
(``.detach().cpu()``) or :func:`~coupling_utils.measurement.store.save_npy`, and stored arrays
read back on the host are moved to the device before they meet device tensors. Shapes: ``N``
stacked Jacobians (tokens or layers), ``T`` tokens of a prompt, ``n`` selected tokens, ``d``
the width (``d_out``, ``d_in`` where it matters), ``kmax`` the largest K.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from coupling_utils.engine import jacobians
from coupling_utils.engine.blocks import block_function
from coupling_utils.engine.gram import exact_topk
from coupling_utils.engine.metric import SVD, bases, check_k, tile_metric
from coupling_utils.engine.one_token import OneTokenCalls, choose_path, one_token_jacobians
from coupling_utils.engine.spectra import (
    Solver,
    TokenOperator,
    block_lanczos_svd,
    operator_topk,
    topk_svd,
)
from coupling_utils.measurement.inputs import ModelInfo, Prompt, token_positions
from coupling_utils.measurement.settings import Settings
from coupling_utils.measurement.store import HeldLayers, Store, save_npy, write_json
from coupling_utils.measurement.tables import (
    Piece,
    concat,
    coupling_pieces,
    host,
    in_window,
    singular_value_piece,
)

__all__ = ["LayerWork", "pair_tiles", "couplings", "as_float", "spectra"]


def pair_tiles(
    J: torch.Tensor,  # [N, d_out, d_in]
    s: SVD,  # of J: U [N, d_out, ≥kmax], S [N, ≥kmax], Vh [N, ≥kmax, d_in]
    kmax: int,
    orientation: str,
    *,
    max_numbers: int = 1 << 26,
) -> torch.Tensor:  # [N, N, kmax, kmax]
    """``tiles[i, j] = |left_jᵀ J_i right_j|`` for all pairs, K = kmax.

    The K-tile of any K ≤ kmax is the top-left K×K corner of the kmax tile, since the bases
    are nested; so one product serves all K. For a chunk of partners j, two GEMMs: the left
    bases side by side times every J_i at once (``[left_j]ᵀ [J_1 … J_N]``, the bulk of the
    FLOPs), then each partner's rows times its own right basis, batched over j. No operand is
    copied into another layout between them (an einsum over ``J right_j`` did that, and ran at
    half the GEMM rate); J is laid side by side once, a chunk of i at a time. That copy and the
    products each hold at most ``max_numbers / 2`` numbers (128 MiB in fp32), so memory stays
    bounded for long prompts (T = 256 tokens at d = 576 would need 7.5 GB at once).
    """
    left, right = bases(s, kmax, orientation)  # [N, d, kmax]
    N, d_out, d = J.shape[0], J.shape[-2], J.shape[-1]
    dtype = torch.promote_types(J.dtype, left.dtype)
    out = torch.empty(N, N, kmax, kmax, dtype=dtype, device=J.device)
    half = max(1, max_numbers // 2)
    i_step = max(1, half // max(1, d_out * d))
    for i0 in range(0, N, i_step):
        i1 = min(N, i0 + i_step)
        n_i = i1 - i0
        J_side = J[i0:i1].to(dtype).permute(1, 0, 2).reshape(d_out, n_i * d)  # [d_out, (i, d)]
        step = max(1, half // max(1, n_i * d * kmax))
        for j0 in range(0, N, step):
            j1 = min(N, j0 + step)
            L = left[j0:j1].to(dtype).transpose(-1, -2).reshape((j1 - j0) * kmax, d_out)  # [(j, r), d_out]
            LJ = (L @ J_side).reshape(j1 - j0, kmax * n_i, d)  # [j, (r, i), d]: left_jᵀ J_i
            # right_jᵀ (left_jᵀ J_i)ᵀ = (left_jᵀ J_i right_j)ᵀ: [j, c, (r, i)]; this order of the
            # operands ran 10 % faster than LJ @ right_j (the GEMM's long side is then N·kmax)
            tiles = right[j0:j1].to(dtype).transpose(-1, -2) @ LJ.transpose(-1, -2)
            out[i0:i1, j0:j1] = tiles.reshape(j1 - j0, kmax, kmax, n_i).permute(3, 0, 2, 1).abs()
    return out


def couplings(
    tiles: torch.Tensor,  # [N, N, kmax, kmax]
    S: torch.Tensor,  # [N, ≥kmax]
    ks: Sequence[int],
    p: float,
    normalize: str,
) -> dict[int, torch.Tensor]:  # K -> m_K [N, N]
    """``m_K[i, j]`` for every K from the kmax tiles and each J_i's own singular values."""
    out = {}
    for k in ks:
        s1k = S[:, :k].unsqueeze(1).expand(-1, tiles.shape[1], -1)  # J_i's own values, per row i
        out[k] = tile_metric(tiles[..., :k, :k], s1k, p, normalize)
    return out


def as_float(J: torch.Tensor) -> torch.Tensor:  # [..., d, d] -> the same, fp32 or fp64
    """Jacobians in fp32 (or fp64), refused if not finite."""
    J = J.detach()
    if J.dtype != torch.float64:
        J = J.float()
    if not torch.isfinite(J).all():
        raise ValueError(
            "the block Jacobians contain NaN or inf; measure the model in float32 "
            "(load_model(..., dtype='float32')) or check the prompt"
        )
    return J


def spectra(
    J: torch.Tensor,  # [N, d, d]
    kmax: int,
    n_singular: int,
    method: str,
    s: Settings,
) -> tuple[SVD, torch.Tensor]:  # (U [N, d, kmax], S [N, kmax], Vh [N, kmax, d]), S [N, n_singular]
    """Top-kmax triplets of J and its top n_singular singular values.

    "exact": the top max(kmax, n_singular) triplets from ``gram.exact_topk`` (a partial
    eigensolver on JᵀJ where that is cheaper than a full SVD, else the full SVD).
    """
    if method == "exact":
        res, _ = exact_topk(J, max(kmax, n_singular))
        top = SVD(
            res.U[..., :kmax].contiguous(), res.S[..., :kmax].contiguous(), res.Vh[..., :kmax, :].contiguous()
        )
        return top, res.S[..., :n_singular]
    if s.solver == "lanczos":
        Jt = J.transpose(-1, -2)
        solver = Solver("lanczos", block=s.block, steps=s.steps, seed=s.seed)
        res, _ = block_lanczos_svd(
            lambda V: J @ V, lambda U: Jt @ U, tuple(J.shape), kmax, solver,
            dtype=J.dtype, device=J.device, keep="all",
        )  # fmt: skip
    else:
        res = topk_svd(
            J, max(kmax, n_singular), "randomized", oversample=s.oversample, n_iter=s.n_iter, seed=s.seed
        )
    top = SVD(
        res.U[..., :kmax].contiguous(), res.S[..., :kmax].contiguous(), res.Vh[..., :kmax, :].contiguous()
    )
    return top, res.S[..., :n_singular]


class LayerWork:
    """The per-(prompt, layer) computations of one run, stored under ``store``: each finished
    layer through ``held`` (:class:`~coupling_utils.measurement.store.HeldLayers`), which writes
    it at most every ``checkpoint_seconds``. Matrix-free layers are written at once: their cross
    products read the partners' vectors from their files."""

    def __init__(self, info: ModelInfo, settings: Settings, store: Store, checkpoint_seconds: float = 0.0):
        self.model = info.model
        self.s = settings
        self.store = store
        self.kmax = settings.kmax
        self.held = HeldLayers(store, 0.0 if settings.method == "matrix_free" else checkpoint_seconds)
        self.paths: dict[tuple[str, int], tuple[str, str]] = {}  # (prompt, layer) -> (path, why)
        self._one_token: tuple[str | None, dict] = (None, {})  # (prompt, {token: OneTokenCalls})
        # the layer tables stored by this run, as their pieces, for the prompt's assembly:
        # prompt -> layer -> table -> pieces
        self._tables: dict[str, dict[int, dict[str, list[Piece]]]] = {}
        self._empty: dict[tuple[str, int], list[str]] = {}  # (prompt, layer) -> its tables without rows
        self._arrays: dict[tuple[str, int], dict[str, list[int]]] = {}  # (prompt, layer) -> array shapes

    def stored_tables(self, pid: str) -> dict[int, dict[str, list[Piece]]]:
        """The layer tables this run stored for prompt ``pid`` (by layer, then table, as the pieces
        they were made of), handed over once: the prompt's assembly takes them instead of reading
        their files back."""
        return self._tables.pop(pid, {})

    def _calls(self, p: Prompt, sel: list[int]) -> dict:
        """The one-token block calls of the selected tokens for every measured block, made once
        per prompt (two forward passes per token, shared by all blocks)."""
        if self._one_token[0] != p.pid:
            blocks = sorted({self.s.block_of(layer)[0] for layer in self.s.layers})
            calls = {t: OneTokenCalls(self.model, p.inputs, t, blocks) for t in sel}
            self._one_token = (p.pid, calls)
        return self._one_token[1]

    def compute_layer(self, p: Prompt, layer: int) -> dict:
        """Spectra of the selected tokens' J_tt, token-wise and context tables; marker last."""
        s, t0 = self.s, time.perf_counter()
        self.held.start(p.pid, layer)
        if s.method == "matrix_free":
            T, sel, basis, S_top, tw_tiles, passes = self._matrix_free_layer(p, layer)
        else:
            T, sel, basis, S_top, tw_tiles, passes = self._formed_layer(p, layer)
        for name, arr in zip(("U", "S", "Vh"), basis):
            self.store_array(p.pid, layer, f"basis_{name}", arr)
        sv = singular_value_piece(p.pid, layer, sel, S_top)
        self.store_table(p.pid, layer, "singular_values", [sv])
        rows = []
        if tw_tiles is not None:
            ms = couplings(tw_tiles, basis.S, s.k, s.p, s.normalize)
            rows = coupling_pieces("tokenwise", ms, sel, ("token_i", "token_j"), prompt=p.pid, layer=layer)
        self.store_table(p.pid, layer, "tokenwise", rows)
        ctx_tokens: list[int] = []
        if s.context is not False:
            ctx_tokens, ctx_passes = self._context_layer(p, layer, T)
            passes += ctx_passes
        meta = {
            "layer": layer,
            "T": T,
            "tokens": sel,
            "context_tokens": ctx_tokens,
            "seconds": time.perf_counter() - t0,
            "block_passes": int(passes),
            "path": self.paths.get((p.pid, layer), ("matrix_free", ""))[0],
            "empty_tables": sorted(self._empty.pop((p.pid, layer), [])),
            "arrays": self._arrays.pop((p.pid, layer)),
        }
        self.held.done(p.pid, layer, meta)  # the layer is complete: written now, or held
        return meta

    def store_array(self, pid: str, layer: int, name: str, arr: torch.Tensor) -> None:
        """Store a layer's array ``name``; its shape goes into the layer's marker, which vouches for it."""
        self.held.array(pid, layer, name, arr)
        self._arrays.setdefault((pid, layer), {})[name] = list(arr.shape)

    def store_table(self, pid: str, layer: int, name: str, pieces: list[Piece]) -> None:
        """Store a layer's table ``name`` (a table without rows is only named in the layer's
        marker, ``empty_tables``), and keep its pieces for the prompt's assembly."""
        table = concat(name, pieces)
        if len(table):
            self.held.table(pid, layer, name, table)
        else:
            self._empty.setdefault((pid, layer), []).append(name)
        self._tables.setdefault(pid, {}).setdefault(layer, {})[name] = pieces

    def _formed_layer(self, p: Prompt, layer: int):
        """Exact/randomized: form the selected J_tt, then their spectra.

        A few tokens of a causal model: one token at a time against its prefix's key/value cache
        (``engine.one_token``, d one-token VJPs each); otherwise one token-diagonal sweep over
        all T tokens (d VJPs). ``self.paths`` records the choice per (prompt, layer).
        """
        s = self.s
        block, last_block = s.block_of(layer)  # the last block's second map has a label of its own
        path, why = "all_tokens", "the inputs are not token ids"
        if p.input_ids:
            T = len(p.input_ids)
            sel = token_positions(s.tokens, T)
            path, why = choose_path(self.model, p.inputs, len(sel), T)
        self.paths[(p.pid, layer)] = (path, why)
        if path == "one_token":
            J = as_float(
                one_token_jacobians(
                    self.model, p.inputs, block, sel, last_block=last_block, calls=self._calls(p, sel)
                )
            )
        else:
            J_all = as_float(
                jacobians.token_jacobians(self.model, p.inputs, block, last_block=last_block)
            )  # [T, d, d]
            T = J_all.shape[0]
            sel = token_positions(s.tokens, T)
            J = J_all[sel].contiguous()  # [n, d, d]
            del J_all
        check_k(self.kmax, J.shape[-1])
        basis, S_top = spectra(J, self.kmax, s.n_singular, s.method, s)
        self.store_array(p.pid, layer, "J", J)
        tw_tiles = pair_tiles(J, basis, self.kmax, s.orientation) if len(sel) >= 2 else None
        passes = J.shape[-1] * (len(sel) if path == "one_token" else 1)  # one-token or all-token VJPs
        return T, sel, basis, S_top, tw_tiles, passes

    def operator(self, p: Prompt, layer: int) -> TokenOperator:
        block, last_block = self.s.block_of(layer)
        f, X = block_function(self.model, p.inputs, block, token_diagonal=True, last_block=last_block)
        return TokenOperator(f, X, chunk_size=self.s.chunk_size)

    def _matrix_free_layer(self, p: Prompt, layer: int):
        """Matrix-free: top triplets from JVP/VJP products; token-wise tiles from products too."""
        s, kmax = self.s, self.kmax
        with jacobians.frozen(self.model):
            op = self.operator(p, layer)
            T, d = op.X.shape
            check_k(kmax, d)
            sel = token_positions(s.tokens, T)
            solver = Solver(
                s.solver, block=s.block, steps=s.steps,
                oversample=s.oversample if s.oversample is not None else 10,
                n_iter=s.n_iter if s.n_iter is not None else 2, seed=s.seed,
            )  # fmt: skip
            res = operator_topk(op, kmax, solver, keep="all")
            U, S, Vh = (x[sel].float() if x.dtype != torch.float64 else x[sel] for x in res.svd)
            basis = SVD(U[..., :kmax].contiguous(), S.contiguous(), Vh[..., :kmax, :].contiguous())
            tw_tiles = None
            if len(sel) >= 2:
                # tiles[a, b] = |U_bᵀ J_a V_b|: token a's Jacobian applied to token b's vectors,
                # all a at once (row a of the tangent carries V_b): n·kmax products
                left, right = bases(basis, kmax, s.orientation)  # [n, d, kmax]
                n = len(sel)
                tangent = torch.zeros(T, d, n * kmax, dtype=op.X.dtype, device=op.X.device)
                tangent[sel] = right.permute(1, 0, 2).reshape(d, n * kmax).to(tangent.dtype)
                JV = op.matmul(tangent)[sel].float().reshape(n, d, n, kmax)  # [a, d, b, c]
                tw_tiles = torch.einsum("bdr,adbc->abrc", left.float(), JV).abs()
        return T, sel, basis, S[:, : s.n_singular], tw_tiles, op.passes

    def compute_cross(self, p: Prompt, layer: int, metas: list[dict]) -> dict:
        """Matrix-free depth-wise tiles ``|U_jᵀ J_i V_j|`` for block i = ``layer`` and its partners j.

        J_i is applied (JVPs) to the stored top-kmax right vectors of every partner layer (all
        other measured layers, or those within ``depth_window``): P·kmax block passes for all
        tokens at once; the (i, i) tile is diag(S_i) exactly (both solvers diagonalise J_i in
        its own basis; the "vju" orientation needs products for it too). Tiles of pairs outside
        the window stay zero and are never reported.
        """
        s, layers, kmax = self.s, list(self.s.layers), self.kmax
        t0 = time.perf_counter()
        sel = metas[0]["tokens"]
        n = len(sel)
        partners = [
            l
            for l in layers
            if (l != layer or s.orientation != "ujv") and in_window(l, layer, s.depth_window)
        ]
        tiles = torch.zeros(n, len(layers), kmax, kmax)  # [a, j, r, c], on the host
        if layer not in partners:
            tiles[:, layers.index(layer)] = torch.diag_embed(self.store.basis(p.pid, layer).S[:, :kmax])
        with jacobians.frozen(self.model):
            op = self.operator(p, layer)
            if partners:
                T, d = op.X.shape
                dev = op.X.device
                pairs = [bases(self.store.basis(p.pid, l), kmax, s.orientation) for l in partners]
                V = torch.cat([right for _, right in pairs], dim=-1)  # [n, d, P·kmax]
                tangent = torch.zeros(T, d, V.shape[-1], dtype=op.X.dtype, device=dev)
                tangent[sel] = V.to(device=dev, dtype=tangent.dtype)
                JV = op.matmul(tangent)[sel].float().reshape(n, d, len(partners), kmax)  # [a, d, j, c]
                U = torch.stack([left for left, _ in pairs], dim=1).float().to(dev)  # [a, j, d, kmax]
                cross = host(torch.einsum("ajdr,adjc->ajrc", U, JV).abs())
                for jj, l in enumerate(partners):
                    tiles[:, layers.index(l)] = cross[:, jj]
        ldir = self.store.layer_dir(p.pid, layer)
        save_npy(ldir / "cross_tiles.npy", tiles)
        meta = {
            "layer": layer,
            "seconds": time.perf_counter() - t0,
            "block_passes": int(op.passes),
            "arrays": {"cross_tiles": list(tiles.shape)},
        }
        write_json(ldir / "cross.json", meta)  # after the tiles
        return meta

    def _context_layer(self, p: Prompt, layer: int, T: int) -> tuple[list[int], int]:
        """Context Jacobians J_{t1 t2} [n, d, d] for the fixed output token (formed: d VJPs)."""
        s = self.s
        block, last_block = s.block_of(layer)
        t2 = token_positions(s.context, T, "context")[0]
        Jc = as_float(
            jacobians.context_jacobians(self.model, p.inputs, block, t2, last_block=last_block)
        )  # [T, d, d]
        nonzero = host(Jc.abs().amax(dim=(-2, -1)) > 0)
        ctx_tokens = [int(t) for t in nonzero.nonzero().flatten().tolist()]
        Jc = Jc[ctx_tokens].contiguous()
        cbasis, _ = spectra(Jc, self.kmax, 1, "exact" if s.method == "exact" else "randomized", s)
        self.store_array(p.pid, layer, "ctx_J", Jc)
        for name, arr in zip(("U", "S", "Vh"), cbasis):
            self.store_array(p.pid, layer, f"ctx_basis_{name}", arr)
        rows = []
        if len(ctx_tokens) >= 2:
            tiles = pair_tiles(Jc, cbasis, self.kmax, s.orientation)
            ms = couplings(tiles, cbasis.S, s.k, s.p, s.normalize)
            rows = coupling_pieces(
                "context",
                ms,
                ctx_tokens,
                ("token_i", "token_j"),
                prompt=p.pid,
                output_token=t2,
                layer_i=layer,
                layer_j=layer,
            )
        self.store_table(p.pid, layer, "context", rows)
        return ctx_tokens, Jc.shape[-1]  # one VJP per output coordinate
