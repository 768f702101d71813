"""The model's attention switched meanwhile: token-diagonal for a sweep, one token against a
cache, or the model's own eager attention (the oracle).

Which way a model is switched is a fact of its row in the architecture table
(``architectures.py``: ``attention``, the ``AttentionInterface`` name or an adapter of
``adapters.py``); this module applies it, and restores the model after.
"""

from __future__ import annotations

import contextlib
import types
import weakref

from coupling_utils.engine.adapters import ATTENTION_ADAPTERS
from coupling_utils.engine.architectures import UnsupportedArchitectureError, find_architecture, unwrap_model
from coupling_utils.engine.attention import ONE_TOKEN, TOKEN_DIAGONAL, registered

__all__ = ["attention_mode"]


_CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its configs


def _configs(model) -> list:
    """Every config object reachable from the model's modules (and their sub-configs), once.

    Found once per model and kept while the model lives (a walk of every module on each block
    call cost a twentieth of a training-checkpoint chapter on small models); found again if the
    model's own config is no longer among them (a config replaced after loading)."""
    known = _CONFIGS.get(model)
    if known is not None and any(c is getattr(model, "config", None) for c in known):
        return known
    found, seen, stack = [], set(), [m.config for m in model.modules() if hasattr(m, "config")]
    while stack:
        c = stack.pop()
        if id(c) in seen or not hasattr(c, "_attn_implementation_internal"):
            continue
        seen.add(id(c))
        found.append(c)
        for key in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, key, None)
            if sub is not None:
                stack.append(sub)
    _CONFIGS[model] = found
    return found


@contextlib.contextmanager
def attention_mode(model, *, token_diagonal: bool, one_token: bool = False):
    """Route the model's attention through the token-diagonal function (or plain eager) meanwhile.

    ``token_diagonal=False`` selects the model's own eager attention (the ordinary block, the
    oracle); adapter architectures then keep their implementation unchanged. ``one_token``
    (with ``token_diagonal=False``) selects ``attention.one_token_attention`` for one query
    against a cache where the model calls ``AttentionInterface`` (the others keep their own).
    The original implementation (and any patched method) is always restored on exit.
    """
    model = unwrap_model(model)
    row = find_architecture(model)
    if row.attention == "interface":
        target = TOKEN_DIAGONAL if token_diagonal else ONE_TOKEN if one_token else "eager"
        registered()
        saved = [(c, c._attn_implementation_internal) for c in _configs(model)]
        try:
            for c, _ in saved:
                c._attn_implementation_internal = target
            yield
        finally:
            for c, value in saved:
                c._attn_implementation_internal = value
        return
    if not token_diagonal:
        yield
        return
    class_name, methods = ATTENTION_ADAPTERS[row.attention]
    patched = []
    try:
        for module in model.modules():
            if any(cls.__name__ == class_name for cls in type(module).__mro__):
                for method, fn in methods.items():
                    had = method in module.__dict__
                    patched.append((module, method, module.__dict__.get(method), had))
                    setattr(module, method, types.MethodType(fn, module))
        if not patched:
            raise UnsupportedArchitectureError(f"{row.name}: no {class_name} modules found to adapt")
        yield
    finally:
        for module, method, old, had in reversed(patched):
            if had:
                setattr(module, method, old)
            else:
                delattr(module, method)
