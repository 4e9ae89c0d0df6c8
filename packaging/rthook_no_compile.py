"""PyInstaller runtime hook: turn ``torch.compile`` into a no-op inside the bundle.

The engine never calls ``torch.compile``, but a library might. TorchInductor needs a C compiler,
which machines running the bundle usually lack; with ``TORCH_COMPILE_DISABLE=1`` torch runs the
function uncompiled instead. Runs before any bundled module is imported; a value set by the user
wins.
"""

import os

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
