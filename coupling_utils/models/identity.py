"""What identifies a model reference's weights, for the store's keys (:func:`model_identity`):
content and recipe, never place, so a cache or a model folder copied, moved or mounted elsewhere
keeps its measurements, and a local folder's checkpoint is known by its own files alone, so a
training run that adds checkpoints does not make the ones already measured new.

It decides which stored measurement is whose, not what a measurement's numbers are: it is not
part of the code fingerprint (:data:`coupling_utils.provenance.NUMBER_SOURCES`); a change here
changes the keys it gives, and only those are measured again.
"""

from __future__ import annotations

from pathlib import Path

from coupling_utils.provenance import stable_hash

__all__ = ["model_identity", "content_hash", "local_path"]


def model_identity(ref: str, revision: str | None = None) -> str:
    """The identity of ``ref``'s weights at ``revision``: a zoo entry by its place in the zoo
    (``zoo:<name>/<key of its recipe>[/<member>]``); a local path by the hash of the files that
    revision loads (:func:`content_hash`); a hub id with the commit its cached snapshot of
    ``revision`` is at (the id alone if the cache does not know it). A misspelled ``embedded:``
    name is its own identity here: loading it fails, and the measurement loop records that failure."""
    from coupling_utils.files import cache_dir
    from coupling_utils.models import zoo

    if ref.startswith("embedded:"):
        try:
            return "zoo:" + zoo.entry_path(ref).relative_to(cache_dir("zoo")).as_posix()
        except zoo.ZooError:
            return ref
    path = local_path(ref)
    if path is not None:
        return f"files@{content_hash(path, revision)}"
    commit = _cached_commit(ref, revision)
    return f"{ref}@{commit}" if commit else ref


def local_path(ref: str) -> Path | None:
    """The folder or file on this machine that ``ref`` names (``~`` expanded); None for an
    ``embedded:`` name and for anything not there (a hub id): what is known by its files."""
    if ref.startswith("embedded:"):
        return None
    path = Path(ref).expanduser()
    return path if path.exists() else None


def content_hash(path: Path, revision: str | None = None) -> str:
    """A hash of the files ``revision`` of a local model loads (each file's path within its
    folder, size and SHA-256, streamed once and remembered by inode or path, size and mtime:
    :func:`coupling_utils.models.zoo.file_sha256`; hidden files aside): a .gguf file; the
    folder the revision loads from by the loader's rule
    (:func:`~coupling_utils.models.model_config.checkpoint_folder`: ``revisions/<R>/``, or the
    folder itself, its ``revisions/`` aside, for the final model); the whole folder where the
    revision is not there (loading then fails, and the failure's key changes once it is)."""
    from coupling_utils.models import zoo
    from coupling_utils.models.model_config import checkpoint_folder

    if path.is_file():
        root, files = path.parent, [path]
    else:
        found = checkpoint_folder(path, revision)
        root = found or path
        files = sorted(
            f
            for f in root.rglob("*")
            if f.is_file()
            and not any(p.startswith(".") for p in f.relative_to(root).parts)
            and not (found == path and f.relative_to(root).parts[0] == "revisions")
        )
    return stable_hash(
        [[f.relative_to(root).as_posix(), f.stat().st_size, zoo.file_sha256(f)] for f in files], 16
    )


def _cached_commit(repo: str, revision: str | None) -> str | None:
    """The commit of the hub cache's snapshot of ``repo`` at ``revision`` (offline; None if unknown)."""
    from coupling_utils.models.model_config import cached_hub_config

    found = cached_hub_config(repo, revision)  # None: not a repo id, not in the cache
    if found is None or found.parent.parent.name != "snapshots":
        return None
    return found.parent.name
