"""A Hugging Face hub on 127.0.0.1 for the tests: the routes and headers ``huggingface_hub`` reads.

- ``GET /api/models?search=...``: the search (``HfApi.list_models``).
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: ``model_info`` (id, sha, gated, config).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]``: ``list_repo_tree`` (sizes, git oids, LFS sha256s).
- ``HEAD|GET /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit`` and ``ETag``; an LFS file answers 302 to the
  "CDN" (the same server as ``localhost``, another host to ``huggingface_hub``, as the real CDN is) with
  ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``. Errors carry the hub's ``X-Error-Code``: a missing
  repository or file is a 404, a gated repository a 401.
- ``HEAD|GET /cdn/{sha256}``: the bytes, with ``Range`` requests answered 206.

Test knobs: ``corrupt`` (sha256s served with one byte flipped), ``drop_once`` (sha256s whose first GET stops
before its last MiB and drops the connection), and ``requests`` (method, path, Range header) of everything asked.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHUNK = 1 << 20


@dataclass
class HubFile:
    path: str
    data: bytes
    lfs: bool

    sha256: str = ""
    git_oid: str = ""

    def __post_init__(self) -> None:
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.git_oid = hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    gguf: dict[str, Any] | None = None
    gated: bool = False
    downloads: int = 0

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.repo_id.encode()).hexdigest()

    def add(self, path: str, data: bytes) -> None:
        lfs = path.endswith((".gguf", ".safetensors", ".bin"))
        self.files[path] = HubFile(path, data, lfs)


class FakeHub:
    """The repositories, the knobs and the request log; :meth:`app` is the ASGI application."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.corrupt: set[str] = set()
        self.drop_once: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self.port = 0
        self._lock = threading.Lock()

    def repo(self, repo_id: str, **kwargs: Any) -> HubRepo:
        self.repos[repo_id] = HubRepo(repo_id, **kwargs)
        return self.repos[repo_id]

    def blob(self, sha: str) -> HubFile | None:
        return next((f for r in self.repos.values() for f in r.files.values() if f.sha256 == sha), None)

    def ranges_seen(self, path_part: str) -> list[str | None]:
        return [rng for method, path, rng in self.requests if method == "GET" and path_part in path]

    # -- routes -------------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/api/models", self.search),
            Route("/api/models/{owner}/{name}", self.info),
            Route("/api/models/{owner}/{name}/revision/{rev}", self.info),
            Route("/api/models/{owner}/{name}/tree/{rev}", self.tree),
            Route("/api/models/{owner}/{name}/tree/{rev}/{path:path}", self.tree),
            Route("/{owner}/{name}/resolve/{rev}/{path:path}", self.resolve, methods=["GET", "HEAD"]),
            Route("/cdn/{sha}", self.cdn, methods=["GET", "HEAD"]),
        ])

    def _log(self, request: Request) -> None:
        with self._lock:
            self.requests.append((request.method, request.url.path, request.headers.get("range")))

    def _repo(self, request: Request) -> HubRepo | None:
        return self.repos.get(f"{request.path_params['owner']}/{request.path_params['name']}")

    @staticmethod
    def _error(status: int, code: str, message: str, **headers: str) -> Response:
        return JSONResponse({"error": message}, status,
                            headers={"X-Error-Code": code, "X-Error-Message": message, **headers})

    async def search(self, request: Request) -> Response:
        self._log(request)
        words = request.query_params.get("search", "").lower()
        limit = int(request.query_params.get("limit", "1000"))
        hits = sorted((r for r in self.repos.values() if words in r.repo_id.lower()), key=lambda r: -r.downloads)
        return JSONResponse([self._summary(r) for r in hits[:limit]])

    def _summary(self, repo: HubRepo) -> dict[str, Any]:
        return {"id": repo.repo_id, "_id": repo.sha[:24], "modelId": repo.repo_id, "downloads": repo.downloads,
                "likes": 1, "gated": "manual" if repo.gated else False, "private": False,
                "tags": ["gguf"] if any(p.endswith(".gguf") for p in repo.files) else ["safetensors"],
                "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"}

    async def info(self, request: Request) -> Response:
        self._log(request)
        repo = self._repo(request)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        body = {**self._summary(repo), "sha": repo.sha, "siblings": [{"rfilename": p} for p in repo.files]}
        if repo.config is not None:
            body["config"] = repo.config
        if repo.gguf is not None:
            body["gguf"] = repo.gguf
        return JSONResponse(body)

    async def tree(self, request: Request) -> Response:
        self._log(request)
        repo = self._repo(request)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        prefix = request.path_params.get("path", "")
        recursive = request.query_params.get("recursive") in ("true", "True", "1")
        items: list[dict[str, Any]] = []
        folders: set[str] = set()
        for f in sorted(repo.files.values(), key=lambda f: f.path):
            if prefix and not f.path.startswith(prefix.rstrip("/") + "/"):
                continue
            rel = f.path[len(prefix.rstrip("/")) + 1:] if prefix else f.path
            if "/" in rel and not recursive:
                folders.add((prefix.rstrip("/") + "/" if prefix else "") + rel.split("/")[0])
                continue
            parts = f.path.split("/")[:-1]
            folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
            item: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": len(f.data), "path": f.path}
            if f.lfs:
                item["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            items.append(item)
        items += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(folders)]
        return JSONResponse(items)

    async def resolve(self, request: Request) -> Response:
        self._log(request)
        repo = self._repo(request)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if repo.gated and "authorization" not in request.headers:
            return self._error(401, "GatedRepo", "Access to this model is restricted. You must have access to it "
                               "and be authenticated to access it. Please log in.")
        f = repo.files.get(request.path_params["path"])
        commit = {"X-Repo-Commit": repo.sha}
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found", **commit)
        if f.lfs:
            return Response(status_code=302, headers={
                **commit, "Location": f"http://localhost:{self.port}/cdn/{f.sha256}", "ETag": f'"{f.git_oid}"',
                "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(len(f.data)), "Content-Length": "0"})
        headers = {**commit, "ETag": f'"{f.git_oid}"', "Content-Length": str(len(f.data))}
        return Response(b"" if request.method == "HEAD" else f.data, headers=headers)

    async def cdn(self, request: Request) -> Response:
        self._log(request)
        f = self.blob(request.path_params["sha"])
        if f is None:
            return Response(status_code=404)
        data = f.data
        if f.sha256 in self.corrupt:
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        start, end = 0, len(data) - 1
        rng = request.headers.get("range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end = int(first or 0), int(last) if last else len(data) - 1
        headers = {"Content-Length": str(end - start + 1), "Accept-Ranges": "bytes", "ETag": f'"{f.sha256}"'}
        status = 200
        if rng:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        drop = f.sha256 in self.drop_once
        self.drop_once.discard(f.sha256)
        body = data[start: end + 1]

        async def stream() -> AsyncIterator[bytes]:
            for i in range(0, len(body), CHUNK):
                if drop and i + CHUNK >= len(body):
                    raise ConnectionResetError("the test hub drops this connection before the end")
                yield body[i: i + CHUNK]

        return StreamingResponse(stream(), status, headers=headers)


class HubThread:
    """Runs a :class:`FakeHub` with uvicorn on a thread; ``endpoint`` is its URL."""

    def __init__(self, hub: FakeHub) -> None:
        self.hub = hub
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        hub.port = self.sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{hub.port}"
        config = uvicorn.Config(hub.app(), log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def file_bytes(path: Path) -> bytes:
    return Path(path).read_bytes()
