"""Chapter f03's module: its plan holds every panel the notebook measures (held-out windows
first, then the quiz prompts), and run() collects exactly that plan."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from coupling_utils.chapters import f03_training_emergence as f03
from coupling_utils.measurement import Options


def _params(**changes):
    values = {"models": ["org/run"], "revisions": ["step8", "step1"], "n_windows": 2, "window_tokens": 12,
              "max_tokens": 6, "k": [2, 4], "k_main": 2, **changes}  # fmt: skip
    return f03.Params.checked(values)


def test_jobs_hold_the_held_out_windows_and_the_quiz_prompts():
    p = _params()
    panels = f03.panel_jobs(p)
    assert list(panels) == [f03.MAIN, f03.QUIZ]
    windows, quiz = panels[f03.MAIN], panels[f03.QUIZ]
    assert [j.revision for j in windows] == ["step1", "step8"] == [j.revision for j in quiz]
    assert all(j.prompts == f03.windows(p) and j.settings["depth"].max_tokens == 12 for j in windows)
    assert all(j.prompts == f03.prompts(p) and j.settings["depth"].max_tokens == 6 for j in quiz)
    assert f03.jobs(p) == windows + quiz
    assert len({j.key for j in f03.jobs(p)}) == 4  # the panels are stored apart
    # no quiz panel when there is no prompt to measure; the windows are always measured
    alone = f03.jobs(_params(n_prompts=0, include_demo=False))
    assert alone == windows and f03.quiz_prompts(_params(n_prompts=0, include_demo=False)) is None


def test_run_collects_exactly_the_plan(monkeypatch, tmp_path):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p, seen = _params(), []
    home = sys.modules[f03.run.__module__]  # the module whose collect() run calls
    real = home.collect

    def spy(jobs, options=None, **kwargs):
        seen.extend(jobs)
        return real(jobs, options, **kwargs)

    monkeypatch.setattr(home, "collect", spy)
    with pytest.raises(RuntimeError, match="none of the runs"):  # nothing stored, nothing computed
        f03.run(p, Options(compute=False))
    assert seen == f03.jobs(p)


def test_search_levels_read_for_people():
    from coupling_utils.chapters.f03_training_emergence.search import _level

    assert [_level(v) for v in (163840.0, 1635840.0, 64.0, 0.003)] == ["163,840", "1,635,840", "64", "0.003"]


def _stub_results(steps: list[int]):
    """The least of a Results that the exercise numbers and the measured line read."""
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.story import MAIN

    rows = [
        {"panel": MAIN, "model": "m", "K": k, "step": s, "coupling": 0.1 + 0.01 * s}
        for k in (2, 4)
        for s in steps
    ]
    summary = pd.DataFrame(rows)
    levels = pd.DataFrame({"model": ["m", "m"], "K": [2, 4], "first": [0.1, 0.12]})
    return SimpleNamespace(
        params=SimpleNamespace(early_step=1),
        summary=summary,
        showcase="m",
        levels=levels,
        k_main=2,
        first_step=0,
        from_paper_early=None,  # no two checkpoints from step 128 on
    )


def test_the_early_step_solution_reads_after_in_this_run():
    """The solution says "In this run {f03_ex_128}": not "In this run this run has ..."."""
    from pathlib import Path

    from coupling_utils.chapters.f03_training_emergence.exercises import exercise_k

    notebook = (Path(__file__).resolve().parents[1] / "notebooks" / "f03_training_emergence.md").read_text()
    assert "In this run {glue:md}`f03_ex_128`." in notebook
    words = exercise_k(_stub_results([0, 1, 4, 16]))["f03_ex_128"].data
    assert not words.startswith("this run") and "too few checkpoints from step 128 on" in words


def test_the_measured_line_counts_in_words():
    from coupling_utils.chapters.f03_training_emergence.results import Results

    line = Results.measured_line.fget(_stub_results([0, 1, 4, 16]))
    assert line == "4 checkpoints measured for 1 model; none missing"  # not "1 model(s)"


NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "f03_training_emergence.md"


@pytest.mark.parametrize(
    "typed",
    [
        "Trajectories: straighter, and growing with depth",  # a result in a heading, whatever was measured
        "The run: trained until validation loss flattens",  # the plateau rule may say "not flattened"
        "out of distribution for this model",  # false for Pythia (laptop, paper), which read the Pile
        "which the model has never seen anything like",
        "Within one run both move with the",  # coupling need not move with the step (default: ρ 0.11)
        "show which pairs carry the peak",  # the heatmaps are drawn at three steps, maybe not the peak
        "coupling at step 0 (random initialisation)",  # Pythia's first public checkpoint is step 1
        "at step 0 (the\nrandom initialisation)",
        "Expect lower:",  # the K compared may be below k_main
    ],
)
def test_typed_prose_asserts_no_result_the_run_may_contradict(typed):
    """Sentences about results follow the numbers: none of these typed phrases is true at every
    profile, so each is computed (glued) or narrowed."""
    assert typed not in NOTEBOOK.read_text()


def test_the_first_checkpoint_is_named_as_measured():
    """A local run starts at its random initialisation (step 0); Pythia's hub checkpoints start at
    step 1, which the prose must not call the initialisation."""
    from coupling_utils.chapters.f03_training_emergence.words import (
        at_first_checkpoint,
        first_checkpoint,
        versus_first,
    )

    assert at_first_checkpoint(0) == "at step 0 (the random initialisation)"
    assert "initialisation" not in at_first_checkpoint(1) and "step 1" in at_first_checkpoint(1)
    assert first_checkpoint(1) == "the first checkpoint (step 1)"
    assert (
        versus_first(0.2, 0.1, 0)
        == "The final value is 2.0× that of the random initialisation (step 0), 0.100."
    )
    below = versus_first(-0.47, -0.474, 1)  # a ratio of values below 0 means nothing: the difference instead
    assert "×" not in below and "+0.004" in below and "step 1" in below


def test_a_share_of_the_peak_is_said_only_where_it_means_something():
    """The old sentence printed "the final value is nan% of the peak" for curves below 0."""
    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.words import peak_words

    row = pd.Series({"peak_step": 8000, "final_step": 143000, "final_vs_peak": float("nan")})
    words = peak_words(row)
    assert "nan" not in words and "step 8000" in words and "not all above 0" in words
    assert peak_words(row.replace({8000: 143000})).startswith("ends at its top")  # its peak is its end
    assert "59% of the peak (step 128)" in peak_words(pd.Series({"peak_step": 128, "final_step": 4096,
                                                                  "final_vs_peak": 0.587}))  # fmt: skip


def test_every_densest_checkpoint_is_named():
    """The layer graph is equally dense at steps 32, 64 and 128: not "highest at step 32"."""
    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.words import density_peak_words

    d = pd.DataFrame({"step": [1, 32, 64, 128, 4096], "density": [0, 1 / 6, 1 / 6, 1 / 6, 0]})
    assert density_peak_words(d) == "is highest (0.17) at steps 32, 64 and 128"
    assert density_peak_words(d.assign(density=0.0)) == "is 0.00 at every checkpoint"


def test_an_edge_density_equal_at_both_ends_is_not_said_to_go_anywhere():
    """The body read "the share of layer pairs with an edge goes from 0.00 at the early checkpoint to
    0.00 at the end"."""
    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.words import density_words

    d = pd.DataFrame({"step": [1, 32, 64, 128, 4096], "density": [0, 1 / 6, 1 / 6, 1 / 6, 0]})
    assert density_words(d, 0.0, 0.0) == (
        "is 0.00 at the early checkpoint and at the end, and highest (0.17) at steps 32, 64 and 128"
    )
    rising = d.assign(density=[0.02, 0.1, 0.1, 0.2, 0.31])
    assert density_words(rising, 0.02, 0.31) == (
        "goes from 0.02 at the early checkpoint to 0.31 at the end, and is highest (0.31) at step 4096"
    )
    assert density_words(d.assign(density=0.0), 0.0, 0.0) == "is 0.00 at every checkpoint"


def test_the_heatmap_solution_says_whether_the_heatmaps_show_the_peak():
    from types import SimpleNamespace

    from coupling_utils.chapters.f03_training_emergence.exercises import _heatmap_words

    r = SimpleNamespace(chosen=[1, 64, 4096])
    assert "include that peak" in _heatmap_words(r, 64)
    assert "not at that peak" in _heatmap_words(r, 128) and "step 128" in _heatmap_words(r, 128)


def test_the_k_exercise_compares_another_k_even_when_k_main_is_the_largest():
    """The paper profile has k = [10, 30, 50] and k_main = 50: the old solution compared K = 50 with
    itself ("equal to") after "Expect lower"."""
    from coupling_utils.chapters.f03_training_emergence.exercises import exercise_k

    r = _stub_results([0, 1, 4, 16])
    r.k_main = 4
    out = exercise_k(r)
    assert out["f03_ex_kbig"] == 2 and out["f03_ex_k_expect"] == "higher"
    # 0.1 at K = 2 against 0.12 at K = 4, as measured: one set of weights, so "lower" in this draw only
    assert out["f03_ex_kbig_vs_main"].data == (
        "both from one set of weights, the random initialisation (step 0), measured once (no interval), "
        "so in this draw $K$ = 2 starts lower"
    )
    r.first_step = 1  # Pythia's first public checkpoint: trained weights, not a random draw
    hub = exercise_k(r)["f03_ex_kbig_vs_main"].data
    assert hub.startswith("both from one set of weights, the first checkpoint (step 1)")
    assert hub.endswith("so in these weights $K$ = 2 starts lower")


def test_the_quiz_panel_is_named_for_what_it_holds():
    """Quiz prompts are out of distribution only for a model trained on Shakespeare alone."""
    assert "out of distribution" not in f03.QUIZ


def test_the_straightness_rule_names_the_windows_it_resamples():
    """f03's interval resamples its windows, not prompts; its first checkpoint stands in for the twin."""
    from coupling_utils.chapters.f03_training_emergence import story

    assert f"(bootstrap over the {f03.MAIN})" in story.STRAIGHT_RULE and "prompts" not in story.STRAIGHT_RULE
    assert "0.9 of the first checkpoint's" in story.STRAIGHT_RULE


def test_the_windows_are_called_held_out_only_for_a_run_trained_here(tmp_path):
    """Held out from training only where the run's own training spec names the validation plays
    (a run trained here); a hub model such as Pythia may have read them (the Pile)."""
    import json

    from coupling_utils.analysis.emergence import Checkpoints
    from coupling_utils.chapters.f03_training_emergence.words import windows_words

    assert "held-out" not in f03.MAIN and "held out" not in f03.MAIN
    corpus = {"validation_plays": ["tragedies/hamlet", "comedies/twelfth-night", "histories/richard-ii"]}
    (tmp_path / "training_spec.json").write_text(json.dumps({"spec": {}, "corpus": corpus}))
    here = windows_words(Checkpoints("embedded:pythia-tiny", ["step0"], [0], path=tmp_path))
    assert here.startswith("Shakespeare windows held out from embedded:pythia-tiny's training")
    assert "(Hamlet, Twelfth Night, Richard II)" in here
    hub = windows_words(Checkpoints("EleutherAI/pythia-160m", ["step1"], [1]))
    assert hub.startswith("Shakespeare windows, not known to be held out from EleutherAI/pythia-160m's")
    assert "held out from" not in hub.replace("not known to be held out from", "")


def _windows(coupling, lss, *, n_windows: int = 8, noise: float = 0.05, seed: int = 0):
    """Per window and checkpoint (steps 0, 1, …): the curves ``coupling`` and ``lss`` plus noise."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        [
            {
                "prompt": f"w{w}",
                "step": step,
                "coupling": c + rng.normal(0, noise),
                "lss": s + rng.normal(0, noise),
            }
            for w in range(n_windows)
            for step, (c, s) in enumerate(zip(coupling, lss))
        ]
    )


def _failed(values):
    from types import SimpleNamespace

    from coupling_utils.chapters.f03_training_emergence.results import Results

    return Results.together_failed.fget(SimpleNamespace(together_values=values))


def test_flat_coupling_with_straighter_trajectories_is_not_together():
    """Coupling that only wiggles (a hump: no rise with the step) beside trajectories that become
    straighter and mirror its wiggles: the old rule (ρ(coupling, LSS) alone) said yes, but the
    claim is that coupling *emerges* with linearity, so the rule must say no and name the part."""
    import numpy as np

    from coupling_utils.analysis.verdicts import Rule
    from coupling_utils.chapters.f03_training_emergence.results import together_intervals
    from coupling_utils.chapters.f03_training_emergence.words import together_words

    hump, steps = np.array([0, 1, 2, 3, 4, 4, 3, 2, 1, 0.0]), np.arange(10)
    v = together_intervals(_windows(0.5 + 0.1 * hump, 3 - 0.3 * hump - 0.2 * steps))
    assert v["lss_step"].high <= -0.3 and v["rho_lss"].high <= -0.5  # straighter, and mirrors coupling
    assert abs(v["coupling_step"].estimate) < 0.3  # but coupling does not rise
    assert Rule(yes="rho_lss <= -0.5", partly="rho_lss <= -0.2").judge(v) == "yes"  # the old rule
    assert f03.RULES["together"].judge(v) == "no"
    assert _failed(v) == ["coupling rises with the step"]
    words = together_words(v, _failed(v))
    assert words.startswith("held over their whole intervals: “the line-shape score falls"), words
    assert "; not held: “coupling rises with the step”, ρ " in words, words
    assert words.endswith("needs ρ ≥ 0.3"), words


def test_together_words_say_which_bound_a_failed_part_missed():
    """Over 2 windows nothing can be resampled, so no part is a yes though every estimate meets its
    bound: the words must not read "not held: … ρ 0.90, needs ρ ≥ 0.3" (which it meets)."""
    import numpy as np

    from coupling_utils.chapters.f03_training_emergence.results import together_intervals
    from coupling_utils.chapters.f03_training_emergence.words import together_words

    steps = np.arange(10)
    few = together_intervals(_windows(0.1 * steps, 3 - 0.2 * steps, n_windows=2))
    assert _failed(few) == list(f03.TOGETHER_PARTS)
    words = together_words(few, _failed(few))
    assert words.startswith("not held: “coupling rises with the step”, ρ "), words
    assert words.count("at the estimate only") == 3 and ", needs ρ" not in words, words


def test_together_needs_every_part_over_its_interval():
    """Coupling up, LSS down, moving together: yes. Coupling up while trajectories turn more: not a
    yes, the linearity parts named. A constant curve has no ρ: NaN, never a yes."""
    import math

    import numpy as np

    from coupling_utils.chapters.f03_training_emergence.results import together_intervals

    steps = np.arange(10)
    both = together_intervals(_windows(0.1 * steps, 3 - 0.2 * steps))
    assert f03.RULES["together"].judge(both) == "yes" and _failed(both) == []
    bent = together_intervals(_windows(0.1 * steps, 1 + 0.2 * steps))
    assert f03.RULES["together"].judge(bent) == "no"
    assert _failed(bent) == list(f03.TOGETHER_PARTS)[1:]
    flat = together_intervals(_windows(np.zeros(10), 3 - 0.2 * steps, noise=0.0))
    assert math.isnan(flat["coupling_step"]) and f03.RULES["together"].judge(flat) == "no"


def test_the_monotony_note_says_in_how_many_steps_the_curve_rises():
    """The status note read "rises between 47% of consecutive checkpoints"."""
    import inspect

    from coupling_utils.chapters.f03_training_emergence import story
    from coupling_utils.chapters.f03_training_emergence.words import rises_words

    assert rises_words(0.4706) == "rises in 47% of the steps between consecutive checkpoints"
    source = inspect.getsource(story)
    assert "rises between" not in source and "rises_words(first.rises)" in source


def test_the_threshold_solution_names_every_densest_checkpoint():
    """Exercise f03-ex-threshold said "densest at step 32 (0.17)" where steps 32, 64 and 128 tie, as
    the body (density_peak_words) says."""
    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.exercises import _threshold_words

    d = pd.DataFrame({"step": [1, 32, 64, 128, 4096], "density": [0, 1 / 6, 1 / 6, 1 / 6, 0]})
    assert (
        _threshold_words(0.4, d)
        == "threshold 0.4: the density is highest (0.17) at steps 32, 64 and 128, final 0.00"
    )
    flat = _threshold_words(0.6, d.assign(density=0.0))
    assert flat == "threshold 0.6: the density is 0.00 at every checkpoint"


def test_the_search_reads_single_runs_without_direction_words(monkeypatch):
    """One run and one seed per setting, no interval: the search said "lower with more width" and
    "training longer made the final coupling lower, so a longer local run is not the way"."""
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.analysis.emergence_search import one_factor_effects
    from coupling_utils.chapters.f03_training_emergence import search

    runs = pd.DataFrame(
        {
            "config": ["base", "long", "longer", "wide"],
            "d_model": [64, 64, 64, 128],
            "n_layers": [4] * 4,
            "steps": [1024, 2048, 4096, 1024],
            "lr": [3e-3] * 4,
            "data_tokens": [0] * 4,
            "final": [0.238, 0.188, 0.150, 0.131],
        }
    )
    monkeypatch.setattr(search, "_search_found", lambda r: "")
    out = search._search_effects(SimpleNamespace(effects=one_factor_effects(runs)))
    effects, length = out["f03_search_effects"].data, out["f03_search_length"].data
    assert "- width 64 → 128 (base, wide): final coupling 0.238 → 0.131." in effects
    assert length == (
        "the runs that differ in length only (1,024 → 2,048 → 4,096 steps) ended at a final coupling of "
        "0.238 → 0.188 → 0.150: one run and one seed each, with no interval, so these values are not a "
        "measured effect of training length"
    )
    for word in ("higher", "lower", "more", "made"):
        assert word not in effects + length
    assert "not the way" not in NOTEBOOK.read_text() and "one seed, per" in NOTEBOOK.read_text()


def test_the_wide_run_and_this_run_are_two_values_not_a_finding():
    """The sentence said "starts at 0.023, higher: the level of unrelated blocks depends on K and the
    width, not on their ratio alone" from one draw each under two last-block maps."""
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.story import _wide_sentence

    curves = pd.DataFrame(
        {
            "config": ["w128"] * 3,
            "d_model": [128] * 3,
            "K": [32] * 3,
            "step": [0, 1, 2],
            "coupling": [-0.008, -0.108, -0.05],
            "share_m_above_1": [0.77, 0.95, 0.9],
        }
    )
    big = pd.Series({"K": 16, "d_model": 64.0, "K_over_d": 0.25, "first": 0.023})
    r = SimpleNamespace(
        big=big, search=SimpleNamespace(curves=curves), params=SimpleNamespace(last_block="final_norm")
    )
    words = _wide_sentence(r)
    assert '(w128, width 128, `last_block = "block"`)' in words
    assert words.endswith(
        'this run\'s K = 16 (width 64, `last_block = "final_norm"`) starts at 0.023. Each of the two values '
        "is one set of weights measured once (no interval), under different last-block maps."
    )
    assert "higher" not in words and "ratio alone" not in words
    r.params.last_block = "block"
    assert _wide_sentence(r).endswith("under the same last-block map.")


def test_the_search_s_verdict_of_this_run_is_set_beside_this_run_s_under_both_maps():
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.story import _block_sentence

    table = pd.DataFrame({"this_chapter": [False, True], "rises progressively": ["yes", "no"]})
    r = SimpleNamespace(
        search_table=table,
        params=SimpleNamespace(last_block="final_norm"),
        coupling_verdicts={"rises": "partly"},
        other_conventions={"block": {"rises": "no"}, "excluded": {"rises": None}},
    )
    assert _block_sentence(r).endswith(
        'it gets no; measured here with intervals it gets partly with `last_block = "final_norm"` and no '
        "with the last block alone (one run measures both)."
    )
    r.other_conventions = {"block": {"rises": None}}  # the other map not measured
    assert _block_sentence(r).endswith(
        'measured here (`last_block = "final_norm"`, with intervals) it gets partly.'
    )
    r.params.last_block = "block"  # the search's own map: the search table says it
    assert _block_sentence(r) == ""


def test_the_panels_figure_is_one_chart_with_a_line_per_prompt_set():
    """Its caption spoke of "(the main panel)" and "(a secondary panel ...)" for a chart of one panel
    with two lines."""
    import re
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.analysis.layout import shown_panels

    main = pd.DataFrame(
        [
            {"panel": panel, "model": "embedded:m", "step": step, "coupling": 0.1 + 0.01 * step}
            for panel in (f03.MAIN, f03.QUIZ)
            for step in (0, 1, 2)
        ]
    )
    growth = pd.DataFrame(
        {"model": ["embedded:m"] * 2, "panel": [f03.MAIN, f03.QUIZ], "peak": [0.12, 0.12],
         "peak_step": [2, 2], "final": [0.12, 0.12]}
    )  # fmt: skip
    chart, _ = f03.panels_figure(SimpleNamespace(main=main, growth=growth, showcase="embedded:m", k_main=2))
    assert len(shown_panels(chart)) == 1
    caption = re.search(r'name="fig-f03-panels",\s*caption="(.*?)",\s*alt', NOTEBOOK.read_text(), re.S)[1]
    assert "panel" not in caption and "one line per run" in caption


def test_the_expodistance_row_names_its_reconstruction_and_reports_the_others():
    """The row said "expodistance falls; our reconstruction" and reported only the log-linear 1 − R²,
    while ratio_cv rose 0.127 → 0.407 and the fitted growth per block fell to 0.795."""
    from coupling_utils.analysis.verdicts import Interval
    from coupling_utils.chapters.f03_training_emergence import story
    from coupling_utils.chapters.f03_training_emergence.words import reconstruction_words

    assert "log-linear reconstruction of expodistance" in story.CLAIMS["expo"]
    over = "8 windows"
    others = {
        "expodistance_ratio_cv": {
            "early": 0.1274,
            "final": 0.4067,
            "ratio": Interval(3.19, 2.86, 3.54, over=over),
        },
        "growth_log_linear_r2": {
            "early": 1.0191,
            "final": Interval(0.795, 0.784, 0.808, over=over),
            "ratio": Interval(0.78, 0.77, 0.79, over=over),
        },
    }
    assert reconstruction_words(others) == (
        "the other reconstruction, ratio_cv, goes 0.127 → 0.407 and ends higher than it starts: final / "
        "early 3.19 (95% interval 2.86 to 3.54 over 8 windows); the fitted growth per block goes 1.019 → "
        "0.795 and ends lower than it starts: final / early 0.78 (95% interval 0.77 to 0.79 over 8 windows), "
        "its last value below 1 (95% interval 0.784 to 0.808 over 8 windows): at the end the step sizes "
        "shrink with depth"
    )
    unclear = {
        "expodistance_ratio_cv": {"early": 0.2, "final": 0.21, "ratio": Interval(1.05, 0.9, 1.2, over=over)},
        "growth_log_linear_r2": {
            "early": 1.0,
            "final": Interval(0.99, 0.95, 1.03, over=over),
            "ratio": Interval(0.99, 0.9, 1.1, over=over),
        },
    }
    words = reconstruction_words(unclear)
    assert not {"higher", "lower", "below", "shrink"} & set(words.replace(",", " ").split())
    assert "not told apart" in words and reconstruction_words({}) == ""
    assert "log-linear reconstruction of expodistance, 1 − R²" in NOTEBOOK.read_text()


def test_trajectory_words_say_where_the_curve_turns_not_only_its_ends():
    """The LSS went 2.012 → 1.830 ("straighter", partly) but was lowest at step 64 and higher at every
    later checkpoint; the growth per block "fell 1.019 → 0.795" through 1.73 at step 32 and 0.58 at
    step 128. The words name the turns and count the moves after the later one."""
    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.words import reconstruction_words, turn_words

    steps = [1, 8, 32, 64, 128, 512, 4096]
    lss = pd.Series([2.01, 1.46, 1.20, 1.16, 1.29, 1.58, 1.83], index=steps)
    assert turn_words(lss, {"higher": "less straight"}) == (
        "lowest (1.160) at step 64, then higher (less straight) at each of the 3 later checkpoints than at "
        "the one before"
    )
    growth = pd.Series([1.02, 1.28, 1.73, 0.91, 0.58, 0.67, 0.60], index=steps)
    assert turn_words(growth) == (
        "highest (1.730) at step 32, lowest (0.580) at step 128, then higher at 1 of the 2 later checkpoints "
        "than at the one before"
    )
    assert turn_words(pd.Series([3.0, 2.0, 2.5, 1.0], index=[1, 2, 4, 8])) == (
        "lowest at the last checkpoint, lower at 2 of the 3 checkpoints after the first than at the one "
        "before"
    )
    assert turn_words(pd.Series([1.0, 1.0], index=[1, 2])) == "the same (1.000) at every checkpoint"
    others = {"growth_log_linear_r2": {"early": 1.02, "final": 0.60, "ratio": 0.59, "curve": growth}}
    assert "(highest (1.730) at step 32, lowest (0.580) at step 128, then" in reconstruction_words(others)


def test_together_intervals_match_scipy_on_every_resample():
    """together_intervals judges every resampled set of windows at once; each of its intervals
    must be the percentile interval of scipy's Spearman ρ on the same resamples' mean curves (the
    loop it replaced), ties included."""
    import numpy as np
    from scipy import stats as sps

    from coupling_utils.analysis.stats import resample_rows
    from coupling_utils.chapters.f03_training_emergence.results import together_intervals

    steps = np.arange(10)
    per = _windows(0.1 * steps, 3 - 0.2 * steps, noise=0.3, seed=4).round(1)  # rounding makes ties
    got = together_intervals(per, n_resamples=200)
    wide = per.pivot_table(index="prompt", columns="step", values=["coupling", "lss"])
    draws = {"coupling_step": [], "lss_step": [], "rho_lss": []}
    for rows in resample_rows(len(wide), 200, 0):
        sample = wide.iloc[rows]
        c, s = sample["coupling"].mean().to_numpy(), sample["lss"].mean().to_numpy()
        for name, (x, y) in {"coupling_step": (steps, c), "lss_step": (steps, s), "rho_lss": (c, s)}.items():
            draws[name].append(sps.spearmanr(x, y).statistic)
    for name, values in draws.items():
        low, high = np.quantile(np.array(values)[np.isfinite(values)], [0.025, 0.975])
        assert (got[name].low, got[name].high) == pytest.approx((low, high), abs=1e-12), name
