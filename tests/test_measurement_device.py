"""Device discipline inside measure(), checked on a CPU with an emulated accelerator.

The engine's outputs (Jacobians, matrix-free operators and their spectra) are wrapped as
``_Dev`` tensors that behave like tensors on a GPU: ``.numpy()`` on them raises, an operation
mixing them with host tensors of dim > 0 raises, ``.device`` is not the host's, and tensors made
with ``device=x.device`` (or moved there with ``.to``) are device tensors too. measure() must
move what it tabulates or stores to the host explicitly and bring stored host arrays to the
device before they meet device tensors; its numbers stay the same.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch.overrides import TorchFunctionMode

import coupling_utils.engine.jacobians as jac
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import TABLES, measure
from coupling_utils.measurement import compute as compute_module

FAKE = torch.device("meta")  # stands for the accelerator; no real tensor is ever made there


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _wrap(obj):
    if isinstance(obj, torch.Tensor) and not isinstance(obj, _Dev):
        return obj.as_subclass(_Dev)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_wrap(o) for o in obj)
    if isinstance(obj, tuple):  # a named tuple (SVD)
        return type(obj)(*(_wrap(o) for o in obj))
    return obj


def _target(args, kwargs):
    device = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            device = a
    return None if device is None else torch.device(device)


class _Dev(torch.Tensor):
    """A tensor that acts as if it lived on an accelerator."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            raise RuntimeError("can't convert a device tensor to numpy: move it to the host first")
        if func == torch.Tensor.device.__get__:
            return FAKE
        host = func is torch.Tensor.cpu or (
            func is torch.Tensor.to and _target(args, kwargs) == torch.device("cpu")
        )
        flat = list(_tensors((args, kwargs)))
        if any(isinstance(t, _Dev) for t in flat) and any(
            not isinstance(t, _Dev) and t.ndim > 0 for t in flat
        ):
            raise RuntimeError(f"{getattr(func, '__name__', func)}: device tensors mixed with host tensors")
        if func is torch.Tensor.to and _target(args, kwargs) == FAKE:
            kwargs = {**kwargs, "device": "cpu"}
            args = tuple(
                a for a in args if not (isinstance(a, (str, torch.device)) and torch.device(a) == FAKE)
            )
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if host:  # on a real device .cpu() copies; here it may return the same object
            return out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out
        return _wrap(out)


class _Accelerator(TorchFunctionMode):
    """Tensors made (or moved) with ``device=FAKE`` are made on the host, as device tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _target(args, kwargs) == FAKE and not any(isinstance(t, _Dev) for t in _tensors(args)):
            kwargs = {**kwargs, "device": "cpu"}
            args = tuple(
                a for a in args if not (isinstance(a, (str, torch.device)) and torch.device(a) == FAKE)
            )
            return _wrap(func(*args, **kwargs))
        return func(*args, **kwargs)


class _DevOperator:
    """A TokenOperator whose products run on the 'device': inputs must be device tensors."""

    def __init__(self, op):
        self.real, self.X = op, _wrap(op.X)

    @property
    def passes(self):
        return self.real.passes

    def matmul(self, V):
        if not isinstance(V, _Dev):
            raise RuntimeError("TokenOperator.matmul got a host tensor; the operator is on the device")
        return _wrap(self.real.matmul(V.as_subclass(torch.Tensor)))


@pytest.fixture
def on_device(monkeypatch):
    for name in ("token_jacobians", "context_jacobians"):
        real = getattr(jac, name)
        monkeypatch.setattr(jac, name, lambda *a, _real=real, **k: _wrap(_real(*a, **k)))
    real_operator = compute_module.LayerWork.operator
    monkeypatch.setattr(
        compute_module.LayerWork, "operator", lambda self, p, l: _DevOperator(real_operator(self, p, l))
    )
    real_topk = compute_module.operator_topk

    def operator_topk(op, *args, **kwargs):
        res = real_topk(op.real, *args, **kwargs)
        res.svd = _wrap(res.svd)
        return res

    monkeypatch.setattr(compute_module, "operator_topk", operator_topk)
    with _Accelerator():
        yield


CASES = {
    "exact": dict(tokens="all", k=(2, 4), context="last", tiles=2),
    "randomized": dict(tokens=[0, -1], k=3, method="randomized", block=2, steps=6),
    "matrix_free": dict(tokens="all", k=(2, 4), method="matrix_free", tiles=2, depth_window=1),
}


PROMPTS = {"a": torch.tensor([[3, 17, 42, 8, 11]])}


@pytest.fixture(scope="module")
def references():
    """Each case measured plainly, on the host (module scope: made before the emulation starts)."""
    model = tiny_model("llama")
    return {case: measure(model, PROMPTS, **kw).tables for case, kw in CASES.items()}


@pytest.mark.parametrize("case", CASES)
def test_measure_moves_every_device_tensor_to_the_host_explicitly(case, references, on_device):
    with pytest.raises(RuntimeError, match="can't convert a device tensor"):  # the emulation bites
        _wrap(torch.ones(2)).numpy()
    with pytest.raises(RuntimeError, match="mixed with host tensors"):
        _wrap(torch.ones(2)) + torch.ones(2)
    assert isinstance(torch.zeros(2, device=_wrap(torch.ones(1)).device), _Dev)
    got = measure(tiny_model("llama"), PROMPTS, **CASES[case]).tables
    for name in TABLES:
        if name != "timings":
            pd.testing.assert_frame_equal(got[name], references[case][name], check_exact=True)
