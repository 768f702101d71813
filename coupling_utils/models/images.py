"""MNIST digits as inputs of any Vision Transformer: the "prompts" of the ViT measurements.

:func:`coupling_utils.measurement.measure` takes a ViT input as a dict ``{"pixel_values":
Tensor[1, C, H, W]}``. The local MNIST ViTs (``embedded:vit-mnist``) see 28×28 greyscale
images normalised with MNIST's mean and std (:func:`coupling_utils.models.vit_training.pixel_values`); a hub
ViT (``google/vit-base-patch16-224``) expects 3-channel images of its own size normalised with
its processor's mean and std. :func:`image_inputs` does either in torch (bilinear resize,
grey replicated to RGB), so no imaging library is needed; :func:`image_format` reads what a
model expects from its files alone (config and ``preprocessor_config.json``), so the inputs of a
hub ViT are made without loading its weights.

Which token's Jacobians are compared across depth: a ViT's sequence is the CLS token (position
0) followed by the patches in raster order. :func:`vit_tokens` turns a choice (``"cls"``, the
token the classifier reads; ``"mean"``, every token measured and the coupling averaged over
them; ``"last"``, the last patch, the authors' ViT code; or a patch number) into measure()'s
``tokens``, and :func:`check_vit_token` checks a patch number against a model's grid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "image_inputs",
    "mnist_digits",
    "mnist_inputs",
    "image_format",
    "ImageFormat",
    "token_position",
    "patch_grid",
    "vit_tokens",
    "check_vit_token",
    "describe_token",
    "VIT_TOKENS",
]

VIT_TOKENS = ("cls", "mean", "last")
"""Named token choices; ``"patch<N>"`` (or the integer N: 0-based, raster order from the top
left) names patch N instead."""


def _config(model) -> Any:
    hf = getattr(model, "model", model)
    cfg = getattr(hf, "config", None)
    if cfg is None or not hasattr(cfg, "image_size"):
        raise ValueError(
            f"image inputs need a vision model with config.image_size (a ViT); got {type(hf).__name__}"
        )
    return cfg


def _size(value) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def image_inputs(model, images) -> torch.Tensor:
    """``pixel_values [N, C, H, W]`` for ``model`` from uint8 greyscale images ``[N, h, w]``.

    Images of the model's size with one channel (the local MNIST ViTs) get MNIST's
    normalisation, exactly as their saved image processor. Otherwise the image is resized
    (bilinear) to ``config.image_size``, replicated to ``config.num_channels`` and normalised
    with the processor's ``image_mean``/``image_std`` (``model.tokenizer`` of a loaded model); a
    model without a known processor is an error, never a guessed normalisation.
    """
    from coupling_utils.models.vit_training import MNIST_MEAN, MNIST_STD

    cfg = _config(model)
    x = torch.as_tensor(np.asarray(images))
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3:
        raise ValueError(f"images must be greyscale [N, h, w] (or one [h, w]), got shape {tuple(x.shape)}")
    x = x.to(torch.float32)[:, None] / 255.0  # [N, 1, h, w] in [0, 1]
    size, channels = _size(cfg.image_size), int(getattr(cfg, "num_channels", 3))
    if tuple(x.shape[-2:]) == size and channels == 1:
        mean, std = [MNIST_MEAN], [MNIST_STD]
    else:
        if tuple(x.shape[-2:]) != size:
            x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
        x = x.expand(-1, channels, -1, -1)
        processor = getattr(model, "tokenizer", None)
        mean, std = getattr(processor, "image_mean", None), getattr(processor, "image_std", None)
        if mean is None or std is None:
            raise ValueError(
                f"{type(getattr(model, 'model', model)).__name__} expects {channels}-channel "
                f"{size[0]}x{size[1]} images normalised with its image processor's mean and std, and none "
                "is known: load it with load_model(...), which reads its preprocessor_config.json (needs "
                "Pillow), so that model.tokenizer is the processor. (Guessing 0.5 would silently "
                "mis-normalise: DeiT uses ImageNet's statistics.)"
            )
        mean = list(np.broadcast_to(mean, (channels,)))
        std = list(np.broadcast_to(std, (channels,)))
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return ((x - mean_t) / std_t).contiguous()


def mnist_digits(n: int, *, split: str = "test", seed: int = 0) -> tuple[dict[str, torch.Tensor], list[int]]:
    """``n`` MNIST digits of ``split``, a seeded choice, as ``{"<split>-<index>": uint8 [28, 28]}``
    and their labels: the prompts of the ViT jobs (``analysis.vision_transformers``), the same for
    every model, so a job's key names its images (ids and pixels) before any model is read."""
    from coupling_utils.models.vit_training import load_mnist

    data = load_mnist()
    if split not in data:
        raise ValueError(f"split must be one of {sorted(data)}, got {split!r}")
    images, labels = data[split]
    if not 1 <= n <= len(images):
        raise ValueError(f"n must be between 1 and {len(images)}, got {n}")
    idx = np.sort(np.random.default_rng(seed).choice(len(images), size=n, replace=False))
    # clone: a view would carry (and pickle) the whole split
    return {f"{split}-{int(i)}": images[int(i)].clone() for i in idx}, [int(labels[i]) for i in idx]


def mnist_inputs(model, n: int, *, split: str = "test", seed: int = 0) -> tuple[dict[str, dict], list[int]]:
    """``n`` MNIST images of ``split`` (the seeded choice of :func:`mnist_digits`) as measure()
    inputs for ``model``.

    Returns ``({"<split>-<index>": {"pixel_values": Tensor[1, C, H, W]}}, labels)``.
    """
    digits, labels = mnist_digits(n, split=split, seed=seed)
    pixels = image_inputs(model, torch.stack(list(digits.values())))
    return {name: {"pixel_values": pixels[j : j + 1]} for j, name in enumerate(digits)}, labels


_PATCH = re.compile(r"patch(\d+)")


def _patch(token) -> int | None:
    """The patch number ``token`` names (``5`` or ``"patch5"``), or None for a named token."""
    if isinstance(token, (int, np.integer)) and not isinstance(token, bool):
        return int(token) if token >= 0 else -1
    if isinstance(token, str):
        m = _PATCH.fullmatch(token)
        return int(m.group(1)) if m else None
    return None


def _check_choice(token) -> None:
    p = _patch(token)
    if (p is None and token not in VIT_TOKENS) or (p is not None and p < 0):
        raise ValueError(
            f"token must be one of {VIT_TOKENS} or a patch, 'patch<N>' or N (N >= 0, raster order from "
            f"the top left), got {token!r}"
        )


def patch_grid(model) -> tuple[int, int]:
    """``(rows, columns)`` of a ViT's patch grid (``image_size // patch_size`` each way)."""
    cfg = _config(model)
    h, w = _size(cfg.image_size)
    p = _size(getattr(cfg, "patch_size", 16))
    return h // p[0], w // p[1]


def vit_tokens(token) -> str | list[int]:
    """measure()'s ``tokens`` for a ViT token choice (the same for every ViT, so a job list is
    made before any model is loaded): ``"cls"`` -> ``[0]``; ``"mean"`` -> ``"all"`` (each
    token's Jacobians measured; summaries average over tokens); ``"last"`` -> ``"last"`` (the
    last patch: ViTs have no token after the patches); patch ``p`` -> ``[p + 1]``."""
    _check_choice(token)
    p = _patch(token)
    if p is not None:
        return [p + 1]
    return {"cls": [0], "mean": "all", "last": "last"}[token]


def token_position(model, token) -> int:
    """Sequence position of ``"cls"`` (0), ``"last"`` (the last patch, the authors' choice) or patch
    ``p`` (``p + 1``) in ``model`` (``"mean"`` is every position, so it has none)."""
    _check_choice(token)
    if token == "mean":
        raise ValueError('token "mean" averages over every position; it has no single position')
    if token == "cls":
        return 0
    rows, cols = patch_grid(model)
    if token == "last":
        return rows * cols  # CLS + patches - 1
    check_vit_token(model, token)
    return _patch(token) + 1


def check_vit_token(model, token) -> None:
    """Raise a ValueError naming the grid if patch number ``token`` is not in ``model``'s patches."""
    _check_choice(token)
    p = _patch(token)
    if p is not None:
        rows, cols = patch_grid(model)
        if p >= rows * cols:
            raise ValueError(
                f"patch {p} does not exist: this ViT has {rows}×{cols} = {rows * cols} patches, "
                f"numbered 0..{rows * cols - 1} in raster order (row r, column c is r·{cols} + c)"
            )


def describe_token(token, grid: tuple[int, int] | None = None) -> str:
    """Words for a token choice, e.g. "the CLS token" or "patch 5 (row 1, column 1)"."""
    _check_choice(token)
    if token == "cls":
        return "the CLS token"
    if token == "mean":
        return "every token (coupling averaged over them)"
    if token == "last":
        return "the last patch token"
    p = _patch(token)
    where = f" (row {p // grid[1]}, column {p % grid[1]})" if grid else ""
    return f"patch {p}{where}"


@dataclass(frozen=True)
class ImageFormat:
    """What a model expects as image input, read from its files: ``config`` (image_size,
    num_channels, patch_size) and ``tokenizer``, its image processor's ``image_mean`` and
    ``image_std`` (None for the local MNIST ViTs, which :func:`image_inputs` normalises with
    MNIST's statistics). Takes the place of a loaded model in :func:`image_inputs`."""

    config: Any
    tokenizer: Any = None


@dataclass(frozen=True)
class _Processor:
    image_mean: Any
    image_std: Any


def image_format(name_or_path: str, revision: str | None = None) -> ImageFormat:
    """The :class:`ImageFormat` of a model reference (``embedded:...``, a directory or a hub id)
    without loading its weights: its ``config.json`` and, when it has one, the mean and std of
    its ``preprocessor_config.json`` (files of the hub cache; offline they must be there)."""
    import transformers

    source = str(name_or_path)
    if source.startswith("embedded:"):
        from coupling_utils.models import zoo

        source = str(zoo.resolve(source, revision, progress=False))
        revision = None
    config = transformers.AutoConfig.from_pretrained(source, **({"revision": revision} if revision else {}))
    path = _processor_file(source, revision)
    processor = None
    if path is not None:
        pre = json.loads(path.read_text(encoding="utf-8"))
        if pre.get("image_mean") is not None and pre.get("image_std") is not None:
            processor = _Processor(pre["image_mean"], pre["image_std"])
    return ImageFormat(config, processor)


def _processor_file(source: str, revision: str | None) -> Path | None:
    """A local directory's or a hub repo's ``preprocessor_config.json``; None if it has none.

    Offline, a hub file missing from the cache is an error (the hub's own), not "no processor"."""
    local = Path(source)
    if local.is_dir():
        path = local / "preprocessor_config.json"
        return path if path.exists() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        return Path(hf_hub_download(source, "preprocessor_config.json", revision=revision))
    except RemoteEntryNotFoundError:
        return None
