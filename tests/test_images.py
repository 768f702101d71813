"""MNIST digits as ViT inputs: shapes, normalisation, token positions, and a measurement."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.models.images import image_inputs, token_position


def _tiny_vit(image_size: int, channels: int, patch: int):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=image_size,
        patch_size=patch,
        num_channels=channels,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
    )
    return ViTModel(cfg, add_pooling_layer=False).eval()


def test_mnist_sized_model_gets_mnist_normalisation():
    from coupling_utils.models.vit_training import MNIST_MEAN, MNIST_STD

    images = torch.zeros(2, 28, 28, dtype=torch.uint8)
    images[1] = 255
    x = image_inputs(_tiny_vit(28, 1, 7), images)
    assert x.shape == (2, 1, 28, 28)
    assert torch.allclose(x[0], torch.full_like(x[0], -MNIST_MEAN / MNIST_STD))
    assert torch.allclose(x[1], torch.full_like(x[1], (1 - MNIST_MEAN) / MNIST_STD))


def test_hub_like_model_gets_resized_rgb_with_processor_stats():
    class Loaded:  # a LoadedModel-like wrapper with an image processor
        model = _tiny_vit(32, 3, 8)
        tokenizer = type("P", (), {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]})()

    x = image_inputs(Loaded(), torch.full((28, 28), 255, dtype=torch.uint8))
    assert x.shape == (1, 3, 32, 32) and torch.allclose(x, torch.full_like(x, 2.0))
    assert token_position(Loaded(), "cls") == 0 and token_position(Loaded(), "last") == 16
    with pytest.raises(ValueError, match="token must be one of"):
        token_position(Loaded(), "first")
    with pytest.raises(ValueError, match="greyscale"):
        image_inputs(Loaded(), torch.zeros(1, 1, 28, 28))


def test_vit_inputs_are_measurable_at_the_last_patch_token():
    from coupling_utils.measurement import measure

    model = _tiny_vit(28, 1, 14)  # CLS + 4 patches
    x = image_inputs(model, torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8))
    m = measure(model, {"img": {"pixel_values": x}}, k=[2], tokens=[token_position(model, "last")])
    assert set(m.depthwise.token) == {4} and len(m.depthwise) == 4


def test_token_choices_map_to_measure_tokens_and_check_the_grid():
    from coupling_utils.models.images import check_vit_token, describe_token, patch_grid, vit_tokens

    assert vit_tokens("cls") == [0] and vit_tokens("mean") == "all" and vit_tokens("last") == "last"
    assert vit_tokens("patch5") == [6] and vit_tokens(5) == [6]
    for bad in ("first", "patch-1", -1, "patch", True, 1.5):
        with pytest.raises(ValueError, match="token must be one of"):
            vit_tokens(bad)
    model = _tiny_vit(28, 1, 7)  # CLS + 4×4 patches
    assert patch_grid(model) == (4, 4) and token_position(model, "patch15") == 16 == token_position(
        model, "last"
    )
    check_vit_token(model, "patch15")
    with pytest.raises(ValueError, match=r"4×4 = 16 patches, numbered 0..15"):
        check_vit_token(model, "patch16")
    with pytest.raises(ValueError, match="no single position"):
        token_position(model, "mean")
    assert describe_token("patch6", (4, 4)) == "patch 6 (row 1, column 2)"
    assert describe_token("cls") == "the CLS token"


def test_image_format_is_read_from_files_without_weights(tmp_path):
    import json

    from coupling_utils.models.images import image_format

    model = _tiny_vit(32, 3, 8)
    model.save_pretrained(tmp_path / "m")
    fmt = image_format(tmp_path / "m")
    assert fmt.config.image_size == 32 and fmt.tokenizer is None
    with pytest.raises(ValueError, match="image processor's mean and std"):
        image_inputs(fmt, torch.zeros(28, 28, dtype=torch.uint8))
    (tmp_path / "m" / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5] * 3, "image_std": [0.25] * 3})
    )
    x = image_inputs(image_format(tmp_path / "m"), torch.full((28, 28), 255, dtype=torch.uint8))
    assert x.shape == (1, 3, 32, 32) and torch.allclose(x, torch.full_like(x, 2.0))
