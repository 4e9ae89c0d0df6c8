"""Chat through a remote OpenAI-compatible server: vLLM, Ollama, LM Studio, or another Hearth.

:class:`RemoteBackend` is the bridge's alternative to the local engine. It runs one asyncio loop on a
thread of its own, with one ``httpx.AsyncClient``; every chat is a task on that loop streaming
``/v1/chat/completions``, so many conversations stream at once without tying up the bridge's pool.
It knows nothing of Qt: it reports through the callbacks in :class:`RemoteEvents`, which the bridge
points at its signals. Errors reach the user in plain words (:func:`describe_error`).

:meth:`RemoteBackend.snapshot` is what the monitor shows, as an ``engine.api.EngineMetrics``: client-side latency
and throughput, overlaid with the server's KV-cache usage, queue lengths and (from Hearth) its scheduler's figures
when it exposes Prometheus ``/metrics`` (vLLM and Hearth do). Figures a server does not report keep their
defaults (0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from app import log
from engine.api import EngineMetrics, RequestMetrics, SamplingParams

CONNECT_TIMEOUT_S = 5.0
#: Longest silence while a reply streams (a big model's first token on a busy server can take a while).
READ_TIMEOUT_S = 120.0
METRICS_INTERVAL_S = 1.0
_WINDOW_S = 10.0
_MAX_SAMPLES = 500
#: Sampling fields an OpenAI-compatible server understands; others are the local engine's own.
_OPENAI_PARAMS = ("temperature", "top_p", "max_tokens", "stop", "seed")


class RemoteError(Exception):
    """A failure with a message meant for the user."""


@dataclass(slots=True)
class RemoteEvents:
    """Where the backend reports; all are called on the backend's thread."""

    token_delta: Callable[[str, str], None]
    #: (request_id, finish_reason, metrics) with metrics as in ``RequestInfo.metrics``.
    request_finished: Callable[[str, str | None, dict[str, Any]], None]
    request_failed: Callable[[str, str], None]


def api_root(base_url: str) -> str:
    """``http://host:8000``, ``http://host:8000/`` or ``http://host:8000/v1`` -> ``http://host:8000/v1``."""
    url = base_url.strip().rstrip("/")
    if not url:
        raise RemoteError("Enter the server's address, for example http://localhost:8000/v1.")
    if "://" not in url:
        url = f"http://{url}"
    return url if url.endswith("/v1") else f"{url}/v1"


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def describe_error(exc: BaseException, url: str, timeout_s: float = READ_TIMEOUT_S) -> str:
    """One sentence for the user about a failed request to ``url``."""
    if isinstance(exc, RemoteError):
        return str(exc)
    if isinstance(exc, httpx.ConnectTimeout):
        return f"Could not connect to {url}: no answer within {CONNECT_TIMEOUT_S:.0f} s."
    if isinstance(exc, httpx.ConnectError):
        return f"Could not connect to {url}. Check the address, and that the server is running."
    if isinstance(exc, httpx.TimeoutException):
        return f"The server at {url} stopped answering (nothing for {timeout_s:.0f} s)."
    if isinstance(exc, httpx.HTTPError):
        return f"The connection to {url} failed: {exc or type(exc).__name__}."
    return f"Talking to {url} failed: {type(exc).__name__}: {exc}"


def _status_error(response: httpx.Response, url: str) -> RemoteError:
    """A RemoteError for a non-200 answer, with the server's own message when it sent one."""
    detail = ""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        body = response.json()
        error = body.get("error", body)
        detail = str(error.get("message") or "") if isinstance(error, dict) else str(error)
    detail = detail or response.text[:200].strip()
    code = response.status_code
    if code in (401, 403):
        return RemoteError(f"The server at {url} refused the API key (HTTP {code}). "
                           "Check the API key in the Model pane.")
    if code == 404:
        return RemoteError(f"The server at {url} answered 404 Not Found: {detail or 'no such model or path'}.")
    return RemoteError(f"The server at {url} answered HTTP {code}: {detail or response.reason_phrase}.")


def fetch_models(base_url: str, api_key: str = "", timeout_s: float = CONNECT_TIMEOUT_S) -> list[str]:
    """The model ids ``GET /v1/models`` lists. Blocks; raises :class:`RemoteError` in plain words."""
    root = api_root(base_url)
    try:
        response = httpx.get(f"{root}/models", headers=_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise RemoteError(describe_error(exc, root, timeout_s)) from exc
    if response.status_code != 200:
        raise _status_error(response, root)
    try:
        return [str(m["id"]) for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteError(f"{root}/models did not answer like an OpenAI-compatible server.") from exc


def sampling_body(params: Mapping[str, Any] | SamplingParams | None) -> dict[str, Any]:
    """The OpenAI request fields for the chat pane's sampling settings (a dict or a ``SamplingParams``)."""
    if params is None:
        return {}
    get = params.get if isinstance(params, Mapping) else (lambda k: getattr(params, k, None))
    body = {key: get(key) for key in _OPENAI_PARAMS}
    schema = get("json_schema")
    if schema is not None:  # the chat's "Reply as JSON", in OpenAI's shape
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    elif get("response_format") == "json":
        body["response_format"] = {"type": "json_object"}
    return {k: v for k, v in body.items() if v is not None and v != []}


def prometheus_totals(text: str) -> dict[str, float]:
    """Each series of a Prometheus page summed over its labels, by name without the ``vllm:``/``hearth:`` prefix.
    Raises ``ValueError`` for a page that is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.split(":", 1)[-1]
            totals[name] = totals.get(name, 0.0) + float(sample.value)
    return totals


def parse_server_metrics(text: str, base: EngineMetrics | None = None) -> EngineMetrics:
    """``base`` (the client's own figures) overlaid with what a Prometheus page by vLLM or Hearth reports."""
    return overlay_server_metrics(base or EngineMetrics(), prometheus_totals(text))


def overlay_server_metrics(base: EngineMetrics, totals: Mapping[str, float]) -> EngineMetrics:
    """``base`` with the figures the server reports in ``totals`` (:func:`prometheus_totals`). The strings are
    Prometheus series names, the server's vocabulary: vLLM's, which Hearth's ``/metrics`` shares, and Hearth's own
    (``engine/serving/metrics.py``); a figure no series reports keeps ``base``'s value."""

    def figure(default: float, *names: str) -> float:
        return next((totals[name] for name in names if name in totals), default)

    queries = int(figure(base.prefix_cache_queries, "prefix_cache_queries_total"))
    hits = int(figure(base.prefix_cache_hits, "prefix_cache_hits_total"))
    return replace(
        base,
        kv_cache_usage=figure(base.kv_cache_usage, "kv_cache_usage_perc", "gpu_cache_usage_perc"),
        num_running=int(figure(base.num_running, "num_requests_running")),
        num_waiting=int(figure(base.num_waiting, "num_requests_waiting")),
        num_preemptions=int(figure(base.num_preemptions, "num_preemptions_total")),
        kv_blocks_used=int(figure(base.kv_blocks_used, "kv_blocks_used")),
        kv_blocks_total=int(figure(base.kv_blocks_total, "kv_blocks_total")),
        mean_batch_size=figure(base.mean_batch_size, "mean_batch_size"),
        batch_efficiency=figure(base.batch_efficiency, "batch_efficiency"),
        concurrency_limit=int(figure(base.concurrency_limit, "concurrency_limit")),
        controller_adjustments_total=int(figure(base.controller_adjustments_total, "controller_adjustments_total")),
        spec_enabled=bool(figure(base.spec_enabled, "spec_enabled")),
        spec_acceptance_rate=figure(base.spec_acceptance_rate, "spec_acceptance_rate"),
        spec_tokens_per_step=figure(base.spec_tokens_per_step, "spec_tokens_per_step"),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hits / queries if queries else base.prefix_cache_hit_rate,
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))]


class _ClientStats:
    """Latency and throughput as this client sees them. Used on the backend's thread; read anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft: deque[float] = deque(maxlen=_MAX_SAMPLES)
        self.itl: deque[float] = deque(maxlen=_MAX_SAMPLES)
        self.e2e: deque[float] = deque(maxlen=_MAX_SAMPLES)
        self.tokens: deque[float] = deque()  # arrival times of streamed pieces
        self.finished: deque[float] = deque()
        self.num_running = 0

    def record(self, series: str, value: float) -> None:
        with self._lock:
            getattr(self, series).append(value)

    def snapshot(self) -> EngineMetrics:
        now = time.monotonic()
        with self._lock:
            for times in (self.tokens, self.finished):
                while times and times[0] < now - _WINDOW_S:
                    times.popleft()
            ttft, itl, e2e = list(self.ttft), list(self.itl), list(self.e2e)
            span = min(_WINDOW_S, now - self.tokens[0]) if self.tokens else _WINDOW_S
            return EngineMetrics(
                time=time.time(),
                num_running=self.num_running,
                throughput_tok_s=len(self.tokens) / max(span, 1e-3) if self.tokens else 0.0,
                requests_per_s=len(self.finished) / _WINDOW_S,
                ttft_p50=_percentile(ttft, 50), ttft_p90=_percentile(ttft, 90), ttft_p99=_percentile(ttft, 99),
                itl_p50=_percentile(itl, 50), itl_p99=_percentile(itl, 99),
                e2e_p50=_percentile(e2e, 50), e2e_p99=_percentile(e2e, 99),
            )


class RemoteBackend:
    """Streams chats from one model on one server.

    Args:
        base_url: the server, with or without the trailing ``/v1``.
        api_key: sent as ``Authorization: Bearer``; empty sends none.
        model: the model id to ask for (from :func:`fetch_models`).
        events: where replies and failures go.
    """

    def __init__(self, base_url: str, api_key: str, model: str, events: RemoteEvents,
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.url = api_root(base_url)
        self.model = model
        self._api_key = api_key
        self._events = events
        self._read_timeout_s = read_timeout_s
        self._stats = _ClientStats()
        #: The server's last ``/metrics`` page (:func:`prometheus_totals`).
        self._server_totals: dict[str, float] = {}
        self._loop = asyncio.new_event_loop()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._close_message = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-remote", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- any thread -------------------------------------------------------------------------------

    def submit(self, request_id: str, messages: list[dict[str, str]] | str,
               params: Mapping[str, Any] | SamplingParams | None = None) -> None:
        """Start streaming a reply; returns at once."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **sampling_body(params)}
        self._loop.call_soon_threadsafe(self._start, request_id, body)

    def cancel(self, request_id: str) -> None:
        """Stop a reply; it finishes with "abort" (closing the stream cancels it on the server too)."""
        self._loop.call_soon_threadsafe(self._cancel, request_id)

    def snapshot(self) -> EngineMetrics:
        """Client-side figures, overlaid with the server's own where it reports them."""
        return overlay_server_metrics(self._stats.snapshot(), self._server_totals)

    def close(self, message: str = "Disconnected from the server before the reply finished.") -> None:
        """Fail the replies in flight with ``message``, then stop the thread. Blocks briefly."""
        if not self._thread.is_alive():
            return
        self._close_message = message
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # -- the backend's thread ---------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        timeout = httpx.Timeout(self._read_timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = httpx.AsyncClient(base_url=self.url, headers=_headers(self._api_key), timeout=timeout)
        self._metrics_task = self._loop.create_task(self._poll_metrics())
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _shutdown(self) -> None:
        tasks = [*self._tasks.values(), self._metrics_task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    def _start(self, request_id: str, body: dict[str, Any]) -> None:
        self._tasks[request_id] = self._loop.create_task(self._stream(request_id, body))

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _stream(self, rid: str, body: dict[str, Any]) -> None:
        stats = self._stats
        started = time.monotonic()
        first: float | None = None
        last: float | None = None
        usage: dict[str, Any] = {}
        finish: str | None = None
        pieces = 0
        stats.num_running += 1
        try:
            async with self._client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise _status_error(response, self.url)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = chunk["error"]
                        raise RemoteError(f"The server failed: {error.get('message', error)}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            now = time.monotonic()
                            if first is None:
                                first = now
                                stats.record("ttft", now - started)
                            elif last is not None:
                                stats.record("itl", now - last)
                            last = now
                            pieces += 1
                            stats.record("tokens", now)
                            self._events.token_delta(rid, text)
                        finish = choice.get("finish_reason") or finish
        except asyncio.CancelledError:
            if self._close_message:
                self._events.request_failed(rid, self._close_message)
            else:
                self._events.request_finished(rid, "abort", self._metrics(started, first, last, pieces, usage))
            raise
        except Exception as exc:  # noqa: BLE001 (every failure must reach the user, in words)
            message = describe_error(exc, self.url, self._read_timeout_s)
            log.bridge.warning("remote request %s failed: %s", rid, message)
            self._events.request_failed(rid, message)
        else:
            stats.record("e2e", time.monotonic() - started)
            stats.record("finished", time.monotonic())
            self._events.request_finished(rid, finish or "stop", self._metrics(started, first, last, pieces, usage))
        finally:
            stats.num_running -= 1
            self._tasks.pop(rid, None)

    @staticmethod
    def _metrics(started: float, first: float | None, last: float | None, pieces: int,
                 usage: dict[str, Any]) -> dict[str, Any]:
        """The request's figures in the local engine's form (``RequestMetrics.as_dict``), from the client's clock
        and the server's token counts."""
        return RequestMetrics(arrival_time=started, first_token_time=first, last_token_time=last,
                              finish_time=time.monotonic(),
                              num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                              num_generated_tokens=int(usage.get("completion_tokens") or pieces)).as_dict()

    async def _poll_metrics(self) -> None:
        """Scrape the server's ``/metrics`` once a second; stop for good if it has none."""
        url = self.url.removesuffix("/v1") + "/metrics"
        while True:
            try:
                response = await self._client.get(url, timeout=CONNECT_TIMEOUT_S)
                if response.status_code != 200:
                    log.bridge.info("%s answered %s; showing client-side figures only", url, response.status_code)
                    return
                self._server_totals = prometheus_totals(response.text)
            except httpx.HTTPError:
                pass  # the server is down for now; the chats will say so
            except ValueError:
                log.bridge.info("%s is not Prometheus text; showing client-side figures only", url)
                return
            await asyncio.sleep(METRICS_INTERVAL_S)
