"""Geometry of token trajectories through the residual stream.

A token's trajectory is its sequence of block-boundary hidden states ``x^0, x^1, ..., x^L``
(``blocks.residual_stream`` returns them for all tokens as ``traj[L+1, T, d]``). The paper
reports that, as coupling emerges during training, trajectories become more linear and their
steps grow exponentially with depth. This module measures that:

- :func:`step_norms`: step sizes ``‖x^l − x^{l-1}‖`` per layer and token;
- :func:`line_shape_score`: Gai & Zhang's (2021) line-shape score (1 = a straight line);
- :func:`expodistance`: how far the steps are from exact geometric growth. The paper's
  formula is not public; both variants here are **this project's reconstruction**;
- :func:`trajectory_tables`, :func:`trajectory_study`: all of these for a model on several
  prompts, with the linearisation of :mod:`coupling_utils.analysis.linearization` (how nearly
  the blocks act on the stream as their own Jacobians);
- :func:`trajectory_pca`: a 2-D or 3-D principal-component view of the trajectories;
- :func:`model_means`, :func:`linearity_contrast`, :func:`growth_contrast`: a trained model
  against its random twin, condensed into the numbers chapter f05's verdict rules judge.

Conventions: ``layer`` in every table is the residual-stream index ``l`` (0..L); the step
``x^l − x^{l-1}`` and the Jacobian ``J^l`` belong to block ``l`` (``model.layers[l-1]``).
Stacks of Jacobians are ordered by block: ``J[0]`` is ``J^1`` (first block). ``token`` is the
position in the prompt. Computations run in float64.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

__all__ = [
    "growth_intervals",
    "checkpoint_trajectories",
    "step_norms",
    "line_shape_score",
    "expodistance",
    "trajectory_pca",
    "trajectory_metrics",
    "ShortWindowWarning",
    "trajectory_tables",
    "TrajectoryTables",
    "trajectory_study",
    "token_texts",
    "study_passes",
    "linearized_study_passes",
    "EXPODISTANCE_METHODS",
    "layer_window",
    "model_means",
    "linearity_contrast",
    "growth_contrast",
]

EXPODISTANCE_METHODS = ("ratio_cv", "log_linear_r2")

# steps shorter than this (relative to the trajectory's largest step) carry no direction
_ZERO_STEP = 1e-12


# --------------------------------------------------------------------------- validation
def _as_traj(traj, name: str = "traj") -> torch.Tensor:
    """Validate a trajectory stack and return it as float64 ``Tensor[L+1, T, d]``.

    A single token's trajectory ``[L+1, d]`` is accepted as ``T = 1``.
    """
    if isinstance(traj, np.ndarray):
        traj = torch.from_numpy(traj)
    if not isinstance(traj, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor or numpy array [L+1, T, d], got {type(traj).__name__}"
        )
    if traj.ndim == 2:
        traj = traj.unsqueeze(1)
    if traj.ndim != 3:
        raise ValueError(
            f"{name} must have shape [L+1, T, d] (layers, tokens, width), got "
            f"{tuple(traj.shape)}; blocks.residual_stream(model, inputs) returns it"
        )
    if traj.shape[0] < 2:
        raise ValueError(
            f"{name} needs at least two residual states (x^0 and x^1), got "
            f"{traj.shape[0]} along the layer axis"
        )
    if traj.shape[1] < 1 or traj.shape[2] < 1:
        raise ValueError(f"{name} has an empty token or width axis: shape {tuple(traj.shape)}")
    traj = traj.detach().to(device="cpu", dtype=torch.float64)
    if not torch.isfinite(traj).all():
        bad = (~torch.isfinite(traj)).nonzero()[0].tolist()
        raise ValueError(
            f"{name} contains NaN or inf (first at layer {bad[0]}, token {bad[1]}); "
            "the forward pass overflowed: try dtype='float32'"
        )
    return traj


def _window(traj: torch.Tensor, layers) -> tuple[torch.Tensor, int]:
    """Restrict ``traj`` to residual states ``layers=(first, last)`` (inclusive)."""
    n = traj.shape[0]
    if layers is None:
        return traj, 0
    try:
        first, last = (int(v) for v in layers)
    except (TypeError, ValueError):
        raise TypeError(
            f"layers must be a pair (first, last) of residual-stream indices, got {layers!r}"
        ) from None
    if last < 0:
        last += n
    if not 0 <= first < last < n:
        raise ValueError(
            f"layers=({first}, {last}) must satisfy 0 <= first < last <= {n - 1} "
            f"(the trajectory has residual states 0..{n - 1})"
        )
    return traj[first : last + 1], first


def _steps(traj: torch.Tensor) -> torch.Tensor:
    """``x^l − x^{l-1}`` for l = 1..L: ``Tensor[L, T, d]``."""
    return traj[1:] - traj[:-1]


# --------------------------------------------------------------------------- step sizes
def step_norms(traj, *, relative: bool = False) -> pd.DataFrame:
    """Step sizes ``‖x^l − x^{l-1}‖`` per layer and token.

    Returns a tidy table (token, layer, step_norm) with ``layer`` = l in 1..L. With
    ``relative=True`` it also has ``relative_step`` = ``‖x^l − x^{l-1}‖ / ‖x^{l-1}‖``
    (how much the block changes the stream, independent of its scale).
    """
    traj = _as_traj(traj)
    norms_lt = torch.linalg.vector_norm(_steps(traj), dim=-1)  # [L, T]
    L, T = norms_lt.shape
    df = pd.DataFrame(
        {
            "token": np.tile(np.arange(T), L),
            "layer": np.repeat(np.arange(1, L + 1), T),
            "step_norm": norms_lt.reshape(-1).numpy(),
        }
    )
    if relative:
        prev = torch.linalg.vector_norm(traj[:-1], dim=-1).reshape(-1).numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            df["relative_step"] = np.where(prev > 0, df["step_norm"].to_numpy() / prev, np.nan)
    return df


# --------------------------------------------------------------------------- line shape
def line_shape_score(traj, *, layers=None) -> pd.DataFrame:
    """Gai & Zhang's (2021) line-shape score (LSS) of each token's trajectory.

    Each step is replaced by its unit direction, ``x̃^l = x̃^{l-1} + (x^l − x^{l-1}) /
    ‖x^l − x^{l-1}‖``, and ``LSS = n / ‖x̃^n − x̃^0‖`` for n steps: 1 for a straight line,
    larger the more the path turns or doubles back (inf for a closed loop). Zero-length steps
    have no direction and are skipped. ``layers=(first, last)`` restricts the score to residual
    states first..last (the paper does not say which layers it used).
    Returns (token, lss, n_steps).
    """
    traj, _ = _window(_as_traj(traj), layers)
    steps = _steps(traj)  # [n, T, d]
    norms = torch.linalg.vector_norm(steps, dim=-1, keepdim=True)  # [n, T, 1]
    scale = norms.amax(dim=0, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    moving = norms > _ZERO_STEP * scale
    units = torch.where(moving, steps / norms.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    n_steps = moving.squeeze(-1).sum(dim=0)  # [T]
    chord = torch.linalg.vector_norm(units.sum(dim=0), dim=-1)  # ‖x̃^n − x̃^0‖, [T]
    if (n_steps == 0).any():
        t = int((n_steps == 0).nonzero()[0])
        raise ValueError(f"token {t} never moves (all steps are zero); its line shape is undefined")
    with np.errstate(divide="ignore"):
        lss = n_steps.double().numpy() / chord.numpy()
    return pd.DataFrame(
        {"token": np.arange(traj.shape[1]), "lss": lss, "n_steps": n_steps.numpy().astype(int)}
    )


# --------------------------------------------------------------------------- exponential spacing
def expodistance(traj, how: str = "ratio_cv", *, layers=None) -> pd.DataFrame:
    """Distance of each token's step sizes from exact geometric (exponential) growth.

    **This project's reconstruction**: the paper's "expodistance" formula is not published.
    With step sizes ``s_l = ‖x^l − x^{l-1}‖``:

    - ``how="ratio_cv"``: coefficient of variation (population std / mean) of the ratios
      ``s_{l+1} / s_l``. 0 means every step is the same multiple of the previous one.
      ``growth`` = the mean ratio.
    - ``how="log_linear_r2"``: fit ``log s_l = a + b·l`` by least squares; the distance is
      ``1 − R²`` (0 = an exact exponential), and ``r2`` is reported too. ``growth`` = e^b,
      the fitted per-layer factor. (Constant steps fit exactly: R² = 1.)

    Needs at least 3 steps (with 2 the answer would be 0 by construction) and no zero steps.
    Returns (token, expodistance, growth, how[, r2]).
    """
    if how not in EXPODISTANCE_METHODS:
        raise ValueError(f"how must be one of {EXPODISTANCE_METHODS}, got {how!r}")
    traj, first = _window(_as_traj(traj), layers)
    s_nt = torch.linalg.vector_norm(_steps(traj), dim=-1)  # [n, T]
    n, T = s_nt.shape
    if n < 3:
        raise ValueError(
            f"expodistance needs at least 3 steps (4 residual states), got {n}; widen the layer window"
        )
    if (s_nt <= 0).any():
        l, t = (s_nt <= 0).nonzero()[0].tolist()
        raise ValueError(
            f"token {t} has a zero step at layer {first + l + 1}; step ratios and "
            "logarithms are undefined there: exclude that layer with layers=(...)"
        )
    out = {"token": np.arange(T)}
    if how == "ratio_cv":
        ratios = s_nt[1:] / s_nt[:-1]  # [n-1, T]
        mean = ratios.mean(dim=0)
        out["expodistance"] = (ratios.std(dim=0, correction=0) / mean).numpy()
        out["growth"] = mean.numpy()
    else:
        y = torch.log(s_nt)  # [n, T]
        x = torch.arange(n, dtype=torch.float64).unsqueeze(1)
        xc = x - x.mean()
        yc = y - y.mean(dim=0, keepdim=True)
        slope = (xc * yc).sum(dim=0) / (xc**2).sum()
        resid = yc - slope * xc
        ss_res = (resid**2).sum(dim=0)
        ss_tot = (yc**2).sum(dim=0)
        # relative tolerance: a perfect fit leaves only rounding in ss_res
        tiny = 1e-24 * (y**2).sum(dim=0).clamp_min(1.0)
        r2 = torch.where(ss_tot > tiny, 1 - ss_res / ss_tot.clamp_min(tiny), 1.0)
        r2 = torch.where(ss_res <= tiny, 1.0, r2)
        out["expodistance"] = (1 - r2).numpy()
        out["growth"] = torch.exp(slope).numpy()
        out["r2"] = r2.numpy()
    out["how"] = how
    df = pd.DataFrame(out)
    cols = ["token", "expodistance", "growth", "how"] + (["r2"] if "r2" in df else [])
    return df[cols]


# --------------------------------------------------------------------------- PCA
def trajectory_pca(traj, n_components: int = 2, *, fit: str = "joint", tokens=None) -> pd.DataFrame:
    """Project token trajectories onto their top principal components.

    ``fit="joint"`` fits one PCA to all (layer, token) states, so every trajectory shares
    the same axes; ``fit="per_token"`` fits each token's trajectory on its own (its shape,
    e.g. how straight it is). States are centred on their mean; component signs are fixed so
    that each component's largest loading is positive (reproducible pictures). ``tokens``
    selects positions. Returns (token, layer, pc1, pc2[, pc3]); ``df.attrs`` holds
    ``explained_variance_ratio`` (a list for "joint", a dict token -> list for "per_token").
    """
    traj = _as_traj(traj)
    if isinstance(n_components, bool) or n_components not in (2, 3):
        raise ValueError(f"n_components must be 2 or 3, got {n_components!r}")
    if fit not in ("joint", "per_token"):
        raise ValueError(f"fit must be 'joint' or 'per_token', got {fit!r}")
    L1, T, d = traj.shape
    if tokens is not None:
        tokens = [int(t) for t in tokens]
        if not tokens or any(not -T <= t < T for t in tokens):
            raise ValueError(f"tokens must be positions in 0..{T - 1}, got {tokens}")
        tokens = [t % T for t in tokens]
    else:
        tokens = list(range(T))
    if n_components > d:
        raise ValueError(f"n_components={n_components} exceeds the width d={d}")
    names = [f"pc{i + 1}" for i in range(n_components)]

    def project(points: torch.Tensor) -> tuple[np.ndarray, list[float]]:
        centred = points - points.mean(dim=0, keepdim=True)
        _, S, Vh = torch.linalg.svd(centred, full_matrices=False)
        comps = Vh[:n_components]
        signs = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))
        comps = comps * torch.where(signs == 0, 1.0, signs)
        total = (S**2).sum()
        evr = ((S[:n_components] ** 2) / total).tolist() if total > 0 else [0.0] * n_components
        evr += [0.0] * (n_components - len(evr))
        proj = centred @ comps.T
        if proj.shape[1] < n_components:  # fewer states than components
            proj = torch.nn.functional.pad(proj, (0, n_components - proj.shape[1]))
        return proj.numpy(), evr

    sel = traj[:, tokens]  # [L+1, T', d]
    if fit == "joint":
        proj, evr = project(sel.transpose(0, 1).reshape(-1, d))  # token-major rows
        df = pd.DataFrame(proj, columns=names)
        df.insert(0, "layer", np.tile(np.arange(L1), len(tokens)))
        df.insert(0, "token", np.repeat(tokens, L1))
        df.attrs["explained_variance_ratio"] = evr
        return df
    frames, evrs = [], {}
    for i, t in enumerate(tokens):
        proj, evrs[t] = project(sel[:, i])
        f = pd.DataFrame(proj, columns=names)
        f.insert(0, "layer", np.arange(L1))
        f.insert(0, "token", t)
        frames.append(f)
    df = pd.concat(frames, ignore_index=True)
    df.attrs["explained_variance_ratio"] = evrs
    return df


# --------------------------------------------------------------------------- summary
class ShortWindowWarning(UserWarning):
    """The layer window has fewer than 3 steps: expodistance is left NaN (filter by this type)."""


def trajectory_metrics(traj, *, layers=None, how: Sequence[str] = EXPODISTANCE_METHODS) -> pd.DataFrame:
    """One row per token: line-shape score and expodistance(s) over the same layer window.

    Columns: token, lss, and ``expodistance_<how>`` (plus ``growth_<how>``) for each method.
    A window of fewer than 3 steps (a 2-block model, say) has no meaningful expodistance: those
    columns are then NaN, with a warning.
    """
    traj = _as_traj(traj)
    df = line_shape_score(traj, layers=layers)[["token", "lss"]]
    n_steps = _window(traj, layers)[0].shape[0] - 1
    if n_steps < 3:
        warnings.warn(
            f"only {n_steps} steps in the layer window: expodistance needs at least 3 and is left NaN",
            ShortWindowWarning,
            stacklevel=2,
        )
    for h in how:
        if n_steps < 3:
            df[f"expodistance_{h}"] = df[f"growth_{h}"] = np.nan
            continue
        e = expodistance(traj, h, layers=layers)
        df[f"expodistance_{h}"] = e["expodistance"].to_numpy()
        df[f"growth_{h}"] = e["growth"].to_numpy()
    return df


# --------------------------------------------------------------------------- a model, many prompts
@dataclass
class TrajectoryTables:
    """Trajectory measurements of one model over several prompts (tidy tables + raw streams).

    ``streams[p]`` is prompt p's residual stream ``Tensor[L+1, T_p, d]``; the tables carry
    ``model`` and ``prompt`` (index) columns so several models concatenate cleanly.
    """

    streams: list
    steps: pd.DataFrame  # model, prompt, token, layer, step_norm, relative_step
    metrics: pd.DataFrame  # model, prompt, token, lss, expodistance_<how>, growth_<how>
    linearization: pd.DataFrame  # model, prompt, token, layer, cosine, norm_ratio (empty if off)


def trajectory_tables(
    model,
    prompts_inputs: Sequence,
    *,
    label: str = "model",
    layers=None,
    linearization: bool = True,
    skip_first_token: bool = False,
) -> TrajectoryTables:
    """Residual streams and every trajectory measurement of ``model`` on several prompts.

    ``prompts_inputs``: one input per prompt (token ids ``[1, T]`` or a dict of model inputs).
    ``layers=(first, last)`` is the residual-state window for the line-shape score and
    expodistance; the linearisation always runs through all blocks. ``skip_first_token``
    drops position 0 from the tables (often an attention sink with outsized norms); it is
    kept in ``streams``. ``label`` fills the ``model`` column.
    """
    # imported here: the linearisation module imports this one
    from coupling_utils.analysis.linearization import model_linearization_cosine
    from coupling_utils.engine.blocks import residual_stream

    if not len(prompts_inputs):
        raise ValueError("prompts_inputs is empty; pass at least one prompt's inputs")
    streams, steps, metrics, lins = [], [], [], []
    for p, inputs in enumerate(prompts_inputs):
        traj = _as_traj(residual_stream(model, inputs), f"the residual stream of prompt {p}")
        streams.append(traj)
        tag = {"model": label, "prompt": p}
        steps.append(step_norms(traj, relative=True).assign(**tag))
        metrics.append(trajectory_metrics(traj, layers=layers).assign(**tag))
        if linearization:
            lins.append(model_linearization_cosine(model, inputs, prefix=True).assign(**tag))

    def tidy(frames, lead=("model", "prompt", "token")):
        if not frames:
            return pd.DataFrame(columns=list(lead))
        df = pd.concat(frames, ignore_index=True)
        if skip_first_token and df["token"].max() > 0:
            df = df[df["token"] != 0].reset_index(drop=True)
        return df[list(lead) + [c for c in df.columns if c not in lead]]

    return TrajectoryTables(streams, tidy(steps), tidy(metrics), tidy(lins))


def trajectory_study(
    model,
    prompts: Sequence[str],
    *,
    label: str,
    window: tuple[int, int] = (0, -1),
    linearization: bool = True,
    skip_first_token: bool = False,
    pca_prompt: int = 0,
    pca_fit: str = "joint",
) -> dict[str, pd.DataFrame]:
    """Every table a trajectory study of ``model`` on the prompts' texts needs, as storable tables.

    A measurement :class:`~coupling_utils.measurement.jobs.Extra` (chapter f05): the prompts are
    tokenised with the model's tokenizer, ``window=(first_layer, last_layer)`` (``last`` may count
    from the end) is resolved against its depth, and :func:`trajectory_tables` measures them.
    Returns ``steps``, ``metrics``, ``linearization`` (as :class:`TrajectoryTables`, ``model`` =
    ``label``), ``pca`` (:func:`trajectory_pca` of prompt ``pca_prompt`` in 2 components, every
    token), ``tokens`` (prompt, position, token_id, token) and ``facts`` (one row: name,
    n_layers, d_model, first, last: the model and the resolved window).
    """
    layers = layer_window(window[0], window[1], model.n_layers)
    inputs = [model.tokenizer(p, return_tensors="pt").input_ids for p in prompts]  # one [1, T] each
    res = trajectory_tables(
        model,
        inputs,
        label=label,
        layers=layers,
        linearization=linearization,
        skip_first_token=skip_first_token,
    )
    pca = trajectory_pca(res.streams[pca_prompt], 2, fit=pca_fit).assign(model=label)
    tokens = pd.concat(
        [
            pd.DataFrame({"prompt": p, "position": range(ids.shape[1]), "token_id": ids[0].tolist(),
                          "token": token_texts(model.tokenizer, ids[0].tolist())})
            for p, ids in enumerate(inputs)
        ],
        ignore_index=True,
    )  # fmt: skip
    facts = pd.DataFrame(
        [{"name": model.name, "n_layers": model.n_layers, "d_model": model.d_model,
          "first": layers[0], "last": layers[1]}]
    )  # fmt: skip
    return {"steps": res.steps, "metrics": res.metrics, "linearization": res.linearization,
            "pca": pca, "tokens": tokens, "facts": facts}  # fmt: skip


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's text as a reader reads it: its id decoded on its own (``" is"``, not the
    vocabulary's ``"Ġis"``). A tokenizer that drops a word's leading space when it decodes one
    token (SentencePiece's ``"▁is"`` decodes to ``"is"``) gets the space back."""
    ids = [int(i) for i in ids]
    raw = tokenizer.convert_ids_to_tokens(ids)
    texts = []
    for i, r in zip(ids, raw, strict=True):
        text = tokenizer.decode([i])
        if str(r).startswith(("Ġ", "▁")) and not text.startswith(" "):
            text = " " + text
        texts.append(text)
    return texts


def study_passes(n_layers: int, d_model: int) -> int:
    """Block passes per prompt of :func:`trajectory_study` without the linearisation (the cost
    model's count: one per block)."""
    return n_layers


def linearized_study_passes(n_layers: int, d_model: int) -> int:
    """Block passes per prompt of :func:`trajectory_study` with the linearisation (one forward
    and one forward-mode product per block)."""
    return 2 * n_layers


# --------------------------------------------------------------------------- a model against its twin
def layer_window(first: int, last: int, n_layers: int) -> tuple[int, int]:
    """The residual-state window ``(first, last)`` of a model with ``n_layers`` blocks.

    ``last`` may count from the end (-1: x^L, the output of the last block). A ValueError names
    both parameters when the window is empty or outside 0..L.
    """
    stop = last + n_layers + 1 if last < 0 else last
    if not 0 <= first < stop <= n_layers:
        raise ValueError(
            f"first_layer={first} and last_layer={last} must give a window 0 <= first < last <= "
            f"{n_layers} of residual states (the model has {n_layers} blocks; -1 is the last state)"
        )
    return first, stop


def model_means(metrics: pd.DataFrame, column: str) -> pd.Series:
    """Mean of ``column`` over each model's tokens and prompts (a Series indexed by model)."""
    from coupling_utils.schemas import Schema, check_table

    check_table(metrics, Schema("metrics", {"model": "any", column: "any"}))
    return metrics.groupby("model", sort=False)[column].mean()


def _paired(metrics: pd.DataFrame, column: str, trained: str, twin: str) -> pd.DataFrame:
    keys = ["prompt", "token"]
    a = metrics[metrics["model"] == trained].set_index(keys)[column]
    b = metrics[metrics["model"] == twin].set_index(keys)[column]
    return pd.concat({"trained": a, "twin": b}, axis=1).dropna()


def linearity_contrast(metrics: pd.DataFrame, trained: str = "trained", twin: str = "random init") -> dict:
    """Line-shape scores of a trained model against its twin, token by token.

    ``lss_trained``, ``lss_twin``: mean LSS (1 = straight); ``lss_ratio`` = their ratio (< 1: the
    trained model's paths are straighter); ``share_lower``: the share of (prompt, token)
    trajectories whose LSS is lower in the trained model than in the twin (the same token of the
    same prompt). NaN where the twin was not measured.
    """
    pairs = _paired(metrics, "lss", trained, twin)
    means = model_means(metrics, "lss")
    a, b = float(means.get(trained, np.nan)), float(means.get(twin, np.nan))
    return {
        "lss_trained": a,
        "lss_twin": b,
        "lss_ratio": a / b if b > 0 else np.nan,
        "share_lower": float((pairs["trained"] < pairs["twin"]).mean()) if len(pairs) else np.nan,
    }


def growth_contrast(metrics: pd.DataFrame, trained: str = "trained", twin: str = "random init") -> dict:
    """Exponential spacing of a trained model's steps against its twin's (both reconstructions).

    ``growth``: the trained model's mean fitted growth per block (``growth_log_linear_r2``);
    ``<how>_trained``, ``<how>_twin`` and ``<how>_ratio`` (trained / twin; < 1: closer to an
    exact exponential) for each expodistance in :data:`EXPODISTANCE_METHODS`. NaN where a
    number is missing (a window of fewer than 3 steps, or no twin).
    """
    out = {"growth": float(model_means(metrics, "growth_log_linear_r2").get(trained, np.nan))}
    for how in EXPODISTANCE_METHODS:
        means = model_means(metrics, f"expodistance_{how}")
        a, b = float(means.get(trained, np.nan)), float(means.get(twin, np.nan))
        out[f"{how}_trained"], out[f"{how}_twin"] = a, b
        out[f"{how}_ratio"] = a / b if b > 0 else np.nan
    return out


def growth_intervals(
    metrics: pd.DataFrame, trained: str = "trained", twin: str = "random init", *, n_resamples: int = 1000
) -> dict:
    """:func:`growth_contrast`'s ``growth`` and ``<how>_ratio`` as 95% intervals over prompts (a
    prompt resampled with all its tokens, for both models at once; seeded). Empty without a twin;
    one prompt gives unbounded intervals (nothing to resample)."""
    from coupling_utils.analysis.stats import bootstrap_intervals

    if not {trained, twin} <= set(metrics["model"]):
        return {}
    cols = ["growth_log_linear_r2", *(f"expodistance_{how}" for how in EXPODISTANCE_METHODS)]
    grouped = metrics[metrics["model"].isin([trained, twin])].groupby(["prompt", "model"])[cols]
    wide = pd.concat({"sum": grouped.sum(), "n": grouped.count()}, axis=1).unstack("model")

    def values(sample: pd.DataFrame) -> dict[str, float]:
        total = sample.sum()

        def mean(column: str, model: str) -> float:
            n = total[("n", column, model)]
            return float(total[("sum", column, model)] / n) if n else np.nan

        out = {"growth": mean("growth_log_linear_r2", trained)}
        for how in EXPODISTANCE_METHODS:
            a, b = mean(f"expodistance_{how}", trained), mean(f"expodistance_{how}", twin)
            out[f"{how}_ratio"] = a / b if b > 0 else np.nan
        return out

    return bootstrap_intervals(wide, values, "prompt", n_resamples=n_resamples)


def checkpoint_trajectories(
    lm, prompts: dict[str, str], *, max_tokens: int | None, layers: tuple[int, int] | None, tokens: str
) -> dict[str, pd.DataFrame]:
    """Residual-stream trajectories of the prompts' tokens at one checkpoint: ``trajectories``
    (line-shape score, expodistance, growth per token) and ``step_norms`` (per token and layer)."""
    from coupling_utils.engine.blocks import residual_stream

    trajs, norms = [], []
    for pid, text in prompts.items():
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens]
        traj = residual_stream(lm, ids)  # [L+1, T, d]
        if tokens == "last":
            traj = traj[:, -1:]
            token_ids = [ids.shape[1] - 1]
        else:
            token_ids = list(range(ids.shape[1]))
        n_steps = (traj.shape[0] - 1) if layers is None else (layers[1] % traj.shape[0]) - layers[0]
        if n_steps >= 3:
            metrics = trajectory_metrics(traj, layers=layers)
        else:  # expodistance needs three steps; a 2-block model has only the line-shape score
            with warnings.catch_warnings():  # the NaN columns below say so; no warning per prompt
                warnings.simplefilter("ignore", ShortWindowWarning)
                metrics = trajectory_metrics(traj, layers=layers, how=())
            for h in EXPODISTANCE_METHODS:
                metrics[f"expodistance_{h}"] = np.nan
                metrics[f"growth_{h}"] = np.nan
        metrics["token"] = np.asarray(token_ids)[metrics["token"].to_numpy()]
        trajs.append(metrics.assign(prompt=pid))
        sn = step_norms(traj, relative=True)
        sn["token"] = np.asarray(token_ids)[sn["token"].to_numpy()]
        norms.append(sn.assign(prompt=pid))
    return {
        "trajectories": pd.concat(trajs, ignore_index=True),
        "step_norms": pd.concat(norms, ignore_index=True),
    }
