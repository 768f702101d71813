"""Every notebook at the `paper` profile, end to end on the stand-in hub; the `laptop` plans checked.

The stand-in hub (``standin_hub`` fixture) holds a tiny random model under every repo id and
revision the two profiles name, so the whole hub path runs offline: loading by id and revision,
SentencePiece-only tokenizers, ``.bin`` and sharded weights, twins, checkpoints, the analyses and
the charts. The changes to the profiles are stated once, in ``tests/profile_overrides.yaml``:
fewer and shorter prompts, and the locally trained model families of f02 and f04 swapped for
their smoke builds (training the full families is not the hub path and costs about 9 CPU
minutes, too much for CI; ``make book`` trains them). Measurements go to a private cache
(stand-in numbers must never be read back as a real model's); the embedded models are built
once in the session's cache and shared. Notebooks run two at a time, each kernel on one
thread, like ``make book``; each (profile, notebook) is its own test, so a failure names the
notebook and its error.

The `laptop` profile names a subset of the paper's model families (GPT-2, Qwen1.5, Pythia, ViT)
at float32, through the same notebooks: ``make test`` checks its plans without running the
notebooks (every job planned from the profile, every hub model loaded from the stand-in hub at
its revision and dtype, and the job's own check run on it), which is what can differ from the
paper profile's run. ``COUPLING_STANDIN_PROFILES=paper,laptop`` runs both end to end (about ten
more CPU minutes).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from coupling_utils.pipeline.execution import notebook_paths, run_notebook

ROOT = Path(__file__).resolve().parents[1]
ALL_PROFILES = ("paper", "laptop")
# profiles run end to end (COUPLING_STANDIN_PROFILES=paper,laptop for both; see the module doc)
PROFILES = tuple(os.environ.get("COUPLING_STANDIN_PROFILES", "paper").replace(" ", "").split(","))
OVERRIDES = yaml.safe_load((ROOT / "tests" / "profile_overrides.yaml").read_text())
OUT = ROOT / "_build" / "profiles"
NOTEBOOKS = notebook_paths(ROOT)
# notebooks whose paper/laptop run fails today because of notebook code (their owners fix them):
# strict, so the test fails as soon as one runs again and the entry must go
KNOWN_FAILURES: dict[str, str] = {}


def test_the_overrides_change_prompt_count_and_length_only():
    """Apart from prompts, an override may only swap a trained family for its own smoke build."""
    from coupling_utils.pipeline.execution import _planned_values

    allowed = {"n_prompts", "max_tokens", "prompt_tokens", "n_images", "prompts", "include_demo"}
    families = {"family", "training_family"}  # f02's two trained families, f04's family
    allowed |= {"scale_prompts", "scale_max_tokens", "n_windows", "window_tokens"} | families
    assert set(OVERRIDES) == {nb.stem for nb in NOTEBOOKS}
    assert set(PROFILES) <= set(ALL_PROFILES), (
        f"COUPLING_STANDIN_PROFILES={','.join(PROFILES)}: name profiles among {', '.join(ALL_PROFILES)}"
    )
    for nb, values in OVERRIDES.items():
        assert set(values) <= allowed, (
            f"{nb}: {sorted(set(values) - allowed)} is not a prompt count or length"
        )
        for name in families & set(values):
            for profile in ALL_PROFILES:
                own = _planned_values(ROOT / "notebooks" / f"{nb}.md", profile, {})[name]
                assert values[name] == f"{own}-smoke", (
                    f"{nb} at {profile}: the {name} override must be the smoke build of {own}"
                )


@pytest.fixture(scope="module")
def profile_runs(standin_hub, tmp_path_factory):
    """Run every (profile, notebook) once; return their results and the wall-clock seconds."""
    from coupling_utils.files import cache_dir
    from coupling_utils.models import zoo
    from coupling_utils.pipeline.execution import _planned_values, embedded_models

    shared = cache_dir()
    private = tmp_path_factory.mktemp("profile-cache")
    for part in ("zoo", "corpus"):
        (shared / part).mkdir(exist_ok=True)
        (private / part).symlink_to(shared / part)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COUPLING_CACHE", str(private))
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("MKL_NUM_THREADS", "1")
        start = time.perf_counter()
        runs = [(p, nb) for p in PROFILES for nb in NOTEBOOKS]
        models = []
        for p, nb in runs:
            models += embedded_models(_planned_values(nb, p, OVERRIDES[nb.stem]))
        zoo.prepare_many(list(dict.fromkeys(models)), jobs=2, echo=lambda *_: None)
        built = time.perf_counter() - start

        def one(run):
            p, nb = run
            return run, run_notebook(nb, p, OVERRIDES[nb.stem], OUT / p)

        with ThreadPoolExecutor(max_workers=2) as pool:
            results = dict(pool.map(one, runs))
        seconds = time.perf_counter() - start
    lines = [f"embedded models: {built:.0f} s"] + [
        f"{p:<7}{r.line()}" for (p, _), r in sorted(results.items(), key=lambda x: (x[0][0], x[0][1].stem))
    ]
    (OUT / "times.txt").write_text("\n".join([*lines, f"total: {seconds:.0f} s", ""]))
    return {(p, nb.stem): r for (p, nb), r in results.items()}


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_profile_runs_on_the_standin_hub(profile, nb, profile_runs):
    result = profile_runs[(profile, nb.stem)]
    if nb.stem in KNOWN_FAILURES:
        assert result.status != "ok", f"{nb.stem} runs at {profile} now: remove it from KNOWN_FAILURES"
        known = KNOWN_FAILURES[nb.stem].split(":")[0]
        assert str(result.error).startswith(known), (
            f"{nb.stem} at {profile}: {result.error} (see {result.output})"
        )
        pytest.xfail(KNOWN_FAILURES[nb.stem])
    assert result.status == "ok", f"{nb.stem} at {profile}: {result.error} (see {result.output})"
    assert os.path.exists(result.output)


@pytest.mark.skipif("laptop" in PROFILES, reason="the laptop profile runs end to end in this session")
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_laptop_plan_loads_on_the_standin_hub(nb, standin_hub):
    """The laptop profile's plan, short of measuring: its jobs, its hub models, their checks.

    Every job the chapter plans from the laptop profile (as ``coupling-book run`` and a sweep
    would), every hub model it names loaded from the stand-in hub at the job's revision and
    load arguments (dtype, weights), and the job's own check of the loaded model (layers in
    range, token positions, image sizes) run on it.
    """
    from coupling_utils.models.loading import load_model
    from coupling_utils.pipeline.sweep import notebook_jobs

    jobs = notebook_jobs(nb.stem, "laptop", OVERRIDES[nb.stem])
    hub = [j for j in jobs if not str(j.model).startswith("embedded:")]
    loaded: dict[tuple, object] = {}
    for job in hub:
        key = (job.model, tuple(sorted((k, repr(v)) for k, v in job.load_kwargs.items())))
        if key not in loaded:
            loaded[key] = load_model(job.model, **job.load_kwargs)
        if job.check is not None:
            job.check(loaded[key])
    assert hub, f"{nb.stem}: the laptop profile plans no hub model"
