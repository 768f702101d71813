"""The engine's measured throughput, for the cost model (``costs.py``): one core's, from
``bench/bench_costs.py`` (``data/benchmarks/costs.csv``), and a GPU's, from ``bench/gpu_check.py``
(``data/benchmarks/gpu_check.csv``), where a run is recorded."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["Rates", "cpu_rates", "gpu_rates"]


def _bench(path: str | Path | None = None) -> pd.DataFrame:
    if path is None:
        from coupling_utils.files import data_dir

        path = data_dir() / "benchmarks" / "costs.csv"
    return pd.read_csv(path)


@dataclass(frozen=True)
class Rates:
    """The engine's throughput on one core, measured by ``bench/bench_costs.py`` (one torch
    thread, CPU time: the median over the benchmarked block shapes and prompt lengths)."""

    exact_flops_per_s: float
    matrix_free_flops_per_s: float
    svd_seconds_per_d3: float
    machine: str = ""
    one_token_flops_per_s: float = math.nan  # NaN: not measured (a one-token run's time unknown)


def cpu_rates(bench: pd.DataFrame | None = None) -> Rates:
    """The per-core throughput of the benchmark's one-thread rows (see :class:`Rates`)."""
    df = _bench() if bench is None else bench
    rows = df[df.torch_threads == 1]
    if rows.empty:
        raise ValueError("the benchmark has no one-thread rows: run python bench/bench_costs.py --threads 1")
    svd = rows[rows.what == "svd"]
    return Rates(
        float(rows[rows.what == "exact"].flops_per_s.median()),
        float(rows[rows.what == "matrix_free"].flops_per_s.median()),
        float((svd.seconds / svd.d.astype(float) ** 3).median()),
        str(rows.machine.iloc[0]),
        float(rows[rows.what == "one_token"].flops_per_s.median()),  # NaN in a run without them
    )


GPU_ENGINE = re.compile(r"\bd=(\d+)\b")  # bench/gpu_check.py names a twin "Llama-style d=4096, 32 blocks"


def gpu_rates(check: pd.DataFrame | None = None) -> Rates | None:
    """The engine's throughput on a GPU, measured by ``bench/gpu_check.py``
    (``data/benchmarks/gpu_check.csv``) on a random-init twin of a paper-size model in bfloat16:
    the all-token sweep's FLOP rate (median over the prompt lengths) and the top-50 spectra's
    seconds per ``d × d`` matrix over ``d³``; the one-token path's FLOP rate (NaN in a run
    without it); no matrix-free rate (not measured on a GPU: NaN, so a matrix-free run's GPU
    time is unknown). None where no GPU run is recorded."""
    if check is None:
        from coupling_utils.files import data_dir

        path = data_dir() / "benchmarks" / "gpu_check.csv"
        if not path.exists():
            return None
        check = pd.read_csv(path)
    ok = check[(check.step == "engine") & (check.status == "ok") & (check.dtype == "bfloat16")]
    sweep = ok[ok.method == "all_tokens: Jacobians"]
    spectra = ok[ok.method.str.startswith("top-50 spectra")]
    if sweep.empty or spectra.empty:
        return None
    d = spectra.name.map(lambda name: float(GPU_ENGINE.search(name).group(1)))
    # matrices decomposed per row (runs before that column timed all T of the sweep's matrices)
    n = spectra["matrices"].fillna(spectra["T"]) if "matrices" in spectra else spectra["T"]
    return Rates(
        float(sweep.flops_per_s.median()),
        math.nan,
        float((spectra.seconds / n / d**3).median()),
        str(ok.device.iloc[0]),
        float(ok[ok.method == "one_token (1 token)"].flops_per_s.median()),
    )
