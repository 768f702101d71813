"""What a measure() call computes: one frozen :class:`Settings`, validated once, stored as JSON.

A ``Settings`` is made from measure()'s keyword arguments and checks everything that needs no
model on construction, so a sweep's job list is checked before any model is loaded. Against a
model, :meth:`Settings.resolve` checks the rest (K and n_singular against the width, layers
against the depth, the Lanczos plan) and fills in what the defaults mean for that model: the
result is what ``settings.json`` stores and what a resumed run must match.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from coupling_utils.engine.blocks import check_last_block
from coupling_utils.engine.metric import check_k, check_options
from coupling_utils.engine.spectra import SOLVERS, check_randomized, lanczos_plan
from coupling_utils.measurement.inputs import ModelInfo, check_tokens_spec

__all__ = ["Settings", "MEASURE_METHODS", "FORMAT"]

MEASURE_METHODS = ("exact", "randomized", "matrix_free")
FORMAT = 1  # bump when the stored layout changes
# fields that change how a run goes, not its numbers: never stored, never part of a key
RUNTIME = ("chunk_size",)
# fields a resolved Settings takes from the model
MODEL_FIELDS = ("model", "revision", "dtype", "also_layer")
# fields added after results were stored, with the value those results were measured with: a
# field at that value is left out of to_dict(runtime=False), so stored keys stay what they were
LATER_DEFAULTS = {"last_block": "block", "last_block_also": None, "also_layer": None}
# the maps of the last block that are measured (``"excluded"`` is either one without it)
LAST_BLOCK_MAPS = ("block", "final_norm")


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in ([values] if _is_int(values) else values))


@dataclass(frozen=True)
class Settings:
    """measure()'s settings (see :func:`coupling_utils.measurement.measure` for each one).

    ``max_tokens`` cuts token prompts (it changes the inputs, whose digests are stored, not the
    settings file); ``chunk_size`` only trades memory for speed. ``model``, ``revision`` and
    ``dtype`` are set by :meth:`resolve`. ``last_block`` (``engine.blocks.LAST_BLOCKS``) is what
    the last block is: ``"block"`` (the paper's definition, the default), ``"final_norm"`` (the
    authors' code: ``hidden_states[L-1] -> hidden_states[L]``, the final norm included) or
    ``"excluded"`` (not measured). It keys a stored measurement only when it is not "block", so
    results stored before it existed keep their keys; ``settings.json`` and the provenance
    always name it.

    ``last_block_also`` (the other of "block" and "final_norm", or None) measures the last block
    once more under that map in the same run, so that both maps stand side by side at the cost of
    one block, not of a second measurement: every other block's map is the same under both.
    :meth:`resolve` gives it a layer label of its own, ``also_layer`` (= the number of blocks),
    and ``Measurement.under`` splits the tables into one measurement per map.
    """

    method: str = "exact"
    k: tuple[int, ...] = (10, 30, 50)
    layers: tuple[int, ...] | None = None
    tokens: str | tuple[int, ...] = "last"
    context: str | int | bool = False
    tiles: int | None = None
    tile_layers: tuple[int, ...] | None = None
    n_singular: int | None = None
    solver: str | None = "lanczos"
    block: int | None = None
    steps: int | None = None
    oversample: int | None = 10
    n_iter: int | None = 2
    seed: int | None = 0
    depth_window: int | None = None
    p: float = 2
    normalize: str = "norm"
    orientation: str = "ujv"
    last_block: str = "block"
    last_block_also: str | None = None
    max_tokens: int | None = None
    chunk_size: int | None = 64
    model: str | None = None
    revision: str | None = None
    dtype: str | None = None
    also_layer: int | None = None

    # measure()'s keyword arguments that are settings (all fields but the model's)
    ARGUMENTS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        set_ = self._set
        if self.method not in MEASURE_METHODS:
            raise ValueError(f"method must be one of {MEASURE_METHODS}, got {self.method!r}")
        check_options(self.p, self.normalize, self.orientation)
        check_last_block(self.last_block)
        self._check_also()
        ks = tuple(sorted(set(_ints(self.k))))
        if not ks:
            raise ValueError("k must name at least one K, e.g. k=(10, 30, 50)")
        for kk in ks:
            check_k(kk, max(ks))
        set_("k", ks)
        n = self.n_singular
        if isinstance(n, bool) or (n is not None and (not _is_int(n) or n < 1)):
            raise ValueError(f"n_singular must be a positive integer or None, got {n!r}")
        set_("n_singular", None if n is None else int(n))
        if self.solver not in SOLVERS and not (self.method == "exact" and self.solver is None):
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        w = self.depth_window
        if w is not None and (not _is_int(w) or w < 1):
            raise ValueError(
                f"depth_window must be a positive integer (the largest |layer_i - layer_j| "
                f"kept) or None for all layer pairs, got {w!r}"
            )
        set_("depth_window", None if w is None else int(w))
        self._check_solver()
        self._check_selection(set_)
        for name in ("max_tokens", "chunk_size"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")

    def _check_also(self) -> None:
        """``last_block_also``: None, or the measured map of the last block that ``last_block`` is not."""
        also = self.last_block_also
        if also is None:
            return
        if also not in LAST_BLOCK_MAPS or self.last_block not in LAST_BLOCK_MAPS or also == self.last_block:
            raise ValueError(
                f"last_block_also measures the last block once more under the other of {LAST_BLOCK_MAPS}; "
                f"got last_block_also={also!r} with last_block={self.last_block!r}: pass "
                f"last_block_also={next(m for m in LAST_BLOCK_MAPS if m != self.last_block)!r} with "
                f"last_block={self.last_block if self.last_block in LAST_BLOCK_MAPS else 'final_norm'!r}, "
                "or None"
            )
        if self.depth_window is not None:
            raise ValueError(
                f"last_block_also cannot be combined with depth_window={self.depth_window!r}: the second "
                "map's layer label is not the last block's depth; measure the other map in its own run "
                f"(last_block={also!r}), or leave depth_window None"
            )

    def block_of(self, layer: int) -> tuple[int, str]:
        """The block a measured layer label stands for, and its map: ``also_layer`` is the last block
        under ``last_block_also``; every other label is its own block under ``last_block``."""
        if self.also_layer is not None and layer == self.also_layer:
            return layer - 1, self.last_block_also
        return layer, self.last_block

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen instance while it is made

    def _check_solver(self) -> None:
        """The solver's own settings, and whether it computes n_singular values."""
        n_singular = self.n_singular or max(self.k)
        if self.lanczos:
            block, steps = lanczos_plan(max(self.k), None, block=self.block, steps=self.steps)
            if n_singular > block * steps:
                raise ValueError(
                    f"the lanczos solver computes block·steps = {block * steps} singular values; "
                    f"n_singular={n_singular} is more (raise block or steps)"
                )
        elif self.subspace:
            check_randomized(self.oversample, self.n_iter)
            if self.method == "matrix_free" and n_singular > max(self.k) + self.oversample:
                raise ValueError(
                    f"matrix_free computes max(k) + oversample = {max(self.k) + self.oversample} "
                    f"singular values; n_singular={n_singular} is more"
                )

    def _check_selection(self, set_) -> None:
        """Layers, tokens, context and tiles (all that needs no model)."""
        if self.layers is not None:
            set_("layers", _ints(self.layers))
            if not self.layers:
                raise ValueError("layers selects no block")
        tokens = check_tokens_spec(self.tokens)
        set_("tokens", tokens if isinstance(tokens, str) else tuple(tokens))
        context = "last" if self.context is True else self.context
        if context is not False:
            spec = check_tokens_spec(context)
            if not isinstance(context, str) and len(spec) != 1:
                raise ValueError(f"context names one output token ('last' or a position), got {context!r}")
            context = context if isinstance(context, str) else int(spec[0])
            if context == "all":
                raise ValueError("context names one output token ('last' or a position), not 'all'")
        set_("context", context)
        if self.tiles is not None:
            set_("tiles", check_k(self.tiles, self.tiles))
            if self.tiles > max(self.k):
                raise ValueError(f"tiles={self.tiles} exceeds max(k)={max(self.k)}; add it to k")
        if self.tile_layers is not None:
            set_("tile_layers", _ints(self.tile_layers))

    @property
    def lanczos(self) -> bool:
        return self.method != "exact" and self.solver == "lanczos"

    @property
    def subspace(self) -> bool:
        return self.method != "exact" and self.solver == "subspace"

    @property
    def resolved(self) -> bool:
        """Whether :meth:`resolve` made these settings (they then name a model)."""
        return self.model is not None

    @property
    def kmax(self) -> int:
        return max(self.k)

    @property
    def layer_tables(self) -> tuple[str, ...]:
        """The tables each measured layer stores for itself (the others need every layer)."""
        return ("singular_values", "tokenwise") + (("context",) if self.context is not False else ())

    def resolve(self, info: ModelInfo) -> Settings:
        """These settings for one model: checked against its size, defaults made concrete."""
        d, L, ks = info.d_model, info.n_layers, self.k
        for kk in ks:
            check_k(kk, d if d else max(ks))
        n_singular = self.n_singular or max(ks)
        if d and n_singular > d:
            raise ValueError(f"n_singular={n_singular} exceeds the width d={d}")
        block, steps = self.block, self.steps
        if self.lanczos:
            block, steps = lanczos_plan(max(ks), d or None, block=block, steps=steps)
        layers = self._resolved_layers(L)
        tile_layers = None
        if self.tiles is not None:
            check_k(self.tiles, d if d else self.tiles)
            tile_layers = layers if self.tile_layers is None else self.tile_layers
            tile_layers = sorted({_in_range("tile_layers", l, L) for l in tile_layers})
            self._check_not_excluded("tile_layers", tile_layers, L)
            if not set(tile_layers) <= set(layers):
                missing = sorted(set(tile_layers) - set(layers))
                raise ValueError(f"tile_layers {missing} are not measured; add them to layers")
        also_layer = None
        if self.last_block_also is not None and L - 1 in layers:  # the last block's second map: label L
            also_layer = L
            layers = [*layers, L]
            if tile_layers is not None and L - 1 in tile_layers:
                tile_layers = [*tile_layers, L]
        exact = self.method == "exact"
        return dataclasses.replace(
            self,
            layers=tuple(layers),
            tile_layers=None if tile_layers is None else tuple(tile_layers),
            n_singular=n_singular,
            solver=None if exact else self.solver,
            block=block if self.lanczos else None,
            steps=steps if self.lanczos else None,
            oversample=self.oversample if self.subspace else None,
            n_iter=self.n_iter if self.subspace else None,
            seed=None if exact else self.seed,
            model=info.name,
            revision=info.revision,
            dtype=info.dtype,
            also_layer=also_layer,
        )

    def _resolved_layers(self, L: int) -> list[int]:
        """The measured blocks: all (all but the last with ``last_block="excluded"``) or ``layers``."""
        excluded = self.last_block == "excluded"
        if excluded and L < 3:
            raise ValueError(
                f"last_block='excluded' leaves {L - 1} block(s) of {L}: too few to couple; "
                "choose last_block='block' or 'final_norm'"
            )
        if self.layers is None:
            return list(range(L - 1 if excluded else L))
        layers = sorted({_in_range("layers", l, L) for l in self.layers})
        self._check_not_excluded("layers", layers, L)
        return layers

    def _check_not_excluded(self, name: str, layers: list[int], L: int) -> None:
        if self.last_block == "excluded" and L - 1 in layers:
            raise ValueError(
                f"{name} includes the last block {L - 1}, which last_block='excluded' leaves out; "
                f"drop it from {name}, or choose last_block='block' or 'final_norm'"
            )

    # ------------------------------------------------------------------ serialising
    def to_dict(self, *, runtime: bool = True) -> dict[str, Any]:
        """Every field as JSON data (tuples as lists); ``runtime=False`` (what keys a stored
        measurement) leaves out chunk_size and the fields of :data:`LATER_DEFAULTS` at the value
        older results were measured with."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            later_default = f.name in LATER_DEFAULTS and LATER_DEFAULTS[f.name] == v
            if runtime or (f.name not in RUNTIME and not later_default):
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    def stored(self) -> dict[str, Any]:
        """What ``settings.json`` holds: the resolved settings that determine the numbers
        (``last_block`` always named, also at its default)."""
        if not self.resolved:
            raise ValueError("only resolved settings are stored; call resolve(model) first")
        out = {**self.to_dict(runtime=False), "last_block": self.last_block}
        del out["max_tokens"]  # the prompts' digests carry it
        return {**out, "format": FORMAT}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        """Settings from :meth:`to_dict` or from a stored ``settings.json`` (older ones upgraded)."""
        data = upgrade(data) if "format" in data else dict(data)
        data.pop("format", None)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(
                f"unknown settings {sorted(unknown)}; known: {[f.name for f in dataclasses.fields(cls)]}"
            )
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    @classmethod
    def from_json(cls, text: str) -> Settings:
        return cls.from_dict(json.loads(text))

    def differences(self, stored: dict[str, Any]) -> list[str]:
        """The names of the settings in which a stored ``settings.json`` differs from these."""
        stored = upgrade(stored)
        mine = json.loads(json.dumps(self.stored(), default=str))
        return sorted(k for k in set(stored) | set(mine) if stored.get(k) != mine.get(k))


Settings.ARGUMENTS = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in MODEL_FIELDS)


def _in_range(name: str, layer: int, L: int) -> int:
    if not -L <= layer < L:
        where = "layer" if name == "layers" else f"{name}: layer"
        raise ValueError(f"{where} {layer} does not exist: the model has {L} blocks (0..{L - 1})")
    return layer % L


def upgrade(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored settings from before the solver and depth_window settings, in today's terms.

    Those runs used subspace iteration (for non-exact methods) and all layer pairs, so they
    resume under the equivalent settings ``solver="subspace"``, ``depth_window=None``; runs from
    before ``last_block`` measured the last block alone (``last_block="block"``).
    """
    stored = dict(stored)
    stored.setdefault("depth_window", None)
    stored.setdefault("last_block", "block")
    if "solver" not in stored:
        stored["solver"] = None if stored.get("method") == "exact" else "subspace"
        stored.setdefault("block", None)
        stored.setdefault("steps", None)
    return stored
