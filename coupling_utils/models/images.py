"""MNIST digits as inputs of any Vision Transformer: the "prompts" of the ViT measurements.

:func:`coupling_utils.measurement.measure` takes a ViT input as a dict ``{"pixel_values":
Tensor[1, C, H, W]}``. The local MNIST ViTs (``embedded:vit-mnist``) see 28×28 greyscale
images normalised with MNIST's mean and std (:func:`coupling_utils.models.vit_training.pixel_values`); a hub
ViT (``google/vit-base-patch16-224``) expects 3-channel images of its own size normalised with
its processor's mean and std. :func:`image_inputs` does either in torch (bilinear resize,
grey replicated to RGB), so no imaging library is needed. Token positions of a ViT:
0 is the CLS token, then the patches in raster order; :func:`token_position` names them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["image_inputs", "mnist_inputs", "token_position", "VIT_TOKENS"]

VIT_TOKENS = ("cls", "last")


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


def mnist_inputs(model, n: int, *, split: str = "test", seed: int = 0) -> tuple[dict[str, dict], list[int]]:
    """``n`` MNIST images of ``split`` (seeded choice) as measure() inputs for ``model``.

    Returns ``({"<split>-<index>": {"pixel_values": Tensor[1, C, H, W]}}, labels)``.
    """
    from coupling_utils.models.vit_training import load_mnist

    data = load_mnist()
    if split not in data:
        raise ValueError(f"split must be one of {sorted(data)}, got {split!r}")
    images, labels = data[split]
    if not 1 <= n <= len(images):
        raise ValueError(f"n must be between 1 and {len(images)}, got {n}")
    idx = np.sort(np.random.default_rng(seed).choice(len(images), size=n, replace=False))
    pixels = image_inputs(model, images[idx])
    inputs = {f"{split}-{int(i)}": {"pixel_values": pixels[j : j + 1]} for j, i in enumerate(idx)}
    return inputs, [int(labels[i]) for i in idx]


def token_position(model, token: str) -> int:
    """Position of ``"cls"`` (0) or ``"last"`` (the last patch token, the authors' choice) in a ViT."""
    if token not in VIT_TOKENS:
        raise ValueError(f"token must be one of {VIT_TOKENS}, got {token!r}")
    if token == "cls":
        return 0
    cfg = _config(model)
    h, w = _size(cfg.image_size)
    p = _size(getattr(cfg, "patch_size", 16))
    return (h // p[0]) * (w // p[1])  # CLS + patches - 1
