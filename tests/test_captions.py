"""Captions and alt text say what the figure shows: panel positions as laid out, plain numbers.

``layout.spec_panels`` is checked against Vega's own rendering (each panel painted its own colour,
found in the PNG); ``caption_problems`` on true and false captions; ``show`` refuses a false
one; and every figure the smoke notebooks show (and f02's hub figure, which runs only with the
hub, on a stand-in table) has a caption and alt text whose positional words are true and that
hold no Python/numpy repr.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

alt = pytest.importorskip("altair")
vlc = pytest.importorskip("vl_convert")

from coupling_utils.analysis import display, layout, rendering  # noqa: E402
from coupling_utils.analysis import plots as P  # noqa: E402

# scatters side by side share their hover selection on purpose (plots.scatter says why)
pytestmark = pytest.mark.filterwarnings("ignore:Automatically deduplicated selection parameter")

ROOT = Path(__file__).resolve().parents[1]
COLOURS = ["#ff0000", "#00c000", "#0000ff", "#ffd700", "#ff00ff", "#00ffff"]


def _block(colour: str, title: str | None = None, width: int = 40):
    """A panel painted one colour (a single rect filling its view)."""
    chart = (
        alt.Chart(pd.DataFrame({"x": [0]}))
        .mark_rect(color=colour)
        .encode(x=alt.X("x:O", axis=None))
        .properties(width=width, height=40)
    )
    return chart.properties(title=title) if title else chart


def _drawn_order(spec: dict, colours: dict[str, str]) -> list[tuple[str, int, int]]:
    """(name, row, column) of each colour as Vega draws ``spec``: panels found by their pixels."""
    from PIL import Image

    png = vlc.vegalite_to_png(spec, scale=1)
    im = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    centres = {}
    for name, colour in colours.items():
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        ys, xs = np.where(np.abs(im - rgb).sum(axis=2) < 30)
        assert len(xs), f"{name} not drawn"
        centres[name] = (ys.mean(), xs.mean())
    rows = sorted({round(y / 20) for y, _ in centres.values()})
    cols = sorted({round(x / 20) for _, x in centres.values()})
    placed = [(n, rows.index(round(y / 20)), cols.index(round(x / 20))) for n, (y, x) in centres.items()]
    return sorted(placed, key=lambda t: (t[1], t[2]))


def _layout_of(spec: dict) -> list[tuple[str, int, int]]:
    return [(p.title, p.row, p.column) for p in layout.spec_panels(spec)]


# --------------------------------------------------------------------------- the layout, as Vega draws it
@pytest.mark.parametrize(
    "compose, words",
    [
        (lambda cs: alt.hconcat(*cs), ["left", "middle", "right"]),
        (lambda cs: alt.vconcat(*cs), ["top", "middle", "bottom"]),
        (lambda cs: alt.concat(*cs, columns=2), ["top-left", "top-right", "bottom-left"]),
    ],
    ids=["hconcat", "vconcat", "concat-wrapped"],
)
def test_concatenations_read_in_reading_order(compose, words):
    names = ["alpha", "beta", "gamma"]
    spec = compose([_block(c, n) for c, n in zip(COLOURS, names)]).to_dict()
    assert _layout_of(spec) == _drawn_order(spec, dict(zip(names, COLOURS)))
    assert [p.position for p in layout.spec_panels(spec)] == words


@pytest.mark.parametrize(
    "sort, columns",
    [(alt.Undefined, 2), (["b"], 2), (["d", "b"], 3), ("descending", 4), (alt.Undefined, alt.Undefined)],
)
def test_facet_panels_follow_the_sort_vega_draws(sort, columns):
    """Facet values come in Vega-Lite's order (ascending; listed ones first, the rest in data
    order; descending), ``columns`` per row, whatever order a caption writer assumes."""
    values = ["c", "a", "b", "d"]
    colours = dict(zip(values, COLOURS))
    base = (
        alt.Chart(pd.DataFrame({"f": values}))
        .mark_rect()
        .encode(
            color=alt.Color("f:N", scale=alt.Scale(domain=values, range=list(colours.values())), legend=None)
        )
        .properties(width=40, height=40)
    )
    spec = base.facet(facet=alt.Facet("f:N", sort=sort), columns=columns).to_dict()
    assert _layout_of(spec) == _drawn_order(spec, colours)


def test_row_and_column_facets_make_a_grid():
    df = pd.DataFrame([(r, c) for r in ("x", "y") for c in (1, 2, 3)], columns=["r", "c"])
    df["cell"] = df.r + df.c.astype(str)
    colours = dict(zip(df.cell, COLOURS))
    chart = (
        alt.Chart(df)
        .mark_rect()
        .encode(color=alt.Color("cell:N", scale=alt.Scale(domain=list(colours), range=COLOURS), legend=None))
        .properties(width=40, height=40)
        .facet(row="r:N", column="c:O")
    )
    spec = chart.to_dict()
    drawn = [(f"{n[0]}, {n[1]}", r, c) for n, r, c in _drawn_order(spec, colours)]
    assert _layout_of(spec) == drawn
    assert [p.position for p in layout.spec_panels(spec)][:3] == ["top-left", "top-middle", "top-right"]


def test_one_panel_has_no_position_and_numbers_read_plainly():
    (one,) = layout.spec_panels(_block(COLOURS[0], "alone").to_dict())
    assert one == layout.Panel("alone", 0, 0, "")
    spec = alt.hconcat(*[_block(c) for c in COLOURS[:5]]).to_dict()
    assert [p.position for p in layout.spec_panels(spec)] == [
        "left",
        "2nd from the left",
        "3rd from the left",
        "4th from the left",
        "right",
    ]
    steps = (
        alt.Chart(pd.DataFrame({"step": np.array([1000, 10, 100], dtype=np.int64)}))
        .mark_point()
        .facet(facet="step:N", columns=3)
    )
    assert [p.title for p in layout.spec_panels(steps.to_dict())] == ["10", "100", "1000"]  # numbers ascend


# --------------------------------------------------------------------------- as show() lays it out
def test_where_follows_the_wrapping_show_applies():
    wide = _block(COLOURS[0], "Excess", width=400) | _block(COLOURS[1], "Raw", width=400)
    assert layout.where(wide, "Excess") == "Excess (top)"  # 2 x 400 px do not fit: show stacks them
    assert layout.position(wide, "Raw") == "bottom"
    spec, _ = display.chart_spec(wide)
    assert "concat" in spec and spec["columns"] == 1
    narrow = _block(COLOURS[0], "Excess", width=200) | _block(COLOURS[1], "Raw", width=200)
    assert layout.where(narrow, "Raw") == "Raw (right)"
    assert layout.where(_block(COLOURS[0], "alone"), "alone") == "alone"
    with pytest.raises(ValueError, match="one panel"):
        layout.position(_block(COLOURS[0], "alone"), "alone")
    with pytest.raises(ValueError, match=r"no panel .* headed 'twin'.*\['Excess', 'Raw'\]"):
        layout.where(narrow, "twin")


def _weights_heatmap(order=None, columns=2, width=120, ks=(4, 8)):
    rows = [
        dict(weights=w, K=k, layer_i=i, layer_j=j, m=0.5)
        for w in ("trained", "random init")
        for k in ks
        for i in range(3)
        for j in range(3)
    ]
    df = pd.DataFrame(rows)
    df["panel"] = df.weights + ", K = " + df.K.astype(str)
    look = P.Look(width=width, columns=columns, order=order)
    return P.coupling_heatmap(df, "layer_j", "layer_i", "m", facet="panel", look=look)


def test_where_names_a_row_of_panels_by_their_common_head():
    alphabetical = _weights_heatmap()
    assert layout.where(alphabetical, "trained") == "trained (bottom row)"  # "random init" sorts first
    trained_first = _weights_heatmap(order=["trained, K = 4", "trained, K = 8"])
    assert layout.where(trained_first, "trained") == "trained (top row)"
    assert layout.where(trained_first, "trained, K = 8") == "trained, K = 8 (top-right)"
    column = _weights_heatmap(columns=4, width=60)
    assert layout.position(column, "random init") == "left and 2nd from the left"
    # f01's depth figure: 4 K values a weights, 2 columns: each weights fills two whole rows
    deep = _weights_heatmap(order=[f"trained, K = {k}" for k in (4, 8, 12, 16)], ks=(4, 8, 12, 16))
    assert layout.where(deep, "trained") == "trained (rows 1–2)"
    assert layout.position(deep, "random init") == "rows 3–4"
    spec = display.chart_spec(deep)[0]
    assert layout.caption_problems("the trained model (rows 1–2) and its random twin (rows 3–4)", spec) == []
    wrong = layout.caption_problems("the trained model (rows 3–4) and its random twin (rows 1–2)", spec)
    assert len(wrong) == 2 and "said to be (rows 3–4) but is at (rows 1–2)" in wrong[0], wrong


# --------------------------------------------------------------------------- checking captions
@pytest.fixture(scope="module")
def stacked_pair():
    """The final spec of two 400 px scatters side by side in code, stacked by show."""
    df = pd.DataFrame({"x": [0.1, 0.2, 0.4], "y": [1.0, 2.0, 2.5], "run": ["a", "b", "c"]})
    excess = P.scatter_fit(df, "x", "y", label="run", look=P.Look(title="Excess over the twin"))
    raw = P.scatter_fit(df, "x", "y", label="run", look=P.Look(title="Raw coupling"))
    return display.chart_spec(excess | raw)[0]


def test_caption_problems_catch_what_the_layout_contradicts(stacked_pair):
    def check(text):
        return layout.caption_problems(text, stacked_pair)

    assert check("Accuracy against excess over the twin (top) and raw coupling (bottom).") == []
    assert check("its untrained twin (top, which carries the verdict) and raw coupling (bottom row)") == []
    wrong = check("Accuracy against coupling in excess of the twin (left) and raw coupling (right).")
    assert len(wrong) == 2 and "said to be (left) but is at (top)" in wrong[0], wrong
    assert "follows no word of a panel's title" in check("The first one (top).")[0]
    assert check("line-shape score (lower = straighter), a curve above 1 at its right end") == []
    assert "names no panel" in check("The raw coupling is on the left.")[0]
    assert "names no panel" in check("Top: the excess.")[0]
    assert check("Two scatters stacked.") == []
    assert "2 panel(s) in 2 row(s)" in check("Two scatters side by side.")[0]
    single = _block(COLOURS[0], "alone").to_dict()
    assert "one panel" in layout.caption_problems("The only chart (left).", single)[0]


def test_show_refuses_a_false_caption_and_reprs_in_alt_text(stacked_pair):
    with pytest.raises(ValueError, match=r"fig-x: the caption: .*said to be \(left\) but is at \(top\)"):
        display.chart_bundle(stacked_pair, name="fig-x", caption="Excess over the twin (left), raw (right).")
    with pytest.raises(ValueError, match=r"repr 'np.float64\('"):
        display.chart_bundle(stacked_pair, alt=f"Coupling peaks at {np.float64(0.25)!r}.")
    with pytest.raises(ValueError, match="repr 'array\\('"):
        display.chart_bundle(stacked_pair, caption=f"Steps {np.array([1, 2])!r}.")
    bundle, meta = display.chart_bundle(
        stacked_pair, caption="Excess over the twin (top), raw coupling (bottom)."
    )
    assert meta[display.METADATA_KEY]["chart"]["caption"].endswith("(bottom).")


def test_alt_text_made_from_a_chart_formats_numbers_plainly():
    spec = {
        "title": {"text": ["Coupling at K =", np.int64(4)]},
        "mark": "point",
        "encoding": {"x": {"field": "step", "title": np.float64(2.0)}, "y": {"field": "m", "title": None}},
    }
    text = rendering._describe(spec)
    assert text == "Chart: Coupling at K = 4. m against 2." and not display.repr_problems(text, "alt")
    assert display.plain([np.int64(2), np.float64(0.125), 3.0, None, np.bool_(True)]) == "2, 0.125, 3, , yes"
    for bad in ("np.int64(2)", "array([1, 2])", "[None, 2]", "at step None", "<Foo object at 0x7f00>"):
        assert display.repr_problems(f"x {bad} y", "alt"), bad
    for fine in ("None of the runs rise.", "True to the paper, it rises.", "0.25 at step 3"):
        assert not display.repr_problems(fine, "alt"), fine


# --------------------------------------------------------------------------- every figure of every chapter
SPEC = re.compile(r'<script type="application/json" class="coupling-chart-spec"[^>]*>(.*?)</script>', re.S)
# figures a smoke run does not show (they need the hub), each checked by its own test below
NOT_AT_SMOKE = {"f02_generalization": {"fig-f02-hub"}}


def _figures(path: Path) -> list[dict]:
    import nbformat

    out = []
    for cell in nbformat.read(path, as_version=4).cells:
        for o in cell.get("outputs", []):
            meta = ((o.get("metadata") or {}).get(display.METADATA_KEY) or {}).get("chart")
            if meta is not None:
                spec = json.loads(SPEC.search(o["data"]["text/html"]).group(1).replace("\\u003c", "<"))
                out.append(dict(meta, spec=spec))
    return out


def _text_problems(figure: dict) -> list[str]:
    caption, alt_text, spec = figure.get("caption") or "", figure.get("alt") or "", figure["spec"]
    return (
        [f"caption: {p}" for p in layout.caption_problems(caption, spec)]
        + [f"alt: {p}" for p in layout.caption_problems(alt_text, spec)]
        + display.repr_problems(caption, "the caption")
        + display.repr_problems(alt_text, "the alt text")
    )


def test_every_figure_the_notebooks_show_says_where_its_panels_are(smoke_runs):
    from support.smoke_runs import SMOKE_DIR

    claims = 0
    for source in sorted((ROOT / "notebooks").glob("f0*.md")):
        text = source.read_text()
        assert smoke_runs.results[source.stem].status == "ok", source.stem
        figures = _figures(SMOKE_DIR / f"{source.stem}.ipynb")
        names = set(re.findall(r'name="(fig-[^"]+)"', text))
        skipped = NOT_AT_SMOKE.get(source.stem, set())
        assert names - {f["name"] for f in figures} == skipped, f"{source.stem}: a figure was not shown"
        shows = len(re.findall(r"(?<![\w.])show\(", text))
        assert len(figures) >= shows - len(skipped), (
            f"{source.stem}: {shows} show( calls, {len(figures)} figures"
        )
        for figure in figures:
            problems = _text_problems(figure)
            assert not problems, f"{source.stem} {figure['name']}: {problems}"
            claims += len(list(layout.CLAIM.finditer(figure.get("caption") or "")))
    assert claims >= 8, "the captions' positional words were not found"  # f01, f02, f04 place panels


def _cell_with(source: Path, marker: str) -> str:
    import jupytext

    cells = [c.source for c in jupytext.read(source).cells if c.cell_type == "code" and marker in c.source]
    assert len(cells) == 1, f"{marker!r} in {len(cells)} cells of {source.name}"
    return cells[0]


def test_the_hub_figure_caption_is_true_where_it_runs():
    """f02's hub figure needs the hub: its notebook cell runs on a stand-in table of three models."""
    from coupling_utils.chapters import f02_generalization as f02

    table = pd.DataFrame(
        {
            "model_id": ["org/a", "org/b", "org/c"],
            "label": ["a", "b", "c"],
            "coupling": [0.91, 0.93, 0.95],
            "average": [40.0, 45.0, 52.0],
            "paper_coupling": [0.90, 0.92, 0.96],
        }
    )
    hub = SimpleNamespace(
        measured=SimpleNamespace(report=lambda: "3 measured"),
        missing=pd.DataFrame(columns=["model", "note"]),
        fits=pd.DataFrame({c: [0.5] for c in f02.SHOW}),
        n_measured=3,
        table=table,
    )
    shown = []
    cell = _cell_with(ROOT / "notebooks" / "f02_generalization.md", 'name="fig-f02-hub"')
    scope = dict(hub=hub, f02=f02, show=lambda chart, **kw: shown.append((chart, kw)), print=lambda *a: None)
    scope["show_table"] = lambda *a, **kw: None
    exec("from coupling_utils.analysis.layout import position\n" + cell, scope)
    ((chart, kw),) = shown
    spec, _ = display.chart_spec(chart, alt=kw["alt"])
    figure = dict(kw, spec=spec)
    assert not _text_problems(figure), _text_problems(figure)
    assert layout.CLAIM.search(kw["caption"]), "the hub caption places its panels"
    display.chart_bundle(chart, **kw)  # show's own checks pass


def test_the_intro_chart_alt_text_states_the_prose_counts():
    """The intro's bottom line and its chart's alt text read one tally (numpy values or not)."""
    from coupling_utils.pipeline import summary

    rows = pd.DataFrame(
        {
            "notebook": ["f01_x", "f01_x", "f02_y", "f02_y"],
            "title": ["f01 · Depth"] * 2 + ["f02 · General"] * 2,
            "claim": ["a", "b", "c", "d"],
            "paper": ["clear", np.float64(0.8), 0.8, "positive"],
            "ours": [np.int64(2), 0.491, np.float64(0.801), -0.87],
            "agree": ["yes", "partly", "yes", "no"],
            "kind": ["measured", "measured", "replot", "measured"],
            "rule": "yes if a > 1",
        }
    )
    t = summary.tally(rows)
    prose, alt_text = summary.bottom_line(rows), summary.status_alt(t)
    assert f"judged {t.judged} of" in prose and f"{t.yes} reproduced (yes), {t.partly} partly" in prose
    assert (t.judged, t.yes, t.partly, t.no, t.replots, t.squares) == (3, 1, 1, 1, 1, 4)
    # the marks named by the shapes the chart draws: squares and a diamond, not "a row of squares"
    assert (
        alt_text
        == "A row of marks per chapter, one per claim, 4 in all: 3 squares for this book's measurements of "
        "the paper's claims (1 yes, 1 partly, 1 no) and 1 diamond for replots of the paper's own points."
    )
    spec = summary.status_chart(rows).to_dict()
    assert not display.repr_problems(alt_text + json.dumps(spec, default=str), "intro")
