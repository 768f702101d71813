"""The ``jupyter-book`` that :func:`coupling_utils.pipeline.book.build_book` runs in a child process
(:data:`JB_MAIN`): its lines name no staging copy as the book, and a write that found no room ends
it with that errno as its status, so the parent can say the disk is full."""

from __future__ import annotations

import os
import sys
import traceback

from coupling_utils.files import NO_ROOM, no_room, no_room_code

__all__ = ["JB_MAIN", "SHOWN_OUT", "jupyter_book_main"]

JB_MAIN = "; ".join(
    [
        "import sys",
        "from coupling_utils.pipeline.jupyter_book_child import jupyter_book_main",
        "sys.exit(jupyter_book_main())",
    ]
)
# Where the pages built by a :data:`JB_MAIN` child end up (``out``, ``out/print``): its "Output
# Path:" line names that folder instead of the staging copy under ``work/jb``.
SHOWN_OUT = "COUPLING_BOOK_SHOWN_OUT"
OUTPUT_LINE = "Output Path: "


def jupyter_book_main() -> int:
    """``jupyter-book`` run without the lines that name the staging copy under ``work/jb`` as the
    book (its opening "Output Path: ..." names ``$COUPLING_BOOK_SHOWN_OUT``, or is left out; its
    closing green box and Sphinx's "The HTML pages are in ..." are not printed): ``build_book``
    copies the pages to ``out``, and ``coupling-book build`` names that ``index.html``, the one
    path a reader should open. Its red boxes (a failed build) are printed
    as they are. A write that found no room, seen on stderr (Sphinx makes some of them warnings)
    or raised, ends it with that errno as its status (ENOSPC or EDQUOT), whatever the build said."""
    from jupyter_book.cli import main as jb
    from sphinx.builders.html import StandaloneHTMLBuilder
    from sphinx.builders.singlehtml import SingleFileHTMLBuilder

    StandaloneHTMLBuilder.epilog = SingleFileHTMLBuilder.epilog = ""
    box = getattr(jb, "_message_box", None)  # private: where a release renames it, the box is shown

    def boxed(msg, color="green", doprint=True, print_func=print):
        return box(msg, color=color, doprint=doprint and color != "green", print_func=print_func)

    if box is not None:
        jb._message_box = boxed
    if callable(getattr(getattr(jb, "click", None), "echo", None)):  # private too: else shown as is
        jb.click = _ShownOutput(jb.click, os.environ.get(SHOWN_OUT, ""))
    sys.stderr = watched = _NoRoomSeen(sys.stderr)
    try:
        status = jb.main()
    except SystemExit as done:
        status = done.code
    except Exception as exc:
        if no_room(exc) is None:
            raise
        watched.code = no_room_code(no_room(exc))
        traceback.print_exception(exc)
    finally:
        sys.stderr = watched.stream
    return watched.code or status


class _ShownOutput:
    """``click`` for Jupyter Book's own module, whose ``echo`` shows its "Output Path:" line with
    ``shown`` (or not at all, when ``shown`` is empty); all else is click's."""

    def __init__(self, click, shown: str):
        self._click, self._shown = click, shown

    def __getattr__(self, name):
        return getattr(self._click, name)

    def echo(self, message=None, *args, **kwargs):
        text = self._click.unstyle(message) if isinstance(message, str) else ""
        if text.startswith(OUTPUT_LINE):
            if not self._shown:
                return None
            message = message.replace(text[len(OUTPUT_LINE) :], self._shown)
        return self._click.echo(message, *args, **kwargs)


class _NoRoomSeen:
    """A stream that notes (in ``code``) a write's no-room error in the text written through it."""

    def __init__(self, stream):
        self.stream, self.code = stream, 0

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def write(self, text):
        for code in NO_ROOM:
            if not self.code and os.strerror(code) in str(text):
                self.code = code
        return self.stream.write(text)
