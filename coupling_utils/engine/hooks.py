"""Capture what enters and leaves transformer blocks during one forward pass, with hooks.

The one place where hooks are put on blocks: :func:`capture_blocks` registers a forward
pre-hook (the block's call: its hidden states ``X`` and every other argument) and/or a
forward hook (the block's output) on the blocks asked for, runs the model once without
gradients, ends the pass as soon as everything asked for is captured (the rest of the model,
the LM head included, is not run), and always removes its hooks, also when the pass raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

__all__ = ["BlockCall", "Captured", "capture_blocks", "capture_block_inputs"]


class BlockCall(NamedTuple):
    """One call of a block: its positional and keyword arguments, as the model passed them."""

    args: tuple
    kwargs: dict[str, Any]

    @property
    def hidden(self) -> torch.Tensor:
        """The hidden states entering the block: ``X: Tensor  # [B, T, d]``."""
        return self.args[0] if self.args else self.kwargs["hidden_states"]


class Captured(NamedTuple):
    """What :func:`capture_blocks` captured, keyed by block index (only blocks that ran)."""

    calls: dict[int, BlockCall]
    outputs: dict[int, torch.Tensor]  # hidden states leaving block l: [B, T, d]


class _Stop(Exception):
    """Raised by a hook to end the forward pass once everything asked for is captured."""


def _hidden(output) -> torch.Tensor:
    """The hidden-states tensor of a block's output (a tensor or a tuple starting with it)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def capture_blocks(
    model,
    blocks: Sequence[torch.nn.Module],
    model_kwargs: Mapping[str, Any],
    *,
    calls: Iterable[int] = (),
    outputs: Iterable[int] = (),
) -> Captured:
    """One forward pass ``model(**model_kwargs)`` (no gradients) capturing block calls and outputs.

    ``blocks`` is the model's list of transformer blocks; ``calls`` and ``outputs`` are indices
    into it (negative ones count from the end). For each index in ``calls`` the block's call is
    recorded (a :class:`BlockCall`, whose ``hidden`` is ``X: Tensor  # [B, T, d]``), for each in
    ``outputs`` the hidden states it returns (``Tensor  # [B, T, d]``), both as the model computed
    them, not copied. The pass ends as soon as all are captured. A block the pass never calls is
    missing from the result: the caller decides what that means. The hooks are removed on return
    and on any exception.
    """
    n = len(blocks)
    want_calls = {i % n for i in calls}
    want_outputs = {i % n for i in outputs}
    got = Captured({}, {})

    def done() -> bool:
        return len(got.calls) == len(want_calls) and len(got.outputs) == len(want_outputs)

    def pre_hook(index):
        def hook(module, args, kwargs):
            got.calls[index] = BlockCall(args, kwargs)
            if done():
                raise _Stop

        return hook

    def post_hook(index):
        def hook(module, args, output):
            got.outputs[index] = _hidden(output)
            if done():
                raise _Stop

        return hook

    handles = []
    try:
        for i in sorted(want_calls):
            handles.append(blocks[i].register_forward_pre_hook(pre_hook(i), with_kwargs=True))
        for i in sorted(want_outputs):
            handles.append(blocks[i].register_forward_hook(post_hook(i)))
        with torch.no_grad(), contextlib.suppress(_Stop):
            model(**model_kwargs)
    finally:
        for h in handles:
            h.remove()
    return got


def capture_block_inputs(
    model,
    blocks: Sequence[torch.nn.Module],
    model_kwargs: Mapping[str, Any],
    layers: Iterable[int] | None = None,
) -> dict[int, torch.Tensor]:
    """``{l: X^l}``: the hidden states entering block ``l`` (``Tensor  # [B, T, d]``, detached).

    ``layers`` defaults to every block; the pass stops when the last block asked for is called.
    For ``l < L``, ``X^l`` is Hugging Face's ``hidden_states[l]`` (``output_hidden_states=True``).
    """
    layers = range(len(blocks)) if layers is None else layers
    captured = capture_blocks(model, blocks, model_kwargs, calls=layers)
    return {i: call.hidden.detach() for i, call in sorted(captured.calls.items())}
