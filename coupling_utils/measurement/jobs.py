"""One measurement loop: many (model, revision, weights) jobs -> measure() -> labelled tables.

A :class:`Job` is one model to load (a reference with the ``load_model`` arguments that pick
its revision, its weights, trained or random init, and its dtype), the prompts, one or more
measurements of it (:class:`Settings` by part name, e.g. ``{"depth": ..., "tokens": ...}``),
optional :class:`Extra` tables computed from the loaded model, and the labels its rows get.
Each measurement is stored under ``root/<model>/<revision>/<weights>/<part>-<key>``, the key a
hash of everything that determines it (``<model>``: :func:`model_folder`; a local model's is
named by its content, so a moved checkpoint finds its measurements), so the three steps can run
in one process (a notebook) or apart (one cluster job per :class:`Job`, then a notebook that
only reads):

- :func:`plan` makes the job list (the same arguments give the same jobs, keys and folders;
  :class:`Loads` says which revisions and weights of each model, in which dtype);
- :func:`~coupling_utils.measurement.loop.run` does one job: it loads the model only if a
  measurement is missing or was made by other code, measures what is missing, and releases
  the model (``gc``, CUDA cache);
- :func:`~coupling_utils.measurement.loop.collect` runs (or, with ``compute=False``, only
  reads) every job and returns a :class:`~coupling_utils.measurement.loop.Collected`: results,
  labelled tables, and a ``failures`` table of the jobs that are missing with the reason
  (exception type and message), so a notebook can say which models are missing instead of
  aborting. ``on_error="raise"`` stops at the first failure instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from coupling_utils.measurement.settings import Settings
from coupling_utils.models.identity import content_hash, local_path, model_identity
from coupling_utils.provenance import code_fingerprint, slug, stable_hash

__all__ = [
    "Job",
    "Extra",
    "Loads",
    "plan",
    "relabel",
    "model_identity",
    "model_folder",
    "WEIGHTS",
]

WEIGHTS = ("trained", "random init")


@dataclass(frozen=True)
class Extra:
    """More tables a job computes from the loaded model: ``fn(model, prompts, **options)``
    returns ``{table name: DataFrame}``. ``sources``: package files (beside the measurement's
    own, e.g. ``"analysis/trajectories.py"``) that determine its numbers; ``fn``'s own source
    always counts. ``passes(n_layers, d_model)``: the block passes it makes per prompt (what the
    cost model counts; not part of the job's key)."""

    name: str
    fn: Callable[..., dict[str, pd.DataFrame]]
    options: Mapping[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    # block passes it makes per prompt, from (n_layers, d_model): for the cost model only (a
    # module-level function, so that a sweep can pickle the job); None: one pass
    passes: Callable[[int, int], int] | None = field(default=None, compare=False)

    def spec(self) -> dict:
        return {
            "name": self.name,
            "fn": f"{self.fn.__module__}.{self.fn.__qualname__}",
            "options": self.options,
        }

    def fingerprint(self) -> dict:
        code = code_fingerprint(self.sources)
        own = stable_hash(inspect.getsource(self.fn), 16)
        return {**code, "fingerprint": stable_hash([code["fingerprint"], own], 16), "fn_source": own}


@dataclass(frozen=True)
class Job:
    """One model to load and what to measure on it (see the module doc).

    ``model``: a reference for ``load`` (``embedded:...``, a directory, a hub id) or an already
    loaded model (then nothing is stored); ``load_kwargs``: the other arguments ``load`` gets;
    ``settings``: one :class:`Settings` or ``{part: Settings}``; ``check(model)`` runs on the
    loaded model before measuring (e.g. to name a bad layer in the caller's terms);
    ``prepare(model, prompts)`` turns the prompts into the loaded model's inputs when they depend
    on the model (images into pixel values of its own size and normalisation), so a job is
    planned without reading the model's files (a module-level function, so that jobs pickle;
    its name is part of the key).
    """

    model: Any
    prompts: Any
    settings: Mapping[str, Settings]
    load_kwargs: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, Any] = field(default_factory=dict)
    root: Path | None = None
    extra: Extra | None = None
    check: Callable[[Any], None] | None = field(default=None, compare=False)
    prepare: Callable[[Any, Any], Any] | None = None

    def __post_init__(self):
        if isinstance(self.settings, Settings):
            object.__setattr__(self, "settings", {"measure": self.settings})
        if self.root is not None:
            object.__setattr__(self, "root", Path(self.root))

    @property
    def revision(self) -> str | None:
        return self.load_kwargs.get("revision")

    @property
    def weights(self) -> str:
        return WEIGHTS[1] if self.load_kwargs.get("random_init") else WEIGHTS[0]

    @property
    def storable(self) -> bool:
        return self.root is not None and isinstance(self.model, str)

    def _key(self, what) -> str:
        ident = {
            "model": model_identity(self.model, self.revision),
            "load": dict(self.load_kwargs),
            "prompts": self.prompts,
        }
        if self.prepare is not None:
            ident["prepare"] = f"{self.prepare.__module__}.{self.prepare.__qualname__}"
        return stable_hash({**ident, "what": what})

    @property
    def key(self) -> str:
        """The job's stable key: model, load arguments, prompts, every measurement and extra."""
        if not isinstance(self.model, str):
            return f"object-{id(self.model):x}"
        parts = {part: s.to_dict(runtime=False) for part, s in self.settings.items()}
        return self._key({"parts": parts, "extra": self.extra.spec() if self.extra else None})

    @property
    def folder(self) -> Path | None:
        """``root/<model>/<revision>/<weights>`` (None for a job that stores nothing); ``<model>``
        by :func:`model_folder`, so a local model moved or renamed finds its measurements."""
        if not self.storable:
            return None
        return (
            self.root
            / model_folder(self.root, self.model, self.revision)
            / slug(self.revision or "main")
            / slug(self.weights)
        )

    def out(self, part: str) -> Path | None:
        """Where measurement ``part`` is stored: ``<folder>/<part>-<key of that measurement>``."""
        if not self.storable:
            return None
        return self.folder / f"{part}-{self._key(self.settings[part].to_dict(runtime=False))}"

    def extra_out(self) -> Path | None:
        if not self.storable or self.extra is None:
            return None
        return self.folder / f"{self.extra.name}-{self._key(self.extra.spec())}"

    def describe(self) -> str:
        """A readable name: labels, else the reference with revision and weights."""
        if self.labels:
            return ", ".join(f"{k}={v}" for k, v in self.labels.items())
        name = self.model if isinstance(self.model, str) else type(self.model).__name__
        return f"{name}@{self.revision or 'main'} ({self.weights})"


@dataclass(frozen=True)
class Loads:
    """Which loads of each model :func:`plan` makes: one per revision × weights, all in ``dtype``.

    ``revisions``: None (no revision argument) or one load per revision; ``weights``: None (no
    random_init argument) or one load per entry of ("trained", "random init"), the random init
    drawn with ``seed``. What is loaded is part of each job's key, so equal ``Loads`` give the
    same jobs.
    """

    revisions: Sequence[str] | None = None
    weights: Sequence[str] | None = None
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self):
        for w in self.weights or ():
            if w not in WEIGHTS:
                raise ValueError(f"weights must be among {WEIGHTS}, got {w!r}")

    def load_kwargs(self, revision: str | None, weights: str | None) -> dict[str, Any]:
        """``load_model``'s arguments for one revision and weights (None: not varied)."""
        kw: dict[str, Any] = {
            "dtype": self.dtype,
            **({"revision": revision} if self.revisions is not None else {}),
        }
        kw.update(
            {"random_init": weights == WEIGHTS[1], "seed": self.seed} if self.weights is not None else {}
        )
        return kw

    def labels(self, revision: str | None, weights: str | None) -> dict[str, Any]:
        """The ``revision`` and ``weights`` labels of one load, for what is varied."""
        out: dict[str, Any] = {"revision": revision} if self.revisions is not None else {}
        out.update({"weights": weights} if self.weights is not None else {})
        return out

    def each(self) -> list[tuple[str | None, str | None]]:
        """Every (revision, weights) pair, revisions outermost (None where not varied)."""
        revisions = [None] if self.revisions is None else list(self.revisions)
        weights = [None] if self.weights is None else list(self.weights)
        return [(rev, w) for rev in revisions for w in weights]


def plan(
    models: Sequence[Any] | Mapping[str, Any],
    prompts: Any,
    settings: Settings | Mapping[str, Settings],
    *,
    loads: Loads | None = None,
    root: str | Path | None = None,
    extra: Extra | None = None,
    check: Callable[[Any], None] | None = None,
) -> list[Job]:
    """The jobs for every model × revision × weights, in that order.

    ``models``: a list, or ``{name: model}``, of references (``embedded:...``, directories, hub
    ids), ``load_model`` keyword dicts (``{"name_or_path": ..., "revision": ...}``) or loaded
    models. ``loads``: which revisions and weights of each, in which dtype (:class:`Loads`;
    default: each model once, as it is, in float32). Labels: ``model`` (the name), and
    ``revision`` / ``weights`` when those are varied. ``root``: where measurements are stored
    (None: nowhere).
    """
    loads = loads or Loads()
    items = (
        list(models.items())
        if isinstance(models, Mapping)
        else [(_name(i, m), m) for i, m in enumerate(models)]
    )
    if not items:
        raise ValueError("models is empty; pass at least one model")
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    jobs = []
    for name, ref in items:
        spec = dict(ref) if isinstance(ref, Mapping) else {}
        if spec and "name_or_path" not in spec:
            raise ValueError(
                f"a model given as a mapping needs 'name_or_path' (load_model's arguments), got {spec}"
            )
        model = spec.pop("name_or_path", ref)
        for rev, w in loads.each():
            kw = {**loads.load_kwargs(rev, w), **spec}
            labels = {"model": name, **loads.labels(rev, w)}
            jobs.append(Job(model, prompts, settings, kw, labels, root, extra, check))
    return jobs


def model_folder(root: Path, ref: str, revision: str | None) -> Path:
    """The store's folder of ``ref`` under ``root``: a hub id or ``embedded:`` name as it is
    written (``slug``); a local folder or ``.gguf`` file by its content, not its place:
    ``local/<its name>-<the first 12 hex digits of the files revision loads>``
    (:func:`~coupling_utils.models.identity.content_hash`, remembered by path, size and
    modification time), and the folder already there with that digest under any name, so a
    checkpoint moved or renamed keeps its measurements, and another one of the same name gets
    its own. Each ``revisions/<R>/`` checkpoint of a run is its own folder, unchanged when the
    run adds more. Stores made before this layout kept local models under ``<slug of the path>``;
    they are not read, and need no migration: the same release changed the code fingerprint, so
    each of them would be measured again anyway (they can be deleted)."""
    path = local_path(ref)
    if path is None:
        return Path(slug(ref))
    digest = content_hash(path, revision)[:12]
    held = sorted(p.name for p in (root / "local").glob(f"*-{digest}") if p.is_dir())
    return Path("local", held[0] if held else f"{slug(Path(os.path.abspath(path)).name, 60)}-{digest}")


def _name(i: int, m) -> str:
    if isinstance(m, str):
        return m
    if isinstance(m, Mapping):
        return "@".join(str(v) for v in (m.get("name_or_path"), m.get("revision")) if v)
    return getattr(m, "name", None) or f"model-{i}"


def relabel(jobs: Sequence[Job], labels: Callable[[Job], Mapping[str, Any]]) -> list[Job]:
    """The jobs with more labels: ``labels(job)`` is added to each job's own."""
    return [dataclasses.replace(job, labels={**job.labels, **labels(job)}) for job in jobs]
