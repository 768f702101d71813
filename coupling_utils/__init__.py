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
    "SVD": "engine.metric",
    "svd": "engine.metric",
    "coupling": "engine.metric",
    "coupling_tile": "engine.metric",
    "coupling_matrix": "engine.metric",
    # cache and atomic writes
    "cache_dir": "files",
    # models and blocks
    "load_model": "models.loading",
    "LoadedModel": "models.loading",
    "ModelNotFoundError": "models.loading",
    "supported_architectures": "engine.architectures",
    "UnsupportedArchitectureError": "engine.architectures",
    "tiny_model": "engine.architectures",
    # Jacobians and spectra
    "token_jacobians": "engine.jacobians",
    "reference_jacobians": "engine.jacobians",
    "context_jacobians": "engine.jacobians",
    "block_function": "engine.blocks",
    "residual_stream": "engine.blocks",
    "topk_svd": "engine.spectra",
    "matrix_free_topk": "engine.spectra",
    "block_lanczos_svd": "engine.spectra",
    # measuring a model
    "measure": "measurement",
    "Measurement": "measurement",
    "coupling_summary": "measurement",
    "TABLES": "measurement",
    "MEASURE_METHODS": "measurement",
    "Settings": "measurement",
    # data with provenance, and statistics
    "data_dir": "analysis.data",
    "DataError": "analysis.data",
    "resolve_model_id": "analysis.data",
    "load_leaderboard": "analysis.data",
    "load_metadata": "analysis.data",
    "load_paper_points": "analysis.data",
    "load_prompts": "analysis.data",
    "load_task_prompts": "analysis.task_prompts",
    "join_scores": "analysis.data",
    "fig1a_table": "analysis.data",
    "ols": "analysis.stats",
    "rank_correlation": "analysis.stats",
    "bootstrap_ci": "analysis.stats",
    "compare_predictors": "analysis.stats",
    # coupling against generalisation; MNIST digits as ViT inputs
    "family_coupling": "analysis.generalization",
    "predictor_comparison": "analysis.predictors",
    "r2_difference": "analysis.predictors",
    "mnist_inputs": "models.images",
    "image_inputs": "models.images",
    # trained vs random init; emergence over training checkpoints
    "measure_twins": "analysis.depth_and_tokens",
    "sweep_checkpoints": "analysis.emergence",
    "growth_summary": "analysis.emergence",
    # trajectories
    "line_shape_score": "analysis.trajectories",
    "expodistance": "analysis.trajectories",
    "linearization_cosine": "analysis.linearization",
    "trajectory_pca": "analysis.trajectories",
    "step_norms": "analysis.trajectories",
    "trajectory_metrics": "analysis.trajectories",
    # tidy tables, per-model scalars, fits
    "matrix_frame": "analysis.coupling_metric",
    "tile_frame": "analysis.coupling_metric",
    "coupling_tiles": "analysis.coupling_metric",
    # the book: live charts and downloadable tables, the build step
    "show": "analysis.display",
    "show_table": "analysis.display",
    "to_svg": "analysis.display",
    "build_book": "pipeline.book",
    "BuildOptions": "pipeline.book",
    # the embedded model zoo and the local training runs
    "family_table": "models.zoo",
    "tokenized_corpus": "models.corpus",
    "load_losses": "models.training",
    "load_accuracy": "models.vit_training",
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
