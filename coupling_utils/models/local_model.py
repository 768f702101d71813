"""A local model (a folder or a ``.gguf`` file, or a hub model's files in the Hugging Face cache),
read from its files alone, before or after loading it, in sentences that name the file, the
problem and the fix:

- :func:`check_model_files`: any model reference that is not embedded, routed to the check its
  kind has (the one call ``coupling-book measure`` and every chapter's parameters make);
- :func:`check_local_model`: what no copy of the files can fix, refused as bad input before any
  work: a file that is not GGUF, a revision the folder does not hold, an architecture the engine
  has no row for (also a cached hub model's: :func:`check_cached_architecture`);
- :func:`local_model_problem`: why loading failed where the files say it (a missing or
  unreadable ``config.json``, no weights, a truncated weight file): a failed run, as a damaged
  download or copy is fixed by fetching it again, and the other models are measured meanwhile.

Loading (:mod:`coupling_utils.models.loading`) stays the authority: what passes here may still
fail there (damaged bytes behind a sound header).
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "LocalModelError",
    "check_model_files",
    "check_local_model",
    "check_cached_architecture",
    "local_model_problem",
    "known_architecture",
    "read_config",
    "unreadable",
]


class LocalModelError(ValueError):
    """A local model that loading cannot measure (the message names the file and the fix)."""


def check_model_files(
    model: str, revisions: Sequence[str] = (), *, label: str | None = None, revision_option: str = "revision"
) -> None:
    """Refuse a model reference (not ``embedded:``) from what its files say here, before any work:
    a local path (:func:`check_local_model`), a path where nothing exists (``./dir``, ``/dir``,
    ``~/dir``, ``x.gguf``), a hub id whose config lies in the Hugging Face cache
    (:func:`check_cached_architecture`; one not in the cache is left to loading). ``label`` and
    ``revision_option``: how the message names the model and its revisions."""
    from coupling_utils.models.identity import local_path

    label = label or str(model)
    if local_path(str(model)) is not None:
        check_local_model(model, revisions, label=label, revision_option=revision_option)
    elif looks_like_path(str(model)):
        raise LocalModelError(
            f"{label}: nothing exists at {Path(model).expanduser().absolute()}; give a save_pretrained "
            "folder, a .gguf file, a hub id (org/name) or embedded:NAME (`coupling-book zoo list`)"
        )
    else:
        check_cached_architecture(model, revisions, label=label)


def looks_like_path(name: str) -> bool:
    """Whether a model reference is written as a path (``/``, ``./``, ``~``, ``x.gguf``,
    ``a/b/c``), not as a hub id (``org/name``) or an embedded name."""
    return (
        name.startswith(("/", "./", "../", "~", "\\"))
        or name.endswith(".gguf")
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def check_local_model(
    model: str, revisions: Sequence[str] = (), *, label: str | None = None, revision_option: str = "revision"
) -> None:
    """Refuse a local ``model`` that no copy of its files can make measurable: a file that is not
    GGUF, a revision the folder does not hold (loading's rule:
    :func:`~coupling_utils.models.model_config.checkpoint_folder`), a ``config.json`` naming an
    architecture the engine has no row for. ``label``: how the message names the model
    (default: the model); ``revision_option``: how it names the revision (``--revision``, a
    parameter's name)."""
    from coupling_utils.models.model_config import checkpoint_folder

    label = label or str(model)
    path = Path(model).expanduser()
    if path.is_file():
        if revisions:
            raise LocalModelError(
                f"{label} is one file, which has no revisions ({revision_option} "
                f"{' '.join(map(str, revisions))}); leave {revision_option} out, or give a folder that "
                "holds revisions/<R>/"
            )
        return _check_gguf(label, path)
    for revision in revisions or [None]:
        folder = checkpoint_folder(path, revision)
        if folder is None:
            raise LocalModelError(_no_revision(label, path, str(revision), revision_option))
        if len(ggufs := sorted(folder.glob("*.gguf"))) == 1 and not (folder / "config.json").exists():
            _check_gguf(label, ggufs[0])
        config = read_config(folder / "config.json")
        if isinstance(config, dict):
            _check_architecture(label, folder / "config.json", config)


def check_cached_architecture(model: str, revisions: Sequence[str] = (), *, label: str | None = None) -> None:
    """Refuse a hub model whose ``config.json`` lies in the Hugging Face cache
    (:func:`~coupling_utils.models.model_config.config_file`: nothing is fetched) and names an
    architecture the engine has no row for, as :func:`check_local_model` refuses a folder; one not
    in the cache is left to loading."""
    from coupling_utils.models.model_config import config_file

    for revision in revisions or [None]:
        path = config_file(str(model), revision)
        config = read_config(path) if path is not None else None
        if isinstance(config, dict):
            _check_architecture(label or str(model), path, config)


def local_model_problem(model: str, revision: str | None = None) -> str | None:
    """Why loading the local ``model`` at ``revision`` fails, as its files say it: no
    ``config.json`` (nor one .gguf file), a ``config.json`` that is not a UTF-8 JSON object, no
    weight files, a weight file that cannot be opened; None when none of these (or not local)."""
    from coupling_utils.models.model_config import checkpoint_folder

    path = Path(model).expanduser()
    folder = checkpoint_folder(path, revision) if path.is_dir() else None
    if folder is None:
        return None
    config = folder / "config.json"
    if not config.is_file():  # one .gguf file (loading refuses a folder holding neither first)
        return None
    read = read_config(config)
    if isinstance(read, str):
        return f"{config} is not {read}; write it again, e.g. with the model's config.save_pretrained(folder)"
    return _weights_problem(folder)


def _weights_problem(folder: Path) -> str | None:
    """No weight files in a model folder, or the first that cannot be opened, and the fix."""
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    if not weights:
        return (
            f"{folder} holds config.json but no weights (no *.safetensors or *.bin file); save the "
            "model there with save_pretrained, or copy its weight files beside config.json"
        )
    named = next((f"{file} ({why})" for file in weights if (why := unreadable(file))), None)
    return (
        None
        if named is None
        else (
            f"a weight file in {folder} cannot be read, so it is probably truncated or damaged (an "
            "interrupted download, copy or save): copy or save it again; the file that cannot be read: "
            + named
        )
    )


def _no_revision(label: str, path: Path, revision: str, option: str) -> str:
    """A revision a local folder does not hold: the rule, what it has, the fix."""
    held = sorted(p.name for p in (path / "revisions").glob("*/")) if (path / "revisions").is_dir() else []
    return (
        f"{label} has no revision {revision!r}: a local folder keeps checkpoint R in revisions/R/, and "
        f"{path / 'revisions' / revision} does not exist; "
        + (
            f"it has {', '.join(held)} (and main, the folder itself); name one of them, or"
            if held
            else "it has no revisions/, only its final model:"
        )
        + f" leave {option} out"
    )


def _check_gguf(label: str, path: Path) -> None:
    """A model file must be GGUF (its first four bytes ``GGUF``), as loading reads it."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise LocalModelError(f"{label}: cannot read {path} ({exc.strerror})") from None
    if path.suffix.lower() != ".gguf" or magic != b"GGUF":
        gguf = path.suffix.lower() == ".gguf"
        why = "it does not start with the GGUF magic bytes" if gguf else "not a .gguf file"
        raise LocalModelError(
            f"{label} is a file but not a GGUF model ({why}); give a .gguf file, or a "
            "save_pretrained folder (config.json and weights)"
        )


def read_config(path: Path) -> dict | str | None:
    """``config.json`` parsed (None if absent), or what it is not: "readable (...)", "UTF-8 text
    (...)", "valid JSON (...)", "a JSON object"."""
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"UTF-8 text ({exc})"
    except OSError as exc:
        return f"readable ({exc.strerror})"
    except ValueError as exc:
        return f"valid JSON ({exc})"
    return config if isinstance(config, dict) else "a JSON object"


def known_architecture(config: dict):
    """The engine's row for a parsed ``config.json`` (by its ``model_type``); the table's
    :class:`~coupling_utils.engine.architectures.UnsupportedArchitectureError` where it has none."""
    from coupling_utils.engine.architectures import find_architecture

    return find_architecture(types.SimpleNamespace(model_type=config.get("model_type")))


def _check_architecture(label: str, path: Path, config: dict) -> None:
    """A config whose model_type the engine has no row for is refused."""
    from coupling_utils.engine.architectures import UnsupportedArchitectureError

    try:
        known_architecture(config)
    except UnsupportedArchitectureError:
        raise LocalModelError(_unsupported(label, path, config)) from None


def _unsupported(label: str, path: Path, config: dict) -> str:
    """Why a model whose config names an architecture without an engine row is refused."""
    from coupling_utils.engine.architectures import ARCHITECTURES

    kind = config.get("model_type")
    pair = (
        " (an encoder-decoder; the engine follows one stack of blocks, decoder or encoder)"
        if config.get("is_encoder_decoder")
        else ""
    )
    named = (
        f"model_type {kind!r}{pair}, an architecture the engine has no row for" if kind else "no model_type"
    )
    return (
        f"{label}: its {path} names {named}; the engine measures these transformers: "
        f"{', '.join(a.name for a in ARCHITECTURES)}; give one of them "
        "(another is supported by a row in coupling_utils.engine.architectures.ARCHITECTURES)"
    )


def unreadable(path: Path) -> str | None:
    """Why a weight file cannot be opened (None: it opens): a safetensors header that does not
    cover the file, or a torch zip archive without its directory (both: a truncated file)."""
    import zipfile

    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt"):
                return None
        with open(path, "rb") as f:
            if f.read(2) == b"PK":  # torch's zip format (an older pickle is not checked)
                zipfile.ZipFile(f).close()
    except Exception as exc:  # noqa: BLE001 - any failure to open is the reason asked for
        return f"{type(exc).__name__}: {exc}"
    return None
