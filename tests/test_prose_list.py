"""The one join of a list into prose (``analysis.prose_list.listed``) and the words its callers
write with it."""

from __future__ import annotations

import pytest

from coupling_utils.analysis.prose_list import listed


def test_one_item_is_itself():
    assert listed(["top"]) == "top"


def test_two_items_are_joined_by_and_without_a_comma():
    assert listed(["A", "B"]) == "A and B"


def test_three_or_more_items_take_commas_and_a_last_and_without_a_serial_comma():
    assert listed(["A", "B", "C"]) == "A, B and C"
    assert listed(["A", "B", "C", "D", "E"]) == "A, B, C, D and E"


def test_items_keep_their_own_commas_and_order():
    assert listed(["0.776 (log10 params)", "0.316 (depth)"]) == "0.776 (log10 params) and 0.316 (depth)"
    assert listed(["b", "a", "b"]) == "b, a and b"  # neither sorted nor deduplicated


def test_numbers_and_generators_are_written_as_an_f_string_writes_them():
    import numpy as np

    assert listed([10, 30, 50]) == "10, 30 and 50"
    assert listed(np.array([32, 64])) == "32 and 64"
    assert listed(f"`-p layer={b}`" for b in (1, 21)) == "`-p layer=1` and `-p layer=21`"


def test_no_items_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="no items.*say 'none' or leave the sentence out"):
        listed([])
    with pytest.raises(ValueError, match="no items"):
        listed(x for x in ())


def test_a_lone_string_is_refused_not_spelled_out():
    with pytest.raises(TypeError, match=r"the string 'abc': pass \['abc'\]"):
        listed("abc")


def test_callers_write_the_same_words():
    """A few callers' sentences, as the book and the CLI show them."""
    from coupling_utils.chapters import f00_coupling_metric as f00
    from coupling_utils.chapters import f05_token_trajectories as f05
    from coupling_utils.chapters.f01_depth_and_tokens.story import k_words
    from coupling_utils.chapters.f03_training_emergence.words import steps_words
    from coupling_utils.pipeline.sweep import Resources, SweepError

    assert f00.layer_reruns(30, 10) == (
        "Rerun `coupling-book run f00` with `-p layer=1`, `-p layer=15` and `-p layer=27`"
    )
    assert k_words([10, 30, 64], 768).startswith(
        "This run measures K = 10, 30 and 64 at width 768 (10 and 30 "
    )
    assert steps_words([32, 64, 128]) == "steps 32, 64 and 128"
    assert f05.prompt_words([3, 4, 5]) == "3 prompts of 3, 4 and 5 tokens"
    with pytest.raises(
        SweepError, match="^--partition, --account and --mem-gb are SLURM options, .* drop them"
    ):
        Resources(executor="local", partition="p", account="a", mem_gb=4)
    with pytest.raises(SweepError, match="^--account is a SLURM option, .* drop it,"):
        Resources(executor="local", account="a")
