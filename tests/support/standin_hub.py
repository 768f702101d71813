"""A stand-in for the Hugging Face hub: tiny random models under the hub profiles' repo ids, offline.

The ``paper`` and ``laptop`` profiles (``notebooks/profiles/{paper,laptop}/*.yaml``, the
:data:`HUB_PROFILES`) name hub models that cannot be
downloaded here (no network, no GPU). :func:`write_standin_hub` writes a Hugging Face cache
directory, the layout ``HF_HUB_CACHE`` points at, holding a tiny randomly initialised model
under every repo id and revision those profiles name, so the whole hub path (``load_model`` by
repo id and revision, tokenizers, image processors, ``.bin`` and ``.safetensors`` weights) runs
offline::

    models--ORG--NAME/refs/<revision>            -> the commit hash of that revision
    models--ORG--NAME/snapshots/<commit>/<file>  -> ../../blobs/<sha256> (relative symlink)
    models--ORG--NAME/blobs/<sha256>             the file's bytes (shared across revisions)

The repos are read from the profiles (:func:`profile_repos`), never listed here, so a new
profile entry cannot go untested: a repo that no family rule in :data:`FAMILIES` matches stops
the writer with an error saying so. Each family keeps what matters to the engine from the real
checkpoints: the ``model_type`` and the switches that change a block's computation (grouped-
and multi-query attention, Mistral's sliding window, partial rotary embeddings, parallel
residuals, Falcon's new decoder architecture, OLMo's ``clip_qkv``, Gemma's ``head_dim`` that is
not hidden/heads), the real depth (``n_layers`` from ``data/model_metadata.csv``), the kind of
tokenizer the real repo ships (a byte-level BPE ``tokenizer.json``; a SentencePiece
``tokenizer.model`` with or without a ``tokenizer.json``: Vicuna-7B-v1.5 and Orca-2-7B ship only
the SentencePiece model), the weight format (``model.safetensors``, sharded safetensors with an
index, or ``pytorch_model.bin``), and the ViT/DeiT image processors (DeiT normalises with
ImageNet's mean and std, ViT with 0.5). Widths are tiny (d = 64, 4 heads: wide enough for the
paper's K = 50); weights are random (seeded by repo id and revision, so every revision of a Pythia
model has its own weights).
Tokenizers are trained here, in a fraction of a second, on a slice of the project's corpus
(``models.corpus``).

Test infrastructure, not part of the library: the tests import it as ``support.standin_hub``.
From a shell, in the repository root: ``python -m tests.support.standin_hub DIR`` (or
``python tests/support/standin_hub.py DIR``) writes it, then ``HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1``
makes every hub id of those profiles loadable.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from coupling_utils.files import atomic_dir
from coupling_utils.models.loading import data_file

__all__ = [
    "FAMILIES",
    "Family",
    "StandInError",
    "profile_repos",
    "hub_profiles",
    "HUB_PROFILES",
    "family_of",
    "switches",
    "write_standin_hub",
    "standin_config",
]

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
WIDTH, HEADS, FFN = 64, 4, 128  # wide enough for the paper's K = 50
HUB_PROFILES = ("paper", "laptop")  # the profiles that name hub models
TEXT_CHARS = 150_000
WEIGHT_FILE = re.compile(
    r"pytorch_model.*\.bin|model.*\.safetensors(\.index\.json)?"
)  # corpus slice the tokenizers are trained on


class StandInError(ValueError):
    """A profile names a repo the stand-in cannot write (no family rule matches it)."""


@dataclass(frozen=True)
class Family:
    """How to write the stand-in of every repo whose id matches ``pattern`` (a full match).

    ``config``: tiny config keyword arguments beyond width, heads and depth; ``kv_heads``: key/value
    heads of the 4 query heads; ``tokenizer``: ``"bpe"`` (a ``tokenizer.json``), ``"sentencepiece"``
    (``tokenizer.model`` and ``tokenizer.json``), ``"sentencepiece-only"`` (``tokenizer.model``
    alone) or ``"image"`` (an image processor); ``tokenizer_class`` as the real
    ``tokenizer_config.json`` names it; ``weights``: ``"safetensors"``, ``"sharded"`` or ``"bin"``;
    ``layers``: depth when ``data/model_metadata.csv`` has no row; ``processor``: the
    ``preprocessor_config.json`` of vision repos. ``source``: where the switches come from.
    """

    pattern: str
    model_type: str
    architecture: str
    config: dict = field(default_factory=dict)
    kv_heads: int = HEADS
    tokenizer: str = "bpe"
    tokenizer_class: str = "PreTrainedTokenizerFast"
    weights: str = "safetensors"
    layers: int = 2
    processor: dict | None = None
    source: str = ""


_IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])

FAMILIES: tuple[Family, ...] = (
    Family(
        r"openai-community/gpt2(-medium|-large|-xl)?",
        "gpt2",
        "GPT2LMHeadModel",
        tokenizer_class="GPT2Tokenizer",
        source="config.json of each repo: learned positions, multi-head attention",
    ),
    Family(
        r"Qwen/Qwen1\.5-[0-9.]+B",
        "qwen2",
        "Qwen2ForCausalLM",
        tokenizer_class="Qwen2Tokenizer",
        weights="sharded",
        source="config.json: model_type qwen2, num_key_value_heads = num_attention_heads (no GQA), QKV bias",
    ),
    Family(
        r"Qwen/Qwen2-7B",
        "qwen2",
        "Qwen2ForCausalLM",
        kv_heads=2,
        tokenizer_class="Qwen2Tokenizer",
        weights="sharded",
        source="config.json: 28 heads, 4 key/value heads (GQA)",
    ),
    Family(
        r"allenai/OLMo-1B-hf",
        "olmo",
        "OlmoForCausalLM",
        tokenizer_class="GPTNeoXTokenizer",
        source="config.json: non-parametric layer norm, clip_qkv null",
    ),
    Family(
        r"allenai/OLMo-1\.7-7B-hf",
        "olmo",
        "OlmoForCausalLM",
        config=dict(clip_qkv=8.0),
        tokenizer_class="GPTNeoXTokenizer",
        source="config.json: clip_qkv 8.0",
    ),
    Family(
        r"microsoft/phi-(1|1_5|2)",
        "phi",
        "PhiForCausalLM",
        config=dict(partial_rotary_factor=0.5),
        tokenizer_class="CodeGenTokenizer",
        source="config.json: parallel attention and MLP, partial_rotary_factor 0.5 (phi-2: 0.4; 0.5 here "
        "keeps the tiny rotary dimension even)",
    ),
    Family(
        r"EleutherAI/pythia-[0-9.]+[mb]",
        "gpt_neox",
        "GPTNeoXForCausalLM",
        config=dict(rotary_pct=0.25, use_parallel_residual=True),
        tokenizer_class="GPTNeoXTokenizer",
        weights="bin",
        source="config.json: rotary_pct 0.25, use_parallel_residual true; checkpoints stepN as revisions, "
        "pytorch_model.bin",
    ),
    Family(
        r"google/gemma-2b",
        "gemma",
        "GemmaForCausalLM",
        kv_heads=1,
        config=dict(head_dim=16),
        tokenizer="sentencepiece",
        tokenizer_class="GemmaTokenizer",
        source="config.json: multi-query attention (1 key/value head), head_dim 256 = hidden/heads",
    ),
    Family(
        r"google/gemma-7b",
        "gemma",
        "GemmaForCausalLM",
        config=dict(head_dim=32),
        tokenizer="sentencepiece",
        tokenizer_class="GemmaTokenizer",
        weights="sharded",
        source="config.json: head_dim 256 while hidden/heads = 3072/16 = 192 (here 32 vs 64/4 = 16)",
    ),
    Family(
        r"lmsys/vicuna-7b-v1\.5|microsoft/Orca-2-7b",
        "llama",
        "LlamaForCausalLM",
        tokenizer="sentencepiece-only",
        tokenizer_class="LlamaTokenizer",
        weights="bin",
        source="repo files: tokenizer.model without tokenizer.json, pytorch_model-*.bin; "
        "Llama-2 architecture",
    ),
    Family(
        r"meta-llama/Llama-2-(7|13)b-hf",
        "llama",
        "LlamaForCausalLM",
        tokenizer="sentencepiece",
        tokenizer_class="LlamaTokenizer",
        weights="sharded",
        source="config.json: multi-head attention (7B, 13B); tokenizer.model and tokenizer.json",
    ),
    Family(
        r"meta-llama/Meta-Llama-3-8B",
        "llama",
        "LlamaForCausalLM",
        kv_heads=2,
        config=dict(rope_theta=500000.0),
        source="config.json: 32 heads, 8 key/value heads (GQA), rope_theta 500000; a BPE tokenizer.json",
    ),
    Family(
        r"mistralai/Mistral-7B(-Instruct)?-v0\.1",
        "mistral",
        "MistralForCausalLM",
        kv_heads=2,
        config=dict(sliding_window=4),
        tokenizer="sentencepiece",
        tokenizer_class="LlamaTokenizer",
        weights="sharded",
        source="config.json: 8 key/value heads of 32, sliding_window 4096 (here 4 tokens, shorter "
        "than a prompt)",
    ),
    Family(
        r"mistralai/Mistral-7B(-Instruct)?-v0\.[23]",
        "mistral",
        "MistralForCausalLM",
        kv_heads=2,
        config=dict(sliding_window=None, rope_theta=1000000.0),
        tokenizer="sentencepiece",
        tokenizer_class="LlamaTokenizer",
        weights="sharded",
        source="config.json: 8 key/value heads of 32, sliding_window null, rope_theta 1e6",
    ),
    Family(
        r"tiiuae/falcon-11B",
        "falcon",
        "FalconForCausalLM",
        config=dict(
            new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1, parallel_attn=True
        ),
        kv_heads=2,
        source="config.json: new_decoder_architecture true, num_kv_heads 8 of 32, parallel attention with "
        "one layer norm",
    ),
    Family(
        r"google/vit-base-patch16-224",
        "vit",
        "ViTForImageClassification",
        tokenizer="image",
        layers=12,
        processor=dict(
            feature_extractor_type="ViTFeatureExtractor",
            do_resize=True,
            do_normalize=True,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            resample=2,
            size=32,
        ),
        source="config.json (12 layers, 224 px, patch 16) and preprocessor_config.json (mean = std = 0.5); "
        "here 32 px, patch 8",
    ),
    Family(
        r"facebook/deit-base-patch16-224",
        "vit",
        "ViTForImageClassification",
        tokenizer="image",
        layers=12,
        processor=dict(
            feature_extractor_type="DeiTFeatureExtractor",
            do_resize=True,
            do_center_crop=True,
            do_normalize=True,
            resample=3,
            size=36,
            crop_size=32,
            **_IMAGENET,
        ),
        source="config.json (model_type vit) and preprocessor_config.json (ImageNet mean and std, "
        "resize 256, crop 224); here resize 36, crop 32",
    ),
)


def family_of(repo: str) -> Family:
    """The family rule for ``repo``; a :class:`StandInError` if none (or several) match."""
    hits = [f for f in FAMILIES if re.fullmatch(f.pattern, repo)]
    if len(hits) != 1:
        raise StandInError(
            f"{len(hits)} stand-in family rules match {repo!r}"
            + (f" ({', '.join(f.pattern for f in hits)})" if hits else "")
            + ": add exactly one rule for it to FAMILIES in tests/support/standin_hub.py (model_type, the "
            "switches that matter, tokenizer kind, weight format), so the hub profile that names it is "
            "tested offline"
        )
    return hits[0]


# --------------------------------------------------------------------------- the profiles
def hub_profiles(names: Iterable[str] = HUB_PROFILES) -> list[Path]:
    """The profile files of the profiles ``names`` (default: :data:`HUB_PROFILES`) in this checkout
    (``$COUPLING_BOOK_ROOT`` or the repository)."""
    # this file is tests/support/standin_hub.py: parents[2] is the repository
    root = Path(os.environ.get("COUPLING_BOOK_ROOT", Path(__file__).resolve().parents[2]))
    files = []
    for name in names:
        folder = root / "notebooks" / "profiles" / name
        found = sorted(folder.glob("*.yaml"))
        if not found:
            raise FileNotFoundError(
                f"no {name} profiles in {folder}; run from a clone (pip install -e .) or set "
                "COUPLING_BOOK_ROOT"
            )
        files += found
    return files


def profile_repos(profiles: Iterable[str | os.PathLike] | None = None) -> dict[str, tuple[str, ...]]:
    """``{repo id: revisions}`` named by the profile files (default: :func:`hub_profiles`).

    A repo id is any string value (or list item) of the form ``org/name`` (not ``embedded:...``,
    not a path); the ``revision``/``revisions`` of a profile apply to every repo it names.
    "main" is implied; revisions are sorted by training step where they are ``stepN``.
    """
    out: dict[str, set[str]] = {}
    for path in hub_profiles() if profiles is None else profiles:
        values = yaml.safe_load(Path(path).read_text()) or {}
        revs = values.get("revisions") or []
        revs = [revs] if isinstance(revs, str) else list(revs)
        if values.get("revision"):
            revs.append(values["revision"])
        found: list[str] = []

        def walk(v, found=found):
            if isinstance(v, str) and HUB_ID.fullmatch(v):
                found.append(v)
            elif isinstance(v, (list, tuple)):
                for item in v:
                    walk(item)
            elif isinstance(v, dict):
                for item in v.values():
                    walk(item)

        walk(values)
        for repo in found:
            out.setdefault(repo, set()).update(str(r) for r in revs)

    def order(r: str):
        m = re.fullmatch(r"step(\d+)", r)
        return (0, int(m.group(1)), r) if m else (1, 0, r)

    return {repo: tuple(sorted(revs, key=order)) for repo, revs in sorted(out.items())}


# --------------------------------------------------------------------------- configs
def _depths() -> dict[str, int]:
    path = data_file("model_metadata.csv")
    if path is None:
        return {}
    with open(path, newline="") as f:
        return {r["model_id"]: int(r["n_layers"]) for r in csv.DictReader(f) if r.get("n_layers")}


def standin_config(repo: str, vocab_size: int = 64, depths: dict[str, int] | None = None):
    """The tiny ``transformers`` config of ``repo``'s stand-in (its family's switches, real depth)."""
    import transformers

    fam = family_of(repo)
    depth = (depths if depths is not None else _depths()).get(repo, fam.layers)
    if fam.model_type == "vit":
        kw = dict(
            hidden_size=WIDTH,
            num_hidden_layers=depth,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            image_size=32,
            patch_size=8,
            num_channels=3,
            num_labels=10,
        )
    elif fam.model_type == "gpt2":
        kw = dict(vocab_size=vocab_size, n_embd=WIDTH, n_layer=depth, n_head=HEADS, n_positions=128)
    else:
        kw = dict(
            vocab_size=vocab_size,
            hidden_size=WIDTH,
            num_hidden_layers=depth,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            max_position_embeddings=128,
        )
        if fam.model_type != "falcon":
            kw["num_key_value_heads"] = fam.kv_heads
    if fam.tokenizer != "image":  # the special tokens of the stand-in tokenizers
        kw.update(
            dict(bos_token_id=0, eos_token_id=0)
            if fam.tokenizer == "bpe"
            else dict(bos_token_id=1, eos_token_id=2)
        )
    kw.update(fam.config)
    config = transformers.AutoConfig.for_model(fam.model_type, **kw)
    config.architectures = [fam.architecture]
    return config


def switches(config) -> list[str]:
    """The switches of a config that change a block's computation, in words (for reports and tests)."""
    c = config
    out = []
    heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
    kv = getattr(c, "num_key_value_heads", None)
    if c.model_type == "falcon":
        kv = c.num_kv_heads if c.new_decoder_architecture else (1 if c.multi_query else heads)
    if kv is not None and heads and kv < heads:
        out.append(f"{'MQA' if kv == 1 else 'GQA'} ({heads} heads, {kv} key/value)")
    if getattr(c, "sliding_window", None):
        out.append(f"sliding window {c.sliding_window}")
    rope = getattr(c, "rope_parameters", None) or {}
    frac = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if frac is not None and frac < 1:
        out.append(f"partial rotary {frac}")
    parallel = getattr(c, "use_parallel_residual", False) or getattr(c, "parallel_attn", False)
    if parallel or c.model_type == "phi":
        out.append("parallel residual")
    if getattr(c, "new_decoder_architecture", False):
        out.append("new decoder architecture")
    if getattr(c, "clip_qkv", None):
        out.append(f"clip_qkv {c.clip_qkv}")
    head_dim = getattr(c, "head_dim", None)
    if head_dim and heads and c.model_type != "falcon" and head_dim * heads != c.hidden_size:
        out.append(f"head_dim {head_dim} != hidden/heads {c.hidden_size // heads}")
    return out


# --------------------------------------------------------------------------- tokenizers
def _training_text() -> str:
    """The first training plays of the project's corpus, about ``TEXT_CHARS`` characters."""
    from coupling_utils.models import corpus

    root, parts, n = corpus.corpus_root(), [], 0
    for path in sorted(root.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix()):
        if path.relative_to(root).with_suffix("").as_posix() in corpus.VALIDATION_PLAYS:
            continue
        parts.append(corpus.markdown_to_text(path.read_text("utf-8")))
        n += len(parts[-1])
        if n >= TEXT_CHARS:
            break
    return "".join(parts)[:TEXT_CHARS]


def _bpe_files(text: str, tokenizer_class: str) -> dict[str, bytes]:
    """A byte-level BPE ``tokenizer.json`` (GPT-2 style) and its ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    eos = "<|endoftext|>"
    config = {"tokenizer_class": tokenizer_class, "bos_token": eos, "eos_token": eos, "unk_token": eos}
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": _json(config)}


def _sentencepiece_files(text: str, tokenizer_class: str, with_json: bool) -> dict[str, bytes]:
    """A SentencePiece BPE ``tokenizer.model`` (Llama style: byte fallback, <unk> <s> </s>)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()),
        model_writer=buf,
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    config = {
        "tokenizer_class": tokenizer_class,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
    }
    files = {"tokenizer.model": buf.getvalue(), "tokenizer_config.json": _json(config)}
    if with_json:  # the fast tokenizer transformers converts from the SentencePiece model
        import tempfile

        from transformers import AutoTokenizer

        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():
                Path(tmp, name).write_bytes(data)
            fast = AutoTokenizer.from_pretrained(tmp)
            files["tokenizer.json"] = fast.backend_tokenizer.to_str().encode()
    return files


def _tokenizer_files(fam: Family, text: str, memo: dict) -> dict[str, bytes]:
    key = (fam.tokenizer, fam.tokenizer_class, json.dumps(fam.processor, sort_keys=True))
    if key not in memo:
        if fam.tokenizer == "bpe":
            memo[key] = _bpe_files(text, fam.tokenizer_class)
        elif fam.tokenizer in ("sentencepiece", "sentencepiece-only"):
            memo[key] = _sentencepiece_files(text, fam.tokenizer_class, fam.tokenizer == "sentencepiece")
        elif fam.tokenizer == "image":
            memo[key] = {"preprocessor_config.json": _json(fam.processor)}
        else:
            raise StandInError(f"unknown tokenizer kind {fam.tokenizer!r} in the family of {fam.pattern}")
    return memo[key]


def _vocab_size(files: dict[str, bytes]) -> int:
    if "tokenizer.json" in files:
        return len(json.loads(files["tokenizer.json"])["model"]["vocab"])
    if "tokenizer.model" in files:
        import sentencepiece as spm

        return spm.SentencePieceProcessor(model_proto=files["tokenizer.model"]).get_piece_size()
    return 0


# --------------------------------------------------------------------------- weights and the cache layout
def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:4], "little")


def _new_model(config, fam: Family, seed: int):
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(transformers, fam.architecture)(config).eval()


def _redrawn(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Another checkpoint: every weight matrix of ``state`` drawn afresh at its own scale (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in state.items():
        if value.ndim >= 2 and value.is_floating_point():
            value = torch.randn(value.shape, generator=gen, dtype=value.dtype) * value.std()
        out[key] = value.clone()
    return out


def _model_files(model, fam: Family, state: dict | None, work: Path) -> dict[str, bytes]:
    """config.json and the weights (``state``, default the model's own) in the family's format."""
    shutil.rmtree(work, ignore_errors=True)
    if state is not None:
        model.load_state_dict(state)
    if fam.weights == "bin":
        work.mkdir(parents=True)
        model.config.save_pretrained(work)
        torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, work / "pytorch_model.bin")
    else:
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        shard = f"{n_bytes // 2 // 1000 + 1}KB" if fam.weights == "sharded" else "10GB"
        model.save_pretrained(work, max_shard_size=shard)
    files = {p.name: p.read_bytes() for p in sorted(work.iterdir()) if p.is_file()}
    files.pop("generation_config.json", None)  # not needed; keeps every snapshot minimal
    return files


def _commit(repo_dir: Path, revision: str, files: dict[str, bytes], repo: str) -> str:
    """Store ``files`` as one snapshot of ``repo_dir``; ``refs/<revision>`` names its commit."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    commit = hashlib.sha1(
        json.dumps([repo, revision, sorted(digests.items())]).encode()
    ).hexdigest()  # 40 hex digits, like a git commit
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = blobs / digests[name]
        if not blob.exists():
            blob.write_bytes(data)
        (snap / name).symlink_to(Path("..", "..", "blobs", digests[name]))
    refs = repo_dir / "refs"
    refs.mkdir(exist_ok=True)
    (refs / revision).write_text(commit)
    return commit


def write_standin_hub(
    dest: str | os.PathLike,
    *,
    repos: dict[str, tuple[str, ...]] | None = None,
    progress: bool = False,
) -> dict[str, dict]:
    """Write the stand-in hub cache to ``dest`` (replaced atomically) and return its manifest.

    ``repos``: ``{repo id: revisions}`` (default: :func:`profile_repos` of the hub profiles).
    Every repo gets ``main`` and each listed revision, each its own commit with its own weights.
    The manifest (also written as ``dest/standin.json``) gives, per repo: model_type, switches,
    layers, tokenizer kind, weight files, revisions -> commit, and the seconds the writing took.
    """
    start = time.perf_counter()
    repos = profile_repos() if repos is None else repos
    families = {repo: family_of(repo) for repo in repos}  # every repo must have a rule, before any work
    text = _training_text() if any(f.tokenizer != "image" for f in families.values()) else ""
    depths = _depths()
    memo: dict = {}
    manifest: dict[str, dict] = {}
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        _write(dest, repos, families, text, depths, memo, manifest, progress, start)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return manifest


def _write(dest, repos, families, text, depths, memo, manifest, progress, start) -> None:
    with atomic_dir(dest) as tmp:
        work = tmp / ".work"
        for repo, revisions in repos.items():
            fam = families[repo]
            tok_files = _tokenizer_files(fam, text, memo)
            config = standin_config(repo, vocab_size=max(64, _vocab_size(tok_files)), depths=depths)
            repo_dir = tmp / ("models--" + repo.replace("/", "--"))
            model = _new_model(config, fam, _seed(repo, "main"))
            main_state = {k: v.clone() for k, v in model.state_dict().items()}
            commits = {}
            for revision in ("main", *[r for r in revisions if r != "main"]):
                state = main_state if revision == "main" else _redrawn(main_state, _seed(repo, revision))
                files = {**_model_files(model, fam, state, work), **tok_files}
                commits[revision] = _commit(repo_dir, revision, files, repo)
            manifest[repo] = {
                "model_type": fam.model_type,
                "switches": switches(config),
                "layers": config.num_hidden_layers if fam.model_type != "gpt2" else config.n_layer,
                "tokenizer": fam.tokenizer,
                "tokenizer_files": sorted(n for n in tok_files if n != "tokenizer_config.json"),
                "weights": sorted(n for n in files if WEIGHT_FILE.fullmatch(n)),
                "revisions": commits,
                "source": fam.source,
            }
            if progress:
                print(f"{repo}: {len(commits)} revision(s), {', '.join(manifest[repo]['switches']) or '-'}")
        shutil.rmtree(work, ignore_errors=True)
        seconds = time.perf_counter() - start
        (tmp / "standin.json").write_bytes(_json({"seconds": round(seconds, 2), "repos": manifest}))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tests.support.standin_hub",
        description="Write a Hugging Face cache with tiny random stand-ins of every hub model the hub "
        "profiles name; then run with HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1.",
    )
    parser.add_argument("dir", help="the cache directory to write (replaced)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    manifest = write_standin_hub(args.dir, progress=True)
    print(
        f"wrote {len(manifest)} repos to {args.dir} in {time.perf_counter() - start:.1f} s; use: "
        f"HF_HUB_CACHE={args.dir} HF_HUB_OFFLINE=1"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
