"""The folders the Models list watches, so that a model copied in or deleted shows without a click.

They are the places a scan for models looks (``engine.loading.discovery.model_locations``: the Hugging Face cache,
LM Studio, Ollama, GPT4All, Jan and the added folders) that exist, and the folders inside them where models sit, a
few levels down (``<folder>/<owner>/<name>/`` in LM Studio's layout, ``models--ORG--NAME/snapshots/<hash>/`` in the
Hugging Face cache, Ollama's manifests), breadth first, at most :data:`MAX_WATCHED_FOLDERS` in all so that a huge
tree costs neither a long walk nor the system's watch handles. Listed in a pool thread, as the scan is.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path

#: Folders (and added files) watched at most.
MAX_WATCHED_FOLDERS = 400
#: How deep below each place its folders are watched, by the place's layout (``Location.kind``).
WATCH_DEPTHS = {"tree": 2, "hf-cache": 3, "ollama": 4}


def watched_model_folders(extra_dirs: Sequence[str], home: Path | None = None) -> list[str]:
    """The places a scan with ``extra_dirs`` added looks in, and their subfolders down to :data:`WATCH_DEPTHS`
    (hidden ones left out); an added file is watched itself. Shallow folders come first; the list stops at
    :data:`MAX_WATCHED_FOLDERS`."""
    from engine.loading.discovery import model_locations  # the engine is imported in pool threads only

    locations = model_locations(home, [Path(d) for d in extra_dirs])
    found: dict[str, None] = {}
    queue: deque[tuple[str, int, int]] = deque()
    for loc in locations:
        root = os.path.normpath(loc.root)
        if os.path.isfile(root):
            queue.append((root, 0, 0))
        elif os.path.isdir(root):
            queue.append((root, 0, WATCH_DEPTHS.get(loc.kind, 2)))
    while queue and len(found) < MAX_WATCHED_FOLDERS:
        folder, depth, max_depth = queue.popleft()
        if folder in found:
            continue
        found[folder] = None
        if depth >= max_depth:
            continue
        try:
            with os.scandir(folder) as entries:
                subfolders = sorted(e.path for e in entries if not e.name.startswith(".") and _is_dir(e))
        except OSError:
            continue
        queue.extend((path, depth + 1, max_depth) for path in subfolders)
    return list(found)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
