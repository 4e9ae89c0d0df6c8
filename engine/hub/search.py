"""Finding models on the hub: by keyword, by ``owner/name``, or by a pasted hub URL.

A query that names one repository (``owner/name`` or a URL of its page or of one of its files) is looked up
with ``model_info``, so an exact name is found even when a keyword search would rank it low; anything else is a
keyword search (``list_models``), most downloaded first.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from huggingface_hub import HfApi, constants
from huggingface_hub.utils import build_hf_headers, get_session

from engine.hub.errors import HubError, hub_errors, unreachable

__all__ = ["RepoHit", "parse_query", "search"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_URL_HOSTS = ("huggingface.co", "hf.co", "www.huggingface.co")


@dataclass(slots=True, frozen=True)
class RepoHit:
    """One repository a search found."""

    repo_id: str
    downloads: int | None = None
    likes: int | None = None
    gated: bool = False
    tags: tuple[str, ...] = ()
    last_modified: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_query(query: str, endpoint: str | None = None) -> tuple[str, str]:
    """``("repo", "owner/name")`` when ``query`` names one repository, else ``("keyword", words)``.

    A URL counts when it is on huggingface.co, hf.co or ``endpoint``: ``https://huggingface.co/owner/name``,
    ``.../tree/main``, ``.../blob/main/file.gguf`` and ``.../resolve/main/file.gguf`` all name ``owner/name``.
    """
    text = query.strip()
    if not text:
        raise HubError("Type a model name, owner/name, or paste a Hugging Face link.")
    if "://" in text or text.startswith(_URL_HOSTS):
        parts = urlsplit(text if "://" in text else "https://" + text)
        hosts = set(_URL_HOSTS) | ({urlsplit(endpoint).netloc} if endpoint else set())
        if parts.netloc not in hosts:
            raise HubError(f"{text} is not a Hugging Face link.")
        segments = [s for s in parts.path.split("/") if s]
        if segments and segments[0] in ("models", "api"):
            segments = segments[1:]
        if len(segments) < 2:
            raise HubError(f"{text} does not name a model (expected huggingface.co/owner/name).")
        return "repo", f"{segments[0]}/{segments[1]}"
    if _REPO_ID.match(text):
        return "repo", text
    return "keyword", text


def search(query: str, limit: int = 20, endpoint: str | None = None, token: str | bool | None = None,
           library: str | None = None) -> list[RepoHit]:
    """The repositories ``query`` finds: the one it names, or up to ``limit`` keyword matches.

    ``library`` ("gguf", "safetensors", ...) keeps keyword matches to repositories with that tag (the hub's
    ``filter``); a repository named outright is shown whatever it holds.

    Raises:
        HubError: The hub cannot be reached, or it refused (the message says why).
    """
    kind, value = parse_query(query, endpoint)
    if constants.is_offline_mode():
        raise unreachable("offline mode is on (HF_HUB_OFFLINE)")
    api = HfApi(endpoint=endpoint, token=token)
    if kind == "repo":
        with hub_errors(value, endpoint=endpoint):
            info = api.model_info(value)
        return [_hit(info)]
    with hub_errors(endpoint=endpoint):
        # list_models retries a refused connection for about 20 s; one plain request says "offline" at once
        get_session().get(f"{api.endpoint}/api/models", params={"limit": "1"}, headers=build_hf_headers(token=token))
        found = api.list_models(search=value, sort="downloads", limit=limit, filter=library)
        hits = [_hit(info) for info in found]
    return [h for h in hits if library in h.tags] if library else hits


def _hit(info: Any) -> RepoHit:
    modified = info.last_modified.isoformat() if info.last_modified else None
    return RepoHit(info.id, info.downloads, info.likes, bool(info.gated), tuple(info.tags or ()), modified)
