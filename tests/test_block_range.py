"""The range checks of :mod:`coupling_utils.analysis.block_range`: which block and residual-state
indices a parameter may name, the index each one means, and the bound a refusal states.

Every refusal says the bound the value broke, in the terms the parameter was given in (counting
from the end where the value did), so a user can correct it from the message alone.
"""

from __future__ import annotations

import pytest

from coupling_utils.analysis.block_range import ParameterError, check_block, check_state


def _refusal(check, *args, **kw) -> str:
    with pytest.raises(ParameterError) as info:
        check(*args, **kw)
    return str(info.value)


def test_a_block_counted_from_the_end_reaches_the_first_block():
    """-n_layers is block 0, up to the last block allowed (one less when the next is needed too)."""
    assert [check_block("--layers", v, "tiny", 4, negative=True) for v in (-4, -3, -1)] == [0, 1, 3]
    assert check_block("layer", -4, "tiny", 4, last=2, negative=True) == 0
    assert check_block("layer", -2, "tiny", 4, last=2, negative=True) == 2


def test_a_block_past_the_last_allowed_is_refused_in_the_terms_it_was_given():
    """A value from the end past ``last`` names the bound from the end; a negative value where only
    indices from 0 are taken names 0, not the model's depth."""
    why = ", and layer + 1 must be a block too"
    assert _refusal(check_block, "layer", -1, "tiny", 4, last=2, negative=True, why=why) == (
        "parameter 'layer' must be <= -2, got -1: tiny has 4 blocks (0..3), and layer + 1 must be a "
        "block too; choose a block in 0..2, or -4..-2 counting from the end"
    )
    assert _refusal(check_block, "layers", -1, "tiny", 4) == (
        "parameter 'layers' must be >= 0, got -1: tiny has 4 blocks (0..3); choose a block in 0..3"
    )


def test_a_one_block_model_offers_its_only_block():
    """With one block, block 0 is a choice (not a depth the model cannot meet); a larger index is
    refused with the bound 0."""
    assert check_block("layer", 0, "tiny", 1) == 0
    assert _refusal(check_block, "layer", 1, "tiny", 1) == (
        "parameter 'layer' must be <= 0, got 1: tiny has 1 block (0..0); choose a block in 0..0"
    )


def test_residual_states_run_from_the_input_to_the_output_of_the_last_block():
    """States 0..n_layers; counting from the end, -1 is state n_layers and 0 is still state 0."""
    assert [check_state("s", v, "tiny", 4) for v in (0, 2, 4)] == [0, 2, 4]
    assert [check_state("s", v, "tiny", 4, negative=True) for v in (0, -1, -5)] == [0, 4, 0]
    assert check_state("last_layer", -4, "tiny", 4, low=1, negative=True) == 1
    assert check_state("s", 2, "tiny", 4, low=2, high=2) == 2


def test_a_state_out_of_range_is_refused_with_the_bound_it_broke():
    too_low = _refusal(check_state, "last_layer", 0, "tiny", 4, low=1, negative=True)
    assert too_low == (
        "parameter 'last_layer' must be >= 1, got 0: tiny has 4 blocks, so residual states 0..4; "
        "choose a state in 1..4, or -4..-1 counting from the end (-1: state 4)"
    )
    from_end_low = _refusal(check_state, "last_layer", -9, "tiny", 4, low=1, negative=True)
    assert from_end_low.startswith("parameter 'last_layer' must be >= -4, got -9: ")
    why = ", and last_layer needs a later one"
    from_end_high = _refusal(check_state, "first_layer", -1, "tiny", 4, high=3, negative=True, why=why)
    assert from_end_high == (
        "parameter 'first_layer' must be <= -2, got -1: tiny has 4 blocks, so residual states 0..4, and "
        "last_layer needs a later one; choose a state in 0..3, or -5..-2 counting from the end (-1: state 4)"
    )
    assert _refusal(check_state, "--state", 3, "m", 4, low=2, high=2) == (
        "--state must be <= 2, got 3: m has 4 blocks, so residual states 0..4; choose a state in 2..2"
    )


def test_a_state_window_the_model_cannot_hold_asks_for_a_deeper_model():
    assert _refusal(check_state, "first_layer", 0, "tiny", 1, low=1, high=0) == (
        "parameter 'first_layer' cannot be met, got 0: tiny has 1 block, so residual states 0..1; "
        "choose a deeper model"
    )
