"""Concept diagrams drawn when the book is built, from small computations that run then.

:func:`coupling_diagram` is what coupling of top singular vectors means: a matrix ``J1`` seen in
three singular bases (its own, that of a noisy copy ``J2`` and that of an unrelated matrix
``J3``), each drawn as the paper's K×K tile ``|U_{j,K}^T J1 V_{j,K}|`` with the metric ``m_K``
computed by :func:`coupling_utils.engine.metric.coupling`. :func:`jacobian_diagram` is a block
Jacobian along a token trajectory: the states ``x^l_t`` of a tiny random GPT-NeoX through its
blocks (PCA) and one step's ``d×d`` Jacobian ``J^l_tt``, both from the engine.
:func:`tile_matrix_diagram` is chapter f01's tile matrix on the same tiny model, its blocks
aligned (copies of one block with a little noise) or independent. :func:`stage_diagrams` writes
each chart beside the notation page and replaces its marker line (:data:`DIAGRAMS`) with a
numbered figure. :func:`k_policy_figure` is not a concept but a measurement: the K/d
sensitivity curve (``data/k_sensitivity.csv``) from which ``analysis.k_policy`` chooses the
book's K/d, staged the same way on the method page; :func:`engine_figure` is the engine's
measured speed-up over the authors' method (``data/benchmarks/engine.csv``), on the performance
page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = [
    "MARKER",
    "DIAGRAM_FILE",
    "DIAGRAM_NAME",
    "JACOBIAN_MARKER",
    "JACOBIAN_NAME",
    "TILES_MARKER",
    "TILES_NAME",
    "DIAGRAMS",
    "Diagram",
    "tiny_block_model",
    "coupling_diagram",
    "jacobian_diagram",
    "tile_matrix_diagram",
    "K_POLICY_MARKER",
    "K_POLICY_NAME",
    "k_policy_figure",
    "ENGINE_MARKER",
    "ENGINE_NAME",
    "engine_figure",
    "stage_diagrams",
]

MARKER = "% concept-diagram"
DIAGRAM_FILE = "_generated/coupling-diagram.html"  # next to the page, in the staged book
DIAGRAM_NAME = "fig-notation-coupling"
OWN, COPY, OTHER = "J1 (its own)", "J2 (J1 + noise)", "J3 (unrelated)"  # the bases, in column order
SIZE, K, NOISE, SEED = 24, 6, 0.1, 0  # J1 is SIZE×SIZE; J2 = J1 + noise of NOISE·‖J1‖ (Frobenius)

JACOBIAN_MARKER, JACOBIAN_NAME = "% jacobian-diagram", "fig-notation-jacobian"
TILES_MARKER, TILES_NAME = "% tile-diagram", "fig-notation-tiles"
# the tiny model of the two engine diagrams: width, blocks, heads, vocabulary; its prompt's token ids
TINY_D, TINY_L, TINY_HEADS, TINY_VOCAB = 16, 6, 2, 64
TINY_IDS = (3, 17, 42, 8, 25)
STEP = 3  # the Jacobian diagram draws block STEP's Jacobian J^STEP_tt (the step x^{STEP-1} -> x^STEP)
TILE_BLOCKS, TILE_K = 4, 4  # the tile matrix: the first TILE_BLOCKS blocks, K = TILE_K
ALIGNED, INDEPENDENT = "aligned blocks", "independent blocks"  # the tile diagram's panels, in order
K_POLICY_MARKER, K_POLICY_NAME = "% k-policy-curve", "fig-method-k-policy"
ENGINE_MARKER, ENGINE_NAME = "% engine-speedup", "fig-performance-engine"
# the engine figure's series: bench/bench_engine.py's method names on the SmolLM2-sized block
ENGINE_SERIES = {"one_token (1 token)": "one token", "all_tokens: Jacobians, spectra, coupling": "all tokens"}


def tiny_block_model(n_layers: int = TINY_L, *, seed: int = SEED, aligned: float | None = None):
    """A tiny random GPT-NeoX (width :data:`TINY_D`) as a ``LoadedModel`` the engine measures.

    ``aligned``: None for independently initialised blocks; a noise level ``a`` makes every block
    a copy of the first with noise of ``a`` times each weight's norm (blocks that compute nearly
    the same map, as coupled blocks do). The global random state is left untouched."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from coupling_utils.models.loading import LoadedModel

    config = GPTNeoXConfig(
        vocab_size=TINY_VOCAB, hidden_size=TINY_D, num_hidden_layers=n_layers,
        num_attention_heads=TINY_HEADS, intermediate_size=4 * TINY_D, hidden_act="gelu",
        max_position_embeddings=64, attention_dropout=0.0, hidden_dropout=0.0,
        tie_word_embeddings=False, use_parallel_residual=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTNeoXForCausalLM(config).eval()
    if aligned is not None:
        g = torch.Generator().manual_seed(seed + 1)
        first, *others = model.gpt_neox.layers
        with torch.no_grad():
            for block in others:
                for p, p0 in zip(block.parameters(), first.parameters(), strict=True):
                    noise = torch.randn(p.shape, generator=g)
                    p.copy_(p0 + aligned * p0.norm() * noise / noise.norm())
    model.requires_grad_(False)
    return LoadedModel(
        model=model, tokenizer=None, name="tiny random GPT-NeoX", revision=None, dtype="float32",
        arch="gpt_neox", n_layers=n_layers, d_model=TINY_D,
    )  # fmt: skip


def coupling_diagram() -> tuple[object, pd.DataFrame]:
    """(chart, metric table): the tiles of ``J1`` in three bases and ``m_K`` for each basis."""
    import torch

    from coupling_utils.analysis import plots
    from coupling_utils.engine.metric import coupling, coupling_tile

    g = torch.Generator().manual_seed(SEED)
    j1 = torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64)
    noise = torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64)
    bases = {
        OWN: j1,
        COPY: j1 + NOISE * j1.norm() * noise / noise.norm(),
        OTHER: torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64),
    }
    rows, metrics = [], []
    for name, other in bases.items():
        tile = coupling_tile(j1, other, K).numpy()
        rows += [
            {"layer_i": "J1", "layer_j": name, "row": r, "col": c, "value": float(tile[r, c])}
            for r in range(K)
            for c in range(K)
        ]
        metrics.append({"basis": name, "m_K": coupling(j1, other, K)})
    look = plots.Look(title=f"J1 in three singular bases (K = {K}, d = {SIZE})")
    return plots.tile_grid(pd.DataFrame(rows), look=look), pd.DataFrame(metrics)


def jacobian_diagram() -> tuple[object, dict]:
    """(chart, facts): the tiny model's token trajectories (PCA of ``x^l_t``) beside block
    :data:`STEP`'s Jacobian ``J^l_tt`` of the last token; facts: its norm, top singular value and
    the share of its Frobenius energy in the top 4 singular values."""
    import altair as alt
    import torch

    from coupling_utils.analysis import plots
    from coupling_utils.analysis.trajectories import trajectory_pca
    from coupling_utils.engine.blocks import residual_stream
    from coupling_utils.engine.jacobians import token_jacobians

    lm, ids = tiny_block_model(), torch.tensor([TINY_IDS])
    t = len(TINY_IDS) - 1
    pca = trajectory_pca(residual_stream(lm, ids), 2)
    pca["token"] = "t = " + pca["token"].astype(str)
    paths = plots.trajectory_pca_chart(pca, look=plots.Look(title="token trajectories", width=240))
    J = token_jacobians(lm, ids, STEP - 1, tokens=[t], progress=False)[0].double()  # engine index = l − 1
    S = torch.linalg.svdvals(J)
    cells = pd.DataFrame(
        [{"output": r, "input": c, "entry": float(J[r, c])} for r in range(TINY_D) for c in range(TINY_D)]
    )
    limit = float(J.abs().max())
    no_axis = alt.Axis(labels=False, ticks=False, domain=False)
    heat = alt.Chart(cells, title=f"Jacobian of block {STEP}, token t = {t}").mark_rect().encode(
        x=alt.X("input:O", axis=no_axis, title="input coordinate"),
        y=alt.Y("output:O", axis=no_axis, title="output coordinate"),
        color=alt.Color("entry:Q", scale=alt.Scale(scheme="blueorange", domain=[-limit, limit]),
                        title="entry"),
        tooltip=["output:O", "input:O", alt.Tooltip("entry:Q", format=".3g")],
    ).properties(width=240, height=240)  # fmt: skip
    facts = {
        "token": t,
        "norm": float(J.norm()),
        "top": float(S[0]),
        "share4": float((S[:4] ** 2).sum() / (S**2).sum()),
    }
    return alt.hconcat(paths, heat).resolve_scale(color="independent"), facts


def _tile_rows(lm, ids, weights: str) -> tuple[list[dict], float]:
    """The long rows of one model's tile matrix (tile (i, j) at x = j·(K+1) + col) and its mean
    ``m_K`` over block pairs i ≠ j."""
    from coupling_utils.engine.jacobians import token_jacobians
    from coupling_utils.engine.metric import coupling, coupling_tile

    t = ids.shape[1] - 1
    Js = [token_jacobians(lm, ids, b, tokens=[t], progress=False)[0].double() for b in range(TILE_BLOCKS)]
    rows, ms = [], []
    for i, Ji in enumerate(Js):
        for j, Jj in enumerate(Js):
            tile = coupling_tile(Ji, Jj, TILE_K).numpy()
            top = float(tile.max()) or 1.0
            if i != j:
                ms.append(coupling(Ji, Jj, TILE_K))
            for r in range(TILE_K):
                for c in range(TILE_K):
                    x, y = j * (TILE_K + 1) + c, i * (TILE_K + 1) + r
                    rows.append({"weights": weights, "block_i": i + 1, "block_j": j + 1, "x": x, "y": y,
                                 "x2": x + 1, "y2": y + 1, "value": float(tile[r, c]) / top})  # fmt: skip
    return rows, sum(ms) / len(ms)


def tile_matrix_diagram(noise: float = NOISE) -> tuple[object, dict[str, float]]:
    """(chart, mean m_K by panel): the tile matrix ``|U_{j,K}^T J_i V_{j,K}|`` of the tiny model's
    first :data:`TILE_BLOCKS` blocks (last token), its blocks aligned (noise ``noise``) and
    independent, side by side."""
    import altair as alt
    import torch

    ids = torch.tensor([TINY_IDS])
    rows, means = [], {}
    for weights, aligned in ((ALIGNED, noise), (INDEPENDENT, None)):
        more, means[weights] = _tile_rows(tiny_block_model(TILE_BLOCKS, aligned=aligned), ids, weights)
        rows += more
    df = pd.DataFrame(rows)
    none = alt.Axis(labels=False, ticks=False, domain=False, grid=False)
    span = TILE_BLOCKS * (TILE_K + 1) - 1
    chart = alt.Chart(df).mark_rect().encode(
        x=alt.X("x:Q", axis=none, title="singular vectors U_j, V_j of block j",
                scale=alt.Scale(domain=[0, span])),
        x2="x2:Q",
        y=alt.Y("y:Q", axis=none, title="Jacobian J_i of block i", scale=alt.Scale(domain=[span, 0])),
        y2="y2:Q",
        color=alt.Color("value:Q", scale=alt.Scale(scheme="viridis"), title="|entry| / tile max"),
        tooltip=["block_i:O", "block_j:O", alt.Tooltip("value:Q", format=".2f")],
    ).properties(width=200, height=200).facet(
        column=alt.Column("weights:N", title=None, sort=[ALIGNED, INDEPENDENT])
    )  # fmt: skip
    return chart, means


@dataclass(frozen=True)
class Diagram:
    """One concept diagram: the marker line it replaces, its figure's name and file, and the
    function that computes it and returns (chart, caption, alt text)."""

    marker: str
    name: str
    file: str
    draw: Callable[[], tuple[object, str, str]]


def _coupling_figure() -> tuple[object, str, str]:
    from coupling_utils.analysis import layout

    chart, metrics = coupling_diagram()
    m = dict(zip(metrics.basis, metrics.m_K, strict=True))
    where = {name: layout.position(chart, f"J1, {name}") for name in (OWN, COPY, OTHER)}
    # each basis named once, then its panel's position (the panels' titles hold these words)
    said = {OWN: "J1's own basis", COPY: "the basis of J2 = J1 + noise",
            OTHER: "the basis of the unrelated J3"}  # fmt: skip
    caption = (
        f"What coupling means, computed when this book was built: a random {SIZE}×{SIZE} matrix "
        f"$J_1$ seen in the leading {K} singular vectors of itself, of a copy with {NOISE:.0%} noise "
        f"and of an unrelated random matrix. Each tile is $|U_{{j,K}}^\\top J_1 V_{{j,K}}|$ over its "
        f"largest entry. In {said[OWN]} ({where[OWN]}) the tile is diagonal ($m_K$ = "
        f"{m[OWN]:.1e}); in {said[COPY]} ({where[COPY]}) it stays nearly so ($m_K$ = {m[COPY]:.2f}); "
        f"in {said[OTHER]} ({where[OTHER]}) it has no diagonal ($m_K$ = {m[OTHER]:.2f})."
    )
    alt = (
        f"Three {K} by {K} heatmaps in a row. Own basis: only the diagonal is bright. Noisy copy: "
        "a bright diagonal with faint off-diagonal cells. Unrelated matrix: bright cells scattered "
        "with no diagonal."
    )
    return chart, caption, alt


def _jacobian_figure() -> tuple[object, str, str]:
    from coupling_utils.analysis import layout

    chart, f = jacobian_diagram()
    paths, heat = layout.where(chart, "token trajectories"), layout.where(chart, f"Jacobian of block {STEP}")
    caption = (
        f"A block Jacobian along a token trajectory, computed when this book was built on a tiny "
        f"random GPT-NeoX ({TINY_L} blocks, $d$ = {TINY_D}) and a prompt of {len(TINY_IDS)} tokens. "
        f"The {paths}: each token's states $x^0_t, \\dots, x^{TINY_L}_t$ in the plane of their first two "
        f"principal components, coloured by depth. The {heat}: the ${TINY_D} \\times {TINY_D}$ matrix "
        f"$J^{STEP}_{{tt}}$ of the step from $x^{STEP - 1}_t$ to $x^{STEP}_t$ for token $t$ = {f['token']} "
        f"(Frobenius norm {f['norm']:.2f}, top singular value {f['top']:.2f}; its top 4 singular "
        f"values hold {f['share4']:.0%} of its energy)."
    )
    alt = (
        f"Two panels in a row. First: {len(TINY_IDS)} short paths of {TINY_L + 1} points each, one "
        f"per token, points coloured from dark (early blocks) to light (late blocks). Second: a "
        f"{TINY_D} by {TINY_D} heatmap of the Jacobian's entries, blue negative, orange positive."
    )
    return chart, caption, alt


def _tiles_figure() -> tuple[object, str, str]:
    from coupling_utils.analysis import layout

    chart, m = tile_matrix_diagram()
    a, b = layout.where(chart, ALIGNED), layout.where(chart, INDEPENDENT)
    caption = (
        f"The tile matrix of chapter f01, computed when this book was built on a tiny GPT-NeoX "
        f"($d$ = {TINY_D}; its first {TILE_BLOCKS} blocks, last token, $K$ = {TILE_K}): tile $(i, j)$ "
        f"is $|U_{{j,K}}^\\top J_i V_{{j,K}}|$ over its largest entry. In the model whose blocks are "
        f"copies of one block with {NOISE:.0%} noise, the {a}, every tile is nearly diagonal "
        f"(mean $m_K$ over pairs $i \\ne j$ = {m[ALIGNED]:.2f}): the blocks are coupled. In the "
        f"model with independently initialised blocks, the {b}, only the tiles $(i, i)$ are "
        f"diagonal (mean $m_K$ = {m[INDEPENDENT]:.2f}). A trained model is expected to look like "
        f"the first, its random twin like the second; the aligned blocks here only stand in for "
        f"what training does."
    )
    alt = (
        f"Two {TILE_BLOCKS} by {TILE_BLOCKS} grids of small {TILE_K} by {TILE_K} heatmaps in a row. "
        "Aligned blocks: a bright diagonal in every small heatmap. Independent blocks: bright "
        "diagonals only on the main diagonal of the grid, scattered cells elsewhere."
    )
    return chart, caption, alt


def k_policy_figure() -> tuple[object, str, str]:
    """The measured K/d sensitivity curve as the rule reads it: per voice (a single model, or an
    embedded family's median member), each K/d's excess over the random twin as a share of the
    model's largest, with the share of its bootstrap interval's ends; a rule at the chosen K/d."""
    from coupling_utils.analysis import k_policy, plots

    curve = k_policy.measured_curve()
    decision = k_policy.decide(curve)
    if decision.k_over_d != k_policy.BOOK_K_OVER_D:
        raise ValueError(
            f"data/k_sensitivity.csv now chooses K/d = {decision.k_over_d:g}, but the book measures at "
            f"k_policy.BOOK_K_OVER_D = {k_policy.BOOK_K_OVER_D:g}: move BOOK_K_OVER_D and every "
            "chapter's K with it (tests/test_k_policy.py lists them), then rerun the book"
        )
    by_voice = k_policy.voice_shares(curve, decision.left_out)
    chart = plots.sensitivity_curve(
        by_voice, "k_over_d", "excess", "low", "high", "voice", chosen=decision.k_over_d,
        look=plots.Look(title="Excess over the random twin, as a share of each model's largest",
                        x_title="K/d", y_title="share of the largest excess"),
    )  # fmt: skip
    n_models = curve["model"].nunique()
    at_choice = by_voice[by_voice.k_over_d == decision.k_over_d]
    flat = sorted(at_choice[at_choice.excess <= 0].voice)
    at = decision.share
    caption = (
        f"The K/d sensitivity curve, measured on {n_models} embedded models and read when this book "
        f"was built (data/k_sensitivity.csv): for each of {len(decision.models)} voices (a model, or "
        f"an embedded family as the median of its members), the excess coupling over the random-init "
        f"twin at each K/d, divided by the model's largest excess, with the same share of its 95% "
        f"interval over prompts. Left out, their largest excess having an interval that touches 0: "
        f"{', '.join(decision.left_out) or 'none'}. The rule (stated on this page) reads the median "
        f"over voices among the K/d that keep at least {k_policy.MIN_K} pairs at width "
        f"{k_policy.NARROWEST} ({', '.join(f'{r:g}' for r in decision.eligible)}): "
        + "; ".join(f"{at[r]:.3f} at {r:g}" for r in decision.eligible)
        + f". The grey rule marks its choice, K/d = {decision.k_over_d:g}. "
        + (
            f"At that K/d the excess is not above zero for {', '.join(flat)}."
            if flat
            else "At that K/d every voice's excess is above zero."
        )
    )
    alt = (
        f"A line chart with {len(decision.models)} lines, one per voice, of the share of the largest "
        f"excess against K/d on a logarithmic axis from {min(k_policy.GRID):g} to "
        f"{max(k_policy.GRID):g}, with interval bars, a dashed line at zero and a grey vertical rule "
        f"at K/d = {decision.k_over_d:g}."
    )
    return chart, caption, alt


def engine_figure(csv: Path | None = None) -> tuple[object, str, str]:
    """The engine against the authors' method, from ``bench/bench_engine.py``'s CSV: the speed-up
    of the one-token and the all-token paths over the per-token reverse-mode reference on the
    SmolLM2-sized block, against the prompt length T, beside issue 26's target of T/2."""
    from coupling_utils.analysis import plots
    from coupling_utils.files import data_dir

    table = pd.read_csv(csv or data_dir() / "benchmarks" / "engine.csv")
    block = table[table.case.str.startswith("block: SmolLM2") & table.method.isin(list(ENGINE_SERIES))]
    if block.empty:
        raise ValueError(
            "data/benchmarks/engine.csv has no SmolLM2-block rows: run python bench/bench_engine.py"
        )
    rows = block.assign(series=block.method.map(ENGINE_SERIES))[["T", "series", "speedup", "target"]]
    target = rows.drop_duplicates("T").assign(series="target (T/2)", speedup=lambda d: d.target)
    data = pd.concat([rows, target]).assign(low=lambda d: d.speedup, high=lambda d: d.speedup)
    chart = plots.sensitivity_curve(
        data, "T", "speedup", "low", "high", "series",
        look=plots.Look(title="Speed-up over the authors' method", x_title="prompt length T (tokens)",
                        y_title="speed-up (times)"),
    )  # fmt: skip
    Ts = sorted(rows["T"].unique())

    def listed(series: str) -> str:
        got = rows[rows.series == series].set_index("T").speedup
        return ", ".join(f"{got[t]:.0f}×" for t in Ts if t in got)

    def meets(series: str) -> str:
        got = rows[rows.series == series]
        ok = sorted(got[got.speedup >= got.target]["T"])
        return "at every T" if len(ok) == len(got) else f"at T = {', '.join(map(str, ok)) or 'none'}"

    machine, date = block.machine.iloc[0], str(block.date_utc.iloc[0])
    caption = (
        f"The engine against the authors' method (the reference: d VJPs of one token through the block "
        f"over all T tokens), on one randomly initialised SmolLM2-sized block (d = {block.d.iloc[0]}), "
        f"one thread, measured by bench/bench_engine.py ({machine}; {date} UTC). At T = "
        f"{', '.join(map(str, Ts))}: the one-token path is {listed('one token')} faster than the "
        f"reference; all tokens (their Jacobians, top-50 spectra and token-wise coupling, against T runs "
        f"of the reference) {listed('all tokens')}; the target, T/2, is "
        f"{', '.join(f'{t / 2:.0f}' for t in Ts)}. One token meets it {meets('one token')}, all tokens "
        f"{meets('all tokens')}."
    )
    alt = (
        f"A line chart of the speed-up against the prompt length on a logarithmic axis (T = "
        f"{', '.join(map(str, Ts))}), with three lines: the one-token path, all tokens, and the target T/2."
    )
    return chart, caption, alt


DIAGRAMS = (
    Diagram(MARKER, DIAGRAM_NAME, DIAGRAM_FILE, _coupling_figure),
    Diagram(JACOBIAN_MARKER, JACOBIAN_NAME, "_generated/jacobian-diagram.html", _jacobian_figure),
    Diagram(TILES_MARKER, TILES_NAME, "_generated/tile-diagram.html", _tiles_figure),
    Diagram(K_POLICY_MARKER, K_POLICY_NAME, "_generated/k-policy-curve.html", k_policy_figure),
    Diagram(ENGINE_MARKER, ENGINE_NAME, "_generated/engine-speedup.html", engine_figure),
)


def stage_diagrams(page: Path) -> bool:
    """Replace each :data:`DIAGRAMS` marker line of a staged page with its diagram as a numbered
    figure (its chart written beside the page). False when the page has no marker."""
    from coupling_utils.analysis.display import chart_bundle
    from coupling_utils.pipeline.teaching import replace_marker

    lines = page.read_text(encoding="utf-8").splitlines()
    staged = False
    for d in DIAGRAMS:
        if d.marker not in lines:
            continue
        chart, caption, alt = d.draw()
        bundle, _ = chart_bundle(chart, caption=caption, alt=alt, name=d.name)
        target = page.parent / d.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(bundle["text/html"], encoding="utf-8")
        figure = f"```{{chart-figure}} {d.file}\n:name: {d.name}\n\n{caption}\n```"
        staged = replace_marker(page, d.marker, figure) or staged
    return staged
