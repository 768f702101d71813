"""data/ files against their schemas and sources; loaders, aliases, joins and their errors."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis import data as D
from coupling_utils.analysis import task_prompts as TP

REPO_DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def data_copy(tmp_path, monkeypatch):
    """A private copy of data/ that COUPLING_DATA points at, for corrupting."""
    dst = tmp_path / "data"
    shutil.copytree(REPO_DATA, dst, ignore=shutil.ignore_patterns("benchmarks"))
    monkeypatch.setenv(D.ENV_VAR, str(dst))
    return dst


def _edit_csv(path: Path, fn) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    fn(df)
    df.to_csv(path, index=False)


# -------------------- files and schemas


def test_data_dir_is_the_repository_data_folder(monkeypatch):
    monkeypatch.delenv(D.ENV_VAR, raising=False)
    assert D.data_dir() == REPO_DATA
    assert (REPO_DATA / "README.md").is_file()


def test_data_dir_env_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv(D.ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="COUPLING_DATA"):
        D.data_dir()


def test_missing_file_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv(D.ENV_VAR, str(tmp_path))
    with pytest.raises(D.DataError, match=r"prompts\.csv.*not found"):
        D.load_prompts()


@pytest.mark.parametrize("name", sorted(D.SCHEMAS))
def test_file_matches_schema_and_has_sources(name):
    df = D.read_table(name)
    schema = D.SCHEMAS[name]
    assert list(df.columns) == [c.name for c in schema.columns]
    assert len(df) > 0
    assert not df.duplicated(list(schema.key)).any()
    src_col = "note" if name == "model_aliases.csv" else "source"
    if name != "model_metadata.csv":  # metadata: source may be empty only where no architecture is known
        assert df[src_col].notna().all() and (df[src_col].str.len() > 10).all()


def test_readme_describes_every_file():
    readme = (REPO_DATA / "README.md").read_text()
    for name in D.SCHEMAS:
        assert f"`{name}`" in readme, name
    for path in REPO_DATA.iterdir():
        if path.is_file() and path.name != "README.md":
            assert path.name in D.SCHEMAS, (
                f"{path.name} has no schema in coupling_utils.analysis.data.SCHEMAS"
            )


# -------------------- spot checks against the sources


def test_v1_spot_checks():
    v1 = D.load_leaderboard("v1").set_index("model_id")
    llama = v1.loc["meta-llama/Llama-2-7b-hf"]
    assert llama["average"] == pytest.approx(50.97) and llama["precision"] == "float16"
    assert llama["arc"] == pytest.approx(53.07) and llama["gsm8k"] == pytest.approx(14.48)
    assert v1.loc["EleutherAI/pythia-1.4b", "average"] == pytest.approx(34.75)
    assert v1.loc["openai-community/gpt2", "average"] == pytest.approx(28.53)
    assert v1.loc["Qwen/Qwen1.5-14B", "average"] == pytest.approx(66.70)
    assert v1.loc["codellama/CodeLlama-7b-hf", "precision"] == "4bit"  # the only row it has
    # pre-2023 Pythia names resolve to today's ids, and the row says under which name it was listed
    assert v1.loc["EleutherAI/pythia-6.9b", "leaderboard_id"] == "EleutherAI/pythia-6.7b"
    assert "pythia-6.7b" in v1.loc["EleutherAI/pythia-6.9b", "source"]
    assert v1.loc["openai-community/gpt2-xl", "leaderboard_id"] == "gpt2-xl"
    assert v1["source"].str.contains("2024-07-07").all()


def test_v1_covers_the_models_the_book_names():
    v1 = set(D.load_leaderboard("v1")["model_id"])
    fig = D.load_paper_points("1a")
    in_v1 = fig["model_id"].isin(v1)
    assert in_v1.sum() == 26
    assert set(fig.loc[~in_v1, "label"]) == {"gpt2-medium", "phi-1"}  # not in the final v1 export
    pythia = {m for m in v1 if m.startswith("EleutherAI/pythia-")}
    assert {
        "EleutherAI/pythia-70m",
        "EleutherAI/pythia-160m",
        "EleutherAI/pythia-410m",
        "EleutherAI/pythia-1.4b",
        "EleutherAI/pythia-2.8b",
        "EleutherAI/pythia-6.9b",
        "EleutherAI/pythia-12b",
    } <= pythia
    registry = D.load_aliases().query("kind.str.contains('paper_key')", engine="python")
    assert len(registry) == 45
    missing = set(registry.loc[~registry["model_id"].isin(v1), "model_id"])
    assert missing == {
        "microsoft/phi-1",
        "openai-community/gpt2-medium",
        "tiiuae/falcon-40b-instruct",
        "google/gemma-1.1-2b-it",
        "google/t5-large-lm-adapt",
        "google/t5-xl-lm-adapt",
    }


def test_v1_other_precision_and_v2():
    other = D.load_leaderboard("v1", other_precisions=True).set_index(["model_id", "precision"])
    assert other.loc[("codellama/CodeLlama-34b-Instruct-hf", "bfloat16"), "average"] == pytest.approx(57.29)
    v1 = D.load_leaderboard("v1").set_index("model_id")
    assert set(other.index.get_level_values(0)) <= set(v1.index)
    v2 = D.load_leaderboard("v2").set_index("model_id")
    assert v2.loc["meta-llama/Llama-2-7b-hf", "average"] == pytest.approx(8.81)
    assert v2.loc["HuggingFaceTB/SmolLM2-135M-Instruct", "ifeval"] == pytest.approx(28.83)
    assert v2["source"].str.contains("normalised").all()
    with pytest.raises(D.DataError, match="v1.*v2"):
        D.load_leaderboard("v3")


def test_metadata_spot_checks():
    md = D.load_metadata().set_index("model_id")
    llama = md.loc["meta-llama/Llama-2-7b-hf"]
    assert (llama.n_layers, llama.d_model, llama.n_heads, llama.n_kv_heads) == (32, 4096, 32, 32)
    assert md.loc["mistralai/Mistral-7B-v0.1", "n_kv_heads"] == 8
    assert md.loc["google/gemma-2b", "n_kv_heads"] == 1
    assert md.loc["EleutherAI/pythia-1.4b", "params_b"] == pytest.approx(1.414647808)
    # GPT-2 small: 124,439,808 parameters (tied head), computed from its config
    assert md.loc["openai-community/gpt2", "params_b"] * 1e9 == pytest.approx(124_439_808, abs=1)
    assert md.loc["openai-community/gpt2-xl", "params_b"] == pytest.approx(1.557611, abs=1e-6)
    assert md.loc["tiiuae/falcon-11B", "n_layers"] == 60
    assert md.loc["Qwen/Qwen2-7B", "n_kv_heads"] == 4
    assert set(md["family"]) >= {
        "gpt2",
        "gpt_neox",
        "llama",
        "mistral",
        "qwen2",
        "gemma",
        "phi",
        "falcon",
        "olmo",
    }
    fig = D.load_paper_points("1a")
    complete = md.loc[fig["model_id"], ["params_b", "n_layers", "d_model", "n_heads", "n_kv_heads"]]
    assert complete.notna().all().all()  # every Fig. 1(a) model has full metadata
    every_model = set(D.load_leaderboard("v1")["model_id"]) | set(D.load_leaderboard("v2")["model_id"])
    assert every_model <= set(md.index)
    assert set(D.load_aliases()["model_id"]) <= set(md.index)


def test_fig1a_points_agree_with_the_leaderboard():
    """The digitised y values match the v1 averages within their reading error (one known exception)."""
    t = D.fig1a_table()
    assert len(t) == 28
    scored = t[t["has_score"] & (t["label"] != "gemma-2b")]
    gap = (scored["score"] - scored["average"]).abs()
    assert (gap <= scored["score_err"] + 0.1).all(), scored.loc[
        gap > scored["score_err"] + 0.1, "label"
    ].tolist()
    gemma = t.set_index("label").loc["gemma-2b"]
    assert abs(gemma["score"] - gemma["average"]) > 3 and "NOT match" in gemma["flag"]
    assert t["coupling"].between(0.88, 0.96).all()
    assert t["source"].str.contains("digitised").all()


def test_fig1b_points():
    b = D.load_paper_points("1b")
    assert sorted(b["model_id"].unique()) == ["EleutherAI/pythia-12b", "EleutherAI/pythia-6.9b"]
    wide = b.pivot(index="step", columns="model_id", values="normalized_coupling")
    assert len(wide) == 12 and wide.index.min() == 128 and wide.index.max() == 143000
    assert (wide["EleutherAI/pythia-6.9b"] > wide["EleutherAI/pythia-12b"]).all()
    rise = wide.iloc[-1] / wide.iloc[0]
    assert rise.between(2.2, 2.6).all()
    assert (b["normalized_coupling_err"] > 0).all()


# -------------------- aliases


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("gpt2", "openai-community/gpt2"),
        ("openai-community/gpt2", "openai-community/gpt2"),
        ("GPT2-XL", "openai-community/gpt2-xl"),
        ("EleutherAI/pythia-1.3b", "EleutherAI/pythia-1.4b"),
        ("pythia-1.4b", "EleutherAI/pythia-1.4b"),
        ("falcon2-11b", "tiiuae/falcon-11B"),
        ("qwen1.5-4b", "Qwen/Qwen1.5-4B"),
        ("allenai/OLMo-1B", "allenai/OLMo-1B-hf"),
        ("neo-20b", "EleutherAI/gpt-neox-20b"),
        ("  someone/new-model ", "someone/new-model"),
    ],
)
def test_resolve_model_id(alias, canonical):
    assert D.resolve_model_id(alias) == canonical


def test_resolve_model_id_rejects_empty():
    with pytest.raises(D.DataError, match="non-empty"):
        D.resolve_model_id(" ")


# -------------------- corrupted copies fail with file and row


def test_score_out_of_range(data_copy):
    def corrupt(df):
        df.loc[3, "arc"] = "153.2"

    _edit_csv(data_copy / "open_llm_leaderboard_v1.csv", corrupt)
    with pytest.raises(
        D.DataError, match=r"open_llm_leaderboard_v1\.csv: line 5 .*arc=153\.2 is outside \[0\.0, 100\.0\]"
    ):
        D.load_leaderboard("v1")


def test_scores_in_fraction_units_are_caught(data_copy):
    def corrupt(df):
        df.loc[0, "mmlu"] = str(float(df.loc[0, "mmlu"]) / 100)  # 0-1 instead of percent

    _edit_csv(data_copy / "open_llm_leaderboard_v1.csv", corrupt)
    with pytest.raises(D.DataError, match=r"line 2 .*average .* is not the mean"):
        D.load_leaderboard("v1")


def test_non_numeric_and_missing_values(data_copy):
    def corrupt(df):
        df.loc[1, "n_layers"] = "thirty-two"

    _edit_csv(data_copy / "model_metadata.csv", corrupt)
    with pytest.raises(
        D.DataError, match=r"model_metadata\.csv: line 3 .*n_layers='thirty-two' is not a finite number"
    ):
        D.load_metadata()


def test_nonpositive_params(data_copy):
    def corrupt(df):
        df.loc[2, "params_b"] = "0"

    _edit_csv(data_copy / "model_metadata.csv", corrupt)
    with pytest.raises(D.DataError, match=r"line 4 .*params_b=0 is outside \(0\.0"):
        D.load_metadata()


def test_missing_column(data_copy):
    path = data_copy / "open_llm_leaderboard_v2.csv"
    pd.read_csv(path, dtype=str).drop(columns=["source"]).to_csv(path, index=False)
    with pytest.raises(D.DataError, match=r"open_llm_leaderboard_v2\.csv: missing column\(s\) \['source'\]"):
        D.load_leaderboard("v2")


def test_empty_required_cell(data_copy):
    def corrupt(df):
        df.loc[5, "source"] = ""

    _edit_csv(data_copy / "paper_fig1a_digitized.csv", corrupt)
    with pytest.raises(D.DataError, match=r"line 7 .*'source' is empty"):
        D.load_paper_points("1a")


def test_duplicate_key(data_copy):
    path = data_copy / "prompts.csv"
    df = pd.read_csv(path, dtype=str)
    pd.concat([df, df.iloc[[4]]]).to_csv(path, index=False)
    with pytest.raises(D.DataError, match=rf"prompts\.csv: line {len(df) + 2}: duplicate key \(id="):
        D.load_prompts()


def test_alias_chain_and_duplicate(data_copy):
    path = data_copy / "model_aliases.csv"
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    chained = pd.concat(
        [df, pd.DataFrame([{"alias": "tiny-gpt", "model_id": "gpt2", "kind": "short_name", "note": ""}])]
    )
    chained.to_csv(path, index=False)
    with pytest.raises(D.DataError, match="is itself an alias"):
        D.resolve_model_id("gpt2")
    dup = pd.concat(
        [df, pd.DataFrame([{"alias": "GPT2", "model_id": "x/y", "kind": "short_name", "note": ""}])]
    )
    dup.to_csv(path, index=False)
    with pytest.raises(D.DataError, match="listed more than once"):
        D.load_aliases()


def test_bad_category(data_copy):
    def corrupt(df):
        df.loc[10, "category"] = "poetry"

    _edit_csv(data_copy / "prompts.csv", corrupt)
    with pytest.raises(D.DataError, match=r"line 12 .*category='poetry' is not one of"):
        D.load_prompts()


def test_corruption_is_not_cached(data_copy):
    assert len(D.load_leaderboard("v2")) > 0

    def corrupt(df):
        df.loc[0, "chat_template"] = "maybe"

    _edit_csv(data_copy / "open_llm_leaderboard_v2.csv", corrupt)
    with pytest.raises(D.DataError, match="not true or false"):
        D.load_leaderboard("v2")


# -------------------- prompts


def test_prompt_set():
    p = D.read_table("prompts.csv")
    assert len(p) == 61
    counts = p["category"].value_counts()
    assert all(counts[c] == 10 for c in D.PROMPT_CATEGORIES)
    demo = p[p["category"] == "demo"]
    assert demo["text"].tolist() == [D.DEMO_PROMPT] == ["What is the capital of France? The capital is"]
    assert (p.loc[p["category"] != "demo", "source"] == "written for this project").all()
    assert p["text"].is_unique and (p["text"].str.len() > 20).all()


def test_load_prompts_options():
    full = D.load_prompts()
    assert len(full) == 61 and full.iloc[0]["id"] == "demo-france"
    assert list(full.columns) == ["id", "category", "text", "source"]
    six = D.load_prompts(n=6, include_demo=False)
    assert list(six["category"]) == list(D.PROMPT_CATEGORIES)  # round-robin: one of each
    math = D.load_prompts("grade_school_math", n=3, include_demo=False)
    assert list(math["id"]) == ["math-01", "math-02", "math-03"]
    two = D.load_prompts(["truthfulness", "pronoun_resolution"], include_demo=True)
    assert len(two) == 21 and two.iloc[0]["category"] == "demo"
    assert list(D.load_prompts("demo", include_demo=False)["text"]) == [D.DEMO_PROMPT]
    with pytest.raises(D.DataError, match="Unknown prompt category"):
        D.load_prompts("poetry")
    assert list(D.load_prompts(n=0)["id"]) == ["demo-france"]  # none of the set: the demo alone
    with pytest.raises(D.DataError, match="no prompt selected"):
        D.load_prompts(n=0, include_demo=False)
    with pytest.raises(D.DataError, match="non-negative integer"):
        D.load_prompts(n=-1)


# -------------------- task prompts through `datasets`


def _fake_records(path):
    if path == "gsm8k":
        return [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]
    if path == "ai2_arc":
        return [
            {"question": f"Science {i}?", "choices": {"label": ["A", "B"], "text": ["yes", "no"]}}
            for i in range(20)
        ]
    if path == "hellaswag":
        return [{"ctx": f"A person does thing {i} and then"} for i in range(20)]
    if path == "cais/mmlu":
        return [{"question": f"Academic {i}?", "choices": ["w", "x", "y", "z"]} for i in range(20)]
    if path == "truthful_qa":
        return [{"question": f"Is myth {i} true?"} for i in range(20)]
    if path == "winogrande":
        return [
            {"sentence": f"Ann helped Bo because _ was kind ({i}).", "option1": "Ann", "option2": "Bo"}
            for i in range(20)
        ]
    raise AssertionError(path)


def test_task_prompts_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(ImportError, match="pip install datasets"):
        TP.load_task_prompts(2)


def test_task_prompts_offline_names_the_dataset(monkeypatch):
    fake = types.ModuleType("datasets")

    def load_dataset(path, name=None, split=None):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(TP.TaskDataUnavailable, match=r"'gsm8k/main'.*load_dataset\('gsm8k', 'main'"):
        TP.load_task_prompts(2)


def test_task_prompts_record_shape(monkeypatch):
    fake = types.ModuleType("datasets")
    seen = []

    def load_dataset(path, name=None, split=None):
        seen.append((path, name, split))
        return _fake_records(path)

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    a = TP.load_task_prompts(3, seed=1)
    assert list(a.columns) == ["id", "category", "text", "source"]
    assert (a["category"].value_counts() == 3).all() and set(a["category"]) == set(D.PROMPT_CATEGORIES)
    assert a["id"].is_unique
    assert ("cais/mmlu", "all", "test") in seen and ("winogrande", "winogrande_xl", "validation") in seen
    assert (
        a[a.category == "academic_multiple_choice"]["text"]
        .str.contains(r"A\) w B\) x C\) y D\) z Answer:")
        .all()
    )
    assert a[a.category == "pronoun_resolution"]["text"].str.endswith("The blank refers to").all()
    pd.testing.assert_frame_equal(a, TP.load_task_prompts(3, seed=1))
    assert not a["id"].equals(TP.load_task_prompts(3, seed=2)["id"])


# -------------------- joins


def test_join_scores_keeps_and_lists_unmatched():
    measured = pd.DataFrame(
        {
            "model": ["gpt2", "EleutherAI/pythia-1.3b", "someone/unknown", "gpt2"],
            "coupling": [0.1, 0.2, 0.3, 0.15],
        }
    )
    with pytest.warns(UserWarning, match="someone/unknown"):
        out = D.join_scores(measured)
    assert len(out) == 4 and list(out["coupling"]) == [0.1, 0.2, 0.3, 0.15]
    assert list(out["model_id"]) == [
        "openai-community/gpt2",
        "EleutherAI/pythia-1.4b",
        "someone/unknown",
        "openai-community/gpt2",
    ]
    assert list(out["has_score"]) == [True, True, False, True]
    assert out.loc[0, "average"] == pytest.approx(28.53) and out.loc[1, "average"] == pytest.approx(34.75)
    assert out.loc[1, "n_layers"] == 24 and np.isnan(out.loc[2, "average"])
    assert out.attrs["unmatched"] == ["someone/unknown"]
    assert {"score_source", "metadata_source", "score_precision"} <= set(out.columns)


def test_join_scores_errors():
    with pytest.raises(D.DataError, match="model_col"):
        D.join_scores(pd.DataFrame({"name": ["gpt2"]}))
    with pytest.raises(D.DataError, match="already has a 'model_id'"):
        D.join_scores(pd.DataFrame({"model": ["gpt2"], "model_id": ["gpt2"]}))
    with pytest.raises(D.DataError, match="exist in the table"):
        D.join_scores(pd.DataFrame({"model": ["gpt2"], "average": [1.0]}))


def test_fig1a_table_joins_everything():
    t = D.fig1a_table()
    assert t["has_metadata"].all()
    assert set(t.attrs["unmatched"]) == {"openai-community/gpt2-medium", "microsoft/phi-1"}
    assert t["log10_params"].between(8, 10.5).all()
