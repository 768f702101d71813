"""What ``coupling-book measure`` is given, checked: the prompts (:func:`read_prompts`), each
MODEL named and its ``--revision`` (:func:`check_model_reference`; a local model from its files,
:mod:`coupling_utils.models.local_model`), token-id prompts against
each model's vocabulary where its config can be read without loading it (:func:`check_token_ids`),
all before anything is written, and the options and text prompts against each model once
loaded (:func:`check_options_fit`, each job's check: a tokenizer for text); a bad one is a
:class:`MeasureError` that names it and says what to give instead (exit 2).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coupling_utils.chapters.checks import FitTerms, ParameterError, check_blocks_and_k, check_revision
from coupling_utils.measurement import Job, Settings

__all__ = [
    "MeasureError",
    "DEFAULT_K",
    "read_prompts",
    "check_model_reference",
    "check_token_ids",
    "check_options_fit",
]

DEFAULT_K = (10, 30, 50)  # the K values measured when --k is not given


class MeasureError(ValueError):
    """Bad input to ``coupling-book measure`` (prompts file, model list, settings)."""


def read_prompts(path: str | Path | None, *, n: int = 6) -> dict[str, Any]:
    """``{id: prompt}`` from a file, or the project's prompt set (``n`` prompts and the demo prompt).

    ``.txt``: one prompt per line (blank lines skipped), ids ``p0, p1, ...``; ``.csv``: a ``text``
    column and optionally an ``id`` column; ``.json``: a list or an ``{id: prompt}`` mapping, each
    prompt a string or a list of token ids (for a model without a tokenizer).
    """
    if path is None:
        from coupling_utils.analysis.data import load_prompts

        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MeasureError(
                f"--n-prompts must be 0 or more (prompts from the project's set, besides the demo prompt), "
                f"got {n!r}; or give your own prompts with --prompts FILE"
            )

        table = load_prompts(n=n, include_demo=True)
        return dict(zip(table["id"], table["text"]))
    path = Path(path)
    if not path.is_file():
        raise MeasureError(
            f"prompts file {path} does not exist"
            + (" (it is a folder)" if path.is_dir() else "")
            + "; give a .txt, .csv or .json file with --prompts"
        )
    text = _prompt_text(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MeasureError(
                f"prompts file {path}: not valid JSON ({exc}); give a JSON list of prompts or an "
                "{id: prompt} mapping (or a .txt file, one prompt per line)"
            ) from exc
        items = (
            list(data.items())
            if isinstance(data, dict)
            else list(enumerate(data))
            if isinstance(data, list)
            else None
        )
        if items is None:
            raise MeasureError(f"{path}: expected a list of prompts or an {{id: prompt}} mapping")
        out = {}
        for key, p in items:
            pid = str(key) if isinstance(data, dict) else f"p{key}"
            out[pid] = _json_prompt(path, pid, p)
    elif suffix == ".csv":
        out = _csv_prompts(path, text)
    else:
        lines = [line.strip() for line in text.splitlines()]
        out = {f"p{i}": line for i, line in enumerate(x for x in lines if x)}
    if not out:
        raise MeasureError(f"{path} holds no prompts")
    return out


def _csv_prompts(path: Path, text: str) -> dict[str, str]:
    """A prompts CSV's ``{id: text}``: a ``text`` column, optionally an ``id`` one (unique)."""
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    if not rows or "text" not in rows[0]:
        raise MeasureError(f"{path}: a prompts CSV needs a 'text' column (and optionally 'id')")
    ids = [str(r.get("id") or f"p{i}") for i, r in enumerate(rows)]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise MeasureError(f"prompts file {path}: prompt ids must be unique; given more than once: {twice}")
    return {i: r["text"] for i, r in zip(ids, rows)}


def _prompt_text(path: Path) -> str:
    """A prompts file's text: UTF-8, a leading byte-order mark dropped (else it is measured as
    tokens and hides the CSV header); any other encoding is refused, named."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MeasureError(
            f"prompts file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start} cannot be decoded); save it as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path.name} "
            f"> prompts-utf8{path.suffix}`"
        ) from None
    except OSError as exc:
        raise MeasureError(f"cannot read prompts file {path}: {exc.strerror}") from None


def _json_prompt(path: Path, pid: str, p):
    if isinstance(p, str) and p.strip():
        return p
    if (
        isinstance(p, list)
        and p
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)
    ):
        import torch

        return torch.tensor([p], dtype=torch.long)
    raise MeasureError(f"{path}: prompt {pid!r} must be a non-empty string or a list of token ids, got {p!r}")


def check_model_reference(model: str, revisions: Sequence[str] = ()) -> None:
    """Refuse, before anything is written, a MODEL known to name nothing: an ``embedded:`` name not
    in the zoo, or a path (``./dir``, ``/dir``, ``~/dir``, ``x.gguf``) where nothing exists; and
    a ``--revision`` that an embedded model's recipe does not save, as a chapter refuses it
    (:func:`~coupling_utils.chapters.checks.check_revision`; nothing is built); any other
    reference as its files say here (:func:`~coupling_utils.models.local_model.check_model_files`,
    as every chapter checks its models): a local model that no copy of its files makes
    measurable, a hub model whose cached config names an architecture the engine has no row for."""
    from coupling_utils.models.loading import EMBEDDED

    model = str(model)  # a path may come as a Path
    if model.startswith(EMBEDDED):
        from coupling_utils.models import zoo

        try:
            entry, member = zoo._split(model)  # the zoo's own check of a name (an entry, a family member)
        except zoo.ZooError as exc:
            raise MeasureError(f"MODEL {model}: {exc}") from None
        if entry.is_family and member is None:  # a family is several models: it has no weights of its own
            names = ", ".join(f"{model}/{m}" for m in entry.members())
            raise MeasureError(f"MODEL {model} is a family of models, not one; name its members: {names}")
        try:
            for revision in revisions:
                check_revision("--revision", str(revision), model, "leave --revision out for the final model")
        except ParameterError as exc:
            raise MeasureError(str(exc)) from None
    else:  # a local path, a path where nothing is, a hub id: each as its files say here
        from coupling_utils.models.local_model import LocalModelError, check_model_files

        try:
            check_model_files(model, revisions, label=f"MODEL {model}", revision_option="--revision")
        except LocalModelError as exc:
            raise MeasureError(str(exc)) from None


def check_token_ids(prompts: Mapping[str, Any], model: str, revision: str | None, source: Any = None) -> None:
    """Refuse, before anything loads, a token-id prompt with an id outside ``model``'s vocabulary
    (at ``revision``), naming ``source`` (the prompts file), the prompt, the id, the vocabulary
    size and the fix; where the vocabulary size cannot be read without loading the model
    (:func:`vocabulary_size`: None), measuring checks it (it loads the model anyway)."""
    given = [(pid, p.tolist()) for pid, p in prompts.items() if hasattr(p, "tolist")]
    vocab = vocabulary_size(model, revision) if given else None
    if vocab is None:
        return
    for pid, ids in given:
        flat = [i for row in ids for i in (row if isinstance(row, list) else [row])]
        bad = [i for i in flat if not 0 <= i < vocab]
        if bad:
            where = f"prompts file {source}: " if source else ""
            at = f" at {revision}" if revision else ""
            raise MeasureError(
                f"{where}prompt {pid!r} has token id{'s' if bad[1:] else ''} {', '.join(map(str, bad[:5]))}, "
                f"outside the vocabulary of MODEL {model}{at} ({vocab} ids, 0..{vocab - 1}); give ids "
                "that model's tokenizer makes, or the prompt as text"
            )


def vocabulary_size(model: str, revision: str | None = None) -> int | None:
    """``model``'s vocabulary size, read without loading it, building it or asking the network:
    an embedded run's recipe, else its config at hand
    (:func:`~coupling_utils.models.model_config.offline_config`: a built embedded model's, a
    local folder's at ``revision``, a hub model's in the Hugging Face cache; its text model's
    where it has one); None if none is at hand (a ``.gguf`` file, a hub
    model not downloaded yet, an embedded model not built yet)."""
    from coupling_utils.models.model_config import offline_config, text_config

    model = str(model)
    if model.startswith("embedded:"):
        from coupling_utils.models import zoo

        spec = zoo.training_spec(model)
        if spec is not None and not isinstance(spec, dict) and hasattr(spec, "vocab_size"):
            return int(spec.vocab_size)
    config = offline_config(model, revision) or {}
    size = text_config(config).get("vocab_size", config.get("vocab_size"))
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def check_options_fit(lm, *, settings: Settings, job: Job) -> None:
    """The options against ``job``'s model loaded (``lm``), before it is measured: a MeasureError
    that names the option (``--layers``, ``--k``, ``--last-block``), the model and its depth or
    width, and what to choose (:func:`~coupling_utils.chapters.checks.check_blocks_and_k`); a
    vision model is refused, as measure's prompts are text or token ids, and text prompts for a
    model without a tokenizer."""
    model = job.labels["model"]
    _refuse_vision(lm, model)
    _refuse_text_without_tokenizer(lm, model, job.prompts)
    default = tuple(settings.k) == DEFAULT_K
    terms = FitTerms(
        k="--k",
        last_block="--last-block",
        all_blocks="--layers",
        negative=True,
        k_note=" (without --k, K is 10, 30 and 50)" if default else "",
    )
    try:
        check_blocks_and_k(
            lm, model, {"--layers": settings.layers or ()}, settings.k, settings.last_block, terms
        )
    except ParameterError as exc:
        raise MeasureError(str(exc)) from None


def _refuse_text_without_tokenizer(lm, model: str, prompts) -> None:
    """Text prompts need the model's tokenizer: a model saved without one is refused, naming
    the prompts that are text and the fix (token ids, or the tokenizer's files)."""
    if lm.tokenizer is not None:
        return
    items = prompts.items() if isinstance(prompts, Mapping) else enumerate(prompts)
    texts = [str(pid) for pid, p in items if isinstance(p, str)]
    if texts:
        raise MeasureError(
            f"MODEL {model} has no tokenizer (none was saved with it), so its text prompts "
            f"({', '.join(texts[:5])}{', ...' if texts[5:] else ''}) cannot become token ids; give the "
            "prompts as token ids (--prompts ids.json: a JSON list of id lists, e.g. [[1, 5, 9]]), or save "
            "the model's tokenizer into its folder (tokenizer.save_pretrained)"
        )


def _refuse_vision(lm, model: str) -> None:
    """A vision transformer (its config has an image size) is refused, with f04's command for it."""
    if getattr(getattr(lm.model, "config", None), "image_size", None) is not None:
        # a training run with checkpoints is f04's model; any other ViT one of its hub_models
        run = model.startswith("embedded:") and "/" not in model or (Path(model) / "revisions").is_dir()
        raise MeasureError(
            f"MODEL {model} is a vision transformer (model type {lm.arch!r}): it reads images, and "
            "`coupling-book measure` measures text prompts or token ids only (it has no option for "
            "images); measure it on MNIST digits in chapter f04 instead: `coupling-book run f04 -p "
            + (f"model={model}`" if run else f"'hub_models=[{model}]'`")
        )
