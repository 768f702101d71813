"""Where the project keeps what it builds (models, runs, measurements) and reads its data, and atomic writes.

Everything built lives under one directory: ``$COUPLING_CACHE`` if set, else the user's cache
directory (``platformdirs.user_cache_dir("coupling-book")``). The facts the book uses (leaderboard
scores, metadata, prompts) are read from :func:`data_dir`. Every write goes to a temporary
name in the same directory and is renamed into place, so an interrupted run never leaves a
half-written file behind; a disk (or quota) that fills up during a write is a :class:`DiskFull`
naming the folder, raised after the temporary file is removed. Files and folders get the modes
the umask gives (as ``open`` and ``mkdir`` would), so a group can share a cache; a corrupt JSON
record is moved aside, not fatal (:func:`read_json`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import platformdirs

ENV_VAR = "COUPLING_CACHE"
DATA_ENV_VAR = "COUPLING_DATA"


class CacheError(OSError):
    """The cache directory cannot be made where it is configured (a file stands in its way)."""


# The errors of a write that found no room: the disk is full, or the user's quota is used up.
NO_ROOM = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up"}


class DiskFull(OSError):
    """A write found no room (ENOSPC, or EDQUOT on a cluster's quota): names the folder and the
    fix; what was being written was removed first, so nothing half-written is left there."""

    def __init__(self, folder: str | os.PathLike, code: int = errno.ENOSPC, *others: str | os.PathLike):
        super().__init__(code, os.strerror(code))
        self.folder = Path(folder)  # where the write failed; ``others``: where else it may have
        self.folders = [self.folder, *map(Path, others)]

    def __reduce__(self):  # as it was made (OSError's would give its args to the wrong parameters)
        return type(self), (self.folder, self.errno, *self.folders[1:])

    def __str__(self) -> str:
        where = " or ".join(map(str, self.folders))
        quota = ", `quota -s` your quota" if self.errno == errno.EDQUOT else ""
        cache = cache_root().absolute()
        in_cache = sum(f.absolute() == cache or cache in f.absolute().parents for f in self.folders)
        move = {
            (True, False): f"point ${ENV_VAR} at",
            (False, True): "give the output option (--out, --output-dir or --work)",
            (True, True): f"point ${ENV_VAR}, or the output option (--out, --output-dir or --work), at",
        }[bool(in_cache), in_cache < len(self.folders)]
        return (
            f"{NO_ROOM.get(self.errno, 'there is no room')} ({self.strerror}) while writing in "
            f"{where}; the files being written were removed, nothing half-written is kept. Free "
            f"space there (`df -h {' '.join(map(str, self.folders))}` shows the room left{quota}), "
            f"or {move} a folder on a disk with room"
        )

    @classmethod
    def said(cls, text: str) -> DiskFull | None:
        """The DiskFull whose message is in ``text`` (a notebook's error), or None."""
        m = re.search(r"\(([^()]*)\) while writing in (.+?); the files being written", text)
        codes = {os.strerror(code): code for code in NO_ROOM}
        if m is None or m[1] not in codes:
            return None
        first, *others = m[2].split(" or ")
        return cls(first, codes[m[1]], *others)


def no_room(exc: BaseException | None) -> BaseException | None:
    """The error in ``exc``'s chain (itself, its cause, what it was handling) that says a disk or
    quota is full: an OSError with errno ENOSPC or EDQUOT, or a library's error whose text carries
    that error's message (safetensors writes from Rust); None if there is none."""
    for link in error_chain(exc):
        if isinstance(link, OSError) and link.errno in NO_ROOM:
            return link
        if any(os.strerror(code) in str(link) for code in NO_ROOM):
            return link
    return None


def error_chain(exc: BaseException | None) -> list[BaseException]:
    """``exc``, its cause (or what it was handling), theirs, ...: the chain a traceback shows."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def no_room_code(exc: BaseException) -> int:
    """ENOSPC or EDQUOT, for the no-room error ``exc`` (:func:`no_room`)."""
    if isinstance(exc, OSError) and exc.errno in NO_ROOM:
        return exc.errno
    return errno.EDQUOT if os.strerror(errno.EDQUOT) in str(exc) else errno.ENOSPC


@contextlib.contextmanager
def naming_the_folder(folder: str | os.PathLike) -> Iterator[None]:
    """Turn a write's no-room error (:func:`no_room`) inside the block into a :class:`DiskFull`
    naming ``folder``; one an inner block named passes unchanged, unless its folder is gone (a
    temporary folder, removed): then it names ``folder``."""
    try:
        yield
    except DiskFull as exc:
        if exc.folder.is_dir():
            raise
        raise DiskFull(folder, exc.errno) from exc
    except Exception as exc:
        found = no_room(exc)
        if found is None:
            raise
        raise DiskFull(folder, no_room_code(found)) from exc


# Below this much room, a write that failed without saying why (numpy's "N requested and M
# written", torch's "file write failed") is taken to have found the disk full.
LITTLE_ROOM = 1 << 20


@contextlib.contextmanager
def _short_write(folder: Path) -> Iterator[None]:
    """Turn a write's failure that names no cause into a :class:`DiskFull` when ``folder``'s disk
    has (almost) no room left: checked here, before the partial file is removed."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if isinstance(exc, DiskFull) or no_room(exc) is not None or getattr(exc, "errno", None):
            raise
        if _room(folder) >= LITTLE_ROOM:
            raise
        raise DiskFull(folder) from exc


def _room(folder: Path) -> float:
    """The bytes an unprivileged write may still use on ``folder``'s disk (inf where unknown)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # gone, or no statvfs (Windows)
        return float("inf")
    return st.f_bavail * st.f_frsize


def cache_root() -> Path:
    """Where the cache is (``$COUPLING_CACHE``, else the user's cache folder), made or not."""
    return Path(os.environ.get(ENV_VAR) or platformdirs.user_cache_dir("coupling-book")).expanduser()


def cache_dir(*parts: str) -> Path:
    """The project's cache directory (created), or a subdirectory of it; a file where a folder
    must be, or a folder that cannot be created (a read-only cache), is a :class:`CacheError`
    naming ``$COUPLING_CACHE`` and the fix."""
    given = os.environ.get(ENV_VAR)
    root = cache_root()
    path = root.joinpath(*parts)
    where = f"${ENV_VAR}={given!r}" if given else f"the cache folder {root} (set ${ENV_VAR} to move it)"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        # the outermost thing in the way: a file, or a link to nothing (exists() does not see one)
        there = [p for p in [path, *path.parents] if (p.exists() or p.is_symlink()) and not p.is_dir()]
        blocking = there[-1] if there else path
        what = (
            f"a link to {os.readlink(blocking)}, which does not exist"
            if blocking.is_symlink() and not blocking.exists()
            else "a file, not a folder"
        )
        raise CacheError(
            f"{where}: {blocking} is {what}, so nothing can be cached there; point "
            f"{ENV_VAR} at a folder (it is created if missing), or move the file away"
        ) from exc
    except PermissionError as exc:  # a read-only cache: what it holds is read, nothing new written
        raise CacheError(
            f"{where}: {path} cannot be created ({exc.strerror}): this cache is not writable here, and "
            f"what it does not hold yet must be written; make it writable (chmod -R u+w {root}) or "
            f"point {ENV_VAR} at a folder you can write"
        ) from exc
    except OSError as exc:  # a full disk, or quota: name the folder it stopped in
        if exc.errno not in NO_ROOM:
            raise
        raise DiskFull(next(p for p in path.parents if p.is_dir()), exc.errno) from exc
    return path


def data_dir() -> Path:
    """The data directory: ``$COUPLING_DATA`` if set, else the repository's ``data/``.

    The package is installed editable from the repository, so ``data/`` sits next to the
    ``coupling_utils`` package directory. Raises FileNotFoundError saying how to fix it.
    """
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"${DATA_ENV_VAR}={env!r} is not a directory. Point it at a copy of the "
                "repository's data/ folder, or unset it to use the repository's own."
            )
        return path
    path = Path(__file__).resolve().parents[1] / "data"
    if not (path / "model_aliases.csv").is_file():
        raise FileNotFoundError(
            f"The project's data folder was not found at {path}. coupling_utils reads its data from "
            "the repository checkout: install it editable from the repository (`pip install -e .`), "
            f"or set ${DATA_ENV_VAR} to a copy of the repository's data/ folder (the lab kit has one "
            "beside its notebooks: run a kit notebook from the unzipped kit's folder, whose first "
            "cell sets it)."
        )
    return path


def umask() -> int:
    """The process's umask (read from /proc where it can be, so no other thread sees it change)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _umask_mode(path: Path, directory: bool) -> None:
    """Give a temporary file (0600 from mkstemp) or folder (0700 from mkdtemp) the umask's mode."""
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


def follow_umask(root: str | os.PathLike) -> None:
    """Give ``root`` and everything under it the modes the umask gives (as ``open`` and ``mkdir``
    would): folders ``0o777 & ~umask``, files ``0o666 & ~umask`` (``0o777`` for an executable one).

    For what a library wrote with its own mode (``save_pretrained`` writes its weights through a
    0600 temporary file): :func:`atomic_dir` calls it on every folder before it is renamed into
    place. Symbolic links are left alone (``chmod`` would follow them out of the folder).
    """
    mask = umask()
    for path in [Path(root), *Path(root).rglob("*")]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        full = stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111
        mode = (0o777 if full else 0o666) & ~mask
        if st.st_mode & 0o7777 != mode:
            os.chmod(path, mode)


def read_json(path: str | os.PathLike, what: str = "record") -> dict | None:
    """The JSON object at ``path`` (None if there is none). A file that is not valid JSON (or not
    UTF-8), or holds another value than an object (every record here is one), is moved aside to
    ``<name>.corrupt-<UTC time>``, named on stderr, and None returned, so the caller recomputes what
    it held instead of failing on it at every later run."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(data)  # from bytes: UTF-8 as JSON says, whatever the locale
    except ValueError as exc:
        set_aside(path, f"the {what} {path} is corrupt ({exc})")
        return None
    if not isinstance(value, dict):
        set_aside(path, f"the {what} {path} is corrupt (a JSON {type(value).__name__}, not an object)")
        return None
    return value


def yaml_problem(exc: BaseException) -> tuple[str, str]:
    """``(where, what)`` of a YAML file that could not be read (``exc``: PyYAML's error or a
    UnicodeDecodeError): " at line L, column C" ("" when PyYAML names no place) and the problem in
    a few words, for a message that names the file and the fix."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return where, getattr(exc, "problem", None) or str(exc).splitlines()[0]


def set_aside(path: str | os.PathLike, why: str) -> None:
    """Move a corrupt record aside to ``<name>.corrupt-<UTC time>`` and say so on stderr (``why``:
    what is wrong, naming it), so that what it held is recomputed instead of failing at every
    later run; in a read-only place it stays, ignored, and the warning says that."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    moved = f"moved it to {aside.name}"
    try:
        os.replace(path, aside)
    except OSError as err:  # a read-only place: leave it, and say so
        moved = f"could not move it aside ({err.strerror}); it is ignored"
    print(f"warning: {why}; {moved} and will recompute what it held.", file=sys.stderr, flush=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    with naming_the_folder(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(tmp)
        try:
            _umask_mode(tmp, directory=False)
            with _short_write(path.parent):
                yield tmp
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; move it onto ``path`` only on success.

    An existing ``path`` is replaced. Used for model directories and checkpoints. Everything in the
    finished folder is given the umask's modes (:func:`follow_umask`) before the move, also what a
    library wrote with its own (``save_pretrained`` writes its weights 0600).
    """
    path = Path(path)
    with naming_the_folder(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            _umask_mode(tmp, directory=True)
            with _short_write(path.parent):
                yield tmp
            follow_umask(tmp)
            if path.exists():
                old = path.with_name(f".{path.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_parquet(df, path: str | os.PathLike) -> None:
    """Write a pandas DataFrame to Parquet atomically."""
    with atomic_path(path) as tmp:
        write_parquet(df, tmp)


def write_parquet(df, path: str | os.PathLike) -> None:
    """``df.to_parquet(path, index=False)`` through a file Python opened: pyarrow encodes a path as
    UTF-8, so a folder whose name is not (its bytes kept as surrogates) fails there, while Python's
    ``open`` takes any name the file system does."""
    with open(path, "wb") as f:
        df.to_parquet(f, index=False)


def read_parquet(path: str | os.PathLike):
    """``pd.read_parquet(path)`` through a file Python opened (see :func:`write_parquet`); a file
    pyarrow cannot read is an error of its class (OSError or ValueError) that names the file."""
    import pandas as pd

    with open(path, "rb") as f:
        try:
            return pd.read_parquet(f)
        except (OSError, ValueError) as exc:  # pyarrow's message names the buffer, not the file
            kind = OSError if isinstance(exc, OSError) else ValueError
            raise kind(f"{os.fsdecode(path)}: {exc}") from exc


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, what: str = "", *, quiet: bool = False) -> Iterator[None]:
    """Hold an exclusive inter-process lock on ``path`` (created); wait, saying so (unless
    ``quiet``: for locks held a moment), if it is taken.

    Two processes building the same model or measuring into the same folder would otherwise
    overwrite each other's work; the second one waits and then finds the first one's results.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no locking
        yield
        return
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"{what or path}: another process is working on it; waiting ...", flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def is_locked(path: str | os.PathLike) -> bool:
    """Whether another process holds :func:`file_lock` on ``path`` right now."""
    path = Path(path)
    if not path.exists():
        return False
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return False
    try:
        fh = open(path)  # noqa: SIM115 (read-only: a cache one cannot write is still readable)
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False
