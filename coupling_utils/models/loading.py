"""Load a model for measurement: frozen, in eval mode, with its tokenizer and its provenance.

One entry point, :func:`load_model`, for every source the project uses:

- a Hugging Face hub id (``"EleutherAI/pythia-1.4b"``, ``revision="step1000"``), served from the
  local cache when offline; a missing model gives :class:`ModelNotFoundError` that says how to
  get it (``hf download``, ``HF_HUB_CACHE``), a gated one :class:`GatedModelError` (how to log in);
- a local ``save_pretrained`` directory (the same code path); ``revision`` then names the
  subdirectory ``<dir>/revisions/<revision>/`` (the layout the training runs write; "main" or
  "final" without such a subdirectory means ``<dir>`` itself);
- a ``.gguf`` file (dequantised by ``transformers``), or a directory holding exactly one;
- ``"embedded:<name>"``: a model shipped with the project, resolved by ``coupling_utils.models.zoo``.

At the paper's scale: ``quantization="4bit"``/``"8bit"`` loads the weights through bitsandbytes
(CUDA GPUs only; the compute dtype is ``dtype``), ``device_map`` places the model as
``transformers`` does (``"auto"`` spreads it over the GPUs). The engine then differentiates a
dequantised copy of one block at a time (``engine.blocks``) and returns fp32 Jacobians.

``random_init=True`` gives the untrained twin: same config, weights from the model's own
initialiser under ``seed`` (deterministic for a given device type and dtype), built directly in
``dtype`` on the target device, so a twin of a 14B model never exists as an fp32 host copy.

On a CPU, ``device="auto"`` with ``dtype`` bfloat16 or float16 loads float32 instead and says so
once: half precision is slow there, and float16 overflows in LayerNorm statistics and in
forward-mode products (NaN Jacobians and trajectories).

The tokenizer (or image processor) is loaded whenever the source has one; when it cannot be,
the error says why and how to fix it (a missing ``sentencepiece``/``protobuf`` for a
SentencePiece-only tokenizer, a missing Pillow for an image processor), never silently None.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coupling_utils.engine.architectures import find_architecture, transformer_blocks
from coupling_utils.files import data_dir
from coupling_utils.models.local_model import looks_like_path

__all__ = [
    "LoadedModel",
    "load_model",
    "ModelNotFoundError",
    "GatedModelError",
    "MissingDependencyError",
    "PreprocessorError",
    "QuantizationError",
    "DamagedModelError",
    "DTYPES",
    "QUANTIZATIONS",
    "resolve_device",
    "gated_repos",
    "data_file",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = (None, "8bit", "4bit")
# Devices bitsandbytes' k-bit loading is offered on. Its CPU kernels exist but are slow and not what
# the paper's setting means; tests widen this tuple to run the quantized path on a CPU.
QUANTIZATION_DEVICES = ("cuda",)
EMBEDDED = "embedded:"
FINAL_REVISIONS = ("main", "final")  # local directories: the final checkpoint is the directory itself
LOGIN = "`hf auth login` (or set HF_TOKEN)"
_NOTICES: set[str] = set()


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local path nor available from the hub (or its cache)."""


class GatedModelError(ModelNotFoundError):
    """The hub refused a gated repo: its licence is not accepted, or no token is logged in."""


class MissingDependencyError(ImportError):
    """A package this model needs (sentencepiece, protobuf, Pillow, bitsandbytes) is not installed."""


class PreprocessorError(RuntimeError):
    """The source has a tokenizer or image processor, but it could not be loaded (cause chained)."""


class DamagedModelError(ValueError):
    """A local model's weight files cannot be read: truncated or damaged (cause chained)."""


class QuantizationError(RuntimeError):
    """4-bit/8-bit loading was asked for where bitsandbytes cannot provide it (no CUDA GPU)."""


def data_file(name: str) -> Path | None:
    """``name`` in the project's data folder (:func:`coupling_utils.files.data_dir`), or None.

    None when the file or the folder is missing (an install without the repository's data):
    what it holds (e.g. which repos are gated) then only improves messages.
    """
    try:
        path = data_dir() / name
    except FileNotFoundError:
        return None
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def gated_repos() -> dict[str, str]:
    """``{repo id: access note}`` of the hub repos known to be gated (``data/gated_repos.csv``)."""
    path = data_file("gated_repos.csv")
    if path is None:
        return {}
    with open(path, newline="") as f:
        return {r["model_id"]: r["access"] for r in csv.DictReader(f) if r["gated"].strip().lower() == "true"}


def _missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that cannot be imported (not installed, or blocked)."""
    out = []
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            out.append(name)
    return out


def _notice_once(text: str) -> None:
    if text not in _NOTICES:
        _NOTICES.add(text)
        print(f"note: {text}")


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


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _hub_error(name: str, revision: str | None, cause: BaseException) -> ModelNotFoundError:
    """The hub could not provide ``name``: say why (gated, offline, not found) and how to get it."""
    from huggingface_hub.errors import GatedRepoError

    rev = f" --revision {revision}" if revision else ""
    what = f"model {name!r}" + (f" revision {revision!r}" if revision else "")
    first = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else type(cause).__name__
    page = f"https://huggingface.co/{name}"
    if any(isinstance(e, GatedRepoError) for e in _chain(cause)):
        return GatedModelError(
            f"{what} is gated on the Hugging Face hub and this machine has no access to it. Accept its "
            f"licence at {page} with your account, then log in here with {LOGIN} and retry; on a machine "
            f"without network, run `hf download {name}{rev}` where you are logged in and copy the cache "
            "(HF_HUB_CACHE)."
        )
    from huggingface_hub import constants

    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    offline = constants.HF_HUB_OFFLINE or any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in flags
    )
    reason = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the hub could not provide it"
    gated = gated_repos().get(name)
    login = (
        f" It is gated ({gated}): accept its licence at {page} and log in with {LOGIN} before downloading."
        if gated
        else ""
    )
    return ModelNotFoundError(
        f"{what} is not a local path and is not in the Hugging Face cache HF_HUB_CACHE="
        f"{constants.HF_HUB_CACHE!r}; {reason}. To get it: on a connected machine run "
        f"`hf download {name}{rev}` and copy the cache here (or point HF_HUB_CACHE at a cache that has "
        f"it), or pass a local save_pretrained directory.{login} ({type(cause).__name__}: {first})"
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
    from coupling_utils.models.local_model import known_architecture, read_config

    config = read_config(directory / "config.json")
    if isinstance(config, dict) and config.get("model_type"):
        known_architecture(config)


def _model_class(config, row):
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    if row.modality == "vision" or row.causal != "causal" and not getattr(config, "is_decoder", False):
        return transformers.AutoModel
    return transformers.AutoModelForCausalLM


def _hub_commit(repo: str, revision: str | None) -> str | None:
    """The commit of the cached snapshot the config was read from (``snapshots/<commit>/``)."""
    from transformers.utils.hub import cached_file

    path = cached_file(repo, "config.json", revision=revision, _raise_exceptions_for_missing_entries=False)
    if path is None or Path(path).parent.parent.name != "snapshots":
        return None
    return Path(path).parent.name


def _precision(torch_dtype: torch.dtype, device, target: torch.device) -> torch.dtype:
    """float32 instead of half precision on a CPU when the device was left to "auto" (with a notice)."""
    if target.type != "cpu" or torch_dtype == torch.float32:
        return torch_dtype
    name = next(k for k, v in DTYPES.items() if v == torch_dtype)
    if str(device) == "auto":
        _notice_once(
            f"no GPU: loading in float32 instead of {name} (half precision on a CPU is slow, and float16 "
            "overflows in LayerNorm statistics and forward-mode products); in Python, load_model(..., "
            "device='cpu') keeps it"
        )
        return torch.float32
    if torch_dtype == torch.float16:
        warnings.warn(
            "float16 on a CPU: LayerNorm statistics and forward-mode products overflow there (NaN "
            "Jacobians or trajectories); use dtype='float32' (or bfloat16)",
            stacklevel=3,
        )
    return torch_dtype


def _quantization_config(quantization: str, torch_dtype: torch.dtype, target: torch.device):
    """transformers' BitsAndBytesConfig for ``quantization``, after checking where it can run."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if target.type not in QUANTIZATION_DEVICES:
        raise QuantizationError(
            f"quantization={quantization!r} loads the weights through bitsandbytes, which needs a CUDA GPU; "
            f"the target device here is {target} (torch.cuda.is_available() = {torch.cuda.is_available()}). "
            "On a CPU load without it (quantization=None, dtype='float32'); on a GPU machine install a CUDA "
            'build of torch (make venv TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").'
        )
    if _missing("bitsandbytes"):
        raise MissingDependencyError(
            f"quantization={quantization!r} needs bitsandbytes, which is not installed: "
            "pip install bitsandbytes (or pip install -e '.[gpu]')"
        )
    import transformers

    if quantization == "8bit":
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    # transformers' defaults for load_in_4bit (the authors' code loads 4-bit with defaults); compute in dtype
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch_dtype)


def _random_init(cls, config, torch_dtype: torch.dtype, target: torch.device, seed: int):
    """The model's own initialiser under ``seed``, run directly in ``torch_dtype`` on ``target``."""
    cuda = [target.index or 0] if target.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(target):
        torch.manual_seed(seed)
        return cls._from_config(config, dtype=torch_dtype)


@dataclass(frozen=True)
class _Source:
    """Where a model reference's files are: what ``from_pretrained`` reads, and of which kind."""

    path: str  # a hub id or a local directory
    kind: str  # "hub", "embedded", "local" or "gguf"
    hub_revision: str | None = None
    gguf_file: str | None = None

    def load_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.hub_revision:
            kw["revision"] = self.hub_revision
        if self.gguf_file:
            kw["gguf_file"] = self.gguf_file
        return kw


def _find_source(name: str, revision: str | None) -> _Source:
    """The files behind ``name``: an embedded model (built or found by the zoo), a local
    directory or .gguf file, or a hub id (whose revision is the hub's)."""
    if name.startswith(EMBEDDED):
        from coupling_utils.models import zoo  # lazy: the zoo is optional for everything else

        source = Path(zoo.resolve(name[len(EMBEDDED) :], revision=revision))
        directory, gguf_file = _local_source(source, revision)
        return _Source(str(directory), "embedded", None, gguf_file)
    if Path(name).expanduser().exists():
        directory, gguf_file = _local_source(Path(name).expanduser().resolve(), revision)
        return _Source(str(directory), "gguf" if gguf_file else "local", None, gguf_file)
    if looks_like_path(name):
        raise ModelNotFoundError(
            f"no such model path: {name!r} (neither a directory nor a .gguf file exists there)"
        )
    return _Source(name, "hub", revision, None)


def _check_options(quantization: str | None, random_init: bool, device_map) -> None:
    if quantization is not None and random_init:
        raise ValueError(
            "random_init=True builds the untrained twin in dtype, unquantized (its weights are random: "
            "quantizing them adds nothing); pass quantization=None for the twin"
        )
    if device_map is not None and random_init:
        raise ValueError("random-init twins are built on one device: pass device=..., not device_map")


def _read_config(src: _Source, name: str, revision: str | None):
    """The model's transformers config, with the hub's or this project's reason when it fails."""
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(src.path, **src.load_kwargs())
    except (OSError, ValueError, AttributeError, TypeError) as e:  # the last two: a config not a JSON object
        if src.kind == "hub" and isinstance(e, OSError):
            raise _hub_error(name, revision, e) from e
        if src.kind != "hub":
            _unknown_model_type(
                Path(src.path)
            )  # transformers does not know it: say what this project supports
            if src.gguf_file and "support" not in str(e):  # read from a (short) GGUF's header
                raise _damaged(name, src, e) from e
            why = _local_problem(src)
            if why:
                raise DamagedModelError(why) from e
        raise


def _weights(cls, config, src: _Source, how: dict[str, Any], name: str, revision: str | None):
    """The model with its weights (trained, or a random-init twin), moved where ``how`` says, frozen
    and in eval mode. ``how``: torch_dtype, target, seed, random_init, quant_config, device_map."""
    from safetensors import SafetensorError

    placement = how["device_map"]
    if how["random_init"]:
        model = _random_init(cls, config, how["torch_dtype"], how["target"], how["seed"])
    else:
        load_kwargs = src.load_kwargs()
        if how["quant_config"] is not None:
            load_kwargs["quantization_config"] = how["quant_config"]
            placement = placement if placement is not None else {"": how["target"]}
        if placement is not None:
            load_kwargs["device_map"] = placement
        try:
            model = cls.from_pretrained(src.path, dtype=how["torch_dtype"], **load_kwargs)
        except OSError as e:
            if src.kind == "hub":
                raise _hub_error(name, revision, e) from e
            raise _damaged(name, src, e) from e
        except (ValueError, RuntimeError, SafetensorError) as e:  # a short GGUF or safetensors file
            if src.kind == "hub" or isinstance(e, (QuantizationError, torch.OutOfMemoryError)):
                raise
            raise _damaged(name, src, e) from e
    if placement is None:
        model = model.to(how["target"])
    return model.eval().requires_grad_(False)


def _local_problem(src: _Source) -> str | None:
    """What a local folder's files say is wrong (no weights, a config that is not a UTF-8 JSON
    object, a weight file that cannot be opened: :mod:`coupling_utils.models.local_model`)."""
    if src.kind == "hub" or src.gguf_file:
        return None
    from coupling_utils.models.local_model import local_model_problem

    return local_model_problem(src.path)


def _damaged(name: str, src: _Source, cause: BaseException) -> DamagedModelError:
    why = _local_problem(src)
    if why:  # the file and the fix, as the folder's files say them
        return DamagedModelError(why)
    where = Path(src.path) / src.gguf_file if src.gguf_file else Path(src.path)
    first = (str(cause).strip().splitlines() or [""])[0]
    return DamagedModelError(
        f"cannot read the weights of {name} at {where} ({type(cause).__name__}: {first}); a file is "
        "probably truncated or damaged (an interrupted download, copy or save): copy or save it again"
    )


def _width(config) -> int:
    """The residual width d of a (possibly multimodal) config."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text_config.hidden_size)


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def load_model(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "auto",
    random_init: bool = False,
    seed: int = 0,
    quantization: str | None = None,
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load a model (hub id, local directory, .gguf file or "embedded:<name>"), frozen and in eval mode.

    ``dtype``: the weights' dtype (the compute dtype under ``quantization``); on a CPU with
    ``device="auto"`` half precision becomes float32 (one notice). ``quantization``: None,
    ``"8bit"`` or ``"4bit"`` (bitsandbytes, CUDA only). ``device_map``: passed to
    ``from_pretrained`` (e.g. ``"auto"``); the model is then not moved to ``device``.
    """
    requested = _dtype(dtype)
    target = resolve_device(device)
    torch_dtype = requested if quantization else _precision(requested, device, target)
    name = os.fspath(name_or_path)
    _check_options(quantization, random_init, device_map)
    quant_config = _quantization_config(quantization, torch_dtype, target) if quantization else None
    src = _find_source(name, revision)
    if quantization and src.gguf_file:
        raise ValueError(
            f"quantization={quantization!r} does not apply to a GGUF file (it is dequantised on load)"
        )
    config = _read_config(src, name, revision)
    row = find_architecture(config)  # unsupported architectures fail here, before any weights are read
    how = dict(
        torch_dtype=torch_dtype, target=target, seed=seed, random_init=random_init,
        quant_config=quant_config, device_map=device_map,
    )  # fmt: skip
    model = _weights(_model_class(config, row), config, src, how, name, revision)
    from coupling_utils.models.preprocessors import load_preprocessor

    tokenizer = load_preprocessor(
        name, src.path, row, src.hub_revision, src.gguf_file, local=src.kind != "hub"
    )
    n_layers, d_model = len(transformer_blocks(model)), _width(config)
    asked = dict(
        name=name, revision=revision, dtype=_dtype_name(torch_dtype), dtype_requested=_dtype_name(requested),
        quantization=quantization,
        device_map=device_map, random_init=random_init, seed=seed,
    )  # fmt: skip
    provenance = _provenance(model, config, row, src, asked, n_layers, d_model)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        revision=revision,
        dtype=provenance["dtype"],
        arch=config.model_type,
        n_layers=n_layers,
        d_model=d_model,
        provenance=provenance,
    )


def _provenance(model, config, row, src: _Source, asked: dict, n_layers: int, d_model: int) -> dict:
    """What was loaded, from where, how: the ``provenance`` of a :class:`LoadedModel`."""
    import transformers

    device_map = asked["device_map"]
    return {
        "name": asked["name"],
        "revision": asked["revision"],
        "source": src.kind,
        "path": src.path,
        "gguf_file": src.gguf_file,
        "commit": getattr(config, "_commit_hash", None)
        or (_hub_commit(src.path, src.hub_revision) if src.kind == "hub" else None),
        "model_type": config.model_type,
        "architecture": row.name,
        "class": type(model).__name__,
        "dtype": asked["dtype"],
        "dtype_requested": asked["dtype_requested"],
        "quantization": asked["quantization"],
        "device": str(next(model.parameters()).device),
        "device_map": device_map if isinstance(device_map, (str, type(None))) else dict(device_map),
        "random_init": bool(asked["random_init"]),
        "seed": int(asked["seed"]) if asked["random_init"] else None,
        "n_parameters": int(sum(p.numel() for p in model.parameters())),
        "n_layers": n_layers,
        "d_model": d_model,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
