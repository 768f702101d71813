"""Small models wide enough for bitsandbytes' CPU kernels, saved to a folder (for the
quantized-loading and quantized-block tests)."""

from __future__ import annotations

import torch
import transformers


def wide_model(root, arch: str, n_layers: int, bias_std: float = 0.0):
    """A small ``arch`` model 128 wide (bitsandbytes' CPU 4-bit kernels need rows of at least its
    block size), saved to ``root``; ``bias_std`` > 0 redraws its biases (zero at init) that large."""
    config = getattr(transformers, f"{arch}Config")(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{arch}ForCausalLM")(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if bias_std and name.endswith("bias"):
                p.normal_(0.0, bias_std)
    model.save_pretrained(root)
    return root
