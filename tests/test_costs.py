"""The cost model: model sizes from configs, FLOPs and memory by hand, throughput, the generated tables."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from coupling_utils.analysis.data import read_table
from coupling_utils.pipeline import costs as C

ROOT = Path(__file__).resolve().parents[1]


def test_configs_rebuild_the_documented_parameter_counts():
    """Each model_configs.csv row, built on the meta device, has model_metadata.csv's depth, width,
    heads and parameter count (within 0.1%): the recalled config fields are the real ones."""
    configs = read_table("model_configs.csv").set_index("model_id")
    meta = read_table("model_metadata.csv").set_index("model_id")
    checked = 0
    for model, row in configs.iterrows():
        size = C.model_size(model)
        if model not in meta.index:
            assert row["model_type"] == "vit", f"{model} has no model_metadata.csv row to check against"
            assert abs(size.n_params - 86.6e6) / 86.6e6 < 0.01  # ViT-Base/16 with its 1000-class head
            continue
        m = meta.loc[model]
        assert (row.n_layers, row.d_model, row.n_heads, row.n_kv_heads) == (
            m.n_layers, m.d_model, m.n_heads, m.n_kv_heads,
        ), model  # fmt: skip
        assert abs(size.n_params / (m.params_b * 1e9) - 1) < 1e-3, (model, size.n_params, m.params_b)
        checked += 1
    assert checked >= 32


def test_every_hub_profile_model_has_a_config():
    from coupling_utils.models.standin_hub import profile_repos

    configs = set(read_table("model_configs.csv").model_id)
    assert set(profile_repos()) <= configs


def test_gpt2_by_hand():
    size = C.model_size("openai-community/gpt2")
    d, L = 768, 12
    assert size.block_params == 12 * d * d + 13 * d  # qkv, proj, mlp weights and biases, two layer norms
    assert size.n_params == 124_439_808
    work = C.Work("openai-community/gpt2", None, "float32", n_prompts=2, T=16, layers=None, n_tokens=1, k=50)
    cost = C.work_cost(work)
    per_pass = 2 * size.block_params * 16 + 4 * 16 * 16 * d
    assert cost.passes == 2 * L * (d + 1) and cost.svds == 2 * L
    assert cost.flops == pytest.approx(2 * L * (d + 1) * per_pass + 2 * L * 21 * d**3)
    weights = size.n_params * 4 / 1e9
    assert cost.host_gb == pytest.approx(weights)
    assert cost.device_gb == pytest.approx(
        weights + (64 * 16 * size.block_params / d + 3 * d * d) * 4 / 1e9 + 1.0
    )
    assert cost.download_gb == pytest.approx(weights)  # GPT-2 stores float32
    twin = C.work_cost(C.Work("openai-community/gpt2", None, "float32", 2, 16, None, 1, download=False))
    assert twin.download_gb == 0 and twin.flops == cost.flops


def test_matrix_free_counts_solver_and_tile_passes():
    from coupling_utils.engine.spectra import solver_passes

    work = C.Work("EleutherAI/pythia-160m", "step1", "float32", 1, 24, None, 1, "matrix_free", k=10)
    cost = C.work_cost(work)
    assert cost.passes == 12 * (solver_passes(10, d=768) + 11 * 10) and cost.svds == 0


@pytest.mark.parametrize(
    "model, dtype, fits",
    [
        ("meta-llama/Meta-Llama-3-8B", "bfloat16", {24: "yes", 40: "yes", 80: "yes"}),
        ("Qwen/Qwen1.5-14B", "bfloat16", {24: "8bit", 40: "yes", 80: "yes"}),
        ("EleutherAI/pythia-12b", "float16", {24: "8bit", 40: "yes", 80: "yes"}),
        ("EleutherAI/pythia-12b", "float32", {24: "4bit", 40: "8bit", 80: "yes"}),
    ],
)
def test_gpu_sizes(model, dtype, fits):
    cost = C.work_cost(C.Work(model, None, dtype, 6, 64, None, 1))
    assert {gb: C.gpu_fit(cost, gb) for gb in C.GPU_SIZES_GB} == fits


def test_rates_are_measured_or_extrapolated_by_the_stated_rule():
    rows = []
    for threads, exact, mf, svd in ((1, 10e9, 5e9, 8.0), (2, 16e9, 9e9, 5.0)):
        rows += [
            {"what": "exact", "torch_threads": threads, "flops_per_s": exact, "machine": "m", "d": 512},
            {"what": "matrix_free", "torch_threads": threads, "flops_per_s": mf, "machine": "m", "d": 512},
            {
                "what": "svd",
                "torch_threads": threads,
                "seconds": svd * 512**3 / 1e9,
                "machine": "m",
                "d": 512,
            },
        ]
    bench = pd.DataFrame(rows)
    two = C.cpu_rates(2, bench)
    assert two.exact_flops_per_s == 16e9 and not two.extrapolated
    four = C.cpu_rates(4, bench)
    assert four.extrapolated and four.exact_flops_per_s == pytest.approx(16e9 * 1.6)
    assert four.matrix_free_flops_per_s == pytest.approx(9e9 * 1.8)
    assert four.svd_seconds_per_d3 == pytest.approx(5e-9 / 1.6)
    with pytest.raises(ValueError, match="cannot extrapolate"):
        C.cpu_rates(1, bench[bench.torch_threads == 2])


def test_the_benchmark_validates_the_cost_model():
    """bench/bench_costs.py's whole measure() run against the model's prediction from the same
    run's throughput: within a factor of two (the model leaves out loading and the tables)."""
    bench = pd.read_csv(ROOT / "data" / "benchmarks" / "costs.csv")
    for threads, rows in bench.groupby("torch_threads"):
        v = rows[rows.what == "validate"].iloc[0]
        rates = C.cpu_rates(int(threads), bench)
        size = C.ModelSize("bench", "gpt2", int(v.layers), int(v.d), 0, int(v.block_params), "float32")
        cost = C.Cost(C.Work("bench", None, "float32", 1, int(v["T"]), None, 1), size)
        cost.passes, cost.svds = int(v.layers) * (int(v.d) + 1), int(v.layers)
        predicted = C.cpu_seconds(cost, rates)
        assert 0.5 < predicted / v.seconds < 2, (threads, predicted, v.seconds)


def test_the_generated_table_is_up_to_date():
    """data/benchmarks/profile_costs.csv is what the cost model gives for today's profiles and benchmark
    (regenerate it with `python -m coupling_utils.pipeline.costs`)."""
    stored = pd.read_csv(ROOT / "data" / "benchmarks" / "profile_costs.csv")
    fresh = C.profile_costs_table()
    pd.testing.assert_frame_equal(stored, fresh, check_dtype=False, rtol=1e-3)


def test_laptop_profiles_state_their_predicted_time():
    table = C.profile_costs_table().set_index(["notebook", "profile"])
    for path in sorted((ROOT / "notebooks" / "profiles" / "laptop").glob("*.yaml")):
        stated = re.search(r"^# expected time on a 4-core CPU: (.+)$", path.read_text(), flags=re.M)
        assert stated, f"{path.name} does not state its expected time on a 4-core CPU"
        want = table.loc[(path.stem, "laptop"), "4-core CPU time"]
        assert stated.group(1).startswith(want), (path.name, stated.group(1), want)
        assert not math.isnan(table.loc[(path.stem, "laptop"), "PFLOP"])
