"""Checks of parameter values: one function per kind of value, each raising :class:`ParameterError`.

A failed check names the parameter, what it must be and the value it got, so a notebook, a
profile or a ``-p`` override that is wrong fails before any work with a message that says how
to fix it. The chapters' parameter classes (:mod:`coupling_utils.chapters.params`) attach one of
these to every field; :data:`COMMON` holds the checks of names that mean the same thing in every
chapter (``model``, ``dtype``, ``k``, ...). What only a loaded model can tell (its depth, its
width) is checked by each planned job (:func:`with_check`), with :func:`check_blocks_and_k` for
the blocks and K of a chapter or of ``coupling-book measure``; what an embedded run's recipe
tells before it is built, its checkpoints, by :func:`check_revisions` (every chapter parameter that
names a revision, :data:`REVISIONS`) and :func:`check_revision` (``measure --revision`` too); the
block range and :class:`ParameterError` live in :mod:`coupling_utils.analysis.block_range`, below
the chapters.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coupling_utils.analysis.block_range import (
    ParameterError,
    check_block,
    check_blocks,
    check_state,
    subject,
)

if TYPE_CHECKING:
    from coupling_utils.measurement import Job

__all__ = [
    "ParameterError",
    "NotMeasured",
    "Check",
    "check_int",
    "check_float",
    "check_bool",
    "check_str",
    "check_choice",
    "check_list",
    "check_model",
    "check_top_k",
    "check_block",
    "check_blocks",
    "check_state",
    "subject",
    "FitTerms",
    "check_blocks_and_k",
    "with_check",
    "refuse_misfits",
    "check_revision",
    "check_revisions",
    "check_local_models",
    "REVISIONS",
    "integer",
    "number",
    "choice",
    "text",
    "list_of",
    "k_values",
    "embedded_family",
    "vit_token",
    "boolean",
    "block",
    "COMMON",
    "DTYPES",
    "METHODS",
    "HOWS",
    "STEP",
]


class NotMeasured(RuntimeError):
    """A job of a chapter's plan has no result (it failed, or was not measured yet): the chapter's
    ``run`` raises it, naming the job and the reason, rather than show a partial story."""


def _fail(name: str, message: str, value: Any) -> ParameterError:
    return ParameterError(f"{subject(name)} {message}, got {value!r}")


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, "must be an integer", value)
    if min is not None and value < min:
        raise _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
        raise _fail(name, f"must be <= {max}", value)
    return value


def check_float(name: str, value: Any, *, min: float | None = None, max: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, "must be a number", value)
    if min is not None and value < min:
        raise _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
        raise _fail(name, f"must be <= {max}", value)
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, "must be true or false", value)
    return value


def check_str(name: str, value: Any, *, pattern: str | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(name, "must be a non-empty string", value)
    if pattern is not None and not re.fullmatch(pattern, value):
        raise _fail(name, f"must match {pattern!r}", value)
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = list(choices)
    if value not in choices:
        raise _fail(name, f"must be one of {choices}", value)
    return value


def check_list(
    name: str,
    value: Any,
    item: Callable[[str, Any], Any] | None = None,
    *,
    min_len: int = 1,
    max_len: int | None = None,
) -> list:
    if not isinstance(value, (list, tuple)):
        raise _fail(name, "must be a list", value)
    if len(value) < min_len:
        raise _fail(name, f"must have at least {min_len} item(s)", value)
    if max_len is not None and len(value) > max_len:
        raise _fail(name, f"must have at most {max_len} item(s)", value)
    if item is None:
        return list(value)
    return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]


def check_top_k(name: str, value: Any, d: int | None = None, model: str | None = None) -> int:
    """A top-K size: a positive integer, at most the Jacobian size ``d`` when known; ``model``
    (its name, once loaded) makes the message say whose width it is and what to choose."""
    check_int(name, value, min=1)
    if d is not None and value > d:
        fix = f": {model} is {d} wide; choose K <= {d}" if model else ""
        raise ParameterError(f"{subject(name)} (K) must be <= the model width d={d}, got {value!r}{fix}")
    return value


@dataclass(frozen=True)
class FitTerms:
    """How a caller names what :func:`check_blocks_and_k` checks, in its messages: the K and
    last-block parameters (a chapter's ``k`` and ``last_block``, or measure's ``--k`` and
    ``--last-block``), the block parameter that, left empty, means every block (``all_blocks``);
    whether block indices may count from the end (``negative``); ``k_note``: said after a K that
    does not fit (measure: what K is without ``--k``)."""

    k: str = "k"
    last_block: str = "last_block"
    all_blocks: str = "layers"
    negative: bool = False
    k_note: str = ""


def _value(name: str, value: str) -> str:
    """A value as the caller writes it: bare after an option (``excluded``), quoted for a parameter."""
    return value if name.startswith("-") else repr(value)


def _too_shallow(flag: str, n_layers: int, model: str) -> ParameterError:
    """``last_block`` (named ``flag``) "excluded" on a model of fewer than 3 blocks."""
    return ParameterError(
        f"{subject(flag)}{' ' if flag.startswith('-') else ' = '}{_value(flag, 'excluded')} leaves "
        f"{n_layers - 1} of the {n_layers} "
        f"blocks of {model}: too few to couple; choose {flag} {_value(flag, 'final_norm')} or "
        f"{_value(flag, 'block')}, or a model with 3 blocks or more"
    )


def check_blocks_and_k(
    lm: Any,
    model: str,
    blocks: Mapping[str, Iterable[int]],
    k: Iterable[int],
    last_block: str,
    terms: FitTerms = FitTerms(),
) -> dict[str, list[int]]:
    """Whether the block and K parameters fit ``model`` loaded (``lm``; a job's check, before
    measuring), in the caller's ``terms``: each of ``blocks`` (``{parameter: block indices}``)
    within its depth, one block shorter with ``last_block`` "excluded" (which needs 3 blocks),
    and each of ``k`` within its width. A :class:`ParameterError` names the parameter, the model,
    its depth or width and what to choose; returns each block parameter's indices, non-negative."""
    L, d, flag = int(lm.n_layers), int(lm.d_model), terms.last_block
    window = {}
    if last_block == "excluded":
        if L < 3:
            raise _too_shallow(flag, L, model)
        window = {"last": L - 2, "why": f", and {flag} {_value(flag, 'excluded')} leaves the last out"}
    out = {}
    for name, values in blocks.items():
        try:
            out[name] = check_blocks(name, values, model, L, negative=terms.negative, **window)
        except ParameterError as exc:
            if name != terms.all_blocks:
                raise
            leave = f"{name} out" if name.startswith("-") else f"{name!r} empty"
            raise ParameterError(f"{exc}; or leave {leave} (all blocks)") from None
    for K in k:
        try:
            check_top_k(terms.k, K, d=d, model=model)
        except ParameterError as exc:
            raise ParameterError(f"{exc}{terms.k_note}") from None
    return out


def with_check(
    jobs: Iterable[Job], check: Callable[..., None], *, chain: bool = False, **bound: Any
) -> list[Job]:
    """``jobs``, each checking its loaded model before measuring with ``check(lm, job=job,
    **bound)`` (``job``: the planned job, for its model, revision and settings); ``chain``: the
    job's own check, if any, runs after it. A module-level ``check`` keeps the jobs picklable."""
    out = []
    for job in jobs:
        own = functools.partial(check, job=job, **bound)
        if chain and job.check is not None:
            own = functools.partial(_in_turn, checks=(own, job.check))
        out.append(dataclasses.replace(job, check=own))
    return out


def _in_turn(lm: Any, *, checks: Iterable[Callable[[Any], None]]) -> None:
    """Each of ``checks`` on the loaded model ``lm``, in order (the first refusal stops)."""
    for check in checks:
        check(lm)


def refuse_misfits(results: Iterable[Any], chapter: str) -> None:
    """Raise :class:`NotMeasured` naming each of ``results`` (a chapter's collected jobs) whose
    check refused a parameter its loaded model does not fit (a ParameterError): bad input, which a
    chapter refuses even where it shows the other jobs without a failed one."""
    from coupling_utils.measurement import Collected

    misfits = Collected([r for r in results if not r.ok and r.error == ParameterError.__name__])
    if misfits.results:
        raise NotMeasured(f"{chapter}: a parameter does not fit the model it measures\n{misfits.report()}")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")


def check_model(name: str, value: Any) -> str:
    """A model reference: ``embedded:<name>`` (known to the zoo), a local directory or file, or a hub id."""
    check_str(name, value)
    if value.startswith("embedded:"):
        from coupling_utils.models import zoo

        known = zoo.names()
        if value.split(":", 1)[1] not in known and value not in known:
            raise _fail(name, "is not a known embedded model; known: " + ", ".join(sorted(known)), value)
        return value
    if Path(value).expanduser().exists():
        return value
    if value.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(value):
        raise _fail(
            name, "is neither an existing local path nor a Hugging Face hub id like 'org/name'", value
        )
    return value


# the chapter parameters that name a model's revision: {parameter: what leaving it empty means};
# each applies to the chapter's ``model`` (or each of its ``models``)
REVISIONS = {"revision": "the final model", "revisions": "every checkpoint it saves"}


def check_revision(name: str, revision: str, model: str, unset: str) -> None:
    """Refuse a ``revision`` (given as ``name``) that the embedded ``model`` will not have: the
    checkpoints its recipe saves (``zoo.planned_revisions``: nothing is built or trained), in the
    zoo's words (``zoo.no_checkpoint``, also said when a built run lacks one) and with the fix
    (``unset``: how to ask for no revision). A hub model's revisions cannot be listed offline, nor
    a local model's before loading: loading checks those."""
    if not str(model).startswith("embedded:"):
        return
    from coupling_utils.models import zoo

    if zoo.is_final(revision):
        return
    have = zoo.planned_revisions(model)
    if revision in have:
        return
    fix = f"choose one of them, or {unset}" if have else unset
    raise ParameterError(f"{subject(name)}: {zoo.no_checkpoint(model, revision, have)}; {fix}")


def check_revisions(values: Mapping[str, Any]) -> None:
    """Every revision a chapter's ``values`` name (:data:`REVISIONS`) against the ``model`` (or
    each of the ``models``) it applies to (:func:`check_revision`); before a notebook runs, so a
    checkpoint an embedded run does not save is bad input, not a failed measurement."""
    models = [values["model"]] if "model" in values else list(values.get("models") or [])
    for name, unset in REVISIONS.items():
        given = values.get(name) or []
        for revision in [given] if isinstance(given, str) else given:
            for model in models:
                check_revision(name, revision, model, f"leave {name!r} empty for {unset}")


def check_local_models(values: Mapping[str, Any]) -> None:
    """Every model a chapter's ``values`` name that is not embedded, from its files before a
    notebook runs (``models.local_model.check_model_files``, as ``coupling-book measure`` checks
    its MODEL): a path where nothing exists; a local one whose architecture the engine has no row
    for, a file that is not GGUF, a checkpoint (``revision``/``revisions``) the folder does not
    hold; a hub one whose config lies in the Hugging Face cache and names such an architecture.
    Damaged files are left to loading: a failed run, not bad input."""
    key = "model" if "model" in values else "models"
    models = [values["model"]] if key == "model" else list(values.get("models") or [])
    others = [str(m) for m in models if not str(m).startswith("embedded:")]
    if not others:
        return
    from coupling_utils.models.local_model import LocalModelError, check_model_files

    given = values.get("revision") or values.get("revisions") or []
    revisions = [given] if isinstance(given, str) else list(given)
    option = "'revision'" if "revision" in values else "'revisions'"
    for model in others:
        try:
            check_model_files(model, revisions, label=f"parameter {key!r}: {model}", revision_option=option)
        except LocalModelError as exc:
            raise ParameterError(str(exc)) from None


# --- checks as values: what a parameter field carries ---------------------------------------
Check = Callable[[str, Any], Any]
DTYPES = ("float32", "bfloat16", "float16")
METHODS = ("exact", "randomized", "matrix_free")
HOWS = ("offdiag", "adjacent")
STEP = r"step\d+"


def integer(min: int | None = None, max: int | None = None) -> Check:
    return lambda name, value: check_int(name, value, min=min, max=max)


def number(min: float | None = None, max: float | None = None) -> Check:
    return lambda name, value: check_float(name, value, min=min, max=max)


def choice(*options: Any) -> Check:
    return lambda name, value: check_choice(name, value, options)


def text(pattern: str | None = None, *, empty: bool = False) -> Check:
    def check(name: str, value: Any) -> str:
        if empty and value == "":
            return value
        return check_str(name, value, pattern=pattern)

    return check


def list_of(item: Check, *, min_len: int = 1, max_len: int | None = None) -> Check:
    return lambda name, value: check_list(name, value, item, min_len=min_len, max_len=max_len)


def k_values(name: str, value: Any) -> Any:
    """One K, or a list of them (the notebook's default says which)."""
    return check_list(name, value, check_top_k) if isinstance(value, list) else check_top_k(name, value)


def embedded_family(name: str, value: Any) -> str:
    check_model(name, value)
    if not value.startswith("embedded:"):
        raise ParameterError(
            f"{subject(name)} must be an embedded family such as 'embedded:lm-family', got {value!r}"
        )
    return value


def vit_token(name: str, value: Any) -> Any:
    """A ViT token choice: "cls", "mean", "last" or "patch<N>" (see ``models.images.vit_tokens``)."""
    from coupling_utils.models.images import vit_tokens

    try:
        vit_tokens(value)
    except ValueError as exc:
        raise ParameterError(f"{subject(name)}: {exc}") from exc
    return value


boolean: Check = check_bool
block: Check = integer(min=0)

COMMON: dict[str, Check] = {
    "model": check_model,
    "models": list_of(check_model),
    "more_models": list_of(check_model, min_len=0),
    "hub_models": list_of(check_model, min_len=0),
    "family": embedded_family,
    "revision": text(empty=True),
    "revisions": list_of(text(STEP), min_len=0),
    "dtype": choice(*DTYPES),
    "method": choice(*METHODS),
    "how": choice(*HOWS),
    "k": k_values,
    "seed": integer(min=0),
    "init_seed": integer(min=0),
    "n_prompts": integer(min=0),
    "include_demo": boolean,
    "include_gemma": boolean,
    "max_tokens": integer(min=2),
    "n_resamples": integer(min=10),
    "use_cache": boolean,
    "skip_first_token": boolean,
}
