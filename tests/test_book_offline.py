"""The built book works from disk with no network: every page, in a real headless browser.

Opens every page of ``_build/html`` (or ``$COUPLING_BOOK_HTML``) through ``file://`` in
headless Chromium with networking off, and checks that no request failed or went to another
host, that no console error was logged, that every chart in the cell outputs and every image
loaded, and that MathJax typeset every formula.

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
NOT_PAGES = {"_static", "_sources", "_images", "_sphinx_design_static"}
MATHJAX_WAIT_MS = 10_000

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
  return {mathjax, nMath: maths.length, unrendered, mathErrors, nImages: images.length,
          brokenImages, nCharts: charts.length, emptyCharts, title: document.title};
}
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


def inspect_page(context, url: str, mathjax_wait_ms: int = MATHJAX_WAIT_MS) -> tuple[dict, list[str]]:
    """Load one page and return (what rendered, problems found)."""
    problems: list[str] = []
    page = context.new_page()
    page.on(
        "request",
        lambda r: (
            None if r.url.startswith(LOCAL_SCHEMES) else problems.append(f"request to another host: {r.url}")
        ),
    )
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url} ({r.failure})"))
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
    return report, problems


def test_every_page_renders_offline(html_dir, browser_context):
    pages = book_pages(html_dir)
    assert len(pages) >= 2, f"only {len(pages)} page(s) under {html_dir}"
    failures, totals = {}, {"math": 0, "charts": 0}
    for path in pages:
        report, problems = inspect_page(browser_context, path.resolve().as_uri())
        totals["math"] += report["nMath"]
        totals["charts"] += report["nCharts"]
        if problems:
            failures[str(path.relative_to(html_dir))] = problems
    listing = "\n".join(
        f"{page}:\n  " + "\n  ".join(p[:300] for p in probs[:15]) for page, probs in failures.items()
    )
    assert not failures, f"{len(failures)} of {len(pages)} pages failed offline:\n{listing}"
    # The book has formulas (notation page); a check that saw none would prove nothing.
    assert totals["math"] > 0, "no formula found in any page: is MathJax markup being produced?"


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
        '<script src="https://cdn.example.com/vega.js"></script></head><body>'
        '<span class="math notranslate nohighlight">\\(m_K\\)</span>'
        '<div class="cell_output"><img src="missing.svg"></div>'
        '<script>console.error("boom")</script></body></html>'
    )
    report, problems = inspect_page(browser_context, page.as_uri(), mathjax_wait_ms=500)
    text = "\n".join(problems)
    assert "request to another host: https://cdn.example.com/vega.js" in text
    assert "image not loaded: missing.svg" in text and "chart not rendered" in text
    assert "1 of 1 formulas not rendered" in text and "MathJax never loaded" in text
    assert "console error: boom" in text
