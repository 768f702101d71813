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
    "load_model": "loading", "LoadedModel": "loading",
    "supported_architectures": "architectures",
    # Jacobians and spectra
    "token_jacobians": "jacobians", "reference_jacobians": "jacobians",
    "context_jacobians": "jacobians", "block_function": "jacobians",
    "topk_svd": "spectra",
    # measuring a model
    "measure": "measure", "Measurement": "measure",
    # trajectories
    "line_shape_score": "trajectories", "expodistance": "trajectories",
    "linearization_cosine": "trajectories", "trajectory_pca": "trajectories",
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
