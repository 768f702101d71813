"""One table of supported architectures: where the blocks live and how attention is switched.

Every architecture-specific fact the engine needs is a row of :data:`ARCHITECTURES` (or an
adapter function named by a row), so the engine itself has no ``if model_type == ...``:

- ``model_types``: Hugging Face ``config.model_type`` values the row covers;
- ``block_paths``: where the list of transformer blocks lives, relative to ``model.base_model``;
- ``block_class``: the class the blocks must be (a guard against silent mismatches);
- ``attention``: ``"interface"`` when the attention modules call ``transformers``'
  ``AttentionInterface`` (the token-diagonal function is selected by name), otherwise the key of
  an adapter in :data:`ATTENTION_ADAPTERS` that patches those modules' forward;
- ``causal``: causal (decoder) or bidirectional (encoder) attention.

Block calls themselves are captured with hooks (``blocks.py``), so no row needs to know a
block's argument list.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from coupling_utils.engine.attention import TOKEN_DIAGONAL, mask_to_bias, repeat_kv, token_diagonal_attention

__all__ = [
    "Architecture",
    "ARCHITECTURES",
    "UnsupportedArchitectureError",
    "supported_architectures",
    "find_architecture",
    "transformer_blocks",
    "attention_mode",
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
    tiny: dict = field(default_factory=dict, compare=False, hash=False)  # tiny test config (kwargs)
    tiny_variants: dict[str, dict] = field(default_factory=dict, compare=False, hash=False)


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
        notes="learned absolute positions; Conv1D projections",
        tiny=dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    ),
    Architecture(
        "GPT-Neo",
        ("gpt_neo",),
        ("EleutherAI/gpt-neo-125m", "EleutherAI/gpt-neo-2.7B"),
        ("h",),
        "GPTNeoBlock",
        attention="gpt_neo",
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
        notes="parallel attention and MLP; partial rotary",
        tiny=dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
    ),
    Architecture(
        "GPT-NeoX (Pythia)",
        ("gpt_neox",),
        ("EleutherAI/pythia-1.4b", "EleutherAI/pythia-6.9b", "EleutherAI/gpt-neox-20b"),
        ("layers",),
        "GPTNeoXLayer",
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
        notes="learned positions (offset 2)",
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
        notes="grouped-query attention; sliding window (v0.1)",
        tiny=dict(_T, num_key_value_heads=2, sliding_window=4),
    ),
    Architecture(
        "Gemma",
        ("gemma",),
        ("google/gemma-2b", "google/gemma-7b"),
        ("layers",),
        "GemmaDecoderLayer",
        notes="multi-query attention (2b); embeddings scaled by sqrt(d)",
        tiny=dict(_T, num_key_value_heads=1, head_dim=8),
    ),
    Architecture(
        "Gemma-2",
        ("gemma2",),
        ("google/gemma-2-2b", "google/gemma-2-9b"),
        ("layers",),
        "Gemma2DecoderLayer",
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
        notes="QKV biases; grouped-query attention (Qwen2)",
        tiny=dict(_T, num_key_value_heads=2),
    ),
    Architecture(
        "Phi",
        ("phi",),
        ("microsoft/phi-1", "microsoft/phi-1_5", "microsoft/phi-2"),
        ("layers",),
        "PhiDecoderLayer",
        notes="parallel attention and MLP; partial rotary",
        tiny=dict(_T, partial_rotary_factor=0.5),
    ),
    Architecture(
        "Phi-3",
        ("phi3",),
        ("microsoft/Phi-3-mini-4k-instruct",),
        ("layers",),
        "Phi3DecoderLayer",
        notes="fused QKV and gate-up projections",
        tiny=dict(_T, num_key_value_heads=2, pad_token_id=0),
    ),
    Architecture(
        "Falcon",
        ("falcon",),
        ("tiiuae/falcon-7b", "tiiuae/falcon-11B", "tiiuae/falcon-40b"),
        ("h",),
        "FalconDecoderLayer",
        attention="falcon",
        notes="rotary or ALiBi; multi-query / grouped (new decoder architecture); "
        "own attention code (adapter)",
        tiny=dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
        tiny_variants={
            "alibi": dict(alibi=True),
            "new_decoder": dict(new_decoder_architecture=True, num_kv_heads=2),
        },
    ),
    Architecture(
        "OLMo",
        ("olmo",),
        ("allenai/OLMo-1B-hf", "allenai/OLMo-1.7-7B-hf"),
        ("layers",),
        "OlmoDecoderLayer",
        notes="non-parametric layer norm",
        tiny=dict(_T),
    ),
    Architecture(
        "OLMo-2",
        ("olmo2",),
        ("allenai/OLMo-2-1124-7B",),
        ("layers",),
        "Olmo2DecoderLayer",
        notes="post-norm inside residual; QK-norm",
        tiny=dict(_T),
    ),
    Architecture(
        "MPT",
        ("mpt",),
        ("mosaicml/mpt-7b", "mosaicml/mpt-30b"),
        ("blocks",),
        "MptBlock",
        attention="mpt",
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
        notes="encoder (bidirectional); causal when configured as a decoder (is_decoder=True)",
        tiny=dict(_T),
        tiny_variants={"decoder": dict(is_decoder=True)},
    ),
    Architecture(
        "ViT",
        ("vit",),
        ("google/vit-base-patch16-224",),
        ("layers", "encoder.layer"),
        "ViTLayer",
        causal="bidirectional",
        modality="vision",
        notes="tokens = [CLS] + image patches; inputs {'pixel_values': ...}",
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
                "token_diagonal": "AttentionInterface"
                if a.attention == "interface"
                else f"adapter ({a.attention})",
                "notes": a.notes,
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


# ---------------------------------------------------------------------------------------------
# Adapters for architectures whose attention does not go through AttentionInterface.
# Each reproduces the module's own computation (same weights, same operations) and routes the
# attention core through token_diagonal_attention. KV caches are refused (Jacobians are taken
# without them).


def _no_cache(cache, name):
    if cache is not None:
        raise ValueError(
            f"{name}: token-diagonal attention runs without a KV cache; call with use_cache=False"
        )


def _gpt_neo_attn(self, query, key, value, attention_mask=None):
    """GPTNeoSelfAttention._attn: unscaled logits, causal/local mask from the ``bias`` buffer."""
    T, S = query.size(-2), key.size(-2)
    allowed = self.bias[:, :, S - T : S, :S]
    bias = mask_to_bias(allowed, T, S, causal_if_none=True)
    if attention_mask is not None:
        bias = (bias + attention_mask.float()).clamp(min=torch.finfo(torch.float32).min)
    return token_diagonal_attention(query, key, value, bias, scaling=1.0)


def _gpt_neo_forward(
    self,
    hidden_states,
    attention_mask=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    **kwargs,
):
    _no_cache(layer_past, "GPT-Neo")
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention

    return GPTNeoSelfAttention.forward(self, hidden_states, attention_mask=attention_mask)


def _falcon_forward(
    self,
    hidden_states,
    alibi,
    attention_mask,
    position_ids=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    position_embeddings=None,
    **kwargs,
):
    """FalconAttention.forward with the attention core replaced (rotary or ALiBi, any KV grouping)."""
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    _no_cache(layer_past, "Falcon")
    q, k, v = self._split_heads(self.query_key_value(hidden_states))
    B, T = q.shape[:2]
    n_kv = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    q = q.transpose(1, 2).reshape(B, self.num_heads, T, self.head_dim)
    k = k.transpose(1, 2).reshape(B, n_kv, T, self.head_dim)
    v = v.transpose(1, 2).reshape(B, n_kv, T, self.head_dim)
    if alibi is None:
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = repeat_kv(k, self.num_heads // n_kv), repeat_kv(v, self.num_heads // n_kv)
    bias = mask_to_bias(attention_mask, T, T, causal_if_none=True, device=q.device)
    sdpa = self.config._attn_implementation == "sdpa" and not output_attentions
    if alibi is not None and not sdpa:
        # eager ALiBi path: softmax((q·k + alibi) · inv_norm + mask)
        bias = alibi.view(B, self.num_heads, 1, -1).float() * self.inv_norm_factor + bias
    out, weights = token_diagonal_attention(q, k, v, bias, scaling=self.inv_norm_factor)
    out = out.permute(0, 2, 1, 3).reshape(B, T, self.num_heads * self.head_dim)
    return self.dense(out), weights


def _mpt_forward(self, hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
    """MptAttention.forward with the attention core replaced (ALiBi bias; boolean mask, True = masked)."""
    _no_cache(cache, "MPT")
    B, T = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    q, k, v = (x.reshape(B, T, self.n_heads, self.head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=2))
    bias = torch.zeros(T, T, device=q.device)
    if position_bias is not None:
        pb = position_bias[:, max(0, position_bias.size(1) - T) :, max(0, position_bias.size(2) - T) :]
        bias = bias + pb.float()
    if attention_mask is not None:
        bias = bias.masked_fill(attention_mask, torch.finfo(torch.float32).min)
    out, weights = token_diagonal_attention(q, k, v, bias, scaling=self.softmax_scale)
    out = out.permute(0, 2, 1, 3).reshape(B, T, -1)
    return self.out_proj(out), weights


# adapter key -> (attention module class name, {method name: replacement})
ATTENTION_ADAPTERS: dict[str, tuple[str, dict[str, Callable]]] = {
    "gpt_neo": ("GPTNeoSelfAttention", {"forward": _gpt_neo_forward, "_attn": _gpt_neo_attn}),
    "falcon": ("FalconAttention", {"forward": _falcon_forward}),
    "mpt": ("MptAttention", {"forward": _mpt_forward}),
}


def _configs(model) -> Iterator:
    """Every config object reachable from the model's modules (and their sub-configs), once."""
    seen, stack = set(), [m.config for m in model.modules() if hasattr(m, "config")]
    while stack:
        c = stack.pop()
        if id(c) in seen or not hasattr(c, "_attn_implementation_internal"):
            continue
        seen.add(id(c))
        yield c
        for key in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, key, None)
            if sub is not None:
                stack.append(sub)


@contextlib.contextmanager
def attention_mode(model, *, token_diagonal: bool):
    """Route the model's attention through the token-diagonal function (or plain eager) meanwhile.

    ``token_diagonal=False`` selects the model's own eager attention (the ordinary block, the
    oracle); adapter architectures then keep their implementation unchanged. The original
    implementation (and any patched method) is always restored on exit.
    """
    model = unwrap_model(model)
    row = find_architecture(model)
    if row.attention == "interface":
        target = TOKEN_DIAGONAL if token_diagonal else "eager"
        saved = [(c, c._attn_implementation_internal) for c in _configs(model)]
        try:
            for c, _ in saved:
                c._attn_implementation_internal = target
            yield
        finally:
            for c, value in saved:
                c._attn_implementation_internal = value
        return
    if not token_diagonal:
        yield
        return
    class_name, methods = ATTENTION_ADAPTERS[row.attention]
    patched = []
    try:
        for module in model.modules():
            if any(cls.__name__ == class_name for cls in type(module).__mro__):
                for method, fn in methods.items():
                    had = method in module.__dict__
                    patched.append((module, method, module.__dict__.get(method), had))
                    setattr(module, method, types.MethodType(fn, module))
        if not patched:
            raise UnsupportedArchitectureError(f"{row.name}: no {class_name} modules found to adapt")
        yield
    finally:
        for module, method, old, had in reversed(patched):
            if had:
                setattr(module, method, old)
            else:
                delattr(module, method)


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
