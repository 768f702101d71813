"""One table of supported architectures: where the blocks live and how attention is switched.

Every architecture-specific fact the engine needs is a row of :data:`ARCHITECTURES` (or an
adapter function named by a row), so the engine itself has no ``if model_type == ...``:

- ``model_types``: Hugging Face ``config.model_type`` values the row covers;
- ``block_paths``: where the list of transformer blocks lives, relative to ``model.base_model``;
- ``block_class``: the class the blocks must be (a guard against silent mismatches);
- ``attention``: ``"interface"`` when the attention modules call ``transformers``'
  ``AttentionInterface`` (the token-diagonal function is selected by name), otherwise the key of
  an adapter in :data:`ATTENTION_ADAPTERS` that patches those modules' forward;
- ``causal``: causal (decoder) or bidirectional (encoder) attention;
- ``residual_outputs``: modules (paths in a block) whose output goes into the block's output as
  it is, no norm after them (a pre-norm MLP's output projection): the all-token sweep cuts there;
  ``residual_outputs_when``: more of them where a config flag is true (``{flag: paths}``: the
  attention output of a block with parallel attention and MLP), read by :meth:`Architecture.cut`;
- ``final_norm``: where the norm after the last block lives, relative to ``model.base_model``
  (candidate paths, like ``block_paths``), or None for an architecture without one (post-norm
  encoders such as BERT normalise inside every block); ``norm_in_hidden_states``: whether
  ``transformers`` returns ``hidden_states[L]`` of ``output_hidden_states=True`` *after* that
  norm (language models) or before it (ViT). The authors' code takes block ``L − 1`` as the map
  ``hidden_states[L-1] -> hidden_states[L]``, so for the former its last "block" is the final
  norm applied to the block's output (``blocks.block_function(..., last_block="final_norm")``).

Block calls themselves are captured with hooks (``blocks.py``), so no row needs to know a
block's argument list; ``attention_modes.py`` switches attention as the row says.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

__all__ = [
    "Architecture",
    "ARCHITECTURES",
    "UnsupportedArchitectureError",
    "supported_architectures",
    "find_architecture",
    "transformer_blocks",
    "final_norm",
    "hidden_states_norm",
    "POINTWISE_ACTIVATIONS",
    "tiny_model",
    "unwrap_model",
]


class UnsupportedArchitectureError(ValueError):
    """The model's architecture has no row in the table."""


@dataclass(frozen=True)
class Architecture:
    """One row of the architecture table."""

    name: str
    model_types: tuple[str, ...]
    examples: tuple[str, ...]
    block_paths: tuple[str, ...]
    block_class: str
    attention: str = "interface"
    causal: str = "causal"  # "causal" | "bidirectional" | "bidirectional or causal"
    modality: str = "text"  # "text" | "vision"
    notes: str = ""
    final_norm: tuple[str, ...] | None = ()  # () = not stated: refused below
    norm_in_hidden_states: bool = True
    # see the module doc; a wrong entry fails token_jacobians' oracle test (tests/test_jacobians.py)
    residual_outputs: tuple[str, ...] = ()
    residual_outputs_when: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)
    tiny: dict = field(default_factory=dict, compare=False, hash=False)  # tiny test config (kwargs)
    tiny_variants: dict[str, dict] = field(default_factory=dict, compare=False, hash=False)

    def cut(self, config) -> tuple[str, ...]:
        """The ``residual_outputs`` of a block of this model (``config``: its configuration),
        with those of ``residual_outputs_when`` whose flag the configuration sets."""
        more = [
            p
            for flag, paths in self.residual_outputs_when.items()
            if getattr(config, flag, False)
            for p in paths
        ]
        return tuple(dict.fromkeys((*self.residual_outputs, *more)))

    def __post_init__(self):
        if self.final_norm == ():
            raise ValueError(
                f"architecture {self.name!r}: say where its final norm lives (final_norm=('path',), "
                "relative to model.base_model) or that it has none (final_norm=None)"
            )


POINTWISE_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "torch.nn.modules.activation": ("SiLU", "GELU", "ReLU", "Tanh", "Sigmoid", "Mish", "ReLU6", "ELU"),
    "transformers.activations": (
        "SiLUActivation",
        "GELUActivation",
        "NewGELUActivation",
        "FastGELUActivation",
        "QuickGELUActivation",
        "GELUTanh",
        "PytorchGELUTanh",
        "ClippedGELUActivation",
        "AccurateGELUActivation",
        "MishActivation",
        "LaplaceActivation",
        "ReLUSquaredActivation",
        "SqrtSoftplusActivation",
    ),
}
"""Activation modules (by their module and class name) that act on each number alone, y_i = φ(x_i),
without parameters: a product through one needs only the slope φ'(x), which
``blocks.held_slopes`` computes once per block call instead of once per product."""

_T = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        "GPT-2",
        ("gpt2",),
        ("openai-community/gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"),
        ("h",),
        "GPT2Block",
        residual_outputs=("mlp.c_proj",),
        final_norm=("ln_f",),
        notes="learned absolute positions; Conv1D projections",
        tiny=dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    ),
    Architecture(
        "GPT-Neo",
        ("gpt_neo",),
        ("EleutherAI/gpt-neo-125m", "EleutherAI/gpt-neo-2.7B"),
        ("h",),
        "GPTNeoBlock",
        residual_outputs=("mlp.c_proj",),
        attention="gpt_neo",
        final_norm=("ln_f",),
        notes="alternating global/local (windowed) layers; unscaled logits; own attention code (adapter)",
        tiny=dict(
            vocab_size=64,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
        ),
    ),
    Architecture(
        "GPT-J",
        ("gptj",),
        ("EleutherAI/gpt-j-6b",),
        ("h",),
        "GPTJBlock",
        residual_outputs=("attn.out_proj", "mlp.fc_out"),
        final_norm=("ln_f",),
        notes="parallel attention and MLP; partial rotary",
        tiny=dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
    ),
    Architecture(
        "GPT-NeoX (Pythia)",
        ("gpt_neox",),
        ("EleutherAI/pythia-1.4b", "EleutherAI/pythia-6.9b", "EleutherAI/gpt-neox-20b"),
        ("layers",),
        "GPTNeoXLayer",
        residual_outputs=("mlp.dense_4h_to_h",),
        residual_outputs_when={"use_parallel_residual": ("attention.dense",)},
        final_norm=("final_layer_norm",),
        notes="parallel residual; partial rotary; Pythia training checkpoints as revisions step<N>",
        tiny=dict(_T, rotary_pct=0.25),
        tiny_variants={"sequential": dict(use_parallel_residual=False)},
    ),
    Architecture(
        "OPT",
        ("opt",),
        ("facebook/opt-125m", "facebook/opt-1.3b"),
        ("decoder.layers",),
        "OPTDecoderLayer",
        final_norm=("decoder.final_layer_norm",),
        notes="learned positions (offset 2); post-norm configs (opt-350m) have no final norm, and "
        "their project_out after it is not part of any block",
        tiny=dict(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
        ),
    ),
    Architecture(
        "Llama",
        ("llama",),
        (
            "meta-llama/Llama-2-7b-hf",
            "meta-llama/Meta-Llama-3-8B",
            "lmsys/vicuna-7b-v1.5",
            "microsoft/Orca-2-7b",
            "codellama/CodeLlama-7b-hf",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        ("layers",),
        "LlamaDecoderLayer",
        final_norm=("norm",),
        residual_outputs=("mlp.down_proj",),
        notes="RMSNorm, rotary, grouped-query attention (Llama-2-70B, Llama-3); "
        "also Vicuna, Orca-2, CodeLlama, SmolLM2",
        tiny=dict(_T, num_key_value_heads=2),
    ),
    Architecture(
        "Mistral",
        ("mistral",),
        ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.2"),
        ("layers",),
        "MistralDecoderLayer",
        residual_outputs=("mlp.down_proj",),
        final_norm=("norm",),
        notes="grouped-query attention; sliding window (v0.1)",
        tiny=dict(_T, num_key_value_heads=2, sliding_window=4),
    ),
    Architecture(
        "Gemma",
        ("gemma",),
        ("google/gemma-2b", "google/gemma-7b"),
        ("layers",),
        "GemmaDecoderLayer",
        residual_outputs=("mlp.down_proj",),
        final_norm=("norm",),
        notes="multi-query attention (2b); embeddings scaled by sqrt(d)",
        tiny=dict(_T, num_key_value_heads=1, head_dim=8),
    ),
    Architecture(
        "Gemma-2",
        ("gemma2",),
        ("google/gemma-2-2b", "google/gemma-2-9b"),
        ("layers",),
        "Gemma2DecoderLayer",
        final_norm=("norm",),
        notes="attention-logit soft-capping; alternating sliding-window layers; sandwich norms",
        tiny=dict(
            _T,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=4,
            attn_logit_softcapping=3.0,
            query_pre_attn_scalar=8,
        ),
    ),
    Architecture(
        "Gemma-3 (text)",
        ("gemma3_text", "gemma3"),
        ("google/gemma-3-1b-pt", "google/gemma-3-4b-pt"),
        ("layers", "language_model.layers"),
        "Gemma3DecoderLayer",
        final_norm=("norm", "language_model.norm"),
        notes="QK-norm; 5:1 local/global layers; for multimodal checkpoints the language model's blocks",
        tiny=dict(
            _T,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=4,
            query_pre_attn_scalar=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    Architecture(
        "Qwen2 (Qwen1.5)",
        ("qwen2",),
        ("Qwen/Qwen1.5-0.5B", "Qwen/Qwen1.5-7B", "Qwen/Qwen2-7B"),
        ("layers",),
        "Qwen2DecoderLayer",
        residual_outputs=("mlp.down_proj",),
        final_norm=("norm",),
        notes="QKV biases; grouped-query attention (Qwen2)",
        tiny=dict(_T, num_key_value_heads=2),
    ),
    Architecture(
        "Phi",
        ("phi",),
        ("microsoft/phi-1", "microsoft/phi-1_5", "microsoft/phi-2"),
        ("layers",),
        "PhiDecoderLayer",
        residual_outputs=("self_attn.dense", "mlp.fc2"),
        final_norm=("final_layernorm",),
        notes="parallel attention and MLP; partial rotary",
        tiny=dict(_T, partial_rotary_factor=0.5),
    ),
    Architecture(
        "Phi-3",
        ("phi3",),
        ("microsoft/Phi-3-mini-4k-instruct",),
        ("layers",),
        "Phi3DecoderLayer",
        residual_outputs=("mlp.down_proj",),
        final_norm=("norm",),
        notes="fused QKV and gate-up projections",
        tiny=dict(_T, num_key_value_heads=2, pad_token_id=0),
    ),
    Architecture(
        "Falcon",
        ("falcon",),
        ("tiiuae/falcon-7b", "tiiuae/falcon-11B", "tiiuae/falcon-40b"),
        ("h",),
        "FalconDecoderLayer",
        residual_outputs=("mlp.dense_4h_to_h",),
        residual_outputs_when={
            "parallel_attn": ("self_attention.dense",),
            "new_decoder_architecture": ("self_attention.dense",),
        },
        attention="falcon",
        final_norm=("ln_f",),
        notes="rotary or ALiBi; multi-query / grouped (new decoder architecture); "
        "own attention code (adapter)",
        tiny=dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
        tiny_variants={
            "alibi": dict(alibi=True),
            "multi_head": dict(multi_query=False),  # q, k, v interleaved per head (falcon-rw)
            "new_decoder": dict(new_decoder_architecture=True, num_kv_heads=2),
            "sequential": dict(parallel_attn=False),  # attention output into the MLP's norm
        },
    ),
    Architecture(
        "OLMo",
        ("olmo",),
        ("allenai/OLMo-1B-hf", "allenai/OLMo-1.7-7B-hf"),
        ("layers",),
        "OlmoDecoderLayer",
        residual_outputs=("mlp.down_proj",),
        final_norm=("norm",),
        notes="non-parametric layer norm",
        tiny=dict(_T),
    ),
    Architecture(
        "OLMo-2",
        ("olmo2",),
        ("allenai/OLMo-2-1124-7B",),
        ("layers",),
        "Olmo2DecoderLayer",
        final_norm=("norm",),
        notes="post-norm inside residual; QK-norm",
        tiny=dict(_T),
    ),
    Architecture(
        "MPT",
        ("mpt",),
        ("mosaicml/mpt-7b", "mosaicml/mpt-30b"),
        ("blocks",),
        "MptBlock",
        residual_outputs=("ffn.down_proj",),
        attention="mpt",
        final_norm=("norm_f",),
        notes="ALiBi; no biases; own attention code (adapter)",
        tiny=dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=64),
    ),
    Architecture(
        "BERT",
        ("bert",),
        ("google-bert/bert-base-uncased",),
        ("encoder.layer",),
        "BertLayer",
        causal="bidirectional or causal",
        final_norm=None,
        notes="encoder (bidirectional); causal when configured as a decoder (is_decoder=True); "
        "post-norm blocks, no final norm (hidden_states[L] is the last block's output)",
        tiny=dict(_T),
        tiny_variants={"decoder": dict(is_decoder=True)},
    ),
    Architecture(
        "ViT",
        ("vit",),
        ("google/vit-base-patch16-224",),
        ("layers", "encoder.layer"),
        "ViTLayer",
        residual_outputs=("mlp.fc2",),
        causal="bidirectional",
        modality="vision",
        final_norm=("layernorm",),
        norm_in_hidden_states=False,
        notes="tokens = [CLS] + image patches; inputs {'pixel_values': ...}; hidden_states[L] is "
        "taken before the final layernorm",
        tiny=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=8,
            patch_size=2,
            num_channels=1,
        ),
    ),
)

_BY_TYPE: dict[str, Architecture] = {t: a for a in ARCHITECTURES for t in a.model_types}


def supported_architectures():
    """The table as a pandas DataFrame (one row per architecture), for the book's table."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "name": a.name,
                "model_types": ", ".join(a.model_types),
                "examples": ", ".join(a.examples),
                "attention": a.causal,
                "modality": a.modality,
                "blocks": " or ".join(f"base_model.{p}" for p in a.block_paths) + f" ({a.block_class})",
                "final_norm": " or ".join(f"base_model.{p}" for p in a.final_norm or ()) or "none",
                "in_hidden_states": a.norm_in_hidden_states if a.final_norm else None,
                "token_diagonal": "AttentionInterface"
                if a.attention == "interface"
                else f"adapter ({a.attention})",
                "notes": a.notes,
                "residual_outputs": ", ".join(a.residual_outputs) or "none",
                "residual_outputs_when": "; ".join(
                    f"{', '.join(paths)} if {flag}" for flag, paths in a.residual_outputs_when.items()
                ),
            }
            for a in ARCHITECTURES
        ]
    )


def unwrap_model(model):
    """The Hugging Face model inside a ``loading.LoadedModel`` (or the model itself)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(model, "arch") and hasattr(model, "provenance"):
        return inner
    return model


def _config_of(model_or_config):
    model_or_config = unwrap_model(model_or_config)
    return getattr(model_or_config, "config", model_or_config)


def find_architecture(model_or_config) -> Architecture:
    """The table row for a model (or config, or LoadedModel); a clear error if there is none."""
    config = _config_of(model_or_config)
    model_type = getattr(config, "model_type", None)
    row = _BY_TYPE.get(model_type)
    if row is None:
        names = "; ".join(f"{a.name} ({', '.join(a.model_types)})" for a in ARCHITECTURES)
        raise UnsupportedArchitectureError(
            f"unsupported architecture model_type={model_type!r}. Supported: {names}. "
            "Add a row to coupling_utils.engine.architectures.ARCHITECTURES (and a tiny test) to support it."
        )
    return row


def _get_path(root, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def transformer_blocks(model) -> torch.nn.ModuleList:
    """The model's list of transformer blocks (found through its table row)."""
    model = unwrap_model(model)
    row = find_architecture(model)
    base = getattr(model, "base_model", model)
    for root in (base, model):
        for path in row.block_paths:
            blocks = _get_path(root, path)
            if isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0:
                kind = type(blocks[0]).__name__
                if kind != row.block_class:
                    raise UnsupportedArchitectureError(
                        f"{row.name}: expected blocks of class {row.block_class} at {path!r}, found {kind}; "
                        "this transformers version changed the model, update the architecture table"
                    )
                return blocks
    raise UnsupportedArchitectureError(
        f"{row.name}: no block list at {' or '.join(row.block_paths)} in {type(model).__name__}"
    )


def final_norm(model) -> torch.nn.Module | None:
    """The norm after the last block (found through the table row's ``final_norm``), or None.

    None when the architecture has none (BERT-like post-norm encoders) or this configuration
    leaves it out (OPT's post-norm models): the path exists but holds None.
    """
    model = unwrap_model(model)
    row = find_architecture(model)
    if row.final_norm is None:
        return None
    base = getattr(model, "base_model", model)
    for root in (base, model):
        for path in row.final_norm:
            parent, _, name = path.rpartition(".")
            holder = _get_path(root, parent) if parent else root
            if holder is not None and hasattr(holder, name):
                norm = getattr(holder, name)
                if norm is not None and not isinstance(norm, torch.nn.Module):
                    raise UnsupportedArchitectureError(
                        f"{row.name}: {path!r} is a {type(norm).__name__}, not a module; update the "
                        "architecture table's final_norm"
                    )
                return norm
    raise UnsupportedArchitectureError(
        f"{row.name}: no final norm at {' or '.join(row.final_norm)} in {type(model).__name__}; "
        "this transformers version changed the model, update the architecture table"
    )


def hidden_states_norm(model) -> torch.nn.Module | None:
    """The norm ``transformers`` applies before it returns ``hidden_states[L]`` (None: none).

    The authors' code measures its last block as ``hidden_states[L-1] -> hidden_states[L]`` of
    ``output_hidden_states=True``: the last block followed by this norm.
    """
    row = find_architecture(model)
    return final_norm(model) if row.norm_in_hidden_states else None


def tiny_model(
    name_or_type: str,
    *,
    variant: str | None = None,
    seed: int = 0,
    scale: float = 1.0,
    attn_implementation: str = "eager",
):
    """A tiny randomly initialised model of one architecture (d = 32, 2 blocks), for tests.

    Weights are drawn at a realistic scale (matrices ~ N(0, 1/fan_in), norms ~ 1) so attention
    is far from uniform and the tests see every derivative term. ``variant`` picks one of the
    row's ``tiny_variants`` (e.g. "alibi" for Falcon, "decoder" for BERT). The model is frozen
    and in eval mode, with the given attention implementation ("eager" or "sdpa").
    """
    import transformers

    row = _BY_TYPE.get(name_or_type) or next((a for a in ARCHITECTURES if a.name == name_or_type), None)
    if row is None:
        find_architecture(types.SimpleNamespace(model_type=name_or_type))  # raises the table's error
    kwargs = dict(row.tiny)
    if variant is not None:
        if variant not in row.tiny_variants:
            raise ValueError(
                f"{row.name} has no tiny variant {variant!r}; known: {sorted(row.tiny_variants)}"
            )
        kwargs.update(row.tiny_variants[variant])
    model_type = row.model_types[0]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation_internal = attn_implementation
    if row.modality == "vision" or row.causal != "causal":
        auto = transformers.AutoModel
        if kwargs.get("is_decoder"):
            auto = transformers.AutoModelForCausalLM
    else:
        auto = transformers.AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto.from_config(config)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.ndim >= 2 and "embed" not in pname and "wte" not in pname and "wpe" not in pname:
                    p.normal_(0.0, scale / p.shape[-1] ** 0.5 if p.shape[-1] > 1 else scale)
                elif p.ndim == 1:
                    p.add_(0.1 * torch.randn_like(p))
    model.eval().requires_grad_(False)
    return model
