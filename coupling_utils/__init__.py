"""coupling_utils: block Jacobians, the coupling metric, and everything the book measures.

Companion package to Aubry, Meng, Sugolov & Papyan, "Transformer Block Coupling and its
Correlation with Generalization in LLMs" (ICLR 2025, arXiv 2407.07810). Public names are
imported lazily, so ``import coupling_utils`` stays fast and light.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    # the metric
    "SVD": "metric", "svd": "metric", "coupling": "metric", "coupling_tile": "metric",
    "coupling_matrix": "metric",
    # cache and atomic writes
    "cache_dir": "cache",
    # models and blocks
    "load_model": "loading", "LoadedModel": "loading", "ModelNotFoundError": "loading",
    "supported_architectures": "architectures", "UnsupportedArchitectureError": "architectures",
    "tiny_model": "architectures",
    # Jacobians and spectra
    "token_jacobians": "jacobians", "reference_jacobians": "jacobians",
    "context_jacobians": "jacobians", "block_function": "blocks", "residual_stream": "blocks",
    "topk_svd": "spectra", "matrix_free_topk": "spectra", "block_lanczos_svd": "spectra",
    # measuring a model
    "measure": "measure", "Measurement": "measure", "coupling_summary": "measure",
    # data with provenance, and statistics
    "data_dir": "data", "DataError": "data", "resolve_model_id": "data", "load_leaderboard": "data",
    "load_metadata": "data", "load_paper_points": "data", "load_prompts": "data",
    "load_task_prompts": "data", "join_scores": "data", "fig1a_table": "data",
    "ols": "stats", "rank_correlation": "stats", "bootstrap_ci": "stats", "compare_predictors": "stats",
    # coupling against generalisation; MNIST digits as ViT inputs
    "family_coupling": "generalization", "predictor_comparison": "generalization",
    "r2_difference": "generalization", "mnist_inputs": "vision", "image_inputs": "vision",
    # trained vs random init; emergence over training checkpoints
    "measure_twins": "twins", "sweep_checkpoints": "emergence", "growth_summary": "emergence",
    # trajectories
    "line_shape_score": "trajectories", "expodistance": "trajectories",
    "linearization_cosine": "trajectories", "trajectory_pca": "trajectories",
    "step_norms": "trajectories", "trajectory_metrics": "trajectories",
    # tidy tables, per-model scalars, fits
    "matrix_frame": "aggregate", "tile_frame": "aggregate", "coupling_tiles": "aggregate",
    # the book: static charts, the build step
    "show": "display", "to_svg": "display", "build_book": "book",
    # the embedded model zoo and the local training runs
    "family_table": "zoo", "tokenized_corpus": "corpus", "load_losses": "training",
    "load_accuracy": "vit",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'coupling_utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"coupling_utils.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
