"""engine/hooks.py: the one capture of block calls and outputs, on tiny models."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.engine.architectures import tiny_model, transformer_blocks
from coupling_utils.engine.blocks import model_inputs
from coupling_utils.engine.hooks import capture_block_inputs, capture_blocks


def _hooks(blocks):
    """The hooks on the blocks (transformers' own recorders included, which stay)."""
    return [(dict(b._forward_hooks), dict(b._forward_pre_hooks)) for b in blocks]


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_captured_inputs_are_the_models_hidden_states(model_type):
    model = tiny_model(model_type)
    blocks = transformer_blocks(model)
    kw = model_inputs(model, torch.randint(0, 64, (1, 7)))
    with torch.no_grad():
        hidden = model(**kw, output_hidden_states=True).hidden_states
    before = _hooks(blocks)
    X = capture_block_inputs(model, blocks, kw)
    assert sorted(X) == list(range(len(blocks))) and len(blocks) >= 2
    for layer, x in X.items():
        assert x.shape == (1, 7, model.config.hidden_size)
        assert torch.equal(x, hidden[layer]), layer
    assert _hooks(blocks) == before
    assert sorted(capture_block_inputs(model, blocks, kw, layers=[-1])) == [len(blocks) - 1]


def test_the_pass_ends_once_everything_is_captured():
    model = tiny_model("llama")
    blocks = transformer_blocks(model)
    kw = model_inputs(model, torch.randint(0, 64, (1, 5)))
    before, seen = _hooks(blocks), []
    handles = [b.register_forward_pre_hook(lambda m, a, i=i: seen.append(i)) for i, b in enumerate(blocks)]
    handles.append(model.model.norm.register_forward_pre_hook(lambda m, a: seen.append("norm")))
    try:
        got = capture_blocks(model, blocks, kw, calls=[0])
        assert seen == [0] and list(got.calls) == [0] and got.outputs == {}
        seen.clear()
        got = capture_blocks(model, blocks, kw, calls=[0], outputs=range(len(blocks)))
        assert seen == list(range(len(blocks))) and sorted(got.outputs) == seen
        assert torch.equal(got.outputs[0], capture_block_inputs(model, blocks, kw, layers=[1])[1])
    finally:
        for h in handles:
            h.remove()
    assert _hooks(blocks) == before


def test_hooks_are_removed_after_an_exception():
    model = tiny_model("llama")
    blocks = transformer_blocks(model)
    kw = model_inputs(model, torch.randint(0, 64, (1, 5)))

    def boom(module, args):
        raise KeyError("boom")

    L, before = len(blocks), _hooks(blocks)
    for where, layers in ((blocks[-1].mlp, range(L)), (model.model.norm, [L - 1])):
        handle = where.register_forward_pre_hook(boom)
        try:
            model.config.num_hidden_layers = L if where is blocks[-1].mlp else L - 1  # last block skipped
            with pytest.raises(KeyError, match="boom"):  # raised inside the pass, not swallowed
                capture_blocks(model, blocks, kw, calls=layers, outputs=layers)
        finally:
            handle.remove()
            model.config.num_hidden_layers = L
        assert _hooks(blocks) == before
