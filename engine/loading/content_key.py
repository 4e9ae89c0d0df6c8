"""A file's content key: what caches of work done on a model file are named by, so that a copy of the file (the same
GGUF under LM Studio's and Ollama's folders) finds the work already done, and an edit in place does not.

The key is the sha256 of the file's size, its first :data:`HEAD_BYTES` (a GGUF's header: its metadata and tensor
table) and :data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` spread evenly over the rest, the last block included. It
reads well under a megabyte whatever the file's size, and two different model files agree on all of it only if
they differ nowhere that the header and the samples see: a re-quantized or re-exported file changes its header's
sizes or its tensor bytes everywhere.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HEAD_BYTES = 256 * 1024
SAMPLE_BYTES = 16 * 1024
SAMPLES = 16
_VERSION = b"hearth-content-key-1"


def content_key(path: Path) -> str:
    """The hex content key of the file at ``path`` (see the module docstring). Raises OSError if it cannot be read."""
    digest = hashlib.sha256(_VERSION)
    with Path(path).open("rb") as fh:
        size = fh.seek(0, 2)
        digest.update(f"\0{size}\0".encode())
        fh.seek(0)
        digest.update(fh.read(HEAD_BYTES))
        span = max(size - HEAD_BYTES - SAMPLE_BYTES, 0)  # where a sample may start, past the head
        if size > HEAD_BYTES:
            for i in range(SAMPLES):
                fh.seek(HEAD_BYTES + span * i // (SAMPLES - 1))
                digest.update(fh.read(SAMPLE_BYTES))
    return digest.hexdigest()
