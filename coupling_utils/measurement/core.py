"""measure(): block Jacobians of some prompts, their spectra and coupling, as tidy tables.

:func:`measure` is the one call every notebook uses; this module ties its parts together
(:mod:`.settings`, :mod:`.store`, :mod:`.compute`, :mod:`.assemble`, :mod:`.tables`). For each
prompt and each block ``l`` it computes the token Jacobians ``J^l_tt`` (all tokens in one
token-diagonal sweep), their top singular triplets, and from those

- ``depthwise``: ``m_K(J^i_tt, J^j_tt)`` for every pair of measured layers, per token;
- ``tokenwise``: ``m_K(J^l_tt, J^l_t't')`` for every pair of selected tokens, per layer;
- ``context`` (optional): context Jacobians ``J^l_{t1 t2}`` for a fixed output token t2,
  compared across input tokens (same layer) and across layers (same input token);
- ``singular_values``: the top singular values per (token, layer);
- ``tiles`` (optional): the raw ``|U_{j,K}ᵀ J_i V_{j,K}|`` tiles the paper draws, for a window
  of layers;
- ``prompts`` and ``timings``: what was measured and what it cost.

Every table is long ("tidy", one row per observation) with ``coupling = 1 − m²`` next to
``m``. Each is written as Parquet under ``out/`` beside ``provenance.json`` (model, revision,
dtype, prompts, settings, what the last block was (``last_block``), the fingerprint of the code
that made the numbers, package and library versions, UTC time).

Memory and resuming: work goes layer by layer. A finished (prompt, layer)'s Jacobians of the
selected tokens (or, matrix-free, their low-rank factors) and per-layer tables are written
atomically under ``out/_work/<prompt>/`` with a completion marker, at most every
``Options.checkpoint_seconds`` (held in memory meanwhile, :class:`~.store.HeldLayers`; written
at once when they reach 256 MiB, and when an error or Ctrl-C stops the run); when a
prompt's layers are all done, its depth-wise tables are computed one token at a time from
memory-mapped files (held arrays from memory) and held; finished prompts are written together,
on the same clock and at the end of the run, to ``out/prompts/<batch>/``
(:class:`~.finished.FinishedPrompts`), and their work files removed. An
interrupted run started again with the same ``out`` (``resume=True``) recomputes nothing that
is stored, as long as the same code stored it: work stored by other code (another
:func:`~coupling_utils.provenance.code_fingerprint`) is measured again, or, with
``reuse_stale=True``, reused and marked stale.

Methods: ``"exact"`` forms J (one token-diagonal sweep of d VJPs per layer) and takes a full
SVD; ``"randomized"`` forms J and takes a top-K SVD with a product-only ``solver``;
``"matrix_free"`` never forms J: per layer it gets the top triplets from JVP/VJP products with
that solver (:mod:`coupling_utils.engine.spectra`), then applies J_i to the partner layers' (and
tokens') top right singular vectors to get the tiles ``|U_jᵀ J_i V_j|`` exactly. The solver is
``"lanczos"`` (default: block Lanczos, ``(2·steps − 1)·block`` passes, ``block`` defaulting to
``ceil(max(k)/10)`` and ``steps`` to 45) or ``"subspace"`` (Halko et al.'s subspace iteration,
``(2·n_iter + 2)(max(k) + oversample)`` passes). Matrix-free cost per layer:

    solver passes + P·max(k)   (+ n·max(k) for token-wise tiles of n ≥ 2 tokens)

where P is the number of partner layers: all other measured layers (P = L − 1), or, with
``depth_window=w``, the measured layers within distance w (P ≤ 2w). P·max(k) is a lower bound
for exact tiles (generic partners' vectors are independent), so the full L × L matrix only pays
off when (L − 1)·max(k) is well below d (large models, few layers, small K); a window of w = 1
(adjacent pairs, ``coupling_summary(how="adjacent")``) costs 2·max(k). Approximating J_i by its
own low-rank factors in the tiles instead would be cheap but is wrong: on SmolLM2-135M it moved
coupling values by up to 0.19.

``depth_window=w`` (any method, so that results stay comparable): the depthwise, tiles and
cross-layer context tables hold only pairs of measured layers with ``|layer_i − layer_j| ≤ w``.
"""

from __future__ import annotations

import datetime as _dt
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from coupling_utils.engine.blocks import last_block_facts, unwrap_model
from coupling_utils.engine.gram import gram_chosen
from coupling_utils.engine.jacobians import frozen
from coupling_utils.files import file_lock
from coupling_utils.measurement.assemble import prompt_tables
from coupling_utils.measurement.compute import LayerWork
from coupling_utils.measurement.finished import FinishedPrompts
from coupling_utils.measurement.inputs import ModelInfo, Prompt, model_info, model_limits
from coupling_utils.measurement.inputs import prompts as normalise_prompts
from coupling_utils.measurement.options import Options
from coupling_utils.measurement.settings import Settings
from coupling_utils.measurement.store import Store
from coupling_utils.measurement.tables import BLOCK_COLUMNS, TABLES, Measurement, concat, other_map_folder
from coupling_utils.provenance import code_fingerprint, versions

__all__ = ["measure", "measure_with"]


def measure(
    model,
    prompts,
    settings: Settings | None = None,
    *,
    out: str | Path | None = None,
    options: Options | None = None,
    resume: bool = True,
    keep_work: bool = False,
    callback: Callable[[dict], None] | None = None,
    **fields: Any,
) -> Measurement:
    """Measure block Jacobians, their spectra and coupling for some prompts; see the module doc.

    What is measured is one :class:`~coupling_utils.measurement.settings.Settings`: pass it as
    ``settings``, or its fields as keyword arguments (``layers=[1, 2], k=10``), not both. How it
    runs is ``options`` (:class:`~coupling_utils.measurement.options.Options`: ``reuse_stale``,
    ``progress``), ``out``, ``resume``, ``keep_work`` and ``callback``. The fields:

    ``model``: a LoadedModel (``coupling_utils.load_model``) or a Hugging Face model.
    ``prompts``: strings (tokenised with the model's tokenizer), token tensors [1, T], or input
    dicts with batch size 1 (e.g. ``{"pixel_values": ...}``); a list (ids "0", "1", ...) or a
    mapping ``{prompt_id: prompt}``. ``layers``: block indices (0-based, negative from the end;
    default all). ``tokens``: "last", "all" or positions. ``k``: one K or several.
    ``method``: "exact" | "randomized" | "matrix_free". The last two use the top-K ``solver``
    "lanczos" (``block``, ``steps``; defaults ceil(max(k)/10) and 45) or "subspace"
    (``oversample``, ``n_iter``), with random start ``seed``; the resolved settings are stored.
    ``depth_window``: None (all layer pairs), or w ≥ 1: only pairs of measured layers with
    ``|layer_i − layer_j| ≤ w`` in the depthwise, tiles and context tables (matrix-free then
    computes only those tiles: 2w·max(k) passes per layer instead of (L − 1)·max(k)).
    ``context``: False, or the output token t2 ("last" or a position) of the context Jacobians
    ``J_{t1 t2}`` (always formed: d VJPs per layer, whatever the method). ``tiles``: a K for the
    raw tiles table, over ``tile_layers`` (default: all measured layers; rows grow as layers² K²).
    ``n_singular``: how many singular values to keep (default max(k)). ``p``, ``normalize``,
    ``orientation``: metric options (see ``metric.coupling``). ``last_block``: what the last
    block is: "block" (alone, the paper's definition; default), "final_norm" (with the final norm,
    ``hidden_states[L-1] -> hidden_states[L]`` as the authors' code measured it) or "excluded"
    (not measured; the default layers then stop before it); ``last_block_also``: the other map,
    the last block once more in the same run (``Measurement.under`` gives each map's tables).
    ``out``: a folder for the tables, provenance and resumable work (default: a temporary one).
    ``callback(info)`` runs after each stored (prompt, layer) (``info["stage"]`` is "layer", or
    "cross" for matrix-free depth-wise products); an exception there interrupts the run, and a
    rerun with the same ``out`` continues from what is stored. ``chunk_size``: columns per
    batched JVP/VJP in the matrix-free method (memory vs speed; not part of the results).
    Work stored in ``out`` by other code (another code fingerprint, see
    :func:`coupling_utils.provenance.code_fingerprint`) is measured again, unless
    ``options.reuse_stale``: then it is reused and the result marked stale (``Measurement.stale``).
    """
    if settings is not None and fields:
        raise TypeError(f"measure(): pass settings or its fields ({', '.join(fields)}), not both")
    if settings is None:
        unknown = sorted(set(fields) - set(Settings.ARGUMENTS))
        if unknown:
            raise TypeError(
                f"measure() got unknown setting(s) {unknown}; settings: {', '.join(Settings.ARGUMENTS)} "
                "(how it runs goes in options=Options(...))"
            )
        settings = Settings(**fields)
    run = dict(resume=resume, keep_work=keep_work, callback=callback)
    return measure_with(model, prompts, settings, out=out, options=options, **run)


def measure_with(
    model,
    prompts,
    settings: Settings,
    *,
    out: str | Path | None = None,
    options: Options | None = None,
    resume: bool = True,
    keep_work: bool = False,
    callback: Callable[[dict], None] | None = None,
) -> Measurement:
    """:func:`measure` with its settings made already (the measurement loop's entry point)."""
    options = options or Options()
    progress, reuse_stale = options.progress, options.reuse_stale
    info = model_info(model)
    resolved = settings.resolve(info)
    plist = normalise_prompts(prompts, info.tokenizer, settings.max_tokens, model_limits(info))
    tmp_out = Path(tempfile.mkdtemp(prefix="coupling-measure-")) if out is None else None
    out_path = tmp_out or Path(out)
    try:
        # one measurement per folder at a time: a second process waits, then resumes from the results
        with file_lock(out_path / ".lock", f"measure into {out_path}"):
            store = Store(out_path)
            made_by = store.open(resolved, code_fingerprint(), resume=resume, reuse_stale=reuse_stale)
            run = _Run(info, resolved, store, callback, progress, options.checkpoint_seconds)
            with frozen(info.model):
                try:
                    tables = run.all_prompts(plist, keep_work)
                except BaseException:  # an error or Ctrl-C: the finished layers and prompts held are kept
                    run.work.held.write()
                    run.finished.write()
                    raise
            provenance = run.provenance(plist, tables, made_by)
            tables, other = _by_map(resolved, info, tables, provenance, None if tmp_out else out_path)
            if tmp_out is None:
                store.finish(tables, provenance, other)
    finally:
        if tmp_out is not None:
            shutil.rmtree(tmp_out, ignore_errors=True)
    out = None if tmp_out else out_path
    return Measurement(**tables, provenance=provenance, out=out, other_map=other)


def _by_map(
    s: Settings, info: ModelInfo, tables: dict[str, pd.DataFrame], provenance: dict, out: Path | None
) -> tuple[dict[str, pd.DataFrame], Measurement | None]:
    """A run's tables under ``last_block``, and (with ``last_block_also``) the Measurement under the
    second map: its rows are those without the last block's own label, ``also_layer`` relabelled as
    the last block; every other block's rows are shared by both."""
    if s.last_block_also is None:
        return tables, None
    main, other = dict(tables), dict(tables)  # the last block not measured: the same tables
    if s.also_layer is not None:
        last = s.also_layer - 1
        for name, df in tables.items():
            cols = [c for c in BLOCK_COLUMNS if c in df.columns]
            if cols:
                main[name] = df[~df[cols].eq(s.also_layer).any(axis=1)].reset_index(drop=True)
                kept = df[~df[cols].eq(last).any(axis=1)].reset_index(drop=True)
                other[name] = kept.assign(**{c: kept[c].mask(kept[c] == s.also_layer, last) for c in cols})
    settings = {**provenance["settings"], "last_block": s.last_block_also, "last_block_also": None}
    facts = last_block_facts(info.model, s.last_block_also)
    prov = {**provenance, "settings": settings, "last_block": facts, "measured_beside": s.last_block}
    folder = None if out is None else out / other_map_folder(s.last_block_also)
    return main, Measurement(**other, provenance=prov, out=folder)


class _Run:
    """The loop of one measure() call: prompts, then their layers, then their tables."""

    def __init__(
        self, info: ModelInfo, settings: Settings, store: Store, callback, progress: bool, checkpoint: float
    ):
        self.info, self.s, self.store, self.callback = info, settings, store, callback
        self.work = LayerWork(info, settings, store, checkpoint)
        self.finished = FinishedPrompts(store, checkpoint)
        self.progress = progress
        self.paths: dict[str, int] = {}  # how the token Jacobians were formed: path -> layers
        self.started = _dt.datetime.now(_dt.timezone.utc)

    def all_prompts(self, plist: list[Prompt], keep_work: bool) -> dict[str, pd.DataFrame]:
        n_layers = len(self.s.layers)
        bar = _progress(len(plist) * n_layers, self.progress)
        results = []
        for p in plist:
            tables = self.finished.tables(p.pid, p.digest)
            if tables is None:
                tables = self.one_prompt(p, bar)
                if keep_work:  # its work files are kept: every layer's, held ones written first
                    self.work.held.write()
                self.finished.add(p.pid, p.digest, tables, keep_work)
                self.work.held.drop(p.pid)
            else:
                bar.update(n_layers)
            results.append(tables)
        self.finished.write()  # every finished prompt stored, before the measurement's tables
        bar.close()
        return {name: concat(name, [r[name] for r in results]) for name in TABLES}

    def one_prompt(self, p: Prompt, bar) -> dict[str, pd.DataFrame]:
        """Every layer of one prompt (resumed from its markers), then its tables."""
        self.store.start_prompt(p.pid, p.digest, p.text)
        metas, read = [], {}
        for layer in self.s.layers:
            stored = self.store.stored_layer(p.pid, layer, self.s.layer_tables)
            computed = stored is None
            if computed:
                meta = self.work.compute_layer(p, layer)
            else:
                meta, read[layer] = stored
            metas.append(meta)
            path = meta.get("path", "all_tokens" if self.s.method != "matrix_free" else "matrix_free")
            self.paths[path] = self.paths.get(path, 0) + 1
            bar.update(1)
            self._report(p, layer, computed, "layer", meta)
        cross = None
        if self.s.method == "matrix_free" and len(self.s.layers) >= 2:
            # products with every partner's stored vectors: all made again if a layer was
            # (its vectors are new), so that no tile pairs vectors of two computations
            redo = len(read) < len(metas)
            cross = []
            for layer in self.s.layers:
                stored = None if redo else self.store.stored_layer(p.pid, layer, stage="cross")
                computed = stored is None
                cmeta = self.work.compute_cross(p, layer, metas) if computed else stored[0]
                cross.append(cmeta)
                self._report(p, layer, computed, "cross", cmeta)
        own = {layer: {name: [df] for name, df in tables.items()} for layer, tables in read.items()}
        own.update(self.work.stored_tables(p.pid))
        return prompt_tables(self.store, self.s, p, metas, cross, own, self.work.held.arrays(p.pid))

    def _report(self, p: Prompt, layer: int, computed: bool, stage: str, meta: dict) -> None:
        if self.callback is not None:
            self.callback({"prompt": p.pid, "layer": layer, "computed": computed, "stage": stage, **meta})

    def _spectra_choice(self) -> str:
        """How formed Jacobians' top triplets are computed in this run (``gram.exact_topk``)."""
        s, d = self.s, self.info.d_model
        if s.method != "exact":
            return f"{s.method} ({s.solver})"
        r = max(s.kmax, s.n_singular or s.kmax)
        device = next(unwrap_model(self.info.model).parameters()).device.type
        if d and gram_chosen(device, d, r):
            return (
                f"gram_topk: top {r} triplets from a partial eigensolver on JᵀJ (float32, refined "
                "in float64 by a power step and Rayleigh–Ritz; float64 where σ_r < 0.01·σ_1), not a full SVD"
            )
        return f"full_svd: top {r} of a full SVD"

    def provenance(self, plist: list[Prompt], tables: dict[str, pd.DataFrame], made_by: dict) -> dict:
        """Where the numbers come from: settings, model, prompts, code, versions, machine, time."""
        current = code_fingerprint()
        stale = made_by.get("fingerprint") != current["fingerprint"]
        return {
            "settings": self.s.stored(),
            "last_block": last_block_facts(self.info.model, self.s.last_block),
            "model": self.info.describe(),
            "prompts": [
                {"prompt": p.pid, "text": p.text, "digest": p.digest, "tokens": p.tokens} for p in plist
            ],
            "code": made_by,
            "stale": stale,
            **({"current_code": current} if stale else {}),
            "versions": versions(),
            "machine": {
                "node": platform.node(),
                "processor": platform.processor(),
                "platform": platform.platform(),
                "torch_threads": torch.get_num_threads(),
            },
            "started_utc": self.started.isoformat(),
            "finished_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "total_block_passes": int(tables["timings"]["block_passes"].sum()),
            "jacobian_paths": {
                "layers": dict(sorted(self.paths.items())),
                "rule": "one_token (each selected token against its prefix's key/value cache) for "
                "causal token-id prompts with at most T/2 selected tokens on a CPU, T/16 on an "
                "accelerator; all_tokens (one "
                "token-diagonal sweep) otherwise; matrix_free: products only",
                "why": sorted({why for path, why in self.work.paths.values()}),
                "spectra": self._spectra_choice(),
            },
        }


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="measure", unit="layer")
