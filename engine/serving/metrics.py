"""The Prometheus registry behind ``/metrics``: vLLM's metric names under the ``hearth:`` prefix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.api import EngineMetrics, StepOutput

METRIC_PREFIX = "hearth:"
#: The media type of :meth:`ServerMetrics.render`.
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
_Figure = Callable[[EngineMetrics], float]
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)


class ServerMetrics:
    """The Prometheus registry behind ``/metrics``.

    Histograms and request counters cover the requests this server answered; gauges and the prefix-cache and
    preemption counters are read from the engine at scrape time, so they include everyone who shares it.
    """

    def __init__(self, engine_metrics: Callable[[], EngineMetrics], model_name: str) -> None:
        disable_created_metrics()  # no *_created series: they only add noise for a single-process server
        self.registry = CollectorRegistry()
        self._model = model_name
        labels = ["model_name"]
        p = METRIC_PREFIX

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(p + name, doc, labels, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token, per request.")
        self.itl = histogram("inter_token_latency_seconds", "Time between successive tokens of a request.")
        self.e2e = histogram("e2e_request_latency_seconds", "Whole-request latency, arrival to last token.")
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed.", labels, registry=self.registry)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated.", labels,
                                         registry=self.registry)
        self.request_success = Counter(p + "request_success", "Finished requests by finish reason.",
                                       [*labels, "finished_reason"], registry=self.registry)
        self.registry.register(_EngineCollector(engine_metrics, model_name))

    def observe_token(self, itl_s: float | None) -> None:
        if itl_s is not None:
            self.itl.labels(self._model).observe(itl_s)

    def observe_finish(self, out: StepOutput | None, num_prompt_tokens: int) -> None:
        reason = "abort" if out is None else (out.finish_reason or "stop")
        self.request_success.labels(self._model, reason).inc()
        self.prompt_tokens.labels(self._model).inc(num_prompt_tokens)
        m = (out.metrics if out is not None else None) or {}
        self.generation_tokens.labels(self._model).inc(m.get("num_generated_tokens") or 0)
        if m.get("ttft_s") is not None:
            self.ttft.labels(self._model).observe(m["ttft_s"])
        if m.get("e2e_s") is not None:
            self.e2e.labels(self._model).observe(m["e2e_s"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Engine state, read at scrape time."""

    # (Prometheus name, its EngineMetrics figure, help)
    _GAUGES: tuple[tuple[str, _Figure, str], ...] = (
        ("num_requests_running", lambda m: m.num_running, "Requests in the running batch."),
        ("num_requests_waiting", lambda m: m.num_waiting, "Requests waiting to be scheduled."),
        ("kv_cache_usage_perc", lambda m: m.kv_cache_usage, "Fraction of KV-cache blocks in use (1 = full)."),
        ("kv_blocks_used", lambda m: m.kv_blocks_used, "KV-cache blocks held by requests."),
        ("kv_blocks_total", lambda m: m.kv_blocks_total, "KV-cache blocks in the pool."),
        ("mean_batch_size", lambda m: m.mean_batch_size, "Mean sequences per engine step over recent steps."),
        ("batch_efficiency", lambda m: m.batch_efficiency, "Mean batch size over max_batch_size."),
        ("generation_throughput_tok_s", lambda m: m.throughput_tok_s, "Tokens generated per second, recent window."),
        ("concurrency_limit", lambda m: m.concurrency_limit,
         "Most sequences the concurrency controller lets run at once."),
        ("spec_acceptance_rate", lambda m: m.spec_acceptance_rate,
         "Share of speculative draft tokens the model accepted."),
        ("spec_tokens_per_step", lambda m: m.spec_tokens_per_step,
         "Tokens a speculating sequence gains per verification step."),
        ("spec_enabled", lambda m: m.spec_enabled, "1 while speculative decoding is on for the batch, else 0."),
    )
    _COUNTERS: tuple[tuple[str, _Figure, str], ...] = (
        ("prefix_cache_queries", lambda m: m.prefix_cache_queries, "Prompt tokens looked up in the prefix cache."),
        ("prefix_cache_hits", lambda m: m.prefix_cache_hits, "Prompt tokens found in the prefix cache."),
        ("num_preemptions", lambda m: m.num_preemptions, "Requests preempted to free KV-cache blocks."),
        ("controller_adjustments", lambda m: m.controller_adjustments_total,
         "Changes the concurrency controller made."),
    )

    def __init__(self, engine_metrics: Callable[[], EngineMetrics], model_name: str) -> None:
        self._engine_metrics = engine_metrics
        self._model = model_name

    def collect(self) -> Any:
        snap = self._engine_metrics()
        for name, figure, doc in self._GAUGES:
            gauge = GaugeMetricFamily(METRIC_PREFIX + name, doc, labels=["model_name"])
            gauge.add_metric([self._model], float(figure(snap)))
            yield gauge
        for name, figure, doc in self._COUNTERS:
            counter = CounterMetricFamily(METRIC_PREFIX + name, doc, labels=["model_name"])
            counter.add_metric([self._model], float(figure(snap)))
            yield counter

