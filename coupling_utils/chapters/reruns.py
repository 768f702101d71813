"""How an exercise says "rerun this chapter with these parameters", written for where it runs.

In the repository (the book, ``coupling-book run``, Jupyter in a clone) a rerun is
``coupling-book run f00 -p k=1``. The lab kit has no clone, so ``coupling-book run`` finds no
chapters there: the kit's notebooks set :data:`KIT_ENV` in a cell of their own
(:mod:`coupling_utils.pipeline.kit`), and a rerun is then the papermill line of the kit's README,
at the ``default`` profile that ``coupling-book run`` runs without ``--profile``::

    python -m papermill f00_coupling_metric.ipynb runs/f00_coupling_metric-k1.ipynb \
        -f profiles/default/f00_coupling_metric.yaml -p k 1

Every glued rerun hint of the chapters is rendered here (:func:`reruns`, :func:`deeper_model`),
and so are the reruns the chapters' prose types (:func:`kit_command`, called by the kit's
:mod:`~coupling_utils.pipeline.kit_links`), so both forms follow one rule.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from coupling_utils.analysis.prose_list import listed

__all__ = ["KIT_ENV", "PROFILE", "in_kit", "reruns", "deeper_model", "kit_command"]

KIT_ENV = "COUPLING_LAB_KIT"  # set (not "" or "0") by the kit's notebooks: reruns are papermill lines
LEADS = ("inside", "before", "none")  # where the repository's words name `coupling-book run fNN`
PROFILE = "default"  # what `coupling-book run` runs without --profile, and so what a kit rerun names


def in_kit() -> bool:
    """Whether this process runs a lab kit's notebook (:data:`KIT_ENV` set)."""
    return os.environ.get(KIT_ENV, "") not in ("", "0")


def _text(value: Any) -> str:
    """A parameter value as YAML reads it back: a list as ``[a, b]``, anything else as written."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)


def _notebook(chapter: str) -> str:
    """The notebook stem of ``chapter`` (``"f00"``)."""
    from coupling_utils.chapters import NAMES

    stems = [name for name in NAMES if name.split("_", 1)[0] == chapter]
    if not stems:
        raise ValueError(f"no chapter {chapter!r}: give its fNN, one of {', '.join(n[:3] for n in NAMES)}")
    return stems[0]


def _options(settings: Mapping[str, Any], kit: bool) -> str:
    """``settings`` as ``coupling-book run``'s ``-p`` options, or papermill's (``-p NAME VALUE``;
    ``-y "NAME: VALUE"`` for a list or a text with spaces, which ``-p`` would read as a string)."""
    out = []
    for name, value in settings.items():
        text = _text(value)
        quoted = " " in text or text[:1] in "[{"  # the shell would split it, or glob its brackets
        if kit and text == "":
            out.append(f'-p {name} ""')  # papermill keeps an empty text as ""; YAML would read null
        elif kit:
            out.append(f'-y "{name}: {text}"' if quoted else f"-p {name} {text}")
        else:
            out.append(f'-p "{name}={text}"' if quoted else f"-p {name}={text}")
    return " ".join(out)


def _command(chapter: str, settings: Mapping[str, Any], kit: bool, profile: str = PROFILE) -> str:
    """The whole command that reruns ``chapter`` at ``profile`` with ``settings`` (without
    backticks); in the kit its output notebook is named by the profile (unless ``default``) and
    the settings."""
    options = _options(settings, kit)
    named = [profile] if profile != PROFILE else []
    if not kit:
        return " ".join(["coupling-book run", chapter, *(f"--profile {p}" for p in named), options]).rstrip()
    stem = _notebook(chapter)
    slug = "-".join(
        named + [name + re.sub(r"[^\w.]+", "-", _text(v)).strip("-") for name, v in settings.items()]
    )
    output = f"runs/{stem}-{slug}.ipynb" if slug else f"runs/{stem}.ipynb"
    return f"python -m papermill {stem}.ipynb {output} -f profiles/{profile}/{stem}.yaml {options}".rstrip()


def kit_command(chapter: str, settings: Mapping[str, Any], profile: str = PROFILE) -> str:
    """The kit's papermill line that reruns ``chapter`` at ``profile`` with ``settings``: what the
    kit writes for a ``coupling-book run`` that the chapters' prose types (ValueError for a
    chapter that is not one)."""
    return _command(chapter, settings, True, profile)


def reruns(chapter: str, runs: Sequence[Mapping[str, Any]], lead: str = "inside", then: bool = False) -> str:
    """The reruns of ``chapter`` (``"f00"``) with each of ``runs`` (parameter settings), as inline
    code joined "A and B" (``then``: "A, then B").

    In the repository ``lead`` says where ``coupling-book run fNN`` is named: ``"inside"`` the
    first code (``coupling-book run f00 -p k=1`` and ``-p k=50``), ``"before"`` the list
    (``coupling-book run f00`` with ``-p layer=1`` and ...), or ``"none"`` (the sentence names it).
    In the lab kit each run is its whole papermill line (its own output notebook), and ``"before"``
    gives "with" and the lines."""
    if not runs:
        raise ValueError(f"reruns() of {chapter} got no runs: say why there is none instead")
    if lead not in LEADS:
        raise ValueError(f"reruns() got lead={lead!r}: choose one of {', '.join(LEADS)}")
    kit = in_kit()
    if kit:
        codes = [f"`{_command(chapter, run, True)}`" for run in runs]
    else:
        codes = [f"`{_options(run, False)}`" for run in runs]
        if lead == "inside":
            codes[0] = f"`{_command(chapter, runs[0], False)}`"
    words = ", then ".join(codes) if then else listed(codes)
    if lead == "before":
        return ("with " if kit else f"`coupling-book run {chapter}` with ") + words
    return words


def deeper_model(chapter: str, named: bool = False) -> str:
    """ "rerun with a deeper model" and the profile that has one (``default``), for a run whose
    model is too shallow for an exercise; ``named``: the repository's words name
    ``coupling-book run fNN``."""
    if in_kit():
        return f"rerun with a deeper model (e.g. the `{PROFILE}` profile: `{_command(chapter, {}, True)}`)"
    command = f"`coupling-book run {chapter}` " if named else ""
    return f"rerun {command}with a deeper model (e.g. `--profile {PROFILE}`)"
