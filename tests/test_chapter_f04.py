"""Chapter f04's module: its plan holds every measurement the notebook shows, planned without
any hub model; ``run`` collects exactly that plan, and a read-only rerun gives the same story."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.chapters import ParameterError
from coupling_utils.chapters import f04_vision_transformers as f04
from coupling_utils.measurement import Options
from coupling_utils.models.training import list_revisions
from coupling_utils.pipeline.sweep import planned_params

ABSENT = "org/absent-vit"  # a hub ViT that is not on this machine


@pytest.fixture(scope="module")
def smoke_vits(session_cache):
    """The smoke profile's run and family, built once into the session cache."""
    from coupling_utils.models import zoo

    status = zoo.prepare_many(["vit-mnist-smoke", "vit-family-smoke"], jobs=2, echo=lambda line: None)
    assert set(status.values()) == {"ready"}, status


def _params(**overrides):
    return planned_params(f04.NOTEBOOK, "smoke", overrides)


@pytest.mark.parametrize("profile", ["smoke", "default", "laptop", "paper"])
def test_planning_trains_downloads_and_loads_nothing(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    jobs = f04.jobs(planned_params(f04.NOTEBOOK, profile))  # laptop, paper: hub ViTs not on this machine
    assert jobs and all(j.folder.is_relative_to(tmp_path / "f04") for j in jobs)
    built = [path for path in (tmp_path / "zoo").rglob("*") if path.is_file()]
    assert built == []  # no embedded run or family was trained to plan


def test_the_plan_holds_every_study_and_reads_no_hub_model(smoke_vits):
    p = _params(hub_models=[ABSENT])
    jobs = f04.jobs(p)
    by = {s: [j for j in jobs if j.labels["study"] == s] for s in f04.STUDIES}
    assert [j.labels["study"] for j in jobs] == [
        s for s in f04.STUDIES for _ in by[s]
    ]  # in the story's order
    assert [j.labels["model"] for j in by["training"]] == f04.checkpoints(p)
    assert {j.weights for j in by["training"]} == {"trained"}
    for study in ("twins", "hub"):
        assert [j.weights for j in by[study]] == ["trained", "random init"]
        assert by[study][1].load_kwargs["seed"] == p.init_seed
    assert by["hub"][0].model == ABSENT
    members = f04.family_runs(p)  # as trained: the recipes planned the same members, K and checkpoints
    planned = vt.family_recipes(p.family, k_over_d=p.family_k_over_d)
    assert planned[["run", "name", "K"]].equals(members[["run", "name", "K"]])
    assert f04.checkpoints(p) == list_revisions(f04.run_dir(p))
    assert [j.labels["model"] for j in by["family"]] == [r for r in members.run for _ in range(2)]
    k = {j.labels["model"]: j.settings["measure"].k for j in by["family"]}
    assert k == {run: (int(kk),) for run, kk in zip(members.run, members.K)}
    assert all(j.storable and j.prepare is vt.digit_inputs for j in jobs)
    assert len({j.key for j in jobs}) == len(jobs)
    with pytest.raises(ParameterError, match="use_cache"):
        f04.jobs(_params(use_cache=False))


def test_run_collects_the_plan_and_a_read_only_rerun_tells_the_same_story(smoke_vits):
    p = _params(hub_models=[ABSENT])
    with pytest.raises(f04.NotMeasured, match="not measured yet"):
        f04.run(p, Options(compute=False))
    measured = f04.run(p)
    missing = f04.glue_values(p, measured)["f04_hub_missing"].data
    assert measured.hub.missing == [ABSENT] and missing.startswith(f"Not measured in this run: {ABSENT} (")
    assert measured.hub_gaps.empty and len(f04.claims(p, measured)) == 3  # no hub row without its numbers
    read = f04.run(p, Options(compute=False))  # what a notebook does after a sweep
    for study in (read.over, read.twins, read.fam):
        assert set(study.summary.cached) == {True}  # read, nothing loaded
    glued, again = f04.glue_values(p, measured), f04.glue_values(p, read)
    assert {k: getattr(v, "data", v) for k, v in glued.items()} == {
        k: getattr(v, "data", v) for k, v in again.items()
    }
    assert f04.claims(p, measured) == f04.claims(p, read)
    assert set(glued) >= {"f04_rule_emerges", "f04_trained", "f04_rho_excess", "f04_r2_words", "f04_n_tokens"}
    assert measured.named["twins"].startswith(
        f"{p.model}, "
    )  # the twins study's trained weights, as measured
    notes = [row["note"] for row in f04.claims(p, measured)[:2]]
    assert notes[0].startswith(measured.named["run"]) and notes[1].startswith(measured.named["twins"])


@pytest.mark.parametrize("token", ["cls", "mean", "last"])
def test_the_exercises_study_measures_each_variant_once(smoke_vits, token):
    """The variants the solutions quote: the run and its twin at every other token, a second
    training curve (every token, or the CLS token when the chapter measures the mean), and the
    twin alone at the four other seeds, none of them the run's own training seed."""
    from coupling_utils.chapters.f04_vision_transformers import exercises as ex

    p = _params(token=token)
    jobs = [j for j in f04.jobs(p) if j.labels["study"] == "exercises"]
    variants = {}
    for j in jobs:
        variants.setdefault(j.labels["variant"], []).append(j)
    tokens = [t for t in ex.EX_TOKENS if t != token]
    curve = ex.curve_token(token)
    seeds = ex.twin_seeds(p.model, p.init_seed)
    assert list(variants) == [f"token:{t}" for t in tokens] + [f"curve:{curve}"] + [
        f"seed:{s}" for s in seeds[1:]
    ]
    for t in tokens:
        assert [j.weights for j in variants[f"token:{t}"]] == ["trained", "random init"]
    assert [j.labels["model"] for j in variants[f"curve:{curve}"]] == f04.checkpoints(p)
    assert len(seeds) == ex.N_SEEDS == len(set(seeds)) and seeds[0] == p.init_seed
    assert vt.training_seed(p.model) not in seeds
    for s in seeds[1:]:
        (twin,) = variants[f"seed:{s}"]
        assert twin.weights == "random init" and twin.load_kwargs["seed"] == s


def test_twin_seeds_skip_the_runs_training_seed():
    from coupling_utils.chapters.f04_vision_transformers import exercises as ex

    trained = vt.training_seed("embedded:vit-mnist-smoke")
    assert ex.twin_seeds("embedded:vit-mnist-smoke", trained) == [
        trained + i for i in range(1, ex.N_SEEDS + 1)
    ]


def test_comparison_words_follow_the_numbers():
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.chapters.f04_vision_transformers import exercises as ex

    p = SimpleNamespace(n_resamples=200, seed=0)
    above = ex._compared(p, pd.Series([0.2, 0.3, 0.25, 0.28] * 2), "X")  # 8 images: 6 or more resample
    below = ex._compared(p, pd.Series([-0.2, -0.3, -0.25, -0.28] * 2), "X")
    mixed = ex._compared(p, pd.Series([0.5, -0.4, 0.3, -0.3] * 2), "X")
    few = ex._compared(p, pd.Series([0.2, 0.3, 0.25, 0.28]), "X")  # 4 images: no 95% interval
    assert above.startswith("larger than X by 0.258") and "excludes 0" in above
    assert below.startswith("smaller than X by 0.258") and "excludes 0" in below
    assert "no 95% interval: only 4 images, too few to resample" in few and not few.startswith("larger")
    # the default book read "larger than the CLS token's excess by 0.003 (... an interval that includes
    # 0, so the two are not told apart)": no direction word where the interval includes 0
    assert mixed.startswith("not told apart from X on these images (difference ") and "includes 0" in mixed
    assert "larger" not in mixed and "smaller" not in mixed


def _excesses(cls, centre, last, n=64, seed=0):
    """Per-image excesses of the CLS token, the centre four patches and the last patch."""
    import numpy as np
    import pandas as pd

    from coupling_utils.chapters.f04_vision_transformers import exercises as ex

    rng = np.random.default_rng(seed)
    cols = {"cls": cls, **dict.fromkeys(ex.CENTRE, centre), "last": last}
    return pd.DataFrame({t: m + 0.02 * rng.standard_normal(n) for t, m in cols.items()})


def test_the_patch_ranking_orders_only_the_pairs_told_apart(monkeypatch):
    """The default book ranked "centre > last > CLS" by the estimates, though last − CLS (0.003) had
    an interval including 0: each pair is now ordered only by a paired interval over the images that
    excludes 0, and the pairs not told apart are named as such."""
    from coupling_utils.chapters.f04_vision_transformers import exercises as ex

    p = SimpleNamespace(n_resamples=200, seed=0)
    monkeypatch.setattr(ex, "token_excesses", lambda p, r, tokens: _excesses(-0.013, 0.0074, -0.010))
    words = ex.patch_sentence(p, None)
    assert "the ranking by these estimates" not in words and "centre > last > CLS" not in words
    assert (
        "told apart (paired intervals over the images that exclude 0): centre > CLS (CLS − centre " in words
    )
    assert "; centre > last (centre − last " in words
    assert "; not told apart (an interval that includes 0, or none): CLS and last (CLS − last " in words
    assert words.endswith("). That contradicts the order CLS > centre > last.")
    monkeypatch.setattr(ex, "token_excesses", lambda p, r, tokens: _excesses(0.3, 0.2, 0.1))
    assert ex.patch_sentence(p, None).endswith("). So the order CLS > centre > last holds for every pair.")
    monkeypatch.setattr(ex, "token_excesses", lambda p, r, tokens: _excesses(0.0, 0.001, 0.0))
    words = ex.patch_sentence(p, None)
    assert "no pair is told apart" in words and words.endswith(
        ". So the order CLS > centre > last is neither shown nor contradicted."
    )


def test_the_r2_sentence_names_no_highest_predictor_unless_intervals_separate():
    """The default book said "the one with the highest R² is log10 params (R² = 0.94)", though no
    rule names a best predictor here and its interval (0.86 to 1.00) overlaps width's (0.38 to 0.92)."""
    import pandas as pd

    from coupling_utils.chapters.f04_vision_transformers.story import _r2_words

    fits = pd.DataFrame(
        {"r2": [0.259, 0.511, 0.936, 0.299, 0.659], "r2_ci_low": [0.049, 0.186, 0.857, 0.005, 0.382],
         "r2_ci_high": [0.756, 0.882, 0.998, 0.815, 0.921], "level": 0.95},
        index=pd.Index(["excess coupling", "coupling", "log10 params", "depth", "width"], name="predictor"),
    )  # fmt: skip
    words = _r2_words(fits, 8)
    assert "highest R² is" not in words and "is the highest" not in words
    assert words.startswith("excess coupling 0.26 (95% interval 0.05 to 0.76 over 8 ViTs); coupling 0.51 (")
    assert "log10 params 0.94 (95% interval 0.86 to 1.00 over 8 ViTs)" in words
    assert words.endswith(
        "The interval of log10 params overlaps those of coupling and width, so no predictor is named the one "
        "with the highest R²; every other pair's intervals overlap"
    )
    for name in ("coupling", "width"):
        fits.loc[name, ["r2", "r2_ci_low", "r2_ci_high"]] = [0.5, 0.4, 0.8]
    separated = _r2_words(fits, 8)
    assert separated.endswith(
        "over 8 ViTs). The R² of log10 params is the highest: its interval lies above every other's; every "
        "other pair's intervals overlap"
    )


def test_the_r2_sentence_names_every_pair_whose_intervals_do_not_overlap():
    """The default book said "Their intervals overlap, so no predictor is named the one with the
    highest R²", though log10 params' interval (0.65 to 0.97) lay wholly above excess coupling's
    (0.01 to 0.62): size explained test accuracy better than coupling, and the page never said so."""
    import pandas as pd

    from coupling_utils.chapters.f04_vision_transformers.story import _r2_words, _size_words

    fits = pd.DataFrame(
        {"r2": [0.170, 0.328, 0.860, 0.241, 0.630], "r2_ci_low": [0.008, 0.055, 0.651, 0.002, 0.290],
         "r2_ci_high": [0.625, 0.751, 0.974, 0.789, 0.900], "level": 0.95},
        index=pd.Index(["excess coupling", "coupling", "log10 params", "depth", "width"], name="predictor"),
    )  # fmt: skip
    words = _r2_words(fits, 8)
    assert "Their intervals overlap" not in words
    assert words.endswith(
        "width 0.63 (95% interval 0.29 to 0.90 over 8 ViTs). The R² of log10 params is above that of excess "
        "coupling: their intervals do not overlap. The interval of log10 params overlaps those of coupling, "
        "depth and width, so no predictor is named the one with the highest R²; every other pair's "
        "intervals overlap"
    )
    size = _size_words(fits, 8)
    assert (
        "size explains test accuracy better (log10 params better than excess coupling), the reverse" in size
    )
    fits.loc["depth", ["r2", "r2_ci_low", "r2_ci_high"]] = [0.03, 0.0, 0.05]  # now below three others
    words = _r2_words(fits, 8)
    assert (
        "The R² of log10 params is above those of excess coupling and depth: its interval lies above each"
        in words
    )
    assert (
        "The R² of coupling is above that of depth" in words
        and "The R² of width is above that of depth" in words
    )
    assert "coupling better than depth" in _size_words(fits, 8)  # both ways now: neither shown
    assert "the pairs go both ways" in _size_words(fits, 8)
    fits.loc[["coupling", "log10 params", "width"], ["r2", "r2_ci_low", "r2_ci_high"]] = [
        [0.3, 0.06, 0.6]
    ] * 3
    assert _size_words(fits, 8).startswith(
        "Comparing intervals (no claim here is judged on it): where a size "
        "measure and a coupling measure are told apart, coupling explains"
    )


def test_the_r2_sentence_says_no_pair_is_told_apart_without_intervals():
    """Too few members to resample: no interval, so the words say no two are told apart (they said
    the intervals overlap, though there were none)."""
    import pandas as pd

    from coupling_utils.chapters.f04_vision_transformers.story import _r2_words, _size_words

    fits = pd.DataFrame(
        {"r2": [0.04, 0.93], "r2_ci_low": [0.0, 0.9], "r2_ci_high": [0.1, 0.95], "level": 0.95},
        index=pd.Index(["excess coupling", "log10 params"], name="predictor"),
    )
    words = _r2_words(fits, 3)
    assert words.endswith(
        "With no intervals, no two are told apart and none is named the one with the highest R²"
    )
    assert _size_words(fits, 3).startswith("Comparing intervals: no size measure is told apart")


def test_the_twins_heatmaps_run_in_the_captions_order_and_name_the_model_as_measured():
    """Fig. 39's facet had no sort, so "random init" sat left of "trained" while the caption and alt
    text named trained first; and they named the run "vit-mnist", not as measured."""
    import pandas as pd

    from coupling_utils.analysis.layout import caption_problems, shown_panels
    from coupling_utils.analysis.rendering import chart_spec
    from coupling_utils.chapters.f04_vision_transformers.figures import depthwise_twins_figure

    rows = [
        {"model": "vit-mnist", "weights": w, "layer_i": i, "layer_j": j, "m": 0.9, "coupling": 0.1}
        for w in ("trained", "random init")
        for i in range(3)
        for j in range(3)
    ]
    named = "embedded:vit-mnist, in float32"
    r = SimpleNamespace(twins=SimpleNamespace(depthwise=pd.DataFrame(rows)), named={"twins": named},
                        run_name="vit-mnist")  # fmt: skip
    fig = depthwise_twins_figure(SimpleNamespace(model="embedded:vit-mnist"), r)
    assert fig["chart"].to_dict()["facet"]["sort"] == ["trained", "random init"]
    assert [x.title for x in shown_panels(fig["chart"])] == ["trained", "random init"]
    caption = fig["caption"]
    assert caption.startswith(
        f"Depth-wise coupling of {named}: trained (left) and its untrained twin, random init (right)"
    )
    assert caption.index("trained (left)") < caption.index("random init (right)")
    assert "trained (left) and random init (right)" in fig["alt"] and named in fig["alt"]
    assert caption_problems(caption, chart_spec(fig["chart"].to_dict())[0]) == []


def test_the_gap_is_read_against_the_seed_spread_and_changes_by_their_sign():
    from coupling_utils.chapters.f04_vision_transformers import exercises as ex
    from coupling_utils.chapters.f04_vision_transformers.story import _change_words

    v = {"seeds": [100, 101, 102, 103, 104], "gap": 0.181, "sd": 0.068, "in_sd": 2.66}
    words = ex.seed_words(v)
    assert words.startswith("2.7 standard deviations above the mean of twins drawn under 5 seeds")
    assert "standard deviation over the 5 seeds 0.0680" in words
    assert "do not vary" in ex.seed_words({**v, "sd": 0.0, "in_sd": float("inf")})
    assert _change_words(-1.6) == "fell by 1.6 points" and _change_words(2.0) == "rose by 2.0 points"
    assert _change_words(0.01).startswith("did not change")


def _curve_of(images: dict[str, list[float]]):
    """An exercise's curve (per image, by checkpoint) as condense_exercises gives it."""
    import pandas as pd

    rows = [
        {"model": f"step{8 * i}", "weights": "trained", "prompt": img, "coupling": v}
        for img, vals in images.items()
        for i, v in enumerate(vals)
    ]
    per = pd.DataFrame(rows)
    return SimpleNamespace(
        per_prompt=per, summary=per.groupby("model", as_index=False, sort=False)["coupling"].mean()
    )


def test_the_mean_token_solution_says_rises_only_of_a_curve_that_rises(monkeypatch):
    """At the default profile both curves fall with the step (ρ -0.04 and -0.66): an older solution
    said the mean's "rises more steadily"; the next one said "only the mean's rises" of a ρ of 0.13
    whose interval over 16 digits includes 0. A curve rises, falls or ranks higher only by its
    interval."""
    from coupling_utils.analysis.verdicts import Interval
    from coupling_utils.chapters.f04_vision_transformers import exercises

    # images that disagree: their mean curve has a positive ρ, its interval includes 0
    noisy = _curve_of(
        {"a": [0.1, 0.3, 0.2, 0.5, 0.1], "b": [0.5, 0.1, 0.4, 0.0, 0.3], "c": [0.2, 0.2, 0.1, 0.3, 0.4],
         "d": [0.1, 0.3, 0.2, 0.5, 0.1], "e": [0.5, 0.1, 0.4, 0.0, 0.3], "f": [0.2, 0.2, 0.1, 0.3, 0.4]}
    )  # fmt: skip
    r = SimpleNamespace(
        exercises={"curve:mean": noisy},
        shape={"spearman": -0.64, "peak_fraction": 0.04, "max_drop": 0.48},
        emerges_values={"spearman": Interval(-0.64, -0.80, -0.45, over="64 images")},
    )
    words = exercises.mean_sentence(SimpleNamespace(token="cls", n_images=64), r)
    assert "only the mean's rises" not in words and "ranks higher" not in words
    assert "the mean's curve shows no clear trend with the step (its interval includes 0)" in words
    assert "the CLS token's falls with the step (its interval lies below 0)" in words
    assert "95% interval -0.80 to -0.45 over 64 images" in words and "over 6 images" in words

    # images that all rise: the mean's curve rises, and ranks above the falling CLS curve
    rising = _curve_of(
        {
            k: [0.1 + s, 0.2 + s, 0.3 + s, 0.4 + s, 0.5 + s]
            for k, s in zip("abcdef", (0, 0.05, 0.1, 0.02, 0.07, 0.12))
        }
    )
    r.exercises = {"curve:mean": rising}
    words = exercises.mean_sentence(SimpleNamespace(token="cls", n_images=64), r)
    assert "the mean's curve rises with the step (its interval lies above 0)" in words
    assert "the mean's ρ is higher than the CLS token's (higher or lower is said only where" in words
    assert "the mean's ranks" not in words  # the old sentence's grammar

    # one image: nothing to resample, so no trend is claimed
    r.exercises = {"curve:mean": _curve_of({"a": [0.1, 0.2, 0.3, 0.4, 0.5]})}
    words = exercises.mean_sentence(SimpleNamespace(token="cls", n_images=1), r)
    assert "the mean's curve shows no clear trend" in words and "is not told apart" in words


def test_the_hub_bullet_says_where_hub_vits_are_measured_when_none_was():
    from types import SimpleNamespace

    from coupling_utils.chapters.f04_vision_transformers.story import hub_words

    words = hub_words(SimpleNamespace(), SimpleNamespace(hub_gaps=None))
    assert words.startswith("**Not reproduced here.**") and "`paper` profile adds" in words


def test_typed_prose_asserts_no_result_the_run_may_contradict():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "notebooks" / "f04_vision_transformers.md").read_text()
    assert "both follow the step" not in text  # coupling need not follow the step
    assert (
        "The `paper` profile measures two pretrained" not in text
    )  # typed, and said at the paper profile too
