"""The cost model: model sizes from configs, FLOPs and memory by hand, throughput, the generated tables."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from coupling_utils.analysis.data import read_table
from coupling_utils.pipeline import costs as C
from coupling_utils.pipeline import model_sizes

ROOT = Path(__file__).resolve().parents[1]


def test_configs_rebuild_the_documented_parameter_counts():
    """Each model_configs.csv row, built on the meta device, has model_metadata.csv's depth, width,
    heads and parameter count (within 0.1%): the recalled config fields are the real ones."""
    configs = read_table("model_configs.csv").set_index("model_id")
    meta = read_table("model_metadata.csv").set_index("model_id")
    checked = 0
    for model, row in configs.iterrows():
        size = model_sizes.model_size(model)
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
    from support.standin_hub import profile_repos

    configs = set(read_table("model_configs.csv").model_id)
    assert set(profile_repos()) <= configs


def test_gpt2_by_hand():
    size = model_sizes.model_size("openai-community/gpt2")
    d, L = 768, 12
    assert size.block_params == 12 * d * d + 13 * d  # qkv, proj, mlp weights and biases, two layer norms
    assert size.n_params == 124_439_808
    work = C.Work("openai-community/gpt2", None, "float32", n_prompts=2, T=16, layers=None, n_tokens=1, k=50)
    cost = C.work_cost(work)
    per_pass = 2 * size.block_params * 16 + 4 * 16 * 16 * d
    one_pass = 2 * size.block_params + 4 * 16 * d  # one token against a 16-token cache
    # the last token of a causal model: d one-token passes per block, and a pass over the prefix
    assert cost.passes == 2 * L and cost.one_token_passes == 2 * L * d and cost.svds == 2 * L
    assert cost.flops == pytest.approx(2 * L * per_pass + 2 * L * d * one_pass + 2 * L * 21 * d**3)
    sweep = C.work_cost(dataclasses.replace(work, n_tokens=16))  # every token: one all-token sweep
    assert sweep.passes == 2 * L * (d + 1) and sweep.one_token_passes == 0 and sweep.svds == 2 * L * 16
    assert sweep.flops == pytest.approx(2 * L * (d + 1) * per_pass + 2 * L * 16 * 21 * d**3)
    eight = C.work_cost(dataclasses.replace(work, n_tokens=8))  # T/2 tokens: still one at a time
    assert eight.one_token_passes == 2 * L * 8 * d
    assert C.work_cost(dataclasses.replace(work, n_tokens=9)).one_token_passes == 0
    weights = size.n_params * 4 / 1e9
    assert cost.host_gb == pytest.approx(weights)
    # one token's activations for a chunk of d cotangents (the CPU's budget of 2^20 numbers allows
    # all 768), and the Jacobian, U and V of the measured token
    assert cost.device_gb == pytest.approx(weights + (d * size.block_params / d + 3 * d * d) * 4 / 1e9 + 1.0)
    # the sweep: a chunk of 2^20 / (T·d) = 85 cotangents through the block over all 16 tokens, the
    # 16 tokens' Jacobians it forms, and the Jacobian, U and V of each measured token
    held = 85 * 16 * size.block_params / d + 16 * d * d + 3 * 16 * d * d
    assert sweep.device_gb == pytest.approx(weights + held * 4 / 1e9 + 1.0)
    # on a GPU (2^24 numbers a chunk) the sweep takes all 768 cotangents at once
    gpu = C.size_cost(sweep.work, size, "cuda")
    assert gpu.device_gb == pytest.approx(
        weights + (768 * 16 * size.block_params / d + 4 * 16 * d * d) * 4 / 1e9 + 1.0
    )
    assert cost.download_gb == pytest.approx(weights)  # GPT-2 stores float32
    twin = C.work_cost(C.Work("openai-community/gpt2", None, "float32", 2, 16, None, 1, download=False))
    assert twin.download_gb == 0 and twin.flops == cost.flops


def test_a_bidirectional_model_keeps_the_sweep_for_one_token():
    """The one-token path needs a causal model (engine.one_token.choose_path): a ViT's CLS token
    is formed by the all-token sweep, as measure() forms it."""
    size = model_sizes.ModelSize("vit", "vit", 12, 768, 0, 7_087_872, "float32")
    cost = C.size_cost(C.Work("vit", None, "float32", 1, 197, None, 1), size)
    assert cost.passes == 12 * 769 and cost.one_token_passes == 0


def test_one_token_passes_take_their_own_rate():
    """cpu_seconds prices one-token passes at the one-token rate (NaN where it is not measured:
    the time is then unknown, not priced at the sweep's rate)."""
    size = model_sizes.model_size("openai-community/gpt2")
    cost = C.work_cost(C.Work("openai-community/gpt2", None, "float32", 1, 16, None, 1))
    rates = C.Rates(1e11, 1e10, 0.0, "m", 1e10)
    one = cost.one_token_passes * (2 * size.block_params + 4 * 16 * 768) / 1e10
    prefix = cost.passes * (2 * size.block_params * 16 + 4 * 16 * 16 * 768) / 1e11
    assert C.cpu_seconds(cost, rates) == pytest.approx(one + prefix)
    assert math.isnan(C.cpu_seconds(cost, C.Rates(1e11, 1e10, 0.0, "m")))


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
        ("EleutherAI/pythia-12b", "float32", {24: "8bit", 40: "8bit", 80: "yes"}),
    ],
)
def test_gpu_sizes(model, dtype, fits):
    cost = C.work_cost(C.Work(model, None, dtype, 6, 64, None, 1))
    assert {gb: C.gpu_fit(cost, gb) for gb in C.GPU_SIZES_GB} == fits


def test_the_lightest_quantization_that_fits():
    """Pythia-12B in float32 (47.4 GB of weights, 1.3 GB of buffers and allowance at T = 64, the last
    token of 6 prompts): 8-bit weights (11.8 GB) fit in 16 GB, 4-bit ones (5.9 GB) in 12 GB, nothing
    in 6 GB."""
    cost = C.work_cost(C.Work("EleutherAI/pythia-12b", None, "float32", 6, 64, None, 1))
    assert cost.device_gb == pytest.approx(48.7, abs=0.05)
    assert [C.gpu_fit(cost, gb) for gb in (50, 16, 12, 6)] == ["yes", "8bit", "4bit", "no"]


def test_rates_are_the_one_thread_medians():
    rows = []
    for threads, exact, mf, svd in (
        (1, 10e9, 5e9, 8.0),
        (1, 14e9, 7e9, 6.0),
        (1, 12e9, 9e9, 7.0),
        (2, 1, 1, 1),
    ):
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
    rates = C.cpu_rates(pd.DataFrame(rows))
    assert (rates.exact_flops_per_s, rates.matrix_free_flops_per_s) == (12e9, 7e9)
    assert math.isnan(rates.one_token_flops_per_s)  # not in this benchmark
    one = [
        {"what": "one_token", "torch_threads": t, "flops_per_s": r, "machine": "m"}
        for t, r in ((1, 3e9), (1, 5e9), (2, 1))
    ]
    assert C.cpu_rates(pd.DataFrame(rows + one)).one_token_flops_per_s == 4e9
    assert rates.svd_seconds_per_d3 == pytest.approx(7e-9)
    with pytest.raises(ValueError, match="no one-thread rows"):
        C.cpu_rates(pd.DataFrame(rows[-3:]))


def test_the_benchmark_validates_the_cost_model():
    """bench/bench_costs.py's whole measure() run against the model's prediction from the same
    run's throughput: within a factor of two (the model leaves out loading and the tables)."""
    bench = pd.read_csv(ROOT / "data" / "benchmarks" / "costs.csv")
    v = bench[(bench.what == "validate") & (bench.torch_threads == 1)].iloc[0]
    size = model_sizes.ModelSize("bench", "gpt2", int(v.layers), int(v.d), 0, int(v.block_params), "float32")
    cost = C.size_cost(C.Work("bench", None, "float32", 1, int(v["T"]), None, 1), size)
    assert cost.one_token_passes == int(v.layers) * int(v.d)  # the last token: the one-token path
    predicted = C.cpu_seconds(cost, C.cpu_rates(bench))
    assert 0.5 < predicted / v.seconds < 2, (predicted, v.seconds)


def test_the_generated_table_is_up_to_date():
    """data/benchmarks/profile_costs.csv is what the cost model gives for today's profiles and benchmark
    (regenerate it with `python -m coupling_utils.pipeline.costs`)."""
    stored = pd.read_csv(ROOT / "data" / "benchmarks" / "profile_costs.csv")
    stored["embedded (zoo cost)"] = stored["embedded (zoo cost)"].fillna("")  # an empty cell reads as NaN
    fresh = C.profile_costs_table()
    pd.testing.assert_frame_equal(stored, fresh, check_dtype=False, rtol=1e-3)


def test_a_checkpoint_several_notebooks_download_is_counted_once():
    """The table's NEW_DOWNLOAD column counts a checkpoint in the first notebook that downloads it:
    f02's paper profile measures f01's 28 models (nothing new), f01 holds f00's Llama-3-8B."""
    stored = pd.read_csv(ROOT / "data" / "benchmarks" / "profile_costs.csv").set_index(
        ["notebook", "profile"]
    )
    new, every = stored[C.NEW_DOWNLOAD], stored["download (GB)"]
    assert new[("f02_generalization", "paper")] == 0 and every[("f02_generalization", "paper")] > 300
    assert new[("f00_coupling_metric", "paper")] == every[("f00_coupling_metric", "paper")]
    assert new[("f01_depth_and_tokens", "paper")] < every[("f01_depth_and_tokens", "paper")]
    assert (new <= every).all()


def test_the_gpu_time_is_named_a_prediction_from_the_gpu_measured():
    """The cost table's GPU column is a prediction at the rates one GPU run measured: its name says
    so, and which GPU (never "measured" alone, which reads as a run of the profile on that GPU)."""
    from coupling_utils.pipeline.rates import gpu_rates

    gpu = gpu_rates()
    columns = [
        c for c in pd.read_csv(ROOT / "data" / "benchmarks" / "profile_costs.csv").columns if "GPU time" in c
    ]
    if gpu is None:
        assert columns == []
    else:
        assert columns == [f"GPU time (predicted from {gpu.machine}'s measured rates)"]


def test_laptop_profiles_state_their_predicted_time():
    table = C.profile_costs_table().set_index(["notebook", "profile"])
    for path in sorted((ROOT / "notebooks" / "profiles" / "laptop").glob("*.yaml")):
        stated = re.search(r"^# expected time on a 4-core CPU: (.+)$", path.read_text(), flags=re.M)
        assert stated, f"{path.name} does not state its expected time on a 4-core CPU"
        want = C.expected_time_line(table.loc[(path.stem, "laptop")])
        assert stated.group(0) == want, f"{path.name}: run python -m coupling_utils.pipeline.costs"
        assert not math.isnan(table.loc[(path.stem, "laptop"), "TFLOP"])


def test_the_laptop_files_are_stated_from_the_table(tmp_path):
    """state_laptop_times rewrites only the expected-time line, and names a file it cannot state."""
    table = pd.DataFrame(
        [
            {
                "notebook": "f99_x",
                "profile": "laptop",
                "4-core CPU time": "about 2 min",
                "1-core CPU time": "about 8 min",
                "embedded (zoo cost)": "embedded:lm-family",
            }
        ]
    )
    path = tmp_path / "f99_x.yaml"
    path.write_text("# what it is\n# expected time on a 4-core CPU: a guess\nk: 10\n")
    assert C.state_laptop_times(table, tmp_path) == [path]
    lines = path.read_text().splitlines()
    assert lines[0] == "# what it is" and lines[2] == "k: 10"
    stated = "# expected time on a 4-core CPU: about 2 min (the 4 cores scaling perfectly) to about 8 min"
    assert lines[1].startswith(stated + " (one core)")
    assert lines[1].endswith("(embedded:lm-family: coupling-book zoo list)")
    assert C.state_laptop_times(table, tmp_path) == []  # already stated
    path.write_text("k: 10\n")
    with pytest.raises(ValueError, match="no line starting with"):
        C.state_laptop_times(table, tmp_path)
