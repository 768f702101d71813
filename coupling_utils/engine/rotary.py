"""Rotary position embeddings as the fixed linear map they are, for sweeps of many products.

At a fixed point a rotary embedding is one linear map per token and head: the first ``r``
features (``r = cos.shape[-1]``, all of them or a fraction) become ``x·cos + rotate_half(x)·sin``
and the rest pass through. Autograd differentiates the library's code for it op by op: every
slice's backward fills a zero tensor of the full head width and copies into it, twice for a
partial rotary (GPT-NeoX, Phi-3), so a sweep of d products spends most of its elementwise time
there. The map's transpose needs one pass: ``g·cos − rotate_half(g·sin)`` on the first ``r``
features (``rotate_half`` is antisymmetric), the rest as they are.

:func:`linear_rotary` runs the model's own ``apply_rotary_pos_emb`` for every value, so values
are the library's to the bit, and gives its products that transpose. Which libraries' function is
this map is data, :data:`ROTATE_HALF_ROTARY`; ``tests/test_architectures.py`` checks every one
listed against autograd on the library's own function.
"""

from __future__ import annotations

import contextlib
import sys

import torch

__all__ = ["ROTATE_HALF_ROTARY", "rotary_modules", "linear_rotary"]

ROTATE_HALF_ROTARY: tuple[str, ...] = tuple(
    f"transformers.models.{name}.modeling_{name}"
    for name in ("llama", "mistral", "gemma", "gemma2", "gemma3", "qwen2", "phi", "phi3", "falcon")
    + ("gpt_neox", "olmo", "olmo2")
)
"""Modules whose ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` rotates the first
``cos.shape[-1]`` features of ``q`` and ``k`` by ``x·cos + rotate_half(x)·sin`` and passes the rest
(OLMo casts the result back to the input's dtype). GPT-J's ``rotate_every_two`` is another map."""


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _transposed(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary map's transpose applied to the cotangent ``g`` (in the type ``g·cos`` promotes
    to, rounded once; autograd casts the result to the input's dtype, as for its own rules)."""
    r = cos.shape[-1]
    if r == g.shape[-1]:
        return g * cos - _rotate_half(g * sin)
    head = g[..., :r]
    return torch.cat((head * cos - _rotate_half(head * sin), g[..., r:]), dim=-1)


class _LinearRotary(torch.autograd.Function):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` as the library computes it, with the map's
    transpose as its backward and the map itself as its forward-mode rule (it is linear in q, k)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, cos, sin, apply, unsqueeze_dim):
        return apply(q, k, cos, sin, unsqueeze_dim)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, cos, sin, apply, unsqueeze_dim = inputs
        ctx.save_for_backward(cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))
        # ctx.rotary, not ctx.apply: autograd's engine calls ctx.apply to run the backward
        ctx.rotary, ctx.unsqueeze_dim, ctx.tables = apply, unsqueeze_dim, (cos, sin)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        q_needed, k_needed = ctx.needs_input_grad[:2]
        return (
            _transposed(gq, cos, sin) if q_needed else None,
            _transposed(gk, cos, sin) if k_needed else None,
            *(None,) * 4,
        )

    @staticmethod
    def jvp(ctx, tq, tk, *_):
        return ctx.rotary(tq, tk, *ctx.tables, ctx.unsqueeze_dim)


def _held_rotary(apply):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if cos.requires_grad or sin.requires_grad:  # tables that depend on X: autograd's own rule
            return apply(q, k, cos, sin, unsqueeze_dim)
        return _LinearRotary.apply(q, k, cos, sin, apply, unsqueeze_dim)

    apply_rotary_pos_emb.original = apply
    return apply_rotary_pos_emb


def rotary_modules(block: torch.nn.Module) -> list:
    """The library modules among ``block``'s submodules' whose rotary is :data:`ROTATE_HALF_ROTARY`."""
    names = {type(m).__module__ for m in block.modules()} & set(ROTATE_HALF_ROTARY)
    return [sys.modules[n] for n in sorted(names)]


@contextlib.contextmanager
def linear_rotary(modules: list):
    """Meanwhile, these modules' ``apply_rotary_pos_emb`` (:func:`rotary_modules`) take their
    products through the map's transpose (:class:`_LinearRotary`); values are the library's own.
    The function is replaced in the module, for whoever calls it in this process meanwhile."""
    replaced = [m for m in modules if not hasattr(m.apply_rotary_pos_emb, "original")]
    try:
        for m in replaced:
            m.apply_rotary_pos_emb = _held_rotary(m.apply_rotary_pos_emb)
        yield
    finally:
        for m in replaced:
            m.apply_rotary_pos_emb = m.apply_rotary_pos_emb.original
