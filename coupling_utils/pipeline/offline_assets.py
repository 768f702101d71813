"""What a built page loads from other hosts: the book must render offline, so it may load nothing.

:func:`remote_assets` scans every HTML, CSS and JavaScript file of a built book for URLs it
would fetch by itself (scripts, styles, images, frames, fonts, CSS ``url()``/``@import``, and
absolute URLs in scripts), leaving out plain links a reader may follow. The book build refuses
a book that has any; the offline browser test checks the same pages in Chromium.
"""

from __future__ import annotations

import html.parser
import re
from pathlib import Path

__all__ = ["remote_assets"]


class _AssetScanner(html.parser.HTMLParser):
    """Collect the URLs a page loads by itself (scripts, styles, images, frames, fonts)."""

    LOADS = {
        "script": ("src",),
        "img": ("src", "srcset"),
        "iframe": ("src",),
        "source": ("src", "srcset"),
        "video": ("src", "poster"),
        "audio": ("src",),
        "embed": ("src",),
        "object": ("data",),
        "input": ("src",),
    }
    LINK_RELS = {
        "stylesheet",
        "preload",
        "prefetch",
        "modulepreload",
        "icon",
        "shortcut icon",
        "apple-touch-icon",
        "manifest",
        "dns-prefetch",
        "preconnect",
    }

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self._in_style = False
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in self.LOADS.get(tag, ()):
            if attrs.get(name):
                value = attrs[name]
                if name.endswith("srcset") and not value.startswith("data:"):  # "a.png 1x, b.png 2x"
                    self.urls.extend(u.strip().split(" ")[0] for u in value.split(","))
                else:  # one URL; a data: URI carries commas of its own
                    self.urls.append(value.strip())
        if tag == "link" and attrs.get("href"):
            rels = {r.strip().lower() for r in (attrs.get("rel") or "").split()}
            if rels & self.LINK_RELS or (attrs.get("rel") or "").lower() in self.LINK_RELS:
                self.urls.append(attrs["href"])
        if tag == "style":
            self._in_style = True
        if tag == "script" and not attrs.get("src") and _is_code(attrs.get("type")):
            self._in_script = True  # data blocks (a chart's JSON spec) name URLs without loading them
        if attrs.get("style"):
            self.urls.extend(_css_urls(attrs["style"]))

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_style:
            self.urls.extend(_css_urls(data))
        if self._in_script:  # a URL in inline code is a load waiting to happen
            self.urls.extend(_SCRIPT_URL.findall(data))


_JS_TYPES = {"", "text/javascript", "application/javascript", "module", "text/ecmascript"}


def _is_code(script_type: str | None) -> bool:
    """Whether a ``<script type=...>`` is run (JavaScript), not a data block such as JSON."""
    return (script_type or "").strip().lower() in _JS_TYPES


_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")
_SCRIPT_URL = re.compile(r"""["'`]((?:https?:)?//[^"'`\s]+)["'`]""")
_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)


def _css_urls(css: str) -> list[str]:
    return [a or b for a, b in _CSS_URL.findall(css)]


def _is_remote(url: str) -> bool:
    url = url.strip()
    return bool(_REMOTE.match(url)) and not url.lower().startswith("file:")


def remote_assets(html_dir: str | Path) -> list[tuple[str, str]]:
    """(file, url) for every remote resource a built page or stylesheet would load.

    Links (``<a href>``) are not loads and are allowed; scripts, stylesheets, images,
    frames, CSS ``url()``/``@import`` and URLs quoted in inline scripts pointing at another
    host are not.
    """
    html_dir = Path(html_dir)
    found = []
    for page in sorted(html_dir.rglob("*.html")):
        scanner = _AssetScanner()
        scanner.feed(page.read_text(encoding="utf-8", errors="replace"))
        found += [(str(page.relative_to(html_dir)), u) for u in scanner.urls if _is_remote(u)]
    for sheet in sorted(html_dir.rglob("*.css")):
        css = sheet.read_text(encoding="utf-8", errors="replace")
        found += [(str(sheet.relative_to(html_dir)), u) for u in _css_urls(css) if _is_remote(u)]
    return found
