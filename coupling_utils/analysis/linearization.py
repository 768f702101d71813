"""How nearly a model's blocks act on the residual stream as their own Jacobians: linearisation.

Each block ``l`` maps ``x^{l-1}`` to ``x^l = x^{l-1} + f_l(x^{l-1})``; its residual Jacobian
``J^l_tt`` (identity subtracted) is the linear map it is near ``x^{l-1}``. Propagating ``x^0``
through ``∏_l (I + J^l_tt)`` and comparing the result with the true ``x^L`` says how far the
token's whole trajectory is from a product of linear maps:

- :func:`linearization_cosine`: that comparison (cosine, and norm ratio layer by layer) from
  stored Jacobians;
- :func:`linearized_stream`: the propagated states straight from a model, with one forward-mode
  product per block and no Jacobian formed;
- :func:`model_linearization_cosine`: :func:`linearization_cosine` straight from a model (what
  chapter f05's trajectory study measures, through
  :func:`~coupling_utils.analysis.trajectories.trajectory_tables`).

Conventions as in :mod:`coupling_utils.analysis.trajectories`: ``layer`` is the residual-stream
index ``l`` (0..L), stacks of Jacobians are ordered by block (``J[0]`` is ``J^1``), ``token`` is
the position in the prompt, and computations run in float64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from coupling_utils.analysis.trajectories import _as_traj

__all__ = ["linearization_cosine", "linearized_stream", "model_linearization_cosine"]


def _as_jacobian_stack(jacobians, name: str = "jacobians") -> torch.Tensor:
    """Jacobians per block -> float64 ``Tensor[n_blocks, T, d, d]``."""
    if isinstance(jacobians, Mapping):
        keys = sorted(jacobians)
        if keys != list(range(keys[0], keys[0] + len(keys))):
            raise ValueError(f"{name} must cover consecutive blocks, got keys {keys}")
        jacobians = [jacobians[k] for k in keys]
    if isinstance(jacobians, (list, tuple)):
        if not jacobians:
            raise ValueError(f"{name} is empty; pass one Jacobian stack [T, d, d] per block")
        jacobians = torch.stack([torch.as_tensor(J) for J in jacobians])
    if isinstance(jacobians, np.ndarray):
        jacobians = torch.from_numpy(jacobians)
    if not isinstance(jacobians, torch.Tensor):
        raise TypeError(
            f"{name} must be a tensor [n_blocks, T, d, d], a list of [T, d, d] or a "
            f"dict block -> [T, d, d], got {type(jacobians).__name__}"
        )
    if jacobians.ndim == 3:  # one token: [n_blocks, d, d]
        jacobians = jacobians.unsqueeze(1)
    if jacobians.ndim != 4 or jacobians.shape[-1] != jacobians.shape[-2]:
        raise ValueError(
            f"{name} must have shape [n_blocks, T, d, d] (square per-token "
            f"Jacobians J^l_tt), got {tuple(jacobians.shape)}"
        )
    jacobians = jacobians.detach().to(device="cpu", dtype=torch.float64)
    if not torch.isfinite(jacobians).all():
        b, t = (~torch.isfinite(jacobians)).nonzero()[0].tolist()[:2]
        raise ValueError(
            f"{name} contains NaN or inf (block index {b}, token {t}); recompute the Jacobians in float32"
        )
    return jacobians


def linearization_cosine(
    jacobians_per_layer, traj, *, start: int = 0, tokens=None, prefix: bool = False
) -> pd.DataFrame:
    """How well the product of linearised blocks ``∏_l (I + J^l_tt)`` reproduces ``x^L``.

    ``jacobians_per_layer``: the residual Jacobians ``J^l_tt`` (identity already subtracted,
    as ``jacobians.token_jacobians`` returns them), ``Tensor[n, T', d, d]`` ordered by block,
    or a list / dict of ``[T', d, d]``. They cover blocks ``start+1 .. start+n``, i.e. the map
    from ``x^start`` to ``x^{start+n}``. ``tokens`` lists the trajectory positions of the T'
    Jacobian tokens (default: all T, or the last token when T' = 1).

    Starting from ``y^start = x^start_t`` it applies ``y^l = (I + J^l_tt) y^{l-1}`` and reports
    the cosine between ``y^{start+n}`` and the true ``x^{start+n}_t``: 1 when every block acts
    on the stream as its own Jacobian (a linear block, for instance). With ``prefix=True`` it
    returns the cosine after every block (``layer`` = start..start+n; 1 at ``layer = start``),
    with the norm ratio ``‖y^l‖ / ‖x^l‖`` as well.
    Returns (token, layer, cosine[, norm_ratio]).
    """
    traj = _as_traj(traj)
    J = _as_jacobian_stack(jacobians_per_layer)
    n, Tj, d, _ = J.shape
    L1, T, dt = traj.shape
    if d != dt:
        raise ValueError(f"Jacobians are {d}×{d} but the trajectory has width d={dt}")
    if start < 0 or start + n > L1 - 1:
        raise ValueError(
            f"{n} blocks starting after residual state {start} need states "
            f"{start}..{start + n}, but the trajectory has 0..{L1 - 1}"
        )
    if tokens is None:
        tokens = list(range(T)) if Tj == T else ([T - 1] if Tj == 1 else None)
        if tokens is None:
            raise ValueError(
                f"Jacobians are given for {Tj} tokens but the trajectory has {T}; "
                "pass tokens=[positions of the Jacobian tokens]"
            )
    tokens = [int(t) for t in tokens]
    if len(tokens) != Tj or any(not -T <= t < T for t in tokens):
        raise ValueError(f"tokens must list {Tj} positions in 0..{T - 1}, got {tokens}")
    tokens = [t % T for t in tokens]

    x = traj[:, tokens]  # [L+1, T', d]
    y = x[start]
    states = [y]
    for b in range(n):
        y = y + torch.einsum("tij,tj->ti", J[b], y)
        states.append(y)
    return _cosine_table(torch.stack(states), x[start : start + n + 1], tokens, start, prefix)


def _cosine_table(
    Y: torch.Tensor, X: torch.Tensor, tokens: Sequence[int], start: int, prefix: bool
) -> pd.DataFrame:
    """Cosines (and norm ratios) of linearised states ``Y`` with true states ``X`` [n+1, T', d]."""
    n = Y.shape[0] - 1
    cos = torch.nn.functional.cosine_similarity(Y, X, dim=-1, eps=1e-300)  # [n+1, T']
    ratio = torch.linalg.vector_norm(Y, dim=-1) / torch.linalg.vector_norm(X, dim=-1)
    if not prefix:
        return pd.DataFrame({"token": list(tokens), "layer": start + n, "cosine": cos[-1].numpy()})
    return pd.DataFrame(
        {
            "token": np.tile(tokens, n + 1),
            "layer": np.repeat(np.arange(start, start + n + 1), len(tokens)),
            "cosine": cos.reshape(-1).numpy(),
            "norm_ratio": ratio.reshape(-1).numpy(),
        }
    )


def _stream_and_blocks(model, inputs) -> tuple[torch.Tensor, list]:
    """One forward pass: the residual stream ``[L+1, T, d]`` and every block as a function.

    Each block's call (its input and every other argument) is captured with hooks, as
    ``blocks.block_function`` does for one block, but for all blocks in the same pass, so the
    linearisation costs one forward instead of one per block. The pass runs with
    token-diagonal attention (same forward values), as the returned functions do.
    """
    from coupling_utils.engine.architectures import transformer_blocks
    from coupling_utils.engine.attention_modes import attention_mode
    from coupling_utils.engine.blocks import BlockFunction, model_inputs, unwrap_model
    from coupling_utils.engine.hooks import capture_blocks

    model = unwrap_model(model)
    if model.training:
        raise ValueError(
            "the model is in training mode (dropout would make Jacobians random); call model.eval()"
        )
    blocks = transformer_blocks(model)
    L = len(blocks)
    with attention_mode(model, token_diagonal=True):
        got = capture_blocks(model, blocks, model_inputs(model, inputs), calls=range(L), outputs=[L - 1])
    if len(got.calls) < L or L - 1 not in got.outputs:
        raise RuntimeError("not every block was called during the forward pass")
    fns, states = [], []
    for i, (args, kwargs) in sorted(got.calls.items()):
        x = args[0] if args else kwargs["hidden_states"]
        if x.shape[0] != 1:
            raise ValueError(f"block inputs must have batch size 1, got {tuple(x.shape)}")
        fns.append(BlockFunction(model, blocks[i], args, kwargs, True, i))
        states.append(x[0].detach())
    states.append(got.outputs[L - 1][0].detach())
    return torch.stack(states), fns


def _propagate(traj: torch.Tensor, fns: list, start: int, stop: int) -> torch.Tensor:
    """``y^l = y^{l-1} + J^l y^{l-1}`` from ``y^start = x^start`` with forward-mode products.

    ``y`` is kept in float64 on the host and can outgrow the model's dtype (float16 ends at
    65504): each token's tangent is scaled by a power of two to a largest entry of at most 1
    before the product and the product scaled back, exact because ``J^l`` is token-diagonal and
    linear and a power of two changes no rounding."""
    from coupling_utils.engine.jacobians import frozen

    y = traj[start].to(device="cpu", dtype=torch.float64)  # propagated on the host, in float64
    states = [y]
    with frozen(fns[0].model):
        for layer in range(start, stop):  # block index `layer` maps x^layer -> x^{layer+1}
            X = traj[layer]
            # a power of two per token [T, 1]: scaling by it is exact, so float32 runs are unchanged
            scale = torch.exp2(
                torch.ceil(torch.log2(y.abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-1000)))
            )
            _, Jy = torch.func.jvp(fns[layer], (X,), ((y / scale).to(device=X.device, dtype=X.dtype),))
            if not torch.isfinite(Jy).all():
                raise ValueError(f"NaN/inf in the linearised step of block {layer}; use dtype='float32'")
            y = y + Jy.detach().to(device="cpu", dtype=torch.float64) * scale
            states.append(y)
    return torch.stack(states)


def _check_span(start: int, stop: int | None, L: int) -> tuple[int, int]:
    stop = L if stop is None else (stop + L + 1 if stop < 0 else stop)
    if not 0 <= start < stop <= L:
        raise ValueError(
            f"need 0 <= start < stop <= {L} (the model has {L} blocks), got start={start}, stop={stop}"
        )
    return start, stop


def linearized_stream(model, inputs, *, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """``Y = [y^start, ..., y^stop]`` with ``y^l = (I + J^l_tt) y^{l-1}`` and ``y^start = x^start``.

    The same propagation as :func:`linearization_cosine`, but without forming any Jacobian:
    each step is one forward-mode product ``J^l_tt y_t`` for all tokens at once, through the
    block with token-diagonal attention, taken at the true block input (all blocks captured
    in one forward pass). Costs about one block forward per layer instead of d backward
    passes. Returns float64 ``Tensor[stop − start + 1, T, d]``; ``stop`` defaults to L.
    """
    traj, fns = _stream_and_blocks(model, inputs)
    start, stop = _check_span(start, stop, len(fns))
    return _propagate(traj, fns, start, stop)


def model_linearization_cosine(
    model, inputs, *, start: int = 0, stop: int | None = None, prefix: bool = False
) -> pd.DataFrame:
    """:func:`linearization_cosine` for every token of a prompt, straight from the model.

    Uses the forward-mode propagation of :func:`linearized_stream` (no Jacobians stored)
    and the model's own residual stream; same table as :func:`linearization_cosine`.
    """
    traj, fns = _stream_and_blocks(model, inputs)
    start, stop = _check_span(start, stop, len(fns))
    Y = _propagate(traj, fns, start, stop)
    X = _as_traj(traj, "the residual stream")[start : stop + 1]
    return _cosine_table(Y, X, list(range(X.shape[1])), start, prefix)
