"""A model reference's ``config.json``, read offline: what planning and input checks know of a
model (its width, its vocabulary, its architecture) before anything is built, loaded or fetched.

The config is the one the loader would read (:func:`coupling_utils.models.loading.load_model`):
an ``embedded:`` entry's once it is built, a local folder's (``revisions/<R>/`` for a checkpoint,
the folder itself for ``main``/``final``), a hub model's in the Hugging Face cache. Nothing here
builds an embedded model or asks the network; a caller that may do either
(:func:`coupling_utils.analysis.emergence.model_width`) does so itself when this finds nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["checkpoint_folder", "cached_hub_config", "config_file", "offline_config", "text_config"]


def checkpoint_folder(folder: Path, revision: str | None) -> Path | None:
    """The folder a local model's ``revision`` loads from, by the loader's local-directory rule:
    ``<folder>/revisions/<revision>/``, or ``folder`` itself for no revision, ``main`` or
    ``final`` without such a subfolder; None when the revision is not there."""
    from coupling_utils.models.zoo.registry import FINAL  # loading's FINAL_REVISIONS (a test ties them)

    if not revision:
        return folder
    sub = folder / "revisions" / str(revision)
    if sub.is_dir():
        return sub
    return folder if str(revision) in FINAL else None


def config_file(model: str, revision: str | None = None) -> Path | None:
    """Where ``model``'s ``config.json`` (at ``revision``) lies on this machine, found without
    building or asking the network; None where there is none at hand (an embedded model not
    built yet, a ``.gguf`` file, a hub model not in the cache, a name that is none of these)."""
    model = str(model)
    if model.startswith("embedded:"):
        from coupling_utils.models import zoo

        try:
            folder = zoo.entry_path(model)
        except zoo.ZooError:  # not a zoo name: loading says so
            return None
    elif Path(model).expanduser().exists():
        folder = Path(model).expanduser()
    elif Path(model).suffix == ".gguf":
        return None
    else:
        return cached_hub_config(model, revision)
    found = checkpoint_folder(folder, revision) if folder.is_dir() else None
    return found / "config.json" if found is not None and (found / "config.json").is_file() else None


def cached_hub_config(model: str, revision: str | None) -> Path | None:
    """A hub model's cached ``config.json`` (the snapshot ``revision`` names, ``main`` for none),
    or None; also how the store finds the commit a hub model's measurements are keyed by
    (:func:`coupling_utils.models.identity.model_identity`)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json", revision=revision or "main")
    except Exception:  # noqa: BLE001 - not a repo id (or no hub library): nothing at hand
        return None
    return Path(found) if isinstance(found, str) else None


def offline_config(model: str, revision: str | None = None) -> dict[str, Any] | None:
    """``model``'s config (at ``revision``) as a dict, read from :func:`config_file`; None when
    there is none at hand or it is not a JSON object (loading then says what is wrong)."""
    path = config_file(model, revision)
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config its text model reads: ``text_config`` of a multimodal model (as
    ``get_text_config()`` gives the loader), else the config itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config
