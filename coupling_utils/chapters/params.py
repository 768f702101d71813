"""A chapter's parameters as one typed, checked object: the base class every chapter's ``Params`` extends.

A chapter declares its notebook's papermill parameters once, as the fields of a frozen dataclass
made with :func:`param` (default and check). :meth:`ChapterParams.checked` builds
the object from any mapping (a notebook's ``globals()``, a profile with overrides, a sweep's
planned values): every field is checked with its own check, then the chapter's :attr:`RULES`
(relations between parameters), so a bad value fails before any work with a message that names
the parameter. ``tests/test_pipeline.py`` checks that each notebook's parameters cell and its
chapter's fields agree, name for name and default for default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from coupling_utils.chapters.checks import Check, ParameterError, check_local_models, check_revisions

__all__ = ["ChapterParams", "param", "Rule"]

Rule = Callable[[Mapping[str, Any]], "str | None"]


def param(default: Any, check: Check) -> Any:
    """A parameter field: its ``default`` (a list is copied for every instance) and the ``check``
    its value must pass. What it means is said once, by its comment in the notebook's parameters
    cell (papermill's source of truth, shown by ``coupling-book list``)."""
    meta = {"check": check}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=tuple(default): list(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class ChapterParams:
    """Base of a chapter's parameters (subclass it as a frozen dataclass of :func:`param` fields)."""

    NOTEBOOK: ClassVar[str] = ""
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @classmethod
    def names(cls) -> list[str]:
        """The parameter names, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every parameter's default."""
        return dataclasses.asdict(cls())

    @classmethod
    def checked(cls, values: Mapping[str, Any]) -> ChapterParams:
        """The parameters among ``values`` (other keys are ignored, missing ones take their
        default), each checked, then the rules between them, then every revision they name
        against its embedded model's recipe; raises :class:`ParameterError`."""
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                out[f.name] = f.metadata["check"](f.name, values[f.name])
        merged = {**cls.defaults(), **out}
        for rule in cls.RULES:
            message = rule(merged)
            if message:
                raise ParameterError(message)
        check_revisions(merged)  # a checkpoint an embedded run will not save (nothing is built)
        check_local_models(merged)  # a local model no copy of its files makes measurable
        return cls(**merged)

    def values(self) -> dict[str, Any]:
        """The parameters as a plain dict (lists copied)."""
        return dataclasses.asdict(self)
