"""A model's tokenizer or image processor: found beside its weights, loaded, or an error naming why not.

``load_model`` calls :func:`load_preprocessor` once the weights are read: a GGUF file's own
tokenizer, a vision model's image processor (``preprocessor_config.json``, which needs Pillow),
or a text model's tokenizer (a SentencePiece-only ``tokenizer.model`` needs sentencepiece and
protobuf). It decides how prompts become token ids, so it is part of the code fingerprint of
every measurement (``provenance.NUMBER_SOURCES``).
"""

from __future__ import annotations

from pathlib import Path

from coupling_utils.models.loading import MissingDependencyError, PreprocessorError, _missing

__all__ = ["load_preprocessor", "TOKENIZER_FILES", "PROCESSOR_FILES"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt")
PROCESSOR_FILES = ("preprocessor_config.json",)


def _present(source: str, names: tuple[str, ...], revision: str | None, local: bool) -> set[str]:
    """Which of the files ``names`` the source has (a local directory, or the hub and its cache)."""
    if local:
        return {n for n in names if (Path(source) / n).is_file()}
    from transformers.utils.hub import cached_file

    found = set()
    for n in names:
        path = cached_file(
            source,
            n,
            revision=revision,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            _raise_exceptions_for_gated_repo=False,
        )
        if path is not None:
            found.add(n)
    return found


def _gguf_has_tokenizer(path: Path) -> bool:
    import gguf

    return gguf.GGUFReader(str(path)).get_field("tokenizer.ggml.tokens") is not None


def load_preprocessor(name: str, source: str, row, revision, gguf_file, local: bool):
    """The tokenizer (or, for vision models, the image processor); None only if the source has none.

    A tokenizer or processor that exists but cannot be loaded is an error naming its cause.
    """
    import transformers

    kwargs = {"revision": revision} if revision else {}
    if gguf_file:
        if not _gguf_has_tokenizer(Path(source) / gguf_file):
            return None
        kind, kwargs = transformers.AutoTokenizer, {"gguf_file": gguf_file}
    elif row.modality == "vision":
        if not _present(source, PROCESSOR_FILES, revision, local):
            return None
        if _missing("PIL"):
            raise MissingDependencyError(
                f"the image processor of {name} (preprocessor_config.json: its resize and its normalisation "
                "mean/std) needs Pillow, which is not installed: pip install pillow (a dependency of "
                "coupling-utils; your environment is incomplete)"
            )
        kind = transformers.AutoImageProcessor
    else:
        present = _present(source, TOKENIZER_FILES, revision, local)
        if not present:
            return None
        if "tokenizer.model" in present and "tokenizer.json" not in present:
            missing = _missing("sentencepiece", "google.protobuf")
            if missing:
                names = ", ".join("protobuf" if m == "google.protobuf" else m for m in missing)
                raise MissingDependencyError(
                    f"the tokenizer of {name} is a SentencePiece model only (tokenizer.model, no "
                    f"tokenizer.json); reading it needs sentencepiece and protobuf, and {names} "
                    "is not installed: pip install sentencepiece protobuf (dependencies of coupling-utils; "
                    "your environment is incomplete)"
                )
        kind = transformers.AutoTokenizer
    try:
        return kind.from_pretrained(source, **kwargs)
    except Exception as exc:  # noqa: BLE001 - surfaced with its cause, whatever the loader raised
        what = "image processor" if kind is transformers.AutoImageProcessor else "tokenizer"
        raise PreprocessorError(f"could not load the {what} of {name}: {type(exc).__name__}: {exc}") from exc
