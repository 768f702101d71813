"""An emulated accelerator for tests: tensors that say they live on a GPU and fail where CUDA would.

A CPU-only machine cannot run the project's GPU path, but most GPU bugs are device bugs that a
CPU never shows: ``.numpy()`` on a device tensor, or an operation mixing a device tensor with a
CPU tensor (``torch.randn(n) * J`` with ``J`` on the GPU). This module makes them show on a CPU.

- The ``privateuse1`` backend is renamed ``emulated`` (:data:`DEVICE` = ``emulated:0``) and given a
  small device module, so ``torch.device("emulated")``, ``model.to(DEVICE)`` and
  ``torch.zeros(..., device=DEVICE)`` are legal.
- :class:`EmulatedTensor` is a wrapper subclass whose ``.device`` is ``emulated:0``; its values
  live in a CPU tensor (``.elem``). ``.numpy()`` and ``np.asarray`` on it fail exactly as on CUDA
  (PyTorch refuses any non-CPU tensor); ``.item()``, ``float()``, ``.tolist()``, ``.cpu()`` and
  ``.to("cpu")`` work, as on CUDA.
- :func:`emulated_device` is a ``TorchDispatchMode`` that runs every ATen operation on the CPU
  values and re-wraps the results, after applying CUDA's device rules (what CUDA refuses):
  an emulated tensor and a CPU tensor of dim > 0 in one operation (CPU 0-dim tensors are allowed,
  as CUDA allows CPU scalars); copies (``copy_``, ``.to``) cross devices freely; indexing an
  emulated tensor with CPU index tensors is allowed (CUDA moves the indices); a random factory on
  the emulated device with a CPU ``torch.Generator`` fails ("Expected a 'cuda' device type for
  generator"). A violation raises :class:`DeviceMismatch` (a RuntimeError, as CUDA raises).

Usage::

    with emulated_device():
        lm = load_model(path, device=DEVICE)       # parameters become EmulatedTensors
        J = token_jacobians(lm, ids, 0)            # any device bug raises here
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = [
    "DEVICE",
    "EmulatedTensor",
    "DeviceMismatch",
    "emulated_device",
    "on_device",
    "ops_seen",
    "host_allocations",
]

NAME = "emulated"


def _install_backend() -> torch.device:
    """Register privateuse1 as the ``emulated`` backend, once per process.

    Uses PyTorch's (experimental, private) helper for Python-implemented backends, which also
    registers a device guard (``float(t)`` needs one) and a hooks object.
    """
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    if torch._C._get_privateuse1_backend_name() != NAME:
        mod = types.ModuleType(f"torch.{NAME}")
        mod.is_available = lambda: True
        mod.is_initialized = lambda: True
        mod._lazy_init = lambda: None
        mod.device_count = lambda: 1
        mod.current_device = lambda: 0
        mod._is_in_bad_fork = lambda: False
        mod.manual_seed_all = lambda seed: None
        mod.manual_seed = lambda seed: None
        mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
        mod.is_bf16_supported = lambda *a, **k: True
        _setup_privateuseone_for_python_backend(NAME, backend_module=mod)
    return torch.device(NAME, 0)


DEVICE = _install_backend()


class DeviceMismatch(RuntimeError):
    """An operation the emulated accelerator refuses, as CUDA would."""


class EmulatedTensor(torch.Tensor):
    """A tensor reporting ``device = emulated:0`` whose values are the CPU tensor ``elem``."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool | None = None):
        if isinstance(elem, EmulatedTensor) or elem.device.type != "cpu":
            raise TypeError(
                f"EmulatedTensor wraps a plain CPU tensor, got {type(elem).__name__} on {elem.device}"
            )
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=DEVICE,
            requires_grad=elem.requires_grad if requires_grad is None else requires_grad,
        )
        out.elem = elem
        return out

    def __repr__(self, *, tensor_contents=None):  # noqa: D105 - the CPU values, labelled
        return f"EmulatedTensor({self.elem!r}, device='{DEVICE}')"

    def __deepcopy__(self, memo):
        """A copy on the same (emulated) device, as ``copy.deepcopy`` of a CUDA tensor gives (a
        key/value cache is deep-copied before each one-token block call, inside ``torch.func.vjp``).

        The copy is a dispatched ``clone`` of the wrapper, as for a CUDA tensor: inside a functorch
        transform the result is then the transform's wrapper around a new EmulatedTensor. Cloning
        ``self.elem`` here, in Python, would let the transform lift the *payload* instead, and the
        EmulatedTensor would hold a functorch wrapper that dies with the transform (issue 26).
        """
        if id(self) not in memo:
            copied = self.detach().clone()
            memo[id(self)] = copied.requires_grad_() if self.requires_grad else copied
        return memo[id(self)]

    def numpy(self, *, force: bool = False):
        raise TypeError(
            f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to "
            "host memory first."
        )

    def tolist(self):  # CUDA copies to the host
        return self.elem.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _host(t):
    return t.elem if isinstance(t, EmulatedTensor) else t


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return EmulatedTensor(torch.empty_strided(size, stride, dtype=dtype, device="cpu"))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return EmulatedTensor(torch.empty(size, dtype=dtype, device="cpu", memory_format=memory_format))


def _copy_from(self, dst, non_blocking=False):
    _host(dst).copy_(_host(self))
    return dst


# Backend kernels for the few operations that PyTorch runs below the Python dispatch key (tensors
# built from Python data: ``torch.tensor(..., device=...)``, ``x[..., [0, 1]]`` with a list index).
_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("empty_strided", _empty_strided, "PrivateUse1")
_LIB.impl("empty.memory_format", _empty, "PrivateUse1")
_LIB.impl("_copy_from", _copy_from, "PrivateUse1")

_COUNT: dict[str, int] = {}
_HOST: list[tuple[str, torch.dtype, int]] = []


def ops_seen() -> dict[str, int]:
    """How many operations on emulated tensors each ATen overload ran (since the last reset)."""
    return dict(_COUNT)


def host_allocations() -> list[tuple[str, torch.dtype, int]]:
    """(operation, dtype, numel) of every floating-point tensor an operation produced on the host
    (a plain CPU tensor) inside :func:`emulated_device`: what a GPU run would hold in host memory."""
    return list(_HOST)


def _is_emulated_device(d) -> bool:
    return d is not None and torch.device(d).type == NAME


# operations that legally move data between devices
_COPIES = {
    torch.ops.aten._to_copy.default,
    torch.ops.aten.copy_.default,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
}
# operations whose index tensors may stay on the CPU (CUDA moves them); values must not
_INDEXING = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put_.default,
    torch.ops.aten.index_put.default,
    torch.ops.aten._index_put_impl_.default,
}
_RANDOM_FACTORIES = {"randn", "rand", "randint", "normal", "randperm", "bernoulli", "multinomial"}


def _check(func, args, kwargs) -> None:
    """Raise DeviceMismatch where CUDA would refuse this operation."""
    flat, _ = tree_flatten((args, kwargs))
    emulated = [a for a in flat if isinstance(a, EmulatedTensor)]
    device_kw = kwargs.get("device")
    if _is_emulated_device(device_kw) and func.__name__.split(".")[0] in _RANDOM_FACTORIES:
        gen = kwargs.get("generator")
        if gen is not None and gen.device.type != NAME:
            raise DeviceMismatch(
                f"{func}: Expected a '{NAME}' device type for generator but found '{gen.device.type}'"
            )
    if not emulated or func in _COPIES:
        return
    if func in _INDEXING:
        # aten.index(self, indices), index_put(self, indices, values, ...): indices may be CPU
        plain = [args[0], *args[2:3]]
    else:
        plain = flat
    for a in plain:
        plain_cpu = (
            isinstance(a, torch.Tensor) and not isinstance(a, EmulatedTensor) and a.device.type == "cpu"
        )
        if plain_cpu and a.dim() > 0:
            raise DeviceMismatch(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{DEVICE} and cpu! (in {func}: a CPU tensor of shape {tuple(a.shape)} mixed with "
                f"tensors on {DEVICE})"
            )


def _unwrap(x):
    if isinstance(x, EmulatedTensor):
        return x.elem
    if isinstance(x, torch.device) and x.type == NAME:
        return torch.device("cpu")
    return x


def _wrap(x):
    if isinstance(x, torch.Tensor) and not isinstance(x, EmulatedTensor):
        return EmulatedTensor(x)
    return x


_HALF = (torch.float16, torch.bfloat16)


def _layer_norm(x, shape, weight, bias, eps):
    """CUDA's LayerNorm of a half-precision input: statistics accumulated and returned in float32
    (the CPU kernel returns them in float16, where forward-mode's ``rstd**3`` overflows)."""
    if x.dtype not in _HALF:
        return torch.ops.aten.native_layer_norm.default(x, shape, weight, bias, eps)
    f = [None if t is None else t.float() for t in (x, weight, bias)]
    out, mean, rstd = torch.ops.aten.native_layer_norm.default(f[0], shape, f[1], f[2], eps)
    return out.to(x.dtype), mean, rstd


def _layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask):
    """The backward of :func:`_layer_norm` (float32 statistics with a half-precision input)."""
    if x.dtype not in _HALF:
        return torch.ops.aten.native_layer_norm_backward.default(
            grad, x, shape, mean, rstd, weight, bias, mask
        )
    f = [None if t is None else t.float() for t in (grad, x, weight, bias)]
    grads = torch.ops.aten.native_layer_norm_backward.default(
        f[0], f[1], shape, mean.float(), rstd.float(), f[2], f[3], mask
    )
    dtypes = (x.dtype, None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    return tuple(None if g is None else g.to(dt) for g, dt in zip(grads, dtypes))


_HALF_LAYER_NORM = {
    torch.ops.aten.native_layer_norm.default: _layer_norm,
    torch.ops.aten.native_layer_norm_backward.default: _layer_norm_backward,
}


def _run(func, args, kwargs):
    _check(func, args, kwargs)
    flat, _ = tree_flatten((args, kwargs))
    any_emulated = any(isinstance(a, EmulatedTensor) for a in flat)
    device_kw = kwargs.get("device")
    if any_emulated:
        _COUNT[str(func)] = _COUNT.get(str(func), 0) + 1
    if func is torch.ops.aten.copy_.default:  # dst.copy_(src): dst keeps its device
        dst, src = args[0], args[1]
        _unwrap(dst).copy_(_unwrap(src), *args[2:], **kwargs)
        return dst
    uargs = tree_map(_unwrap, args)
    ukwargs = tree_map(_unwrap, kwargs)
    if "device" in ukwargs and isinstance(ukwargs["device"], str) and ukwargs["device"].startswith(NAME):
        ukwargs["device"] = "cpu"
    if (
        "generator" in ukwargs
        and ukwargs["generator"] is not None
        and ukwargs["generator"].device.type == NAME
    ):
        ukwargs["generator"] = None
    if func is torch.ops.aten._efficientzerotensor.default:
        # forward-mode AD's zero tangents carry no data (ZeroTensor key), which the wrapper hides
        func = torch.ops.aten.zeros.default
    out = _HALF_LAYER_NORM.get(func, func)(*uargs, **ukwargs)
    if func.__name__.split(".")[0].endswith("_") and args and isinstance(args[0], EmulatedTensor):
        return args[0]  # in-place: the values of args[0].elem changed
    if "out" in kwargs:
        return kwargs["out"]
    if func is torch.ops.aten._to_copy.default or "device" in kwargs:
        target = _is_emulated_device(device_kw) if device_kw is not None else any_emulated
    else:
        target = any_emulated
    if target:
        return tree_map(_wrap, out)
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            _HOST.append((str(func), t.dtype, t.numel()))
    return out


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def emulated_device():
    """Run the body with the emulated accelerator: factories on ``DEVICE`` and CUDA's device rules."""
    _COUNT.clear()
    _HOST.clear()
    with _Mode():
        yield DEVICE


def on_device(t) -> bool:
    """Whether ``t`` is an emulated-device tensor."""
    return isinstance(t, EmulatedTensor)
