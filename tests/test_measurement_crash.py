"""Crash safety of measure(): processes killed (SIGKILL) inside a layer's computation and in the
middle of writing a file resume to the tables of an uninterrupted run; two processes measuring
into one folder at once end with one correct result; completion markers follow their data.

The kills land deterministically: a worker script (below, run with this Python) wraps the
engine's Jacobian sweep or the low-level writers (``np.save``, ``DataFrame.to_parquet``,
``Path.write_text``) and kills its own process at a chosen call, after writing half of the file.
Nothing of this is in the package: normal runs pay nothing for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import ANY

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import TABLES, Measurement, Options, measure

WORKER = r"""
import fnmatch, os, signal, sys, time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

torch.set_num_threads(1)
import coupling_utils.engine.jacobians as jac
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import Options, measure

out, kill_at, result, sync = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
options = Options(checkpoint_seconds=float(sys.argv[5]))  # 0: every layer written when done
kind, _, target = kill_at.partition(":")


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


if kind == "jacobian":  # inside a layer: the n-th Jacobian sweep is computed, then the process dies
    n, calls, sweep = int(target), [0], jac.token_jacobians

    def token_jacobians(*args, **kwargs):
        calls[0] += 1
        J = sweep(*args, **kwargs)
        if calls[0] == n:
            die()
        return J

    jac.token_jacobians = token_jacobians

if kind == "write":  # mid-write: half of the file whose final path matches, then the process dies
    def final(path):  # the file a temporary ".<name>.<random>.tmp" becomes (or the path itself)
        path = Path(path)
        if path.name.endswith(".tmp"):
            path = path.parent / path.name[1:].rsplit(".", 2)[0]
        return path.relative_to(out).as_posix() if path.is_relative_to(out) else ""

    def cut(tmp):
        if fnmatch.fnmatch(final(tmp), target):
            os.truncate(tmp, os.path.getsize(tmp) // 2)
            die()

    save, to_parquet, write_text = np.save, pd.DataFrame.to_parquet, Path.write_text

    def np_save(fh, arr, *a, **k):
        save(fh, arr, *a, **k)
        fh.flush()
        cut(fh.name)

    def df_to_parquet(df, path, *a, **k):  # a path, or the file files.write_parquet opened
        to_parquet(df, path, *a, **k)
        if hasattr(path, "flush"):
            path.flush()
        cut(getattr(path, "name", path))

    def path_write_text(self, text, *a, **k):
        n = write_text(self, text, *a, **k)
        cut(self)
        return n

    np.save, pd.DataFrame.to_parquet, Path.write_text = np_save, df_to_parquet, path_write_text

callback = None
if kind == "hold":  # after the first stored layer: say so, then wait to be let go
    def callback(info):
        (Path(sync) / "a_in").touch()
        while not (Path(sync) / "go").exists():
            time.sleep(0.05)

computed = []
model = tiny_model("llama")
g = torch.Generator().manual_seed(7)
prompts = {"a": torch.randint(0, 64, (1, 5), generator=g), "b": torch.randint(0, 64, (1, 4), generator=g)}
cb = callback or (lambda info: computed.append(info["computed"]))
res = measure(
    model, prompts, tokens="all", k=(3, 8), context="last", tiles=3, out=out, callback=cb, options=options
)
pd.to_pickle({"tables": res.tables, "computed": computed}, result)
print("finished", flush=True)
"""

KW = dict(tokens="all", k=(3, 8), context="last", tiles=3, options=Options(checkpoint_seconds=0))
"""Every layer written as soon as it is done: the layer files these tests kill, damage and resume."""


def _inputs():
    """The worker's model and prompts."""
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(7)
    prompts = {"a": torch.randint(0, 64, (1, 5), generator=g), "b": torch.randint(0, 64, (1, 4), generator=g)}
    return model, prompts


@pytest.fixture(scope="module")
def reference():
    return measure(*_inputs(), **KW).tables


@pytest.fixture
def worker(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(out: Path, kill_at: str = "none", name: str = "result", checkpoint: float = 0):
        result = str(tmp_path / f"{name}.pkl")
        cmd = [sys.executable, str(script), str(out), kill_at, result, str(tmp_path), str(checkpoint)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    return start


def _same_tables(got: dict, ref: dict) -> None:
    for name in TABLES:
        a, b = got[name], ref[name]
        if name == "timings":  # seconds differ from run to run; the work done does not
            a, b = a.drop(columns="seconds"), b.drop(columns="seconds")
        if name == "prompts":  # token ids read back from Parquet are arrays, fresh ones lists
            a, b = (df.assign(input_ids=[list(map(int, x)) for x in df["input_ids"]]) for df in (a, b))
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=name)


def _batch(out: Path, n: int) -> dict:
    """The marker of the n-th batch of finished prompts written into ``out``."""
    return json.loads((out / "prompts" / f"batch-{n}" / "done.json").read_text())


def _killed(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == -9, f"expected SIGKILL, got {proc.returncode}:\n{out}\n{err[-3000:]}"


@pytest.mark.slow
def test_killed_inside_a_layer_and_mid_write_then_resumed_gives_the_same_tables(tmp_path, worker, reference):
    out = tmp_path / "m"
    # 1. inside prompt b's layer 1 (the 4th Jacobian sweep): a is done, b's layer 0 is stored
    _killed(worker(out, "jacobian:4"))
    assert _batch(out, 1) == {"prompts": {"a": ANY}, "empty_tables": ANY}  # each prompt, at once
    assert (out / "_work" / "b" / "layer_0000" / "done.json").exists()
    assert not (out / "_work" / "b" / "layer_0001" / "done.json").exists()
    # 2. half-way through writing b's layer-1 marker: the half file is a temporary, not the marker
    _killed(worker(out, "write:_work/b/layer_0001/done.json"))
    layer1 = out / "_work" / "b" / "layer_0001"
    assert not (layer1 / "done.json").exists() and list(layer1.glob(".done.json.*.tmp"))
    # 3. half-way through a Jacobian file, a prompt's table, its marker, a final table and the
    #    final marker: each run resumes from what the previous one stored (a marker written
    #    before its data would be found here with its data missing)
    for target in (
        "_work/b/layer_0001/J.npy",
        "prompts/batch-2/depthwise.parquet",
        "prompts/batch-2/done.json",
        "context.parquet",
        "provenance.json",
    ):
        _killed(worker(out, f"write:{target}"))
        assert not (out / "provenance.json").exists(), target
    assert "b" in _batch(out, 2)["prompts"] and (out / "depthwise.parquet").exists()
    # 4. an uninterrupted resume finishes with the reference tables, and nothing half-written
    computed = []
    model, prompts = _inputs()
    res = measure(model, prompts, **KW, out=out, callback=lambda info: computed.append(info["computed"]))
    assert computed == []  # everything was stored: only the final marker was missing
    _same_tables(res.tables, reference)
    _same_tables(Measurement.load(out).tables, reference)
    assert not list(out.rglob("*.tmp"))
    assert not (out / "_work").exists() or not any((out / "_work").iterdir())


@pytest.mark.slow
def test_killed_with_its_layers_held_loses_only_them_and_resumes_to_the_same_tables(
    tmp_path, worker, reference
):
    """At a checkpoint interval longer than the run, finished layers and prompts are held in memory:
    a process killed inside prompt b's layer 1 has written neither prompt a nor any of b's layers;
    a resumed run measures them again, to the reference tables."""
    out = tmp_path / "m"
    _killed(worker(out, "jacobian:4", checkpoint=600))
    assert not (out / "prompts").exists()
    assert not list((out / "_work").rglob("done.json"))
    proc = worker(out, "none", checkpoint=600)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "finished" in stdout, stderr[-3000:]
    got = pd.read_pickle(tmp_path / "result.pkl")
    assert got["computed"] == [True] * 4  # a's and b's two layers each, measured again
    _same_tables(got["tables"], reference)


@pytest.mark.slow
def test_two_processes_measuring_into_one_folder_end_with_one_correct_result(tmp_path, worker, reference):
    out = tmp_path / "m"
    first = worker(out, "hold", "first")  # stops after its first stored layer, holding the folder
    deadline = time.monotonic() + 300
    while not (tmp_path / "a_in").exists():
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline, (
            "the first process did not start measuring within 300 s: the machine is very slow or it hangs"
        )
        time.sleep(0.1)
    second = worker(out, "none", "second")
    line = second.stdout.readline()  # the second one says it waits for the first
    assert "another process is working on it" in line, line + second.stderr.read()[-3000:]
    (tmp_path / "go").touch()
    for proc in (first, second):
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
    a, b = pd.read_pickle(tmp_path / "first.pkl"), pd.read_pickle(tmp_path / "second.pkl")
    assert b["computed"] == []  # the second found the first's results and computed nothing
    _same_tables(a["tables"], reference)
    _same_tables(b["tables"], reference)
    _same_tables(Measurement.load(out).tables, reference)
    assert json.loads((out / "provenance.json").read_text())["settings"]["k"] == [3, 8]
    assert not list(out.rglob("*.tmp"))


def test_completion_markers_are_written_after_their_data(tmp_path, monkeypatch):
    """Every file goes through the store's atomic writers; each marker comes after its data."""
    import coupling_utils.files as files

    order = []
    real = files.atomic_path

    def logging_atomic_path(path):
        class Logged:
            def __enter__(self):
                self.cm = real(path)
                return self.cm.__enter__()

            def __exit__(self, *exc):
                result = self.cm.__exit__(*exc)
                if exc[0] is None:
                    order.append(Path(path).resolve().relative_to(out.resolve()).as_posix())
                return result

        return Logged()

    out = tmp_path / "m"
    for module in ("coupling_utils.files", "coupling_utils.measurement.store"):
        monkeypatch.setattr(f"{module}.atomic_path", logging_atomic_path)
    measure(*_inputs(), **KW, out=out, keep_work=True, method="matrix_free")
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    assert written == set(order), f"written outside the atomic writers: {written ^ set(order)}"
    assert len(order) == len(set(order))

    def before(marker: str, data) -> None:
        late = [d for d in data if order.index(d) > order.index(marker)]
        assert not late, f"{marker} was written before {late}"

    for path in order:
        folder, name = path.rpartition("/")[0], path.rpartition("/")[2]
        siblings = [p for p in order if p.rpartition("/")[0] == folder and p != path]
        if name == "done.json" and "/layer_" in path:  # a layer: all but its cross products
            before(path, [p for p in siblings if "cross" not in p])
        elif name == "cross.json":
            before(path, [p for p in siblings if p.endswith("cross_tiles.npy")])
        elif name == "done.json":  # a finished prompt: its tables
            before(path, siblings)
        elif name == "provenance.json":
            before(path, [p for p in siblings if p.endswith(".parquet")])
    assert order.index("settings.json") < min(order.index(p) for p in order if p.endswith(".npy"))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _marker_without(key: str):
    def damage(layer: Path) -> None:
        marker = json.loads((layer / "done.json").read_text())
        del marker[key]
        (layer / "done.json").write_text(json.dumps(marker))

    return damage


LAYER_DAMAGES = {
    "a table cut short": lambda layer: _cut(layer / "singular_values.parquet"),
    "a table missing": lambda layer: (layer / "tokenwise.parquet").unlink(),
    "a table a column short": lambda layer: (
        pd.read_parquet(layer / "context.parquet").drop(columns=["m"]).to_parquet(layer / "context.parquet")
    ),
    "an array cut short": lambda layer: _cut(layer / "J.npy"),
    "an array missing": lambda layer: (layer / "basis_S.npy").unlink(),
    "an array of another shape": lambda layer: np.save(layer / "ctx_J.npy", np.load(layer / "ctx_J.npy")[1:]),
    "a marker without its tokens": _marker_without("tokens"),
    "a marker naming no arrays": _marker_without("arrays"),
}


@pytest.mark.parametrize("damage", sorted(LAYER_DAMAGES))
def test_a_stored_layer_damaged_before_its_prompt_finished_is_computed_again(
    damage, tmp_path, reference, capsys
):
    """A layer stored by an interrupted run, then damaged from outside (a file cut short, deleted
    or rewritten, a marker that lost a fact) is found before its prompt's tables are assembled:
    its marker is set aside, said, and the layer computed again; the resumed run gives the tables
    of an uninterrupted one. Before, the assembly read the damaged file and the run stopped."""

    class Stop(Exception):
        pass

    def stop_at_b_layer_1(info):
        if info["prompt"] == "b" and info["layer"] == 1:
            raise Stop

    out = tmp_path / "m"
    with pytest.raises(Stop):
        measure(*_inputs(), **KW, out=out, callback=stop_at_b_layer_1)
    layer = out / "_work" / "b" / "layer_0000"
    LAYER_DAMAGES[damage](layer)
    capsys.readouterr()
    seen = []
    res = measure(
        *_inputs(), **KW, out=out, keep_work=True, callback=lambda i: seen.append((i["layer"], i["computed"]))
    )
    err = capsys.readouterr().err
    assert f"warning: layer 0 of prompt 'b' stored in {layer} cannot be read (" in err, err
    assert seen == [(0, True), (1, False)]  # the damaged layer again; layer 1 was stored whole
    assert len(list(layer.glob("done.json.corrupt-*"))) == 1
    _same_tables(res.tables, reference)


def test_damaged_matrix_free_products_are_made_again_and_a_layer_made_again_remakes_them_all(
    tmp_path, capsys
):
    """Matrix-free: a layer's stored cross products cut short are made again; a layer computed
    again (its stored vectors damaged) makes every layer's cross products again, since each used
    that layer's vectors. Either way the tables are those of an uninterrupted run."""
    kw = dict(KW, method="matrix_free")
    whole = measure(*_inputs(), **kw).tables

    class Stop(Exception):
        pass

    def stop_at_b_cross_1(info):
        if info["prompt"] == "b" and info["stage"] == "cross" and info["layer"] == 1:
            raise Stop

    for damaged, redone in (("cross_tiles.npy", [("cross", 0)]), ("basis_U.npy", None)):
        out = tmp_path / damaged
        with pytest.raises(Stop):
            measure(*_inputs(), **kw, out=out, callback=stop_at_b_cross_1)
        _cut(out / "_work" / "b" / "layer_0000" / damaged)
        seen = []
        res = measure(
            *_inputs(),
            **kw,
            out=out,
            callback=lambda i, seen=seen: seen.append((i["stage"], i["layer"], i["computed"])),
        )
        assert "warning: layer 0 of prompt 'b' stored in" in capsys.readouterr().err
        computed = [(stage, layer) for stage, layer, c in seen if c]
        assert computed == (redone or [("layer", 0), ("cross", 0), ("cross", 1)]), seen
        _same_tables(res.tables, whole)
