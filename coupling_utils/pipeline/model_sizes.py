"""A model's size from its configuration: parameters per block and in all, counted exactly by
building the model on PyTorch's meta device (no memory, no weights). Hub ids are read from
``data/model_configs.csv``; ``pipeline.costs`` prices a run from these counts and
``pipeline.sweep_resources`` sizes a cluster task with them."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

__all__ = ["ModelSize", "model_size", "build_config", "meta_counts", "BYTES"]

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "8bit": 1, "4bit": 0.5}
GB = 1e9


@dataclass(frozen=True)
class ModelSize:
    """A model's size as its configuration gives it (exact parameter counts)."""

    model: str
    model_type: str
    n_layers: int
    d_model: int
    n_params: int
    block_params: int  # parameters of one transformer block
    stored_dtype: str  # the dtype the repo stores its weights in

    def weights_gb(self, dtype: str) -> float:
        return self.n_params * BYTES[dtype] / GB


def _configs() -> pd.DataFrame:
    from coupling_utils.analysis.data import read_table

    return read_table("model_configs.csv").set_index("model_id")


def build_config(row: Mapping[str, Any]):
    """The transformers config of a ``model_configs.csv`` row."""
    import transformers

    mt = row["model_type"]
    L, d, h, kv = (int(row[c]) for c in ("n_layers", "d_model", "n_heads", "n_kv_heads"))
    ffn, V = int(row["intermediate_size"]), int(row["vocab_size"])
    if mt == "gpt2":
        kw = dict(n_embd=d, n_layer=L, n_head=h, n_inner=ffn, vocab_size=V)
    elif mt == "vit":
        kw = dict(hidden_size=d, num_hidden_layers=L, num_attention_heads=h, intermediate_size=ffn)
    elif mt == "falcon":
        kw = dict(
            hidden_size=d, num_hidden_layers=L, num_attention_heads=h, num_kv_heads=kv, ffn_hidden_size=ffn,
            vocab_size=V,
        )  # fmt: skip
    else:
        kw = dict(
            hidden_size=d, num_hidden_layers=L, num_attention_heads=h, intermediate_size=ffn, vocab_size=V
        )
        if mt != "gpt_neox":
            kw["num_key_value_heads"] = kv
    kw.update(json.loads(row["extra"] or "{}"))
    if mt != "vit":
        kw["tie_word_embeddings"] = bool(row["tie_word_embeddings"])
    return transformers.AutoConfig.for_model(mt, **kw)


@functools.cache
def model_size(model: str) -> ModelSize | None:
    """The size of hub model ``model`` from ``data/model_configs.csv`` (None if it has no row):
    the model is built on the meta device and its parameters counted."""
    import transformers

    table = _configs()
    if model not in table.index:
        return None
    row = table.loc[model].to_dict()
    config = build_config(row)
    vit = row["model_type"] == "vit"
    n_params, block, _ = meta_counts(
        lambda: (
            transformers.ViTForImageClassification(config)
            if vit
            else transformers.AutoModelForCausalLM.from_config(config)
        )
    )
    return ModelSize(
        model,
        row["model_type"],
        int(row["n_layers"]),
        int(row["d_model"]),
        n_params,
        block,
        row["torch_dtype"],
    )


def meta_counts(build) -> tuple[int, int, int]:
    """The model ``build()`` makes, made on PyTorch's meta device (no memory, no weights): its
    parameters, its first transformer block's, and its number of blocks."""
    import torch

    from coupling_utils.engine.architectures import transformer_blocks

    with torch.device("meta"):
        net = build()
    blocks = transformer_blocks(net)
    block_params = sum(p.numel() for p in blocks[0].parameters())
    return sum(p.numel() for p in net.parameters()), block_params, len(blocks)
