"""Load a model for measurement: frozen, in eval mode, with its tokenizer and its provenance.

One entry point, :func:`load_model`, for every source the project uses:

- a Hugging Face hub id (``"EleutherAI/pythia-1.4b"``, ``revision="step1000"``), served from the
  local cache when offline; a missing model gives :class:`ModelNotFoundError` that says how to
  get it, never a hub-client stack trace;
- a local ``save_pretrained`` directory (the same code path); ``revision`` then names the
  subdirectory ``<dir>/revisions/<revision>/`` (the layout the training runs write; "main" or
  "final" without such a subdirectory means ``<dir>`` itself);
- a ``.gguf`` file (dequantised by ``transformers``), or a directory holding exactly one;
- ``"embedded:<name>"``: a model shipped with the project, resolved by ``coupling_utils.models.zoo``.

``random_init=True`` gives the untrained twin: same config, weights from the model's own
initialiser under ``seed`` (deterministic).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coupling_utils.engine.architectures import find_architecture, transformer_blocks

__all__ = ["LoadedModel", "load_model", "ModelNotFoundError", "DTYPES", "resolve_device"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EMBEDDED = "embedded:"
FINAL_REVISIONS = ("main", "final")  # local directories: the final checkpoint is the directory itself


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local path nor available from the hub (or its cache)."""


@dataclass
class LoadedModel:
    """A frozen eval-mode model with what is needed to measure it and to say what it was."""

    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # tokenizer, image processor, or None
    name: str
    revision: str | None
    dtype: str
    arch: str  # config.model_type, the key of its row in architectures.ARCHITECTURES
    n_layers: int
    d_model: int
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __repr__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return (
            f"LoadedModel({self.name}{rev}, arch={self.arch}, layers={self.n_layers}, d={self.d_model}, "
            f"dtype={self.dtype}, device={self.device})"
        )


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` means CUDA when available, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~", "\\"))
        or name.endswith(".gguf")
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def _hub_missing(name: str, revision: str | None, cause: BaseException) -> ModelNotFoundError:
    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    rev = f" --revision {revision}" if revision else ""
    home = os.environ.get("HF_HOME", os.path.join("~", ".cache", "huggingface"))
    reason = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the hub could not provide it"
    first = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else type(cause).__name__
    return ModelNotFoundError(
        f"model {name!r}{' revision ' + repr(revision) if revision else ''} is not a local path and is not "
        "in "
        f"the Hugging Face cache under HF_HOME={home!r}; {reason}. To get it: on a connected machine run "
        f"`huggingface-cli download {name}{rev}` and copy the cache here (or set HF_HOME to a cache that has "
        f"it), or pass a local save_pretrained directory. ({type(cause).__name__}: {first})"
    )


def _local_source(path: Path, revision: str | None):
    """(directory, gguf file name or None) for a local model path."""
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(
                f"{path} is a file but not a .gguf model; pass a save_pretrained directory or a .gguf file"
            )
        if revision:
            raise ValueError(f"revision={revision!r} makes no sense for a single GGUF file ({path})")
        return path.parent, path.name
    if revision:
        sub = path / "revisions" / str(revision)
        if not sub.is_dir() and str(revision) in FINAL_REVISIONS:
            sub = path  # "main"/"final": the directory itself holds the final checkpoint
        if not sub.is_dir():
            have = (
                sorted(p.name for p in (path / "revisions").iterdir())
                if (path / "revisions").is_dir()
                else []
            )
            raise ModelNotFoundError(
                f"no revision {revision!r} in {path}: expected the directory {sub}"
                + (
                    f"; available revisions: {', '.join(have)}"
                    if have
                    else "; this directory has no revisions/"
                )
            )
        path = sub
    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0].name
    raise ModelNotFoundError(
        f"{path} holds no model: expected config.json (a save_pretrained directory) or exactly one .gguf file"
        + (f", found {len(ggufs)} .gguf files" if ggufs else "")
    )


def _unknown_model_type(directory: Path) -> None:
    """Raise the table's UnsupportedArchitectureError if config.json names a model_type."""
    import json
    import types

    try:
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return
    if model_type:
        find_architecture(types.SimpleNamespace(model_type=model_type))


def _model_class(config, row):
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    if row.modality == "vision" or row.causal != "causal" and not getattr(config, "is_decoder", False):
        return transformers.AutoModel
    return transformers.AutoModelForCausalLM


def _preprocessor(source: str, row, revision, gguf_file):
    """The tokenizer (or, for vision models, the image processor); None if there is neither."""
    import transformers

    kinds = [transformers.AutoTokenizer, transformers.AutoImageProcessor]
    if row.modality == "vision":
        kinds.reverse()
    for kind in kinds:
        kwargs = {"revision": revision} if revision else {}
        if gguf_file and kind is transformers.AutoTokenizer:
            kwargs["gguf_file"] = gguf_file
        elif gguf_file:
            continue
        try:
            return kind.from_pretrained(source, **kwargs)
        except Exception:  # noqa: BLE001 - many loaders, many error types; "none available" is a valid answer
            continue
    return None


def load_model(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "auto",
    random_init: bool = False,
    seed: int = 0,
) -> LoadedModel:
    """Load a model (hub id, local directory, .gguf file or "embedded:<name>"), frozen and in eval mode."""
    import transformers

    torch_dtype = _dtype(dtype)
    dtype_name = next(k for k, v in DTYPES.items() if v == torch_dtype)
    target = resolve_device(device)
    name = os.fspath(name_or_path)
    hub_revision, gguf_file, source_kind = None, None, "hub"

    if name.startswith(EMBEDDED):
        from coupling_utils.models import zoo  # lazy: the zoo is optional for everything else

        source = Path(zoo.resolve(name[len(EMBEDDED) :], revision=revision))
        directory, gguf_file = _local_source(source, revision)
        source, source_kind = str(directory), "embedded"
    elif Path(name).expanduser().exists():
        directory, gguf_file = _local_source(Path(name).expanduser().resolve(), revision)
        source, source_kind = str(directory), ("gguf" if gguf_file else "local")
    elif _looks_like_path(name):
        raise ModelNotFoundError(
            f"no such model path: {name!r} (neither a directory nor a .gguf file exists there)"
        )
    else:
        source, hub_revision = name, revision

    load_kwargs = {}
    if hub_revision:
        load_kwargs["revision"] = hub_revision
    if gguf_file:
        load_kwargs["gguf_file"] = gguf_file
    try:
        config = transformers.AutoConfig.from_pretrained(source, **load_kwargs)
    except (OSError, ValueError) as e:
        if source_kind == "hub":
            raise _hub_missing(name, revision, e) from None
        _unknown_model_type(Path(source))  # transformers does not know it: say what this project supports
        raise
    row = find_architecture(config)  # unsupported architectures fail here, before any weights are read
    cls = _model_class(config, row)

    if random_init:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls._from_config(config, dtype=torch.float32)
        model = model.to(torch_dtype)
    else:
        try:
            model = cls.from_pretrained(source, dtype=torch_dtype, **load_kwargs)
        except OSError as e:
            if source_kind == "hub":
                raise _hub_missing(name, revision, e) from None
            raise
    model = model.to(target).eval().requires_grad_(False)

    tokenizer = _preprocessor(source, row, hub_revision, gguf_file)
    blocks = transformer_blocks(model)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    d_model = int(text_config.hidden_size)
    provenance = {
        "name": name,
        "revision": revision,
        "source": source_kind,
        "path": source,
        "gguf_file": gguf_file,
        "commit": getattr(config, "_commit_hash", None),
        "model_type": config.model_type,
        "architecture": row.name,
        "class": type(model).__name__,
        "dtype": dtype_name,
        "device": str(target),
        "random_init": bool(random_init),
        "seed": int(seed) if random_init else None,
        "n_parameters": int(sum(p.numel() for p in model.parameters())),
        "n_layers": len(blocks),
        "d_model": d_model,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        revision=revision,
        dtype=dtype_name,
        arch=config.model_type,
        n_layers=len(blocks),
        d_model=d_model,
        provenance=provenance,
    )
