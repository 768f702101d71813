"""The built book works from disk with no network: every page, in a real headless browser.

Opens every page of ``_build/html`` (or ``$COUPLING_BOOK_HTML``) through ``file://`` in
headless Chromium with networking off and every request intercepted (one that is not for a
``file:``/``data:``/``blob:`` URL or localhost is aborted and fails the test), and checks that
no request failed, that no console error was logged, that every image loaded, that MathJax
typeset every formula, that every chart became a live Vega view whose marks show a tooltip
when hovered, that every figure has a numbered caption, and that the page shows one search
box. It also weighs every page with what it loads and keeps the heaviest under a budget.

Every number the test compares comes from one view of one finished page: the inspection first
finishes what renders asynchronously (MathJax, every chart's live Vega view, lazy images), then
counts; a redirecting page (Sphinx's index.html) is followed, not inspected half-way through
the next page's parsing; a hover is judged once the page has handled that pointer event. No
verdict depends on the machine's speed: timeouts (HANG_S) only guard against hangs and say so.

Skips when the book is not built or Chromium/Playwright are missing, unless ``CI=true`` or
``COUPLING_REQUIRE_BROWSER=1`` (then it fails). Uses the system Chromium (Debian package
``chromium``; ``make browser`` installs it); never downloads a browser.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
except ImportError:  # reported by the browser_context fixture
    PlaywrightError = PlaywrightTimeoutError = RuntimeError

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
# Timeouts only guard against a page that hangs: they are far above what any page needs on a
# slow, busy machine, and when one fires the test says so; no verdict depends on how fast the
# machine is. Everything the test compares comes from one view of one finished page.
HANG_S = 120
HANG_MS = HANG_S * 1000
# Every chart must be a captioned figure (issue 12): show(chart, name=..., caption=...).
REQUIRE_CAPTIONS = True
# The heaviest page with everything it loads (HTML, scripts, styles, images, fonts).
PAGE_BUDGET_BYTES = 30 * 2**20
# <meta http-equiv="refresh" content="0; url=..."> (Sphinx's redirecting index.html)
META_REFRESH = re.compile(
    r"""<meta\s[^>]*http-equiv\s*=\s*["']?refresh["']?[^>]*content\s*=\s*["']\s*\d+\s*;\s*url\s*=\s*([^"'>]+)""",
    re.IGNORECASE,
)


def hang_message(what: str, seconds: int = HANG_S) -> str:
    return f"{what} did not finish within {seconds} s: the machine is very slow or the page hangs"


# Runs in the page once it has loaded (its deferred scripts, MathJax and the chart runtime, have
# then run: one that is missing is missing, not late). First finishes everything that renders
# asynchronously (MathJax typesetting, every chart's live Vega view, lazy images), each guarded
# only against a hang, then takes every count from that one finished document.
INSPECT_PAGE = """
async (hangMs) => {
  const hung = [];
  const finish = async (promise, what) => {
    let timer;
    const done = await Promise.race([
      Promise.resolve(promise).then(() => true, () => true),
      new Promise(r => { timer = setTimeout(() => r(false), hangMs); }),
    ]);
    clearTimeout(timer);
    if (!done) hung.push(what);
  };
  const maths = [...document.querySelectorAll('.math')];
  let mathjax = 'absent';
  if (maths.length) {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      await finish(MathJax.startup.promise, 'MathJax typesetting');
      mathjax = hung.length ? 'still typesetting' : 'ready';
    } else {
      mathjax = 'never loaded';
    }
  }
  // The runtime draws charts lazily, near the viewport: draw every one now.
  const bookCharts = [...document.querySelectorAll('.coupling-chart')];
  const runtime = !bookCharts.length ? 'unused' : window.couplingCharts ? 'loaded' : 'never loaded';
  if (runtime === 'loaded') await finish(window.couplingCharts.embedAll(), 'drawing the charts');
  // A chart's static picture loads lazily (for print, or readers without JavaScript): fetch
  // every one now, so that a missing or broken file is caught like any other image.
  const lazy = [...document.querySelectorAll('img[loading="lazy"]')];
  lazy.forEach(i => { i.loading = 'eager'; });
  await finish(Promise.all(lazy.map(i => i.decode().catch(() => null))), 'loading the images');

  // From here on, one view of the finished page.
  const brief = el => (el.getAttribute('src') || el.textContent || el.outerHTML).trim().slice(0, 100);
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
  const notLive = runtime === 'never loaded' ? ['the chart runtime never loaded']
    : bookCharts.filter(c => !(c.dataset.state === 'live' && c.vegaView
        && c.querySelector('.vega-embed canvas, .vega-embed svg.marks')))
      .map(c => (c.id || 'chart') + ': ' + (c.dataset.state || 'never drawn'));
  const liveCharts = runtime === 'loaded' ? bookCharts.length - notLive.length : 0;
  const article = document.querySelector('article') || document.body || document.documentElement;
  const figures = [...article.querySelectorAll('figure')];
  const uncaptioned = figures.filter(f => !f.querySelector('figcaption .caption-number'))
    .map(f => f.id || brief(f));
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
  return {url: location.href, hung, mathjax, nMath: maths.length, unrendered, mathErrors,
          nImages: images.length, brokenImages, nCharts: charts.length, emptyCharts,
          title: document.title, nFigures: figures.length, uncaptioned,
          nBookCharts: bookCharts.length, liveCharts, notLive, captionedCharts,
          brokenNumrefs: numrefs, searches, isPage: !!document.querySelector('article')};
}
"""

# Points (in window coordinates) of marks of chart number `index` that have a tooltip and that
# the pointer can reach (nothing drawn over them), discrete marks first. The chart is scrolled
# (at once, never smoothly) to the middle of the window first, and the points are read after
# the next frame, once the page has handled the scroll.
TOOLTIP_MARKS = """
async ([index, hangMs]) => {
  const chart = document.querySelectorAll('.coupling-chart')[index];
  chart.scrollIntoView({block: 'center', inline: 'nearest', behavior: 'instant'});
  let timer;
  const framed = await Promise.race([
    new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true)))),
    new Promise(r => { timer = setTimeout(() => r(false), hangMs); }),
  ]);
  clearTimeout(timer);
  const id = chart.id || `chart ${index + 1}`;
  if (!framed) return {id, marks: [], hung: true};
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
  const reachable = out.filter(m => { const hit = document.elementFromPoint(m.x, m.y);
                                      return hit && chart.contains(hit); });
  reachable.sort((a, b) => order.indexOf(a.type) - order.indexOf(b.type));
  return {id, marks: reachable.slice(0, 8), hung: false};
}
"""

# Before a pointer move: a promise that resolves once the page has handled the pointer event at
# (x, y), every listener included (Vega shows or hides its tooltip in its own pointer listener,
# synchronously), or false after hangMs.
ARM_POINTER = """
([x, y, hangMs]) => {
  window.couplingPointerHandled = new Promise(resolve => {
    const timer = setTimeout(() => {
      removeEventListener('pointermove', seen, true);
      resolve(false);
    }, hangMs);
    function seen(e) {
      if (Math.abs(e.clientX - x) > 1 || Math.abs(e.clientY - y) > 1) return;
      removeEventListener('pointermove', seen, true);
      clearTimeout(timer);
      setTimeout(() => resolve(true), 0);  // runs after this event's dispatch has ended
    }
    addEventListener('pointermove', seen, true);
  });
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
            context.set_default_timeout(HANG_MS)  # a guard against hangs, not a verdict
            context.set_default_navigation_timeout(HANG_MS)
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


class _Pointer:
    """The mouse of one page; every move returns once the page has handled it."""

    def __init__(self, page):
        self.page, self.at = page, None

    def move(self, x: float, y: float) -> bool:
        """Move to (x, y); False if the page never handled the move (it hangs)."""
        if self.at == (x, y):  # no movement, no event: the page is already as it will be
            return True
        self.page.evaluate(ARM_POINTER, [x, y, HANG_MS])
        self.page.mouse.move(x, y)
        self.at = (x, y)
        return self.page.evaluate("() => window.couplingPointerHandled")


def _hover_tooltips(page, n_charts: int) -> tuple[list[str], list[str], list[str]]:
    """Hover marks of every chart until one shows a tooltip; (tooltip texts seen, charts whose
    marks showed none, hangs)."""
    seen, silent, hung = [], [], []
    pointer = _Pointer(page)
    if not pointer.move(1, 1):  # start away from every chart, its tooltip hidden
        return seen, silent, [hang_message("moving the pointer")]
    for index in range(n_charts):
        found = page.evaluate(TOOLTIP_MARKS, [index, HANG_MS])
        if found["hung"]:
            hung.append(hang_message(f"scrolling to {found['id']}"))
            break
        text = ""
        for mark in found["marks"]:
            if not pointer.move(mark["x"], mark["y"]):
                hung.append(hang_message(f"hovering a mark of {found['id']}"))
                return seen, silent, hung
            text = page.evaluate(TOOLTIP_TEXT)  # the move has been handled: shown now or never
            if text:
                break
        if not pointer.move(1, 1):  # away, so that the next chart's tooltip is its own
            hung.append(hang_message(f"moving the pointer away from {found['id']}"))
            break
        if text:
            seen.append(f"{found['id']}: {text[:80]}")
        else:
            silent.append(f"{found['id']} ({len(found['marks'])} marks with a tooltip tried)")
    return seen, silent, hung


def redirect_target(url: str) -> str | None:
    """Where a page sends its reader by itself (``<meta http-equiv="refresh">``), read from the
    file: such a page navigates away as soon as it has loaded, so it cannot be inspected."""
    if not url.startswith("file:"):
        return None
    from urllib.parse import urljoin, urlsplit
    from urllib.request import url2pathname

    found = META_REFRESH.search(Path(url2pathname(urlsplit(url).path)).read_text(errors="replace"))
    return urljoin(url, found.group(1).strip()) if found else None


def inspect_page(context, url: str, *, charts: bool = True) -> tuple[dict, list[str]]:
    """Load one page and return (what rendered, problems found).

    With ``charts``, one mark of every chart is hovered (its tooltip must show). A redirecting
    page is followed to its target and reported as ``{"redirectsTo": target}`` (the target is a
    page of its own). Every count in the report comes from one view of the finished page; a
    page that navigates away by itself while it is inspected is a problem.
    """
    problems: list[str] = []
    page = context.new_page()
    navigations: list[str] = []

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
    page.on("framenavigated", lambda f: f == page.main_frame and navigations.append(f.url))
    target = redirect_target(url)
    report = None
    try:
        try:
            if target:
                page.goto(url, wait_until="commit", timeout=HANG_MS)
                page.wait_for_url(target, wait_until="load", timeout=HANG_MS)
                return {"redirectsTo": target}, problems
            page.goto(url, wait_until="load", timeout=HANG_MS)
        except PlaywrightTimeoutError:
            what = f"loading {url}" + (f" and its redirect to {target}" if target else "")
            return {"redirectsTo": target} if target else {}, [*problems, hang_message(what)]
        try:
            report = page.evaluate(INSPECT_PAGE, HANG_MS)
            problems += [hang_message(what) for what in report["hung"]]
            problems += [f"chart not live: {c}" for c in report["notLive"]]
            hover = charts and report["liveCharts"] and not report["notLive"] and not report["hung"]
            seen, silent, hung = _hover_tooltips(page, report["liveCharts"]) if hover else ([], [], [])
            report["tooltips"] = seen
            problems += [f"no tooltip when hovering a mark of {c}" for c in silent] + hung
            # A round trip after a macrotask: console messages and errors the page has raised
            # so far have all arrived.
            page.evaluate("() => new Promise(r => setTimeout(r, 0))")
        except PlaywrightError as exc:  # the page navigated away, destroying what was inspected
            if "context was destroyed" not in str(exc):
                raise
            navigations.append(page.url)
        if {u.split("#")[0] for u in navigations} != {url.split("#")[0]}:
            problems.append(f"the page navigated away by itself to {navigations[-1]} while it was inspected")
            return {}, problems
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
    uris = {path.resolve().as_uri() for path in pages}
    failures, totals = {}, {"math": 0, "charts": 0, "live": 0, "tooltips": 0, "captioned": 0}
    for path in pages:
        report, problems = inspect_page(browser_context, path.resolve().as_uri())
        if "redirectsTo" in report:  # index.html: its target is inspected as a page of its own
            if report["redirectsTo"].split("#")[0] not in uris:
                problems.append(f"redirects to {report['redirectsTo']}, not a page of the book")
        elif report:  # every count from the same view of the same finished page
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
        target = redirect_target(index)
        assert target, "index.html does not redirect (no <meta http-equiv=refresh>)"
        try:  # the index redirects to the root page
            page.goto(index, wait_until="commit", timeout=HANG_MS)
            page.wait_for_url(target, wait_until="load", timeout=HANG_MS)
        except PlaywrightTimeoutError:
            pytest.fail(hang_message(f"the redirect from {index} to {target}"))
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
    report, problems = inspect_page(browser_context, page.as_uri())
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
    report, problems = inspect_page(browser_context, page.as_uri())
    assert report["liveCharts"] == 2, problems
    assert len(report["tooltips"]) == 1 and "coupling" in report["tooltips"][0], report["tooltips"]
    expected = ["no tooltip when hovering a mark of silent (0 marks with a tooltip tried)"]
    if REQUIRE_CAPTIONS:  # neither chart of this page is a captioned figure
        expected.append("2 of 2 charts have no caption: show(chart, caption=..., name=...)")
    assert problems == expected, problems
