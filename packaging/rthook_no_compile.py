"""PyInstaller runtime hook: turn ``torch.compile`` into a no-op inside the bundle.

The engine never calls ``torch.compile``, but a library might. TorchInductor needs a C compiler,
which machines running the bundle usually lack; with ``TORCH_COMPILE_DISABLE=1`` torch runs the
function uncompiled instead. Runs before any bundled module is imported; a value set by the user
wins.

That variable is not enough on its own: ``torch.compile`` imports TorchDynamo (and through it sympy) before it
looks at it, and the bundle leaves those out. llguidance's torch helpers, which grammar-constrained output uses,
apply ``@torch.compile`` when they are imported. So while the variable is set, ``torch.compile`` is replaced, as
soon as torch has defined it, by a function that returns the model (or a decorator returning the function)
unchanged: what ``torch.compile(..., disable=True)`` does, without the imports.
"""

import importlib.abc
import os
import sys

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")


def _uncompiled(model=None, **_options):
    """``torch.compile`` with compilation disabled: the model itself, or an identity decorator."""
    if model is None:
        return lambda function: function
    return model


class _UncompiledTorch(importlib.abc.MetaPathFinder):
    """Consulted on every import, finds nothing; meanwhile puts :func:`_uncompiled` in place of ``torch.compile``
    once torch has defined it (torch's own definition may come after the first check, so it checks each time)."""

    def find_spec(self, fullname, path=None, target=None):
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and getattr(torch, "compile", _uncompiled) is not _uncompiled
            and os.environ.get("TORCH_COMPILE_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
        ):
            torch.compile = _uncompiled


sys.meta_path.insert(0, _UncompiledTorch())
