"""Block Jacobians ``J^l_{t1 t2} = ∂ f^l(X)_{t2} / ∂ x_{t1}`` (rows = output coordinates).

``f^l(X) = block(X) − X`` is the block's residual contribution, so the identity is subtracted
exactly where it belongs: on the token's own Jacobian (t1 = t2) and nowhere else.

- :func:`token_jacobians`: ``J_tt`` for every token in ONE sweep of d vector-Jacobian products
  through token-diagonal attention (``attention.py``): a cotangent with a row for each token
  returns ``c_tᵀ J_tt`` for all t at once.
- :func:`reference_jacobians`: the authors' method, per token d VJPs through the ordinary
  block. Slow (T sweeps instead of one) and simple: the oracle the fast path is tested against.
- :func:`context_jacobians`: ``J_{t1 t2}`` for every input token t1 and one output token t2,
  one sweep of d VJPs of output row t2 through the ordinary block.

Each takes ``last_block`` (``blocks.LAST_BLOCKS``): what the last block's map is, the block
alone (default, the paper's definition) or with the final norm folded in (``"final_norm"``, as
the authors' code measured it); other blocks are the same under every choice.

VJPs are batched with ``torch.func.vmap`` over chunks of ``chunk_size`` cotangents; parameters
are frozen meanwhile; Jacobians come back in fp32 whatever the model's dtype; any NaN/inf is
reported with its layer and token.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from coupling_utils.engine.architectures import find_architecture
from coupling_utils.engine.blocks import block_function, residual_stream, unwrap_model

__all__ = [
    "token_jacobians",
    "reference_jacobians",
    "context_jacobians",
    "block_function",
    "residual_stream",
    "check_finite",
    "frozen",
]

Tokens = int | Sequence[int] | None


_FROZEN: weakref.WeakSet = weakref.WeakSet()  # models inside a frozen() now


@contextlib.contextmanager
def frozen(model):
    """Parameters temporarily ``requires_grad=False`` (VJPs then build no parameter gradients).

    Nested on the same model, only the outermost call walks and restores the parameters (a walk
    per block call cost a twentieth of a training-checkpoint chapter on small models);
    ``measure`` freezes each model once for all its layers."""
    model = unwrap_model(model)
    if model in _FROZEN:
        yield model
        return
    changed = [p for p in model.parameters() if p.requires_grad]
    _FROZEN.add(model)
    try:
        for p in changed:
            p.requires_grad_(False)
        yield model
    finally:
        _FROZEN.discard(model)
        for p in changed:
            p.requires_grad_(True)


def check_finite(J: torch.Tensor, layer: int, tokens: Sequence[int], what: str = "block Jacobian") -> None:
    """Raise a ValueError naming the layer and tokens if ``J: Tensor  # [T, d_out, d_in]`` holds
    NaN or inf (``tokens`` names the T positions)."""
    if bool(torch.isfinite(J.sum())):  # NaN or inf would make the sum so: one pass, no copy
        return  # (a finite J whose sum overflows takes the exact check below, and passes it)
    bad = ~torch.isfinite(J).flatten(1).all(dim=1)
    if bool(bad.any()):
        where = [int(tokens[i]) for i in torch.nonzero(bad).flatten().tolist()]
        raise ValueError(
            f"NaN/inf in the {what} at layer {layer}, token(s) {where}. The block's output is not finite "
            "there: check the model weights, or use dtype='float32' if the model runs in float16/bfloat16."
        )


def _token_list(tokens: Tokens, T: int) -> list:
    if tokens is None:
        return list(range(T))
    if isinstance(tokens, int):
        tokens = [tokens]
    out = []
    for t in tokens:
        t = int(t)
        if not -T <= t < T:
            raise IndexError(f"token {t} out of range for a sequence of {T} tokens")
        out.append(t % T)
    return out


def _default_chunk(d: int, T: int, chunk_size: int | None, device: torch.device | str | None = None) -> int:
    """How many cotangents one batched VJP takes: ``chunk_size``, or a budget of chunk × T × d numbers.

    On a CPU the budget is 2^20 numbers (4 MiB in fp32), so that each batched operation's operands
    stay in cache: on one SmolLM2-sized block, one thread, the all-token sweep took 2.2 s at
    T = 64 and 10.5 s at T = 256 against 4.1 s and 19.2 s with 2^24 (chunks of 28 and 7 cotangents
    against 455 and 113; no change on a GPT-NeoX block at T = 32). An accelerator keeps 2^24: it
    needs large batches to fill, and has the memory for them.
    """
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return int(chunk_size)
    budget = 1 << 20 if torch.device(device or "cpu").type == "cpu" else 1 << 24
    return max(1, min(d, budget // max(1, T * d)))


def _vjp_rows(vjp_fn, make_cotangents, d: int, chunk: int, progress: bool | None, desc: str):
    """Stack ``vjp_fn(C_i)`` for i = 0..d-1, batched over chunks: returns [d, T, d_in]."""
    pieces = []
    bar = tqdm(range(0, d, chunk), desc=desc, leave=False, disable=None if progress is None else not progress)
    for start in bar:
        C = make_cotangents(start, min(d, start + chunk))  # [c, T, d]
        (rows,) = torch.func.vmap(vjp_fn)(C)
        pieces.append(rows)
    return torch.cat(pieces)


def token_jacobians(
    model,
    inputs,
    layer: int,
    *,
    tokens: Tokens = None,
    chunk_size: int | None = None,
    progress: bool | None = None,
    last_block: str = "block",
) -> torch.Tensor:
    """``J^l_tt − I`` for every token (or the listed ``tokens``), in one sweep.

    Returns ``J: Tensor  # [T, d_out, d_in]`` (fp32; T = the tokens kept). d VJPs through the
    block with token-diagonal attention; cotangent ``i`` is the unit vector e_i on every token's
    row, and its VJP is row i of every ``J_tt`` at once. ``inputs``: token ids ``[1, T]`` or a
    dict of model inputs.

    Where the architecture table names the modules whose output the block adds to its output as
    it is (``residual_outputs``, e.g. the MLP's output projection W), the cotangent reaching
    their input is ``e_iᵀW``, the same on every token: the sweep cuts the block there
    (``blocks.cut_at``) and feeds it directly, instead of multiplying all T rows by W (a quarter
    of a Llama block's backward FLOPs). Not after a final norm (``last_block="final_norm"``).
    """
    with frozen(model):
        f, X = block_function(model, inputs, layer, token_diagonal=True, last_block=last_block)
        T, d = X.shape
        keep = _token_list(tokens, T)
        cut = find_architecture(model).cut(f.model.config) if f.norm is None else ()
        if cut:  # the block's output, without − X: J_tt − I is taken below, on the diagonal only
            (_, entered), vjp_fn = torch.func.vjp(lambda x: f(x, cut, minus_input=False), X)
            E = torch.eye(d, dtype=X.dtype, device=X.device)  # the rows e_i, all at once:
            # any token's input will do (the modules are affine), and once for the whole sweep
            into = [f.row_products(p, z[..., :1, :], E) for p, z in zip(cut, entered)]  # [d, ..., 1, d_in]
        else:
            _, vjp_fn = torch.func.vjp(lambda x: f(x, minus_input=False), X)

        def cotangents(i0, i1):
            C = torch.zeros(i1 - i0, T, d, dtype=X.dtype, device=X.device)
            C[torch.arange(i1 - i0), :, torch.arange(i0, i1)] = 1
            if not cut:
                return C
            rows = (r[i0:i1] for r in into)  # [c, ..., 1, d_in] each, the same on every token
            return C, tuple(r.expand(*r.shape[:-2], T, r.shape[-1]) for r in rows)

        chunk = _default_chunk(d, T, chunk_size, X.device)
        bar = tqdm(
            range(0, d, chunk),
            desc=f"J_tt layer {layer}",
            leave=False,
            disable=None if progress is None else not progress,
        )
        index = torch.tensor(keep, device=X.device)
        J = torch.empty(len(keep), d, d, dtype=torch.float32, device=X.device)  # [n, d_out, d_in]
        for start in bar:
            stop = min(d, start + chunk)
            (rows,) = torch.func.vmap(vjp_fn)(cotangents(start, stop))  # [c, T, d]
            J[:, start:stop] = rows.index_select(1, index).transpose(0, 1)  # written in place: no cat
        J.diagonal(dim1=1, dim2=2).sub_(1)  # the skip connection's identity
    check_finite(J, layer, keep)
    return J


def reference_jacobians(
    model,
    inputs,
    layer: int,
    *,
    tokens: Tokens = None,
    chunk_size: int | None = None,
    progress: bool | None = None,
    last_block: str = "block",
) -> torch.Tensor:
    """``J^l_tt − I`` by the authors' method (the oracle).

    Returns ``J: Tensor  # [T, d_out, d_in]`` (fp32), as :func:`token_jacobians`. For each
    token t, d VJPs through the ordinary block with cotangents e_i on row t only; the input-row
    t of each result is row i of ``J_tt``. T·d backward passes in all.
    """
    with frozen(model):
        f, X = block_function(model, inputs, layer, token_diagonal=False, last_block=last_block, plain=True)
        T, d = X.shape
        keep = _token_list(tokens, T)
        _, vjp_fn = torch.func.vjp(f, X)
        chunk = _default_chunk(d, T, chunk_size, X.device)
        out = []
        for t in tqdm(
            keep,
            desc=f"reference J_tt layer {layer}",
            leave=False,
            disable=None if progress is None else not progress,
        ):

            def cotangents(i0, i1, t=t):
                C = torch.zeros(i1 - i0, T, d, dtype=X.dtype, device=X.device)
                C[torch.arange(i1 - i0), t, torch.arange(i0, i1)] = 1
                return C

            rows = _vjp_rows(vjp_fn, cotangents, d, chunk, False, "")
            out.append(rows[:, t, :].float())
        J = torch.stack(out)
    check_finite(J, layer, keep)
    return J


def context_jacobians(
    model,
    inputs,
    layer: int,
    output_token: int,
    *,
    chunk_size: int | None = None,
    progress: bool | None = None,
    last_block: str = "block",
) -> torch.Tensor:
    """``J^l_{t1, t2}`` for every input token t1 and the one output token t2.

    Returns ``J: Tensor  # [T, d_out, d_in]`` (fp32), indexed by the input token t1. One sweep
    of d VJPs of output row t2 through the ordinary block: cotangent e_i on row t2 returns row i
    of ``J_{t1 t2}`` for all t1 at once. The identity is subtracted only at
    t1 = t2 (it comes from the skip connection); in a causal model ``J_{t1 t2} = 0`` for t1 > t2.
    """
    with frozen(model):
        f, X = block_function(model, inputs, layer, token_diagonal=False, last_block=last_block)
        T, d = X.shape
        (t2,) = _token_list(output_token, T)
        _, vjp_fn = torch.func.vjp(f, X)

        def cotangents(i0, i1):
            C = torch.zeros(i1 - i0, T, d, dtype=X.dtype, device=X.device)
            C[torch.arange(i1 - i0), t2, torch.arange(i0, i1)] = 1
            return C

        chunk = _default_chunk(d, T, chunk_size, X.device)
        rows = _vjp_rows(vjp_fn, cotangents, d, chunk, progress, f"J_(t1,{t2}) layer {layer}")
        J = rows.transpose(0, 1).float().contiguous()  # [T (input token), d_out, d_in]
    check_finite(J, layer, list(range(T)), what=f"context Jacobian (output token {t2})")
    return J
