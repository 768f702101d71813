"""One check of whether a parameter fits the loaded model, in each caller's terms: the block range
(:mod:`coupling_utils.analysis.block_range`, below the chapters, so ``measure_twins`` refuses in
the same words), the blocks and K of f01 and of ``coupling-book measure``
(:func:`~coupling_utils.chapters.checks.check_blocks_and_k`), and the one way a plan attaches a
check to its jobs (:func:`~coupling_utils.chapters.checks.with_check`)."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import pytest

from coupling_utils import chapters
from coupling_utils.analysis import block_range
from coupling_utils.chapters import checks
from coupling_utils.chapters import f01_depth_and_tokens as f01
from coupling_utils.chapters.checks import FitTerms, ParameterError, check_blocks_and_k, with_check
from coupling_utils.chapters.f01_depth_and_tokens import plan as f01_plan
from coupling_utils.measurement import Job, Settings
from coupling_utils.pipeline.measure_inputs import MeasureError, check_options_fit

MEASURE = FitTerms(k="--k", last_block="--last-block", all_blocks="--layers", negative=True)


def _lm(n_layers: int, d_model: int = 16):
    """What the checks read of a loaded model: its depth and width (and a text model's config and
    tokenizer)."""
    return SimpleNamespace(
        n_layers=n_layers, d_model=d_model, model=SimpleNamespace(config=None), tokenizer=object()
    )


def _refused(*args, **kw) -> str:
    with pytest.raises(ParameterError) as info:
        check_blocks_and_k(*args, **kw)
    return str(info.value)


def test_one_parameter_error_class_everywhere():
    assert checks.ParameterError is block_range.ParameterError is chapters.ParameterError
    assert checks.check_block is block_range.check_block and issubclass(ParameterError, ValueError)


def test_in_a_chapters_terms_each_message_names_the_parameter_the_model_its_range_and_the_fix():
    lm = _lm(4)
    assert _refused(lm, "tiny", {"layers": [0, 9]}, [2], "block") == (
        "parameter 'layers' must be <= 3, got 9: tiny has 4 blocks (0..3); choose a block in 0..3; "
        "or leave 'layers' empty (all blocks)"
    )
    said = _refused(lm, "tiny", {"layers": [], "token_layer": [7]}, [2], "block")
    assert (
        said
        == "parameter 'token_layer' must be <= 3, got 7: tiny has 4 blocks (0..3); choose a block in 0..3"
    )
    assert _refused(lm, "tiny", {"layers": []}, [2, 40], "block") == (
        "parameter 'k' (K) must be <= the model width d=16, got 40: tiny is 16 wide; choose K <= 16"
    )
    assert _refused(lm, "tiny", {"tile_layers": [1, 3]}, [2], "excluded").endswith(
        "tiny has 4 blocks (0..3), and last_block 'excluded' leaves the last out; choose a block in 0..2"
    )
    assert _refused(_lm(2), "tiny", {"layers": []}, [2], "excluded") == (
        "parameter 'last_block' = 'excluded' leaves 1 of the 2 blocks of tiny: too few to couple; choose "
        "last_block 'final_norm' or 'block', or a model with 3 blocks or more"
    )
    assert check_blocks_and_k(lm, "tiny", {"layers": [2, 0], "tile_layers": [1]}, [2, 16], "final_norm") == {
        "layers": [2, 0],
        "tile_layers": [1],
    }


@pytest.mark.parametrize(
    "refuse",
    [
        lambda name: checks.check_top_k(name, 0),
        lambda name: checks.check_top_k(name, 40, d=16, model="tiny"),
        lambda name: checks.check_int(name, "2"),
        lambda name: checks.check_list(name, 3),
        lambda name: checks.check_choice(name, "x", ["a"]),
        lambda name: checks.embedded_family(name, "gpt2"),
        lambda name: checks.vit_token(name, "patchy"),
        lambda name: block_range.check_block(name, 9, "tiny", 4),
        lambda name: check_blocks_and_k(_lm(2), "tiny", {}, [2], "excluded", FitTerms(last_block=name)),
    ],
)
@pytest.mark.parametrize("name", ["k", "--k"])
def test_every_refusal_names_what_was_given_in_one_wording(refuse, name):
    """A parameter as ``parameter 'k'``, a command-line option as typed (``--k``), by every check."""
    assert checks.subject is block_range.subject
    with pytest.raises(ParameterError) as info:
        refuse(name)
    said = str(info.value)
    assert said.startswith(f"{block_range.subject(name)}"), said
    assert ("parameter" in said) == (name == "k"), said


def test_in_measures_terms_the_options_are_named_as_typed():
    lm = _lm(2, 32)
    assert _refused(lm, "m", {"--layers": [0, 99]}, [2], "block", MEASURE) == (
        "--layers must be <= 1, got 99: m has 2 blocks (0..1); choose a block in 0..1, or -2..-1 counting "
        "from the end; or leave --layers out (all blocks)"
    )
    assert _refused(lm, "m", {}, [50], "block", dataclasses.replace(MEASURE, k_note=" (note)")) == (
        "--k (K) must be <= the model width d=32, got 50: m is 32 wide; choose K <= 32 (note)"
    )
    assert _refused(lm, "m", {}, [2], "excluded", MEASURE) == (
        "--last-block excluded leaves 1 of the 2 blocks of m: too few to couple; choose --last-block "
        "final_norm or block, or a model with 3 blocks or more"
    )
    assert check_blocks_and_k(_lm(4), "m", {"--layers": [-1, 0]}, [2], "block", MEASURE) == {
        "--layers": [3, 0]
    }
    assert "'excluded'" not in _refused(_lm(4), "m", {"--layers": [3]}, [2], "excluded", MEASURE)


def test_f01_and_measure_check_through_it_each_in_its_own_terms(tmp_path, monkeypatch):
    """Both callers' names: f01's parameters, measure's options (a MeasureError: measure exits 2)."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    values = {"model": "tiny", "more_models": [], "k": [2, 40], "tile_layers": [1, 2], "tile_k": 2}
    p = f01.Params.checked({**values, "layers": [], "token_layer": 3})
    job = Job("tiny", ["a"], {}, labels={"model": "tiny"})
    with pytest.raises(ParameterError, match=r"^parameter 'k' \(K\) must be <= the model width d=16, got 40"):
        f01_plan._check_fits(_lm(4), p=p, job=job)
    with pytest.raises(ParameterError, match=r"^parameter 'token_layer' must be <= 2, got 3: .*'excluded'"):
        f01_plan._check_fits(_lm(4), p=p.__class__.checked({**p.values(), "last_block": "excluded"}), job=job)
    settings = Settings(k=(10, 30, 50), layers=[0, 5])
    with pytest.raises(
        MeasureError, match=r"^--layers must be <= 3, got 5: m has 4 blocks .*leave --layers out"
    ):
        check_options_fit(_lm(4), settings=settings, job=Job("/abs/m", ["a"], {}, labels={"model": "m"}))
    with pytest.raises(
        MeasureError, match=r"got 50: m is 32 wide; choose K <= 32 \(without --k, K is 10, 30"
    ):
        check_options_fit(
            _lm(4, 32), settings=Settings(k=(10, 30, 50)), job=Job("m", ["a"], {}, labels={"model": "m"})
        )


def _record(lm, *, job, seen):
    seen.append(("planned", job.labels["model"], lm))


def _own(lm):
    raise ParameterError("the job's own check")


def test_with_check_binds_the_job_and_chains_its_own_check_after():
    seen: list = []
    jobs = [
        Job("a", ["x"], {}, labels={"model": "a"}, check=_own),
        Job("b", ["x"], {}, labels={"model": "b"}),
    ]
    replaced = with_check(jobs, _record, seen=seen)
    replaced[0].check("lm-a")  # the job's own check is replaced: it does not run
    assert seen == [("planned", "a", "lm-a")]
    chained = with_check(jobs, _record, chain=True, seen=seen)
    with pytest.raises(ParameterError, match="own check"):
        chained[0].check("lm-a")  # the planned check first, then the job's own
    chained[1].check("lm-b")  # no own check: the planned one alone
    assert seen[1:] == [("planned", "a", "lm-a"), ("planned", "b", "lm-b")]
    assert [j.key for j in chained] == [j.key for j in jobs]  # a check is no part of what is stored


def test_checked_jobs_still_pickle_for_a_sweep():
    job = with_check([Job("a", ["x"], {}, labels={"model": "a"}, check=_own)], _own_fit, chain=True, n=2)[0]
    again = pickle.loads(pickle.dumps(job))
    with pytest.raises(ParameterError, match="n=2"):
        again.check(_lm(4))


def _own_fit(lm, *, job, n):
    raise ParameterError(f"{job.labels['model']} n={n}")
