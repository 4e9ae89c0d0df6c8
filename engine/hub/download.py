"""Downloading one file from the hub: progress, cancel, resume after a restart, and the hub's sha256 checked.

The bytes move through ``huggingface_hub``: :func:`get_hf_file_metadata` gives the commit, the ETag (for an LFS
file, its sha256), the size and where the bytes are; :func:`http_get` streams them, retries a dropped connection
with a ``Range`` request, and resumes from ``resume_size``. ``hf_hub_download`` itself is not used because it
writes to a temporary name unique to each call and deletes it on failure, so it cannot resume after a restart.
Here the partial file has a fixed name (``blobs/<etag>.incomplete`` in the cache, ``<file>.incomplete`` in a
folder), so a cancelled, killed or failed download continues where it stopped.

Files land in the standard HF cache layout (``models--owner--name/blobs``, ``snapshots/<commit>/<file>`` as a
link to the blob, ``refs/<revision>``), where other tools and :mod:`engine.loading.discovery` find them, or in a
folder the caller names.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Self, cast
from urllib.parse import urlsplit

from filelock import FileLock
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import build_hf_headers

from engine.hub.errors import DownloadCancelled, HubError, hub_errors, unreachable
from engine.hub.files import SPLIT_PART, FileEntry

__all__ = ["Progress", "ProgressFn", "download_all", "download_entry", "download_file", "partial_path"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HASH_CHUNK = 4 * 1024 * 1024
_REPORT_EVERY_S = 0.1


@dataclass(slots=True, frozen=True)
class Progress:
    """Where a download stands: ``stage`` is "download", "verify" or "done"."""

    filename: str
    stage: str
    done_bytes: int
    total_bytes: int | None
    speed_bps: float
    eta_s: float | None


ProgressFn = Callable[[Progress], None]


class _Meter:
    """The progress bar ``http_get`` drives (any class taking tqdm's keywords will do): bytes, speed and ETA
    to the callback at most every :data:`_REPORT_EVERY_S`, and the cancel check on every chunk."""

    def __init__(self, filename: str, on_progress: ProgressFn | None, cancel: threading.Event | None,
                 total: int | None = None, initial: int = 0, **_: Any) -> None:
        self.filename, self.on_progress, self.cancel = filename, on_progress, cancel
        self.total, self.done = total, initial
        self.started, self.start_bytes, self.last = time.monotonic(), initial, 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None

    def update(self, n: float = 1) -> None:
        self.done += int(n)
        if self.cancel is not None and self.cancel.is_set():
            raise DownloadCancelled(f"Download of {self.filename} cancelled; it resumes from here next time.")
        now = time.monotonic()
        if self.on_progress is not None and (now - self.last >= _REPORT_EVERY_S or self.done == self.total):
            self.last = now
            elapsed = max(now - self.started, 1e-6)
            speed = (self.done - self.start_bytes) / elapsed
            eta = (self.total - self.done) / speed if self.total is not None and speed > 0 else None
            self.on_progress(Progress(self.filename, "download", self.done, self.total, speed, eta))


def partial_path(repo_id: str, etag: str, filename: str, dest: Path | None, cache_dir: Path | None) -> Path:
    """Where the unfinished bytes of a file are kept between calls."""
    if dest is not None:
        final = Path(dest) / filename
        return final.with_name(final.name + ".incomplete")
    storage = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    return storage / "blobs" / f"{etag}.incomplete"


def download_file(
    repo_id: str, filename: str, *, dest: Path | None = None, cache_dir: Path | None = None,
    revision: str | None = None, endpoint: str | None = None, token: str | bool | None = None,
    on_progress: ProgressFn | None = None, cancel: threading.Event | None = None,
    expected_sha256: str | None = None,
) -> Path:
    """Download ``filename`` of ``repo_id`` and return its local path.

    Args:
        dest: A folder to put the file in (at its path inside the repository); None means the HF cache.
        cache_dir: The HF cache to use when ``dest`` is None; None means huggingface_hub's (``HF_HUB_CACHE``).
        on_progress: Called with a :class:`Progress` while downloading, verifying, and when done.
        cancel: Set it to stop; :class:`DownloadCancelled` is raised and the partial file kept for a resume.
        expected_sha256: The sha256 to check; None means the hub's LFS hash (the ETag of an LFS file).

    Raises:
        HubError: No network, no such repository or file, a gated repository, a full disk, or a file whose
            sha256 differs from the hub's (then it is removed). :class:`DownloadCancelled` when cancelled.
    """
    if constants.is_offline_mode():
        raise unreachable("offline mode is on (HF_HUB_OFFLINE)")
    rev = revision or constants.DEFAULT_REVISION
    url = hf_hub_url(repo_id, filename, revision=rev, endpoint=endpoint)
    with hub_errors(repo_id, filename, endpoint):
        meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    if not meta.commit_hash or not meta.etag:
        raise HubError(f"{url} did not answer as a Hugging Face hub does (no commit or ETag header).")
    etag, commit, size = meta.etag, meta.commit_hash, meta.size
    sha = expected_sha256 or (etag if _SHA256.match(etag) else None)
    partial = partial_path(repo_id, etag, filename, dest, cache_dir)
    final = (Path(dest) / filename) if dest is not None else (partial.parent.parent / "snapshots" / commit / filename)
    partial.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(partial) + ".lock"):
        if not final.exists() or (size is not None and final.stat().st_size != size):  # absent, or not this file
            _fetch(repo_id, filename, url, meta.location, partial, size, token, endpoint, on_progress, cancel)
            _verify(repo_id, filename, partial, sha, on_progress)
            _place(partial, final, dest is None, etag)
        if dest is None and not _COMMIT.match(rev):
            refs = partial.parent.parent / "refs" / rev
            refs.parent.mkdir(parents=True, exist_ok=True)
            refs.write_text(commit)
    if on_progress is not None:
        done = final.stat().st_size
        on_progress(Progress(filename, "done", done, done, 0.0, 0.0))
    return final


def download_entry(repo_id: str, entry: FileEntry, **kwargs: Any) -> list[Path]:
    """Download every file of one entry of :func:`engine.hub.files.list_files` (all parts of a split GGUF, a
    whole safetensors folder), each checked against the sha256 the listing gave; ``kwargs`` as
    :func:`download_file`. Returns the local paths, in the entry's order."""
    return [download_file(repo_id, name, expected_sha256=entry.sha256.get(name), **kwargs) for name in entry.files]


def download_all(repo_id: str, filename: str, **kwargs: Any) -> list[Path]:
    """:func:`download_file`, except that any part of a split GGUF brings every part (their names are regular)."""
    split = SPLIT_PART.search(filename)
    if split is None:
        return [download_file(repo_id, filename, **kwargs)]
    count, stem = int(split.group(2)), filename[: split.start()]
    return [download_file(repo_id, f"{stem}-{i:05d}-of-{count:05d}.gguf", **kwargs) for i in range(1, count + 1)]


def _fetch(repo_id: str, filename: str, url: str, location: str, partial: Path, size: int | None,
           token: str | bool | None, endpoint: str | None, on_progress: ProgressFn | None,
           cancel: threading.Event | None) -> None:
    """Stream the missing bytes into ``partial``, from where it ends."""
    resume = partial.stat().st_size if partial.exists() else 0
    if size is not None and resume > size:  # not this file's bytes: start again
        partial.unlink()
        resume = 0
    missing = (size or 0) - resume
    free = shutil.disk_usage(partial.parent).free
    if missing > free:
        raise HubError(f"The disk is full: {filename} needs {missing / 2**30:.2f} GiB more but {partial.parent} "
                       f"has {free / 2**30:.2f} GiB free. Free some space or choose another folder.")
    headers = build_hf_headers(token=token)
    if urlsplit(location).netloc != urlsplit(url).netloc:  # a CDN: the token stays with the hub
        headers.pop("authorization", None)

    def meter(**kwargs: Any) -> _Meter:
        return _Meter(filename, on_progress, cancel, **kwargs)

    with hub_errors(repo_id, filename, endpoint), _open_partial(partial) as out:
        http_get(location, out, resume_size=resume, headers=headers, expected_size=size,
                 displayed_filename=filename, tqdm_class=cast(Any, meter))


def _open_partial(path: Path) -> BinaryIO:
    """The partial file, opened to append: a resume continues it."""
    return path.open("ab")


def _verify(repo_id: str, filename: str, partial: Path, sha: str | None, on_progress: ProgressFn | None) -> None:
    """Check the sha256 of the finished bytes; a mismatch removes them and says so."""
    if sha is None:  # a small file kept in git: its ETag is a git hash, and http_get checked its size
        return
    digest = hashlib.sha256()
    total, done = partial.stat().st_size, 0
    with partial.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if on_progress is not None:
                on_progress(Progress(filename, "verify", done, total, 0.0, None))
    if digest.hexdigest() != sha:
        partial.unlink(missing_ok=True)
        raise HubError(f"{filename} from {repo_id} arrived damaged: its sha256 is {digest.hexdigest()} but the hub "
                       f"says {sha}. The file was removed; download it again.")


def _place(partial: Path, final: Path, in_cache: bool, etag: str) -> None:
    """Move the verified bytes to their place: the cache's blob and a relative link in the snapshot, or ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if not in_cache:
        os.replace(partial, final)
        return
    blob = partial.with_name(etag)
    os.replace(partial, blob)
    try:
        final.unlink(missing_ok=True)
        os.symlink(os.path.relpath(blob, final.parent), final)
    except OSError:  # no symlinks here (Windows without developer mode): the snapshot holds the file itself
        os.replace(blob, final)
