"""Resource monitor: memory, CPU, NVIDIA GPUs and the engine's metrics, sampled on a thread of its own.

A :class:`Sampler` takes one flat sample about once a second and keeps the last ten minutes in a
ring buffer. A sample is a ``dict[str, float]``; every key is optional except ``time``:

* psutil: ``process_rss_bytes``, ``process_cpu_percent``, ``ram_used_bytes``, ``ram_total_bytes``,
  ``cpu_percent`` (mean over cores) and ``cpu{i}_percent`` per logical core.
* pynvml: ``gpu_count`` and, per GPU ``i``, ``gpu{i}_memory_used_bytes``, ``gpu{i}_memory_total_bytes``,
  ``gpu{i}_utilization_percent``, ``gpu{i}_temperature_c``, ``gpu{i}_power_w`` where the driver reports
  them. Without pynvml or an NVIDIA driver ``gpu_count`` is 0 and :attr:`Sampler.gpu_reason` says why.
* torch: ``torch_cuda_allocated_bytes`` and ``torch_cuda_reserved_bytes`` (this process, all devices),
  only when torch is already imported and has initialized CUDA; the monitor never imports torch.
* the engine: whatever ``metrics_source()`` returns (``LLM.metrics()``, an :class:`~engine.api.EngineMetrics`:
  ``num_running``, ``kv_blocks_used``, ``throughput_tok_s``, ...; or such figures by name), plus
  ``kv_blocks_free``.

``python -m engine.system.monitor`` prints samples and what sampling costs.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from engine.api import EngineMetrics

log = logging.getLogger("engine")

Sample = dict[str, float]
MetricsSource = Callable[[], "EngineMetrics | Mapping[str, Any] | None"]

DEFAULT_INTERVAL_S = 1.0
#: How much history the ring buffer keeps.
HISTORY_S = 600.0


class _Nvml:
    """NVIDIA GPUs through pynvml; a missing library or driver leaves ``handles`` empty."""

    def __init__(self) -> None:
        self.reason = ""
        self.handles: list[Any] = []
        self._nvml: ModuleType | None = None
        try:
            import pynvml
        except ImportError:
            self.reason = "pynvml is not installed"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:  # LibraryNotFound, DriverNotLoaded, ...: no usable NVIDIA driver
            self.reason = f"no NVIDIA driver ({exc})"
            return
        self._nvml = pynvml
        try:
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            self.reason = f"NVML could not list GPUs ({exc})"
        if not self.handles and not self.reason:
            self.reason = "no NVIDIA GPU"

    def read(self, sample: Sample) -> None:
        sample["gpu_count"] = float(len(self.handles))
        nvml = self._nvml
        if nvml is None:
            return
        for i, handle in enumerate(self.handles):
            reads: tuple[tuple[str, Callable[[Any], float]], ...] = (
                ("memory_used_bytes", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used),
                ("memory_total_bytes", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).total),
                ("utilization_percent", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                ("temperature_c", lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                ("power_w", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
            )
            for name, read in reads:
                try:
                    sample[f"gpu{i}_{name}"] = float(read(handle))
                except nvml.NVMLError:  # NotSupported on this board, or the GPU fell off the bus
                    pass

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None


def _read_torch(sample: Sample) -> None:
    torch = sys.modules.get("torch")  # only if someone else imported it
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return
    devices = range(cuda.device_count())
    sample["torch_cuda_allocated_bytes"] = float(sum(cuda.memory_allocated(d) for d in devices))
    sample["torch_cuda_reserved_bytes"] = float(sum(cuda.memory_reserved(d) for d in devices))


class Sampler:
    """Samples resources and engine metrics every ``interval_s`` on a daemon thread.

    Args:
        interval_s: seconds between samples.
        metrics_source: returns the engine's metrics (``llm.metrics``), or None while there is no engine.
        on_sample: called with each new sample, on the sampler thread.
        history_s: how many seconds of samples the ring buffer keeps.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, metrics_source: MetricsSource | None = None,
                 on_sample: Callable[[Sample], None] | None = None, history_s: float = HISTORY_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        if history_s < interval_s:
            raise ValueError(f"history_s must be at least interval_s, got {history_s}")
        self.interval_s = interval_s
        self._metrics_source = metrics_source
        self._on_sample = on_sample
        self._buffer: deque[Sample] = deque(maxlen=math.ceil(history_s / interval_s) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()
        self._nvml: _Nvml | None = None
        self._source_failed = False
        #: Why no GPU is reported ("" when GPUs are, or before the first sample).
        self.gpu_reason = ""
        self.num_samples = 0
        #: CPU time the sampler thread has used, and the wall time it has run, in seconds.
        self.cpu_s = 0.0
        self.wall_s = 0.0

    # --- control -------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hearth-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and release NVML; the buffer stays readable."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def cpu_fraction(self) -> float:
        """Share of one core the sampler thread has used since it started."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def _run(self) -> None:
        cpu0, wall0 = time.thread_time(), time.monotonic()
        next_at = wall0
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:
                log.exception("monitor sample failed")
            self.cpu_s, self.wall_s = time.thread_time() - cpu0, time.monotonic() - wall0
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (suspended laptop, a slow metrics source): skip, don't burst
                next_at, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    # --- sampling ------------------------------------------------------------------------------------------
    def sample_once(self) -> Sample:
        """Take one sample now, store it and pass it to ``on_sample``."""
        if self._nvml is None:
            self._nvml = _Nvml()
            self.gpu_reason = self._nvml.reason
            psutil.cpu_percent(percpu=True)  # the first call only sets the baseline
            self._process.cpu_percent()
        sample: Sample = {"time": time.time()}
        self._read_psutil(sample)
        self._nvml.read(sample)
        _read_torch(sample)
        self._read_engine(sample)
        with self._lock:
            self._buffer.append(sample)
            self.num_samples += 1
        if self._on_sample is not None:
            self._on_sample(dict(sample))
        return sample

    def _read_psutil(self, sample: Sample) -> None:
        sample["process_rss_bytes"] = float(self._process.memory_info().rss)
        sample["process_cpu_percent"] = float(self._process.cpu_percent())
        memory = psutil.virtual_memory()
        sample["ram_used_bytes"] = float(memory.total - memory.available)
        sample["ram_total_bytes"] = float(memory.total)
        cores = psutil.cpu_percent(percpu=True)
        sample["cpu_percent"] = float(sum(cores) / len(cores)) if cores else 0.0
        for i, percent in enumerate(cores):
            sample[f"cpu{i}_percent"] = float(percent)

    def _read_engine(self, sample: Sample) -> None:
        if self._metrics_source is None:
            return
        try:
            metrics = self._metrics_source()
        except Exception:
            if not self._source_failed:
                log.exception("engine metrics could not be read")
                self._source_failed = True
            return
        if isinstance(metrics, EngineMetrics):
            metrics = metrics.to_dict()
        if not metrics:
            return
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "time":
                sample[key] = float(value)
        if {"kv_blocks_total", "kv_blocks_used"} <= sample.keys():
            sample["kv_blocks_free"] = (sample["kv_blocks_total"] - sample["kv_blocks_used"]
                                        - sample.get("kv_blocks_cached", 0.0))

    # --- reading -------------------------------------------------------------------------------------------
    def samples(self) -> list[Sample]:
        """Copies of the buffered samples, oldest first."""
        with self._lock:
            return [dict(s) for s in self._buffer]

    def snapshot(self) -> Sample:
        """The newest sample ({} before the first)."""
        with self._lock:
            return dict(self._buffer[-1]) if self._buffer else {}

    def series(self, name: str) -> list[tuple[float, float]]:
        """``(time, value)`` pairs of one key, oldest first, from the samples that have it."""
        with self._lock:
            return [(s["time"], s[name]) for s in self._buffer if name in s]

    def to_csv(self, path: str | Path) -> int:
        """Write the buffer as CSV (one row per sample, a column per key); returns the number of rows."""
        rows = self.samples()
        write_csv(path, rows)
        return len(rows)


def csv_columns(rows: Iterable[Sample]) -> list[str]:
    """``time`` first, then every other key in the order it first appears."""
    columns: dict[str, None] = {"time": None}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns)


def write_csv(path: str | Path, rows: list[Sample]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=csv_columns(rows), restval="")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    """Print samples for a while, then what sampling cost."""
    parser = argparse.ArgumentParser(prog="python -m engine.system.monitor", description=main.__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--quiet", action="store_true", help="print only the cost")
    args = parser.parse_args(argv)

    def show(sample: Sample) -> None:
        if not args.quiet:
            print({k: round(v, 3) for k, v in sample.items() if not k.startswith("cpu") or k == "cpu_percent"})

    sampler = Sampler(args.interval, on_sample=show)
    sampler.start()
    time.sleep(args.seconds)
    sampler.stop()
    print(f"{sampler.num_samples} samples, {sampler.cpu_s * 1000 / max(sampler.num_samples, 1):.2f} ms CPU each, "
          f"{sampler.cpu_fraction * 100:.3f} % of one core at {args.interval:g} s intervals"
          + (f"; no GPU: {sampler.gpu_reason}" if sampler.gpu_reason else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
