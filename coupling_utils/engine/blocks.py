"""Transformer blocks as functions of their input, and the residual stream at block boundaries.

A block's inputs are captured with hooks during an ordinary forward pass of the whole model:
the hidden states ``X`` entering block ``l`` and every other argument (masks, rotary tables,
ALiBi biases, position ids). :func:`block_function` then returns ``f(X) = block(X) - X``, the
block's contribution to the residual stream, as a differentiable function of ``X`` alone.
No architecture needs to know its block's call signature; which list holds the blocks comes
from the table in ``architectures.py``.

What the *last* block is, is a measurement setting (:data:`LAST_BLOCKS`), applied here and
nowhere else:

- ``"block"`` (the paper's definition): the last block alone, ``f(X) = block(X) − X``;
- ``"final_norm"`` (the authors' code): the map ``hidden_states[L-1] -> hidden_states[L]`` of
  ``output_hidden_states=True``, which for language models is the final norm N applied to the
  block's output, ``f(X) = N(block(X)) − X``; its Jacobian is ``N'(I + J_L) − I`` at
  t1 = t2 and ``N' J_{t1 t2}`` at t1 ≠ t2 (N acts on each token alone). Where ``transformers``
  takes ``hidden_states[L]`` before the norm (ViT) or there is none (BERT), it is the block alone
  (``architectures.hidden_states_norm``);
- ``"excluded"`` (older helpers of the authors' code): the last block is not measured, and
  asking for it is an error.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import sys
from collections.abc import Callable, Mapping

import torch

from coupling_utils.engine.architectures import (
    POINTWISE_ACTIVATIONS,
    find_architecture,
    hidden_states_norm,
    transformer_blocks,
    unwrap_model,
)
from coupling_utils.engine.attention import own_rows
from coupling_utils.engine.attention_modes import attention_mode
from coupling_utils.engine.hooks import _hidden, capture_blocks
from coupling_utils.engine.rotary import linear_rotary, rotary_modules

__all__ = [
    "block_function",
    "residual_stream",
    "unwrap_model",
    "model_inputs",
    "BlockFunction",
    "cut_at",
    "held_slopes",
    "LAST_BLOCKS",
    "check_last_block",
    "last_block_norm",
    "last_block_facts",
]

LAST_BLOCKS = ("block", "final_norm", "excluded")
"""What the last block is: the paper's definition, the authors' code, or left out (module doc)."""

Inputs = torch.Tensor | Mapping[str, torch.Tensor]


def model_inputs(model, inputs: Inputs) -> dict[str, torch.Tensor]:
    """Keyword inputs (batch size 1, on the model's device) for one forward pass without a cache."""
    if isinstance(inputs, torch.Tensor):
        if inputs.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                f"token ids must be an integer tensor, got {inputs.dtype}; pass a dict for other inputs"
            )
        ids = inputs.reshape(1, -1) if inputs.ndim == 1 else inputs
        kwargs = {"input_ids": ids.long()}
    elif isinstance(inputs, Mapping):
        kwargs = dict(inputs)
    else:
        raise TypeError(
            f"inputs must be a LongTensor [1, T] of token ids or a dict of model inputs, got {type(inputs)}"
        )
    device = next(model.parameters()).device
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            if value.shape[0] != 1:
                raise ValueError(f"inputs must have batch size 1, got {key} of shape {tuple(value.shape)}")
            if torch.is_floating_point(value):
                value = value.to(device=device, dtype=model.dtype)
            else:
                value = value.to(device)
        out[key] = value
    if "use_cache" in inspect.signature(model.forward).parameters:
        out.setdefault("use_cache", False)
    return out


def check_last_block(last_block: str, what: str = "last_block") -> str:
    """``last_block`` if it is one of :data:`LAST_BLOCKS`; a ValueError naming the choices otherwise."""
    if last_block not in LAST_BLOCKS:
        raise ValueError(
            f"{what} must be one of {LAST_BLOCKS} ('block': the last block alone, the paper's "
            "definition; 'final_norm': with the final norm, as the authors' code measured it; "
            f"'excluded': the last block left out), got {last_block!r}"
        )
    return last_block


def last_block_norm(model, layer: int, last_block: str = "block") -> torch.nn.Module | None:
    """The norm folded into block ``layer``'s map under ``last_block`` (None: the block alone).

    Only the last block gets one, only under ``"final_norm"``, and only where ``transformers``
    applies it before returning ``hidden_states[L]``. Under ``"excluded"`` the last block is
    refused with a ValueError.
    """
    check_last_block(last_block)
    n = len(transformer_blocks(model))
    if not -n <= layer < n:
        raise IndexError(f"layer {layer} out of range: the model has {n} blocks (0..{n - 1})")
    if layer % n != n - 1 or last_block == "block":
        return None
    if last_block == "excluded":
        raise ValueError(
            f"block {n - 1} is the last block, and last_block='excluded' leaves it out; measure "
            f"blocks 0..{n - 2}, or choose last_block='block' or 'final_norm'"
        )
    return hidden_states_norm(model)


def last_block_facts(model, last_block: str = "block") -> dict:
    """What ``last_block`` means for this model, for a measurement's provenance: the convention,
    the last block's index, the norm folded into it (its class and where it lives, or None) and
    whether the last block is measured at all."""
    check_last_block(last_block)
    model = unwrap_model(model)
    row = find_architecture(model)
    n = len(transformer_blocks(model))
    norm = None if last_block == "excluded" else last_block_norm(model, n - 1, last_block)
    return {
        "convention": last_block,
        "block": n - 1,
        "measured": last_block != "excluded",
        "folded_norm": None if norm is None else type(norm).__name__,
        "norm_path": None if norm is None else " or ".join(f"base_model.{p}" for p in row.final_norm),
    }


def _capture_block_call(model, inputs: Inputs, layer: int, token_diagonal: bool):
    """(block, args, kwargs) of the call of block ``layer`` in one forward pass (stopped there)."""
    blocks = transformer_blocks(model)
    n = len(blocks)
    if not -n <= layer < n:
        raise IndexError(f"layer {layer} out of range: the model has {n} blocks (0..{n - 1})")
    block = blocks[layer]
    kw = model_inputs(model, inputs)
    with attention_mode(model, token_diagonal=token_diagonal):
        calls = capture_blocks(model, blocks, kw, calls=[layer]).calls
    if layer % n not in calls:
        raise RuntimeError(f"block {layer} was not called during the forward pass")
    args, kwargs = calls[layer % n]
    return block, args, kwargs


_QUANTIZED = ("Linear4bit", "Linear8bitLt")  # bitsandbytes' k-bit layers


def _quantized_layers(block) -> list[str]:
    """Names of the bitsandbytes 4-bit/8-bit linear layers inside ``block`` (none without a walk
    when bitsandbytes was never imported: the path chooser asks of the whole model per layer)."""
    if "bitsandbytes" not in sys.modules:
        return []
    return [
        name
        for name, m in block.named_modules()
        if type(m).__name__ in _QUANTIZED and type(m).__module__.startswith("bitsandbytes")
    ]


class _DequantizedLinear(torch.nn.Module):
    """A bitsandbytes layer's function with its weight dequantized: ``x W^T + b`` in ``compute_dtype``.

    4-bit (``Linear4bit``): bitsandbytes itself dequantizes the weight to the compute dtype and
    multiplies, so this is the same function (same values up to rounding), and its Jacobian the
    exact one. 8-bit (``Linear8bitLt``, LLM.int8): on a GPU bitsandbytes also rounds the
    activations to int8 (outliers above its threshold in fp16), a piecewise-constant function
    whose derivative is zero almost everywhere; this layer is its smooth counterpart with the
    int8 weights (what the weights are), so Jacobians of 8-bit models are those of the
    dequantized weights, not of the int8 activation rounding.
    """

    def __init__(self, layer):
        super().__init__()
        import bitsandbytes.functional as bnbf

        w = layer.weight
        if type(layer).__name__ == "Linear4bit":
            W = bnbf.dequantize_4bit(w.data, w.quant_state)
            self.compute_dtype = layer.compute_dtype or W.dtype
        else:
            scb = layer.state.SCB if layer.state.SCB is not None else w.SCB
            W = bnbf.int8_vectorwise_dequant(w.data, scb)
            self.compute_dtype = layer.bias.dtype if layer.bias is not None else torch.float16
        self.weight = W.to(self.compute_dtype)
        self.bias = None if layer.bias is None else layer.bias.detach().to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(self.compute_dtype), self.weight, self.bias).to(x.dtype)


@contextlib.contextmanager
def _dequantized(block, names: list[str]):
    """Meanwhile, the quantized layers ``names`` of ``block`` are replaced by dequantized copies.

    ``torch.func`` transforms cannot pass bitsandbytes' autograd functions (no ``setup_context``),
    so a quantized block is differentiated through plain linear layers with the same weights.
    Copies are made per call and dropped after it: one block's weights at a time in full precision.
    """
    saved = []
    try:
        for name in names:
            parent_name, _, attr = name.rpartition(".")
            parent = block.get_submodule(parent_name) if parent_name else block
            layer = getattr(parent, attr)
            saved.append((parent, attr, layer))
            setattr(parent, attr, _DequantizedLinear(layer))
        yield
    finally:
        for parent, attr, layer in reversed(saved):
            setattr(parent, attr, layer)


HALF = (torch.float16, torch.bfloat16)


def _float32_layer_norm(norm: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``; for a half-precision ``x``, computed in float32 and rounded to ``x``'s dtype
    (what CUDA's half-precision kernel computes), as a composite whose forward-mode tangent keeps
    ``x``'s dtype. Other inputs take ``nn.LayerNorm.forward``'s own call."""
    w, b = norm.weight, norm.bias
    if x.dtype not in HALF:
        return torch.nn.functional.layer_norm(x, norm.normalized_shape, w, b, norm.eps)
    out = torch.nn.functional.layer_norm(
        x.float(),
        norm.normalized_shape,
        None if w is None else w.float(),
        None if b is None else b.float(),
        norm.eps,
    )
    return out.to(x.dtype)


def layer_norms(*modules) -> list[torch.nn.LayerNorm]:
    """The ``torch.nn.LayerNorm`` layers in ``modules`` (None entries skipped)."""
    return [
        m
        for module in modules
        if module is not None
        for m in module.modules()
        if isinstance(m, torch.nn.LayerNorm)
    ]


@contextlib.contextmanager
def float32_layer_norms(*modules):
    """Meanwhile, the ``torch.nn.LayerNorm`` layers in ``modules`` run in float32 on a
    half-precision input (:func:`_float32_layer_norm`; other inputs as before, bit for bit).

    A half-precision LayerNorm's forward-mode product breaks on both devices: the CPU kernel keeps
    its statistics in float16, where the product's ``rstd³`` overflows (NaN/inf), and CUDA's
    returns float32 statistics, which turn the tangent float32 and stop the next matmul (float
    tangent, half weights). Values are those of the half-precision kernel up to its rounding.
    """
    with _forwards_replaced(layer_norms(*modules), _float32_layer_norm):
        yield


@contextlib.contextmanager
def _forwards_replaced(modules, forward):
    """Meanwhile, each of ``modules`` runs ``forward(module, x)`` instead of its own forward."""
    try:
        for m in modules:
            m.forward = forward.__get__(m)
        yield
    finally:
        for m in modules:
            m.__dict__.pop("forward", None)


def pointwise_activations(*modules) -> list[torch.nn.Module]:
    """The activation modules in ``modules`` that :data:`POINTWISE_ACTIVATIONS` names."""
    return [
        m
        for module in modules
        if module is not None
        for m in module.modules()
        if type(m).__name__ in POINTWISE_ACTIVATIONS.get(type(m).__module__, ())
    ]


class _HeldSlope(torch.autograd.Function):
    """``φ(x)`` whose products are ``g ⊙ φ'(x)`` with ``φ'(x)`` computed once, in the forward pass.

    Autograd's own rule recomputes ``φ'`` from ``x`` in every product (an ``erf`` or ``exp`` per
    number per cotangent, and under ``vmap`` a copy of ``x`` per batch); a sweep of d products at
    one point needs it once. The slope of a half-precision ``x`` is taken in float32, as
    autograd's kernels compute it; products come back in the cotangent's dtype.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, act):
        wide = x.float() if x.dtype in HALF else x
        y, back = torch.func.vjp(act, wide)  # autograd's own rule, as a product would take it
        (slope,) = back(torch.ones_like(y))
        return act(x), slope

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])
        ctx.slope = output[1]

    @staticmethod
    def backward(ctx, g, _):
        (slope,) = ctx.saved_tensors
        return (g * slope).to(g.dtype), None

    @staticmethod
    def jvp(ctx, t, _):
        return (t * ctx.slope).to(t.dtype), None


def _held_slope_forward(act, x):
    return _HeldSlope.apply(x, type(act).forward.__get__(act))[0]


@contextlib.contextmanager
def held_slopes(activations: list[torch.nn.Module]):
    """Meanwhile, each of these pointwise ``activations`` (:func:`pointwise_activations`) holds its
    slope for every product through it (:class:`_HeldSlope`); values are unchanged, products equal
    autograd's up to rounding. A sweep of d products through a GELU block then spends one
    multiplication per number where autograd spent a ``gelu_backward``."""
    with _forwards_replaced(activations, _held_slope_forward):
        yield


def _is_cache(value) -> bool:
    from transformers.cache_utils import Cache

    return isinstance(value, Cache)


def _appending_layers() -> tuple[type, ...]:
    """Cache layers whose ``update`` appends by rebinding ``keys``/``values`` to new tensors
    (``torch.cat``), never writing into the tensors they hold."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return (DynamicLayer, DynamicSlidingWindowLayer)


def _fresh(value):
    """A copy of a captured key/value cache (the block appends to it when called; each call of a
    :class:`BlockFunction` must see the cache as captured); any other argument as it is.

    A cache of appending layers (``DynamicCache``, what a forward pass with ``use_cache=True``
    makes) is copied one level down: a new cache object and new layer objects holding the same
    tensors, which an update replaces instead of writing into. Any other cache (a static cache
    writes in place) is copied deeply. The deep copy of every layer's keys and values cost a
    twentieth of f02's paper-profile run on the stand-in hub."""
    if not _is_cache(value):
        return value
    layers = getattr(value, "layers", None)
    if isinstance(layers, list) and all(type(layer) in _appending_layers() for layer in layers):
        fresh = copy.copy(value)
        fresh.layers = [copy.copy(layer) for layer in layers]
        return fresh
    return copy.deepcopy(value)


class BlockFunction:
    """``f(X) = block(X) − X`` for one block, with everything else fixed as captured.

    ``X: Tensor  # [T, d]`` (or ``[B, T, d]``) -> ``Tensor  # [T, d]`` (or ``[B, T, d]``); with
    ``token_diagonal`` the block runs with token-diagonal attention, so its Jacobian is
    block-diagonal over tokens with the true ``J_tt`` on the diagonal; otherwise it is the ordinary
    block. With a ``norm`` (the final norm of the last block under ``last_block="final_norm"``)
    it is ``f(X) = norm(block(X)) − X``. ``one_token``: the block runs on one token against a
    captured key/value cache (``one_token.py``), copied per call. The block runs in the model's
    dtype (the Jacobian functions cast their results to fp32); bitsandbytes 4-bit/8-bit layers run dequantized
    (:class:`_DequantizedLinear` says what is exact). Its pointwise activations hold their slopes
    (:func:`held_slopes`) and its rotary embedding takes products through its transpose
    (``rotary.linear_rotary``) unless ``plain``: the block exactly as ``transformers`` runs it, for the
    oracle (``jacobians.reference_jacobians``).
    """

    def __init__(
        self,
        model,
        block,
        args,
        kwargs,
        token_diagonal: bool,
        layer: int,
        norm=None,
        one_token: bool = False,
        plain: bool = False,
    ):
        self.model, self.block, self.layer = model, block, layer
        self.token_diagonal, self.norm, self.one_token = token_diagonal, norm, one_token
        # one_token_attention takes the own key/value from the cache's update (attention.own_rows);
        # architectures with their own attention code slice them out of the cache themselves
        self._own_rows = one_token and find_architecture(model).attention == "interface"
        self._quantized = _quantized_layers(block)
        self._norms = layer_norms(block, norm)  # found once: __call__ runs once per product
        self._activations = [] if plain else pointwise_activations(block)
        self._rotary = [] if plain else rotary_modules(block)
        if args:
            self._args, self._kwargs, self._key = tuple(args[1:]), dict(kwargs), None
        else:
            self._args, self._kwargs, self._key = (), dict(kwargs), "hidden_states"
            if "hidden_states" not in kwargs:
                raise RuntimeError(f"could not find the hidden states among block {layer}'s arguments")
            self._kwargs.pop("hidden_states")

    def __call__(self, X: torch.Tensor, cut: tuple[str, ...] = (), minus_input: bool = True):
        """``f(X)``; with ``cut`` (paths of modules in the block), ``(f(X), inputs)``: the block
        runs with those modules' inputs detached, and ``inputs`` are what entered them, one per
        call (:func:`cut_at`). ``minus_input=False``: ``f(X) + X`` (the block's output), for a
        sweep that subtracts the identity from its Jacobians itself, once per diagonal entry
        (a VJP through ``− X`` costs two passes over every cotangent)."""
        x = X.unsqueeze(0) if X.ndim == 2 else X
        args = tuple(_fresh(a) for a in self._args)
        kwargs = {key: _fresh(v) for key, v in self._kwargs.items()}
        caches = [v for v in (*args, *kwargs.values()) if _is_cache(v)]
        with (
            own_rows(caches[0]) if self._own_rows and caches else contextlib.nullcontext(),
            _dequantized(self.block, self._quantized),
            cut_at(self.block, cut) as inputs,
            float32_layer_norms(*self._norms),
            held_slopes(self._activations),
            linear_rotary(self._rotary),
            attention_mode(self.model, token_diagonal=self.token_diagonal, one_token=self.one_token),
        ):
            if self._key is None:
                out = self.block(x, *args, **kwargs)
            else:
                out = self.block(*args, hidden_states=x, **kwargs)
            y = _hidden(out)
            if self.norm is not None:  # in the block's contexts: a LayerNorm runs in float32 too
                y = self.norm(y)
        if X.ndim == 2:
            y = y.squeeze(0)
        if not cut:
            return y - X if minus_input else y
        ran = [path for path, _ in inputs]
        if sorted(ran) != sorted(cut):
            raise RuntimeError(
                f"block {self.layer}: the modules to cut at ran as {ran}, not once each as {list(cut)}; "
                "fix residual_outputs in the architecture table"
            )
        entered = dict(inputs)
        return y - X if minus_input else y, tuple(entered[p] for p in cut)

    def row_products(self, path: str, z: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        """``cᵀ ∂m(z)/∂z`` of the module ``m`` at ``path`` in the block, for each row ``c`` of
        ``C: Tensor  # [n, d_out]``, at the input ``z: Tensor  # [..., 1, d_in]`` (one token):
        ``Tensor  # [n, ..., 1, d_in]``. For a linear module, rows of its weight matrix.

        One VJP of ``m`` on n copies of ``z`` (a batch, which a per-token module such as a
        projection takes as it is): for a linear layer one ``[n, d_out] @ W`` product, where a
        ``vmap`` over the rows reads the whole weight once per row."""
        with _dequantized(self.block, self._quantized):
            module = self.block.get_submodule(path)
            out, back = torch.func.vjp(module, z.expand(C.shape[0], *z.shape).contiguous())  # folds to 2-D
            (rows,) = back(
                C.to(out.dtype).reshape(C.shape[0], *[1] * (out.ndim - 2), C.shape[-1]).expand(out.shape)
            )
        return rows


@contextlib.contextmanager
def cut_at(block, paths: tuple[str, ...]):
    """Meanwhile, each module at ``paths`` in ``block`` gets its input detached; yields the list
    of ``(path, what entered it)``, appended as they run.

    A module whose output the block adds to its output as it is (``Architecture.residual_outputs``)
    receives, in a VJP from the block's output with the same cotangent row on every token, that
    same row on every token; so ``jacobians.token_jacobians`` cuts the block there and feeds
    the module's input its cotangent directly (:meth:`BlockFunction.row_products`), sparing the
    backward matrix product over all T tokens.
    """
    entered: list[tuple[str, torch.Tensor]] = []

    def detach_input(path):
        def hook(module, args):
            entered.append((path, args[0]))
            return (args[0].detach(), *args[1:])

        return hook

    handles = [block.get_submodule(p).register_forward_pre_hook(detach_input(p)) for p in paths]
    try:
        yield entered
    finally:
        for h in handles:
            h.remove()


def block_function(
    model,
    inputs: Inputs,
    layer: int,
    *,
    token_diagonal: bool = True,
    last_block: str = "block",
    plain: bool = False,
) -> tuple[Callable, torch.Tensor]:
    """``(f, X)``: block ``layer`` as a function and its input.

    ``f(X: Tensor  # [T, d]) -> Tensor  # [T, d]`` is ``block(X) − X``, the block's residual
    contribution, differentiable in ``X``; ``X: Tensor  # [T, d]`` is the hidden state entering
    the block (captured with a hook, detached). With ``token_diagonal=True`` a VJP of ``f`` with
    a cotangent ``C: Tensor  # [T, d]`` returns the rows ``c_tᵀ J_tt`` for all tokens at once
    (and JVPs likewise). ``last_block`` (:data:`LAST_BLOCKS`) says what the last block's map is:
    under ``"final_norm"`` it is ``N(block(X)) − X`` (the module doc); under ``"excluded"`` the
    last block is refused. ``plain``: no held slopes (:class:`BlockFunction`), for the oracle.
    """
    model = unwrap_model(model)
    find_architecture(model)
    if model.training:
        raise ValueError(
            "the model is in training mode (dropout would make Jacobians random); call model.eval()"
        )
    norm = last_block_norm(model, layer, last_block)
    block, args, kwargs = _capture_block_call(model, inputs, layer, token_diagonal)
    x = args[0] if args else kwargs["hidden_states"]
    if x.shape[0] != 1:
        raise ValueError(f"block inputs must have batch size 1, got {tuple(x.shape)}")
    f = BlockFunction(model, block, args, kwargs, token_diagonal, layer, norm, plain=plain)
    return f, x[0].detach()


def residual_stream(model, inputs: Inputs) -> torch.Tensor:
    """The hidden states x⁰..x^L at the block boundaries: ``traj: Tensor  # [L+1, T, d]``.

    ``x⁰`` is the input of the first block and ``x^l`` the output of block ``l`` (hooks), so
    the last one is *before* any final norm (unlike Hugging Face ``hidden_states[-1]``).
    """
    model = unwrap_model(model)
    blocks = transformer_blocks(model)
    L = len(blocks)
    got = capture_blocks(model, blocks, model_inputs(model, inputs), calls=[0], outputs=range(L))
    if 0 not in got.calls or len(got.outputs) < L:
        raise RuntimeError("not every block was called during the forward pass")
    states = [got.calls[0].hidden[0].detach()] + [got.outputs[i][0].detach() for i in range(L)]
    return torch.stack(states)
