"""The printable edition as a PDF: the one-page book printed by headless Chromium.

``coupling-book build --printable`` renders the whole book on one page (``print/index.html``,
where :func:`settle_one_page` moves it so that its styles, MathJax and charts load, and
relinks what the one page does not hold to the HTML book around it).
When a Chromium is installed (``make browser``, or the Debian package ``chromium``), the build
also prints that page to :data:`PDF_FILE` beside it with :func:`print_pdf`, offline, after the
page's scripts (the live charts) have run; the intro links both. Without Chromium the build says
so in one line and links the single page only.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from coupling_utils.pipeline.pages import PRINT_DIR, BookError

__all__ = [
    "PDF_FILE",
    "CHART_WAIT_MS",
    "find_chromium",
    "pdf_planned",
    "print_pdf",
    "one_page",
    "relink_one_page",
    "settle_one_page",
    "finish_printable",
    "printable_link",
]

PDF_FILE = "coupling-book.pdf"  # in the printable edition's folder, beside its index.html
CHART_WAIT_MS = 20_000  # virtual time the page's scripts get before printing (the charts draw)
PRINT_TIMEOUT_S = 600  # wall-clock limit of one print
_REDIRECT = re.compile(r"""http-equiv=["']refresh["'][^>]*url=([^"'>\s]+)""", re.IGNORECASE)
_LINK = re.compile(r'(?<=\s)(href|src|action)="([^"]*)"', re.IGNORECASE)
_DOCUMENT = re.compile(r"""<span id="document-([^"]+)"></span>""")  # where each page starts
_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The path of an installed Chromium (or Chrome), or None."""
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def pdf_planned(printable: bool) -> bool:
    """Whether this build will add the PDF: a printable edition and a Chromium to print it. When
    the printable edition is asked for but there is no Chromium, says so in one line."""
    if not printable:
        return False
    if find_chromium() is None:
        print(
            "[book] no Chromium found: the printable edition is the single page only "
            "(install it with `make browser` or `apt-get install chromium` for a PDF too)",
            file=sys.stderr,
        )
        return False
    return True


def print_pdf(page: Path, pdf: Path, *, chromium: str | None = None, wait_ms: int = CHART_WAIT_MS) -> Path:
    """Print the HTML file ``page`` to ``pdf`` with headless Chromium (no header or footer, its
    scripts given ``wait_ms`` of virtual time first) and return ``pdf``. Raises
    :class:`~coupling_utils.pipeline.pages.BookError` naming the page and Chromium's output when
    no PDF comes out."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise BookError(
            f"cannot print {page} to a PDF: no Chromium found; install it (`make browser`) or build "
            "without --printable"
        )
    page, pdf = Path(page).resolve(), Path(pdf).resolve()
    pdf.parent.mkdir(parents=True, exist_ok=True)
    partial = pdf.with_name(pdf.name + ".partial")
    with tempfile.TemporaryDirectory(prefix="coupling-book-print-") as profile:
        command = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
            "--no-pdf-header-footer", f"--virtual-time-budget={wait_ms}",
            f"--print-to-pdf={partial}", page.as_uri(),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=PRINT_TIMEOUT_S)
    if not partial.is_file() or partial.read_bytes()[:5] != b"%PDF-":
        partial.unlink(missing_ok=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise BookError(
            f"Chromium ({chromium}) printed no PDF of {page} (exit {done.returncode}): "
            + " | ".join(tail)
            + "; check the page opens in a browser, or build without --printable"
        )
    partial.replace(pdf)
    return pdf


def one_page(folder: Path) -> Path:
    """The page of the printable edition in ``folder``: what its ``index.html`` redirects to
    (Jupyter Book's ``singlehtml`` puts the book at the root document's path), else itself."""
    index = Path(folder) / "index.html"
    found = _REDIRECT.search(index.read_text(encoding="utf-8", errors="replace"))
    target = (index.parent / found.group(1)).resolve() if found else index
    return target if target.is_file() and target.is_relative_to(index.parent.resolve()) else index


def settle_one_page(folder: Path, book: Path | None = None) -> Path:
    """Move the one page to ``folder/index.html``, relink it (:func:`relink_one_page`) and return
    that path. Jupyter Book's ``singlehtml`` writes it at the root document's path
    (``book/intro.html``) with every link (styles, scripts, MathJax, images) relative to
    ``folder``, so there it loads none of them; its old place becomes a redirect to the index."""
    folder = Path(folder).resolve()
    index, page = folder / "index.html", one_page(folder)
    old = page.relative_to(folder).as_posix()
    text = page.read_text(encoding="utf-8")
    if page != index:
        up = "../" * (len(page.relative_to(folder).parts) - 1)
        page.write_text(f'<meta http-equiv="Refresh" content="0; url={up}index.html" />\n', encoding="utf-8")
    index.write_text(relink_one_page(text, old, folder, book), encoding="utf-8")
    return index


def relink_one_page(text: str, old: str, folder: Path, book: Path | None = None) -> str:
    """The one page's HTML ``text`` with every local link that would not resolve from
    ``folder/index.html`` mended. Sphinx's ``singlehtml`` points the cross-references it
    resolves (exercises, glossary terms, citations, figures) at the root document's page, ``old``
    (``book/intro.html#f00-ex-bound``): they become the fragment alone. Links the pages wrote
    themselves (the chapters' download boxes: ``f00_coupling_metric.ipynb``, relative to
    ``notebooks/``) and the index and search pages, which the one page has not got, point at the
    HTML ``book`` around it (default: ``folder``'s parent, where the build puts ``print/``), from
    the folder of the page they were written in, else from the book's root."""
    folder = Path(folder).resolve()
    book = Path(book).resolve() if book is not None else folder.parent
    starts = [(m.start(), m.group(1)) for m in _DOCUMENT.finditer(text)]
    root_doc = PurePosixPath(old).with_suffix("").as_posix()

    def mend(match: re.Match) -> str:
        url = html.unescape(match.group(2))
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or not parts.path or url.startswith("/"):
            return match.group(0)
        fragment = f"#{parts.fragment}" if parts.fragment else ""
        if parts.path == old:
            new = fragment or "index.html"
        elif (folder / unquote(parts.path)).exists():
            return match.group(0)
        else:
            doc = next((name for at, name in reversed(starts) if at < match.start()), root_doc)
            new = url
            for base in (PurePosixPath(doc).parent, PurePosixPath()):
                target = (book / base / unquote(parts.path)).resolve()
                if target.exists() and target.is_relative_to(book) and not target.is_relative_to(folder):
                    query = f"?{parts.query}" if parts.query else ""
                    new = Path(os.path.relpath(target, folder)).as_posix() + query + fragment
                    break
        return f'{match.group(1)}="{html.escape(new)}"'

    return _LINK.sub(mend, text)


def finish_printable(folder: Path, book: Path | None = None) -> Path | None:
    """The printable edition in ``folder`` made whole: its one page at ``index.html``, linked to
    itself and to the HTML ``book`` around it (:func:`settle_one_page`) and, when a Chromium is
    installed, printed to :data:`PDF_FILE` beside it; the PDF's path, or None without Chromium."""
    index = settle_one_page(folder, book)
    chromium = find_chromium()
    if chromium is None:
        return None
    return print_pdf(index, index.parent / PDF_FILE, chromium=chromium)


def printable_link(printable: bool) -> str:
    """The intro's list item about the printable edition: a link to it (and to its PDF when this
    build can print one, :func:`pdf_planned`), or how to build it."""
    item = "- A **printable edition**, for classrooms without a screen per student: "
    if printable and pdf_planned(printable):
        return item + (
            f'<a href="../{PRINT_DIR}/index.html">the whole book on one page</a> and '
            f'<a href="../{PRINT_DIR}/{PDF_FILE}">the same as one PDF</a>, printed by headless Chromium '
            "when the book was built (`coupling-book build --printable`, which `make book` runs)."
        )
    if printable:
        return item + (
            f'<a href="../{PRINT_DIR}/index.html">the whole book on one page</a>, to print or to save '
            "as a PDF from the browser (`coupling-book build --printable`, which `make book` runs; "
            "with Chromium installed it also makes the PDF)."
        )
    return item + "not part of this build; `coupling-book build --printable` adds it (`make book` does)."
