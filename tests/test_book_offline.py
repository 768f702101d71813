"""The built book works from disk with no network: every page, in a real headless browser.

Opens every page of ``_build/html`` (or ``$COUPLING_BOOK_HTML``) through ``file://`` in
headless Chromium with networking off and every request intercepted (one that is not for a
``file:``/``data:``/``blob:`` URL or localhost is aborted and fails the test), and checks that
no request failed, that no console error was logged, that every image loaded, that MathJax
typeset every formula, that every chart became a live Vega view whose marks show a tooltip
when hovered, that every figure has a numbered caption, and that the page shows one search
box. It also weighs every page with what it loads and keeps the heaviest under a budget.

Skips when the book is not built or Chromium/Playwright are missing, unless ``CI=true`` or
``COUPLING_REQUIRE_BROWSER=1`` (then it fails). Uses the system Chromium (Debian package
``chromium``; ``make browser`` installs it); never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Error as PlaywrightError
except ImportError:  # reported by the browser_context fixture
    PlaywrightError = RuntimeError

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = os.environ.get("CI", "").lower() == "true" or os.environ.get("COUPLING_REQUIRE_BROWSER", "") == "1"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: nothing can leave the machine
]
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
NOT_PAGES = {"_static", "_sources", "_images", "_sphinx_design_static"}
MATHJAX_WAIT_MS = 10_000
CHART_WAIT_MS = 20_000
# Every chart must be a captioned figure (issue 12): show(chart, name=..., caption=...).
REQUIRE_CAPTIONS = True
# The heaviest page with everything it loads (HTML, scripts, styles, images, fonts).
PAGE_BUDGET_BYTES = 30 * 2**20

# Runs in the page once it has loaded: waits for MathJax where the page has math, then
# reports what did not render.
INSPECT_PAGE = """
async (waitMs) => {
  const maths = [...document.querySelectorAll('.math')];
  let mathjax = 'absent';
  if (maths.length) {
    const t0 = Date.now();
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise) && Date.now() - t0 < waitMs) {
      await new Promise(r => setTimeout(r, 50));
    }
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      await MathJax.startup.promise;
      mathjax = 'ready';
    } else {
      mathjax = 'never loaded';
    }
  }
  const brief = el => (el.getAttribute('src') || el.textContent || el.outerHTML).trim().slice(0, 100);
  // A chart's static picture loads lazily (for print, or readers without JavaScript): fetch
  // every one now, so that a missing or broken file is caught like any other image.
  const lazy = [...document.querySelectorAll('img[loading="lazy"]')];
  lazy.forEach(i => { i.loading = 'eager'; });
  await Promise.all(lazy.map(i => i.decode().catch(() => null)));
  const unrendered = maths.filter(el => !el.querySelector('mjx-container')).map(brief);
  const mathErrors = [...document.querySelectorAll('mjx-merror, [data-mjx-error]')].map(brief);
  const images = [...document.querySelectorAll('img')];
  const brokenImages = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(brief);
  const outputs = [...document.querySelectorAll('.cell_output, .output')];
  const charts = outputs.flatMap(o => [...o.querySelectorAll('img, svg, canvas, .vega-embed')])
    .filter(el => !el.closest('mjx-container')
                  && !(el.tagName.toLowerCase() === 'svg' && el.parentElement.closest('svg')));
  const emptyCharts = charts.filter(el => {
    if (el.classList.contains('vega-embed')) return !el.querySelector('svg, canvas');
    const r = el.getBoundingClientRect();
    if (el.tagName.toLowerCase() === 'img') return !(el.complete && el.naturalWidth > 0);
    return !(r.width > 0 && r.height > 0);
  }).map(brief);
  const article = document.querySelector('article') || document.body || document.documentElement;
  const figures = [...article.querySelectorAll('figure')];
  const uncaptioned = figures.filter(f => !f.querySelector('figcaption .caption-number'))
    .map(f => f.id || brief(f));
  const bookCharts = [...document.querySelectorAll('.coupling-chart')];
  const captionedCharts = bookCharts.filter(c => c.tagName.toLowerCase() === 'figure'
    && c.querySelector('figcaption .caption-number')).length;
  const numrefs = [...article.querySelectorAll('a.reference.internal')]
    .filter(a => a.querySelector('.std-numref') && a.getAttribute('href').startsWith('#'))
    .filter(a => !document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1))))
    .map(a => a.getAttribute('href'));
  const visible = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const searches = [...document.querySelectorAll('.search-button-field, .search-button')]
    .filter(visible).length;
  return {mathjax, nMath: maths.length, unrendered, mathErrors, nImages: images.length,
          brokenImages, nCharts: charts.length, emptyCharts, title: document.title,
          nFigures: figures.length, uncaptioned, nBookCharts: bookCharts.length, captionedCharts,
          brokenNumrefs: numrefs, searches, isPage: !!document.querySelector('article')};
}
"""

# Draws every chart of the page (the runtime draws them lazily, near the viewport) and reports
# the ones that did not become a live Vega view.
DRAW_CHARTS = """
async (waitMs) => {
  const charts = [...document.querySelectorAll('.coupling-chart')];
  if (!charts.length) return {n: 0, notLive: []};
  const t0 = Date.now();
  while (!window.couplingCharts && Date.now() - t0 < waitMs) await new Promise(r => setTimeout(r, 50));
  if (!window.couplingCharts) return {n: charts.length, notLive: ['the chart runtime never loaded']};
  await Promise.race([window.couplingCharts.embedAll(), new Promise(r => setTimeout(r, waitMs))]);
  const notLive = charts.filter(c => !(c.dataset.state === 'live' && c.vegaView
      && c.querySelector('.vega-embed canvas, .vega-embed svg.marks')))
    .map(c => (c.id || 'chart') + ': ' + (c.dataset.state || 'never drawn'));
  return {n: charts.length, notLive};
}
"""

# Points (in page coordinates) of marks of chart number `index` that have a tooltip, discrete
# marks first; the chart is scrolled to the middle of the window first.
TOOLTIP_MARKS = """
(index) => {
  const chart = document.querySelectorAll('.coupling-chart')[index];
  chart.scrollIntoView({block: 'center', inline: 'nearest'});
  const view = chart.vegaView;
  const surface = chart.querySelector('.vega-embed canvas, .vega-embed svg.marks');
  const rect = surface.getBoundingClientRect();
  const [ox, oy] = view.origin();
  const pad = view.padding();
  const order = ['symbol', 'rect', 'rule', 'arc', 'text', 'path', 'shape', 'area', 'line', 'trail'];
  const out = [];
  const walk = (scene, x0, y0) => {
    if (!scene || !scene.items) return;
    for (const item of scene.items) {
      if (scene.marktype === 'group') {
        for (const child of item.items || []) walk(child, x0 + (item.x || 0), y0 + (item.y || 0));
      } else if (item.tooltip != null && item.bounds && !item.bounds.empty()) {
        const b = item.bounds;
        const x = x0 + (b.x1 + b.x2) / 2, y = y0 + (b.y1 + b.y2) / 2;
        if (x > 0 && y > 0 && x < innerWidth && y < innerHeight) out.push({x, y, type: scene.marktype});
      }
    }
  };
  walk(view.scenegraph().root, rect.left + ox + (pad.left || 0), rect.top + oy + (pad.top || 0));
  out.sort((a, b) => order.indexOf(a.type) - order.indexOf(b.type));
  return {id: chart.id || `chart ${index + 1}`, marks: out.slice(0, 8)};
}
"""

TOOLTIP_TEXT = """
() => { const t = document.getElementById('vg-tooltip-element');
        return t && t.classList.contains('visible') ? t.textContent.trim() : ''; }
"""


def _unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"{reason} (required because CI=true or COUPLING_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


def _chromium() -> str | None:
    candidates = [
        os.environ.get("COUPLING_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def book_pages(html_dir: Path) -> list[Path]:
    """Every built HTML page (theme assets and copied sources excluded)."""
    return sorted(
        p for p in html_dir.rglob("*.html") if not NOT_PAGES.intersection(p.relative_to(html_dir).parts)
    )


@pytest.fixture(scope="module")
def html_dir() -> Path:
    path = Path(os.environ.get("COUPLING_BOOK_HTML") or ROOT / "_build" / "html")
    if not (path / "index.html").is_file():
        _unavailable(f"the book is not built at {path}: run `coupling-book build` (or `make book`) first")
    return path


@pytest.fixture(scope="module")
def browser_context():
    executable = _chromium()
    if executable is None:
        _unavailable(
            "Chromium not found at /usr/bin/chromium or on PATH: install the Debian "
            "package (`make browser`, or `apt-get install chromium`)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable(
            "the Python package playwright is missing: `pip install -e '.[test]'` "
            "(it drives the system Chromium; no `playwright install` needed)"
        )
    profile = tempfile.mkdtemp(prefix="coupling-book-chromium-")
    try:
        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                headless=True,
                args=CHROMIUM_FLAGS,
                offline=True,
                service_workers="block",
                viewport={"width": 1280, "height": 900},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _is_local(url: str) -> bool:
    if url.startswith(LOCAL_SCHEMES):
        return True
    from urllib.parse import urlsplit

    return urlsplit(url).hostname in {h.strip("[]") for h in LOCAL_HOSTS}


def _hover_tooltips(page, n_charts: int) -> tuple[list[str], list[str]]:
    """Hover a mark of every chart; (tooltip texts seen, charts whose marks showed none)."""
    seen, silent = [], []
    for index in range(n_charts):
        found = page.evaluate(TOOLTIP_MARKS, index)
        text = ""
        for mark in found["marks"]:
            page.mouse.move(mark["x"], mark["y"], steps=2)
            try:
                page.wait_for_function(TOOLTIP_TEXT, timeout=1_500)
            except PlaywrightError:
                continue
            text = page.evaluate(TOOLTIP_TEXT)
            if text:
                break
        page.mouse.move(1, 1)  # away, so that the next chart's tooltip is its own
        page.wait_for_timeout(50)
        if text:
            seen.append(f"{found['id']}: {text[:80]}")
        else:
            silent.append(f"{found['id']} ({len(found['marks'])} marks with a tooltip tried)")
    return seen, silent


def inspect_page(
    context, url: str, mathjax_wait_ms: int = MATHJAX_WAIT_MS, *, charts: bool = True
) -> tuple[dict, list[str]]:
    """Load one page and return (what rendered, problems found).

    With ``charts``, every chart is drawn and one of its marks hovered (its tooltip must show).
    """
    problems: list[str] = []
    page = context.new_page()

    def route(r):
        if _is_local(r.request.url):
            r.continue_()
        else:
            problems.append(f"request to another host: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    page.on(
        "requestfailed",
        lambda r: _is_local(r.url) and problems.append(f"failed request: {r.url} ({r.failure})"),
    )
    page.on("console", lambda m: problems.append(f"console error: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught exception: {e}"))
    try:
        page.goto(url, wait_until="load", timeout=30_000)
        try:
            report = page.evaluate(INSPECT_PAGE, mathjax_wait_ms)
        except PlaywrightError as exc:  # a redirect page (index.html) navigated meanwhile
            if "context was destroyed" not in str(exc):
                raise
            page.wait_for_load_state("load")
            report = page.evaluate(INSPECT_PAGE, mathjax_wait_ms)
        drawn = page.evaluate(DRAW_CHARTS, CHART_WAIT_MS) if charts else {"n": 0, "notLive": []}
        report["tooltips"], silent = (
            _hover_tooltips(page, drawn["n"] - len(drawn["notLive"]))
            if drawn["n"] and not drawn["notLive"]
            else ([], [])
        )
        report["liveCharts"] = drawn["n"] - len(drawn["notLive"])
        problems += [f"chart not live: {c}" for c in drawn["notLive"]]
        problems += [f"no tooltip when hovering a mark of {c}" for c in silent]
        page.wait_for_timeout(100)  # let late requests and console messages arrive
    finally:
        page.close()
    if report["nMath"] and report["mathjax"] != "ready":
        problems.append(f"MathJax {report['mathjax']} on a page with {report['nMath']} formulas")
    if report["unrendered"]:
        problems.append(
            f"{len(report['unrendered'])} of {report['nMath']} formulas not rendered, "
            f"first: {report['unrendered'][0]}"
        )
    problems += [f"MathJax error: {m}" for m in report["mathErrors"]]
    problems += [f"image not loaded: {m}" for m in report["brokenImages"]]
    problems += [f"chart not rendered: {m}" for m in report["emptyCharts"]]
    problems += [f"figure without a numbered caption: {m}" for m in report["uncaptioned"]]
    problems += [f"{{numref}} to a figure missing from the page: {m}" for m in report["brokenNumrefs"]]
    if REQUIRE_CAPTIONS and report["captionedCharts"] < report["nBookCharts"]:
        problems.append(
            f"{report['nBookCharts'] - report['captionedCharts']} of {report['nBookCharts']} charts "
            "have no caption: show(chart, caption=..., name=...)"
        )
    if report["isPage"] and report["searches"] != 1:
        problems.append(f"{report['searches']} search boxes visible (expected one)")
    return report, problems


def test_every_page_renders_offline(html_dir, browser_context):
    pages = book_pages(html_dir)
    assert len(pages) >= 2, f"only {len(pages)} page(s) under {html_dir}"
    failures, totals = {}, {"math": 0, "charts": 0, "live": 0, "tooltips": 0, "captioned": 0}
    for path in pages:
        report, problems = inspect_page(browser_context, path.resolve().as_uri())
        totals["math"] += report["nMath"]
        totals["charts"] += report["nBookCharts"]
        totals["live"] += report["liveCharts"]
        totals["tooltips"] += len(report["tooltips"])
        totals["captioned"] += report["captionedCharts"]
        if problems:
            failures[str(path.relative_to(html_dir))] = problems
    listing = "\n".join(
        f"{page}:\n  " + "\n  ".join(p[:300] for p in probs[:15]) for page, probs in failures.items()
    )
    assert not failures, f"{len(failures)} of {len(pages)} pages failed offline:\n{listing}"
    # The book has formulas (notation page); a check that saw none would prove nothing.
    assert totals["math"] > 0, "no formula found in any page: is MathJax markup being produced?"
    # Charts: every one live and hovered (failures above); and there must be some to check.
    assert totals["charts"] > 0 and totals["live"] == totals["charts"] == totals["tooltips"], totals
    assert totals["captioned"] > 0, "no chart has a numbered caption: show(chart, caption=..., name=...)"


def page_weight(html_dir: Path, page: Path) -> int:
    """Bytes a page loads from the book: itself and every local file it references (scripts,
    styles, images, fonts, MathJax parts), each counted once."""
    from coupling_utils.pipeline.offline_assets import _AssetScanner, _css_urls

    seen: set[Path] = set()
    todo = [page.resolve()]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8", errors="replace") if path.suffix in {".html", ".css"} else ""
        if path.suffix == ".html":
            scanner = _AssetScanner()
            scanner.feed(text)
            urls = scanner.urls
        elif path.suffix == ".css":
            urls = _css_urls(text)
        else:
            urls = []
        for url in urls:
            if url.startswith(("data:", "#")) or "//" in url:
                continue
            todo.append((path.parent / url.split("?")[0].split("#")[0]).resolve())
    return sum(p.stat().st_size for p in seen)


def test_pages_stay_light(html_dir):
    """The heaviest page, with everything it loads, stays under PAGE_BUDGET_BYTES."""
    weights = {str(p.relative_to(html_dir)): page_weight(html_dir, p) for p in book_pages(html_dir)}
    heaviest = max(weights, key=weights.get)
    listing = ", ".join(
        f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(weights.items(), key=lambda kv: -kv[1])[:5]
    )
    assert weights[heaviest] <= PAGE_BUDGET_BYTES, f"heaviest pages: {listing}"


def test_index_leads_to_the_book(html_dir, browser_context):
    page = browser_context.new_page()
    try:
        index = (html_dir / "index.html").resolve().as_uri()
        page.goto(index, wait_until="load")
        # the index redirects to the root page
        page.wait_for_url(lambda url: url != index, timeout=10_000)
        page.wait_for_load_state("load")
        assert page.title() and "Redirect" not in page.title(), page.url
        assert page.url.startswith("file://"), page.url
        assert page.locator("nav.bd-links a").count() >= 2, "the table of contents has no links"
    finally:
        page.close()


def test_the_check_catches_a_broken_page(tmp_path, browser_context):
    """The inspection itself must fail on what it is meant to catch."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<html><head><title>broken</title>"
        '<script src="https://cdn.example.com/vega.js"></script></head><body><article>'
        '<span class="math notranslate nohighlight">\\(m_K\\)</span>'
        '<div class="cell_output"><img src="missing.svg"></div>'
        '<div style="height: 5000px"></div><img loading="lazy" style="display: none" src="missing-lazy.svg">'
        '<figure id="fig-x"><img src="data:image/gif;base64,R0lGODlhAQABAAAAACw="></figure>'
        '<a class="reference internal" href="#fig-gone"><span class="std std-numref">Fig. 2</span></a>'
        '<div class="coupling-chart" id="dead-chart"><div class="coupling-chart-view"></div></div>'
        '<img src="http://img.example.org/p.png">'
        '<script>console.error("boom")</script></article></body></html>'
    )
    report, problems = inspect_page(browser_context, page.as_uri(), mathjax_wait_ms=500)
    text = "\n".join(problems)
    assert "request to another host: https://cdn.example.com/vega.js" in text
    assert "request to another host: http://img.example.org/p.png" in text
    assert "image not loaded: missing.svg" in text and "chart not rendered" in text
    assert "image not loaded: missing-lazy.svg" in text  # hidden, far below, lazy: still checked
    assert "1 of 1 formulas not rendered" in text and "MathJax never loaded" in text
    assert "console error: boom" in text
    assert "figure without a numbered caption: fig-x" in text
    assert "{numref} to a figure missing from the page: #fig-gone" in text
    assert "chart not live: the chart runtime never loaded" in text
    assert "0 search boxes visible" in text


def test_the_check_hovers_live_charts(tmp_path, browser_context):
    """A chart whose marks have tooltips passes; one whose marks have none is reported."""
    import altair as alt
    import pandas as pd

    from coupling_utils.analysis.display import chart_bundle
    from coupling_utils.pipeline.book_extension import chart_runtime

    data = pd.DataFrame({"layer": [0, 1, 2], "coupling": [0.2, 0.6, 0.9]})
    talking = alt.Chart(data).mark_point(size=200, filled=True).encode(x="layer:Q", y="coupling:Q")
    silent = talking.configure_mark(tooltip=None)  # no tooltip anywhere
    (tmp_path / "charts.js").write_text(chart_runtime())
    parts = [chart_bundle(c)[0]["text/html"] for c in (talking, silent)]
    parts[1] = parts[1].replace('class="coupling-chart"', 'class="coupling-chart" id="silent"', 1)
    page = tmp_path / "charts.html"
    page.write_text(
        '<html><head><title>charts</title><script defer src="charts.js"></script></head><body><article>'
        '<input class="search-button-field" placeholder="search">'
        + "".join(parts)
        + "</article></body></html>"
    )
    report, problems = inspect_page(browser_context, page.as_uri(), mathjax_wait_ms=500)
    assert report["liveCharts"] == 2, problems
    assert len(report["tooltips"]) == 1 and "coupling" in report["tooltips"][0], report["tooltips"]
    expected = ["no tooltip when hovering a mark of silent (0 marks with a tooltip tried)"]
    if REQUIRE_CAPTIONS:  # neither chart of this page is a captioned figure
        expected.append("2 of 2 charts have no caption: show(chart, caption=..., name=...)")
    assert problems == expected, problems
