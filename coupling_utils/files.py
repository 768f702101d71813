"""Where the project keeps what it builds (models, runs, measurements) and reads its data, and atomic writes.

Everything built lives under one directory: ``$COUPLING_CACHE`` if set, else the user's cache
directory (``platformdirs.user_cache_dir("coupling-book")``). The facts the book uses (leaderboard
scores, metadata, prompts) are read from :func:`data_dir`. Every write goes to a temporary
name in the same directory and is renamed into place, so an interrupted run never leaves a
half-written file behind. Files and folders get the modes the umask gives (as ``open`` and
``mkdir`` would), so a group can share a cache; a corrupt JSON record is moved aside, not fatal
(:func:`read_json`).
"""

from __future__ import annotations

import contextlib
import json
import os
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


def cache_dir(*parts: str) -> Path:
    """The project's cache directory (created), or a subdirectory of it; a file where a folder
    must be, or a folder that cannot be created (a read-only cache), is a :class:`CacheError`
    naming ``$COUPLING_CACHE`` and the fix."""
    given = os.environ.get(ENV_VAR)
    root = Path(given or platformdirs.user_cache_dir("coupling-book")).expanduser()
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
            f"or set ${DATA_ENV_VAR} to a copy of the repository's data/ folder."
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


def read_json(path: str | os.PathLike, what: str = "record"):
    """The JSON at ``path`` (None if there is none). A file that is not valid JSON (or not UTF-8) is
    moved aside to ``<name>.corrupt-<UTC time>``, named on stderr, and None returned, so the caller
    recomputes what it held instead of failing on it at every later run."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(data)  # from bytes: UTF-8 as JSON says, whatever the locale
    except ValueError as exc:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        moved = f"moved it to {aside.name}"
        try:
            os.replace(path, aside)
        except OSError as err:  # a read-only place: leave it, and say so
            moved = f"could not move it aside ({err.strerror}); it is ignored"
        print(
            f"warning: the {what} {path} is corrupt ({exc}); {moved} and will recompute what it held.",
            file=sys.stderr,
            flush=True,
        )
        return None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    _umask_mode(tmp, directory=False)
    try:
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    _umask_mode(tmp, directory=True)
    try:
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
        df.to_parquet(tmp, index=False)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Hold an exclusive inter-process lock on ``path`` (created); wait, saying so, if it is taken.

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
