"""Models from the Hugging Face hub: search, a repository's files with their fit on this machine, downloads.

Everything goes through ``huggingface_hub`` (its endpoint setting, ``HF_ENDPOINT``, is honoured), and no Qt is
imported. ``python -m engine.hub search|files|download`` is the command line (:mod:`engine.hub.cli`).
"""

from engine.hub.download import Progress, download_all, download_entry, download_file
from engine.hub.errors import DownloadCancelled, HubError
from engine.hub.files import FileEntry, RepoFiles, list_files
from engine.hub.fit import Fit
from engine.hub.search import RepoHit, search

__all__ = [
    "DownloadCancelled", "FileEntry", "Fit", "HubError", "Progress", "RepoFiles", "RepoHit", "download_all",
    "download_entry", "download_file", "list_files", "search",
]
