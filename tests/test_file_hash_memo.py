"""provenance.file_sha256's memo: a file moved within its filesystem is not read again; a file
rewritten in place, or another file at the old path, is."""

import hashlib
import json
import os

import pytest

from coupling_utils import provenance

MEMO = ("zoo", "sha256-memo.json")


@pytest.fixture
def reads(tmp_path, monkeypatch):
    """The paths whose bytes file_sha256 read, in a fresh cache with an empty in-process memo."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance, "_SHA_MEMO", {})
    seen = []
    stream = provenance._stream_sha256

    def counted(path):
        seen.append(path)
        return stream(path)

    monkeypatch.setattr(provenance, "_stream_sha256", counted)
    return seen


@pytest.mark.parametrize("forget", [False, True], ids=["same-process", "from-the-memo-file"])
def test_a_moved_file_is_not_read_again(tmp_path, reads, forget):
    (tmp_path / "run1").mkdir()
    (tmp_path / "scratch").mkdir()
    old = tmp_path / "run1" / "model.safetensors"
    old.write_bytes(b"weights" * 1000)
    want = hashlib.sha256(b"weights" * 1000).hexdigest()
    assert provenance.file_sha256(old) == want and len(reads) == 1
    new = tmp_path / "scratch" / "ckpt.safetensors"
    old.rename(new)  # mv /data/run1/ckpt /scratch/ckpt
    if forget:  # a later process: only the memo file remembers
        provenance._SHA_MEMO.clear()
    assert provenance.file_sha256(new) == want
    assert len(reads) == 1, f"the moved file was read again: {reads}"


def test_a_hard_link_is_the_same_file(tmp_path, reads):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    os.link(f, tmp_path / "link.bin")
    provenance.file_sha256(f)
    provenance._SHA_MEMO.clear()
    assert provenance.file_sha256(tmp_path / "link.bin") == hashlib.sha256(b"abc").hexdigest()
    assert len(reads) == 1


@pytest.mark.parametrize("forget", [False, True], ids=["same-process", "from-the-memo-file"])
def test_a_file_rewritten_in_place_with_the_same_size_is_hashed_again(tmp_path, reads, forget):
    f = tmp_path / "w.bin"
    f.write_bytes(b"aaaa")
    before = f.stat()
    assert provenance.file_sha256(f) == hashlib.sha256(b"aaaa").hexdigest()
    with open(f, "r+b") as out:  # the same inode, new bytes of the same length
        out.write(b"bbbb")
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # a new mtime, surely
    after = f.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    if forget:
        provenance._SHA_MEMO.clear()
    assert provenance.file_sha256(f) == hashlib.sha256(b"bbbb").hexdigest()
    assert len(reads) == 2


@pytest.mark.parametrize("forget", [False, True], ids=["same-process", "from-the-memo-file"])
def test_another_file_at_the_old_path_gets_its_own_hash(tmp_path, reads, forget):
    """Even with the old file's size and mtime to the nanosecond: it has another inode."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"aaaa")
    old = f.stat()
    assert provenance.file_sha256(f) == hashlib.sha256(b"aaaa").hexdigest()
    f.rename(tmp_path / "moved.bin")
    f.write_bytes(b"bbbb")
    os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    if forget:
        provenance._SHA_MEMO.clear()
    assert provenance.file_sha256(f) == hashlib.sha256(b"bbbb").hexdigest()
    assert provenance.file_sha256(tmp_path / "moved.bin") == hashlib.sha256(b"aaaa").hexdigest()
    assert len(reads) == 2


def test_entries_of_the_older_format_are_not_read(tmp_path, reads):
    """A ``path|size|mtime_ns`` entry (without the inode) cannot tell the file it hashed from
    another one at that path: it is not trusted, the file is hashed and remembered anew."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    st = f.stat()
    memo = tmp_path.joinpath("cache", *MEMO)
    memo.parent.mkdir(parents=True)
    old_key = f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    memo.write_text(json.dumps({old_key: "0" * 64}))
    assert provenance.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    assert len(reads) == 1
    stored = json.loads(memo.read_text())
    assert stored[old_key] == "0" * 64  # kept for an older coupling_utils sharing the cache
    assert sorted(k.split("|")[0] for k in stored if k != old_key) == ["inode", "path"]


def test_a_memo_file_that_is_not_a_mapping_is_replaced(tmp_path, reads):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    memo = tmp_path.joinpath("cache", *MEMO)
    memo.parent.mkdir(parents=True)
    memo.write_text("[1, 2]")
    assert provenance.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    assert isinstance(json.loads(memo.read_text()), dict)


def test_processes_sharing_a_cache_keep_each_others_entries(tmp_path):
    """Four processes hash 25 files each into one cache at once (a sweep's jobs on a shared
    cache): the memo ends with every file's entries. Read, updated and written without its lock,
    each writer replaced the memo with its own view, and most entries were lost."""
    import subprocess
    import sys

    files = tmp_path / "files"
    files.mkdir()
    for i in range(100):
        (files / f"{i}.bin").write_bytes(str(i).encode() * 100)
    script = (
        "import sys\nfrom pathlib import Path\nfrom coupling_utils import provenance\n"
        "for p in sorted(Path(sys.argv[1]).glob('*.bin'))[int(sys.argv[2])::4]:\n"
        "    provenance.file_sha256(p)\n"
    )
    env = {**os.environ, "COUPLING_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(files), str(i)], env=env) for i in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    memo = json.loads(tmp_path.joinpath("cache", *MEMO).read_text())
    hashed = {k.split("|")[1] for k in memo if k.startswith("path|")}
    assert hashed == {str((files / f"{i}.bin").resolve()) for i in range(100)}
    for i in (0, 57, 99):
        assert memo[next(k for k in memo if k.startswith(f"path|{(files / f'{i}.bin').resolve()}|"))] == (
            hashlib.sha256(str(i).encode() * 100).hexdigest()
        )
