"""Native decode steps: every layer of a decode-only step in one C++ call (the layer loop in ``csrc/decode_step.cpp``,
its op families beside it in ``csrc/``).

On a small model an eager decode step is mostly per-op overhead: some twenty torch calls per layer from Python.
The native step runs the layer loop in C++: each layer's tuned matmul kernels (torch's packed int4, int8 or dense
through ATen, or the extension's own AVX512-VNNI int4 kernel), and fused loops for the small ops between them
(RMSNorm, rotary embedding, K/V writes, paged decode attention, SiLU-and-multiply). The embedding, final norm
and lm_head stay in Python.

The extension also serves eager layers: its AVX512-VNNI kernels (``Int4VnniLinear``, ``Int8VnniLinear``), offered
to the tuner where :func:`engine.model.vnni.vnni_problem` finds nothing against them.

The extension is compiled once per machine with the system's C++ compiler, for this CPU (``-march=native``), and
kept in ``build_cache_dir()/native`` (shared by every data dir) under a key of its source, the torch version, the
compiler and the CPU's flags (``engine/model/native_build.py``). The first start builds it in the background, so a
start never waits on the compiler; that load's steps run eager to its end (a step turning native mid-conversation
could change a greedy reply's tokens), and later loads only load the library. The offline
bundle carries copies built when the bundle is (``packaging/hearth.spec``, :data:`BUNDLED_BUILDS`), the most
portable for any x86-64 CPU with AVX2 and FMA, and checks the running CPU's flags before loading one. Where there is
no compiler, the build fails or the CPU lacks those flags, steps run eager, with the reason logged and shown by
``python -m engine info``.

``EngineConfig.native``:

* ``"auto"``: per batch bucket, the native step is timed against the eager layers the first time a step lands in
  that bucket, and kept where it is at least :data:`MIN_GAIN` faster; the verdict is cached per machine
  (``engine/model/layer_spec.py``). A verdict timed while the machine was busy is provisional, as the kernel plans'
  are (``engine/model/autotune.py``): a later load on a quiet machine times it again. fp32 models stay eager: that
  level promises HF's own ops.
* ``"on"``: native wherever it can run (fp32 too: tests check it against HF ``generate``).
* ``"off"``: eager.

Steps with a prefill chunk, speculative verification, deterministic mode, a non-fp32 KV pool and CUDA run eager.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from engine.model.autotune import MAX_REMEASURES
from engine.model.kernel_timing import BUCKET_NAMES, BUCKETS, bucket_index, machine_quiet
from engine.model.layer_spec import LayerShape, LayerWeights, LinearSpec, Rotary, VerdictCache
from engine.model.native_build import build, build_key, compiler, source_digest, sources
from engine.system import hardware
from engine.system.paths import build_cache_dir

log = logging.getLogger("engine")

#: ``auto`` keeps the native step for a bucket only where it is at least this much faster than eager.
MIN_GAIN = 0.05
_KINDS = {"int4": 0, "int8": 1, "dense": 2, "int4_vnni": 3, "gguf": 4}
#: The offline bundle's prebuilt copy for any x86-64 CPU with AVX2: where it lies in the bundle, what it is built
#: for, and the CPU flags (as /proc/cpuinfo names them) that this needs.
BUNDLED_LIBRARY = "native/decode_step.so"
PORTABLE_MARCH = "-march=x86-64-v3"
PORTABLE_CPU_FLAGS = ("avx2", "fma", "f16c", "bmi2")
#: Every prebuilt copy the bundle carries, best first: its place, its -march flags, the CPU flags it needs. The
#: first also carries the AVX512-VNNI kernels (``engine/model/vnni.py``).
BUNDLED_BUILDS = (
    (
        "native/decode_step-avx512vnni.so",
        ("-march=x86-64-v4", "-mavx512vnni", "-mavx512vbmi"),
        (*PORTABLE_CPU_FLAGS, "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512vbmi"),
    ),
    (BUNDLED_LIBRARY, (PORTABLE_MARCH,), PORTABLE_CPU_FLAGS),
)
_SCRATCH_CONTEXT = 64  # context length of the timing calls


def native_problem(device: torch.device, kv_dtype: torch.dtype) -> str | None:
    """Why native decode steps cannot run here, or None when they can (once built)."""
    if device.type != "cpu":
        return f"native steps are implemented for the CPU only, not {device.type}"
    if kv_dtype != torch.float32:
        return f"native steps read an fp32 KV pool, not {kv_dtype}"
    if getattr(sys, "frozen", False):
        present = [needs for name, _, needs in BUNDLED_BUILDS if (_bundle_root() / name).is_file()]
        if not present:
            return "a frozen bundle carries no C++ compiler, and this one no prebuilt native step"
        if bundled_library() is None:  # the most portable copy's needs
            missing = sorted(set(present[-1]) - hardware.cpu_flags_and_model()[0])
            return f"this CPU lacks {', '.join(missing)}, which the bundle's prebuilt native step needs"
        return None
    if sys.platform == "win32":
        return "native steps are built on Linux and macOS only"
    if compiler() is None:
        return "no C++ compiler found (set CXX, or install g++)"
    return None


#: What :func:`file_problem` says, not waiting, while the extension is still being built in the background.
STILL_BUILDING = "the native extension is still being built"


def file_problem(wait: bool = True) -> str | None:
    """Why a GGUF file's blocks cannot be multiplied as they are here (the "file" precision's kernels,
    ``engine/model/gguf_linear.py``), or None. On a machine that has no build, starts one (once) and waits for it, or
    with ``wait=False`` says :data:`STILL_BUILDING` while it runs: a load never waits for the compiler."""
    problem = native_problem(torch.device("cpu"), torch.float32) or EXTENSION.start(wait=wait)
    if problem == "building":
        return STILL_BUILDING
    if problem is None and not hasattr(torch.ops.hearth, "gguf_mm"):
        problem = "the native extension carries no GGUF block kernels"
    return problem


def _bundle_root() -> Path:
    root = getattr(sys, "_MEIPASS", None)
    return Path(root if root is not None else Path(sys.executable).parent)


def bundled_library() -> Path | None:
    """The best native step prebuilt into a frozen bundle (``packaging/hearth.spec``) that this CPU can run, if any."""
    flags = hardware.cpu_flags_and_model()[0]
    for name, _, needs in BUNDLED_BUILDS:
        path = _bundle_root() / name
        if path.is_file() and set(needs) <= flags:
            return path
    return None


def library_path() -> Path:
    """Where this process loads the extension from: the bundle's prebuilt one, or this machine's own build (which
    may not exist yet)."""
    if getattr(sys, "frozen", False):
        return bundled_library() or Path(BUNDLED_LIBRARY)
    return build_cache_dir() / "native" / f"decode_step-{build_key(compiler() or 'none')}.so"


class _Extension:
    """The process's one copy of the extension: absent, building, ready, or failed with a reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.ready = False
        self.problem: str | None = None

    @property
    def state(self) -> str:
        """"ready", "failed" (:attr:`problem` says why), "building", or "absent" (not asked for yet); reads only."""
        if self.ready:
            return "ready"
        if self.problem is not None:
            return "failed"
        return "building" if self._thread is not None else "absent"

    def op(self) -> Callable[..., torch.Tensor]:
        return torch.ops.hearth.decode_layers

    def pin(self, weights: list[torch.Tensor], kinds: list[int]) -> int:
        """Hand every layer's weights to the extension once (as C++-owned aliases); returns their handle."""
        return int(torch.ops.hearth.pin_weights(weights, kinds))

    def unpin(self, handles: list[int]) -> None:
        if self.ready:
            for handle in handles:
                torch.ops.hearth.unpin_weights(handle)
        handles.clear()

    def start(self, wait: bool) -> str | None:
        """Load the extension, building it first if this machine has no build (in the background unless ``wait``).

        Returns None when it is loaded, else "building" or why it cannot be.
        """
        with self._lock:
            if self.ready or self.problem is not None:
                return self.problem
            path = library_path()
            if path.exists():
                self._load(path)
                return self.problem
            if self._thread is None:
                self._thread = threading.Thread(target=self._build, args=(path, not wait), name="hearth-native",
                                                daemon=True)
                self._thread.start()
            thread = self._thread
        if not wait:
            return "building"
        thread.join()
        return self.problem

    def _build(self, path: Path, background: bool) -> None:
        start = time.perf_counter()
        log.info("building the native decode step (once per machine) into %s", path.parent)
        try:
            build(path, background=background)
        except Exception as exc:  # noqa: BLE001 -- no build: eager, with the reason
            self.problem = f"the native step did not build ({exc})"
            log.warning("%s; decode steps run eager", self.problem)
            return
        with self._lock:
            self._load(path)
        if self.ready:
            log.info("native decode step built in %.0f s", time.perf_counter() - start)

    def _load(self, path: Path) -> None:
        try:
            torch.ops.load_library(str(path))
            self.ready = True
        except Exception as exc:  # noqa: BLE001 -- a broken build: eager, with the reason
            self.problem = f"the native step did not load ({exc})"
            log.warning("%s; decode steps run eager", self.problem)


EXTENSION = _Extension()


def _spec_args(spec: LinearSpec) -> tuple[list[torch.Tensor], list[int]]:
    empty = torch.empty(0)
    tensors = [spec.weight, empty if spec.scales is None else spec.scales, empty if spec.bias is None else spec.bias]
    return tensors, [_KINDS[spec.kind], spec.group_size, spec.row_multiple]


def flatten(weights: list[LayerWeights], dtype: torch.dtype) -> tuple[list[torch.Tensor], list[int]]:
    """Every layer's weights as the native op takes them: 16 tensors and 12 integers per layer."""
    tensors: list[torch.Tensor] = []
    kinds: list[int] = []
    empty = torch.empty(0, dtype=dtype)
    for w in weights:
        norms = (w.input_norm, w.q_norm, w.k_norm, w.post_norm)
        tensors += [empty if n is None else n.to(dtype).contiguous() for n in norms]
        for spec in (w.qkv, w.o, w.gate_up, w.down):
            t, k = _spec_args(spec)
            tensors += t
            kinds += k
    return tensors, kinds


class NativeDecode:
    """The native decode step of one fused decoder: per batch bucket, native or eager, decided on first use.

    Args:
        mode: "auto" (timed against eager per bucket, the verdict cached) or "on".
        shape, hidden, dtype: the layer's constants, the hidden size, the activation dtype.
        layers: every layer's weights, per bucket: ``layers(bucket)`` (None where a kernel has no native form).
        kv_layout: ``(layers, kv_heads, head_dim)`` of the pool.
        rotary: ``rotary(x, positions)`` -> cos, sin as the eager path computes them ([T, 1, D]).
        eager_trial: ``eager_trial(rows, context)`` -> a function running one eager decode step's layers over
            scratch inputs: what ``auto`` times the native step against.
        signature: names the model and its kernels, for ``auto``'s cache; every_step: (deterministic mode) all.
    """

    def __init__(
        self,
        mode: str,
        shape: LayerShape,
        layers: Callable[[int], list[LayerWeights] | None],
        hidden: int,
        dtype: torch.dtype,
        kv_layout: tuple[int, int, int],
        rotary: Rotary,
        eager_trial: Callable[[int, int], Callable[[], object]],
        signature: str,
        every_step: bool = False,
    ) -> None:
        self.mode = mode
        #: every step runs natively, prefill chunks and draft verification too (deterministic mode): each token is
        #: then computed the same way whatever step it is in. Decided once for all buckets, and never timed.
        self.every_step = every_step
        self.shape = shape
        self._layers = layers
        self._hidden, self._dtype, self._kv_layout, self._rotary = hidden, dtype, kv_layout, rotary
        self._eager_trial = eager_trial
        self.signature = f"native {_code_digest()} {signature}"
        self._ready: dict[int, int] = {}  # bucket -> handle of its pinned weights
        self._handles: list[int] = []
        # unpin when this decoder goes: the extension's aliases would otherwise keep the weights alive
        weakref.finalize(self, EXTENSION.unpin, self._handles)
        #: decode steps run natively so far
        self.steps = 0
        #: why each bucket runs as it does, for logs and ``python -m engine info``
        self.reasons: dict[int, str] = {}
        #: the extension was still being built when this decoder's load enabled it: its steps stay eager until the
        #: next load, since a step that turned native mid-conversation could change a greedy reply's tokens
        self.built_after_load = not EXTENSION.ready

    def status(self) -> str:
        """One line: how each bucket seen so far runs."""
        if not EXTENSION.ready:
            return "eager: " + (EXTENSION.problem or "the native step is being built")
        if self.built_after_load:
            return "eager: the native step was built after this load began; it runs from the next load"
        if not self.reasons:
            return "native, per batch bucket on first use"
        return "; ".join(f"{BUCKET_NAMES[b]} rows: {r}" for b, r in sorted(self.reasons.items()))

    def weights_for(self, rows: int) -> int | None:
        """The handle of the pinned weights of the bucket of ``rows``, once it runs native; None while eager."""
        bucket = 0 if self.every_step else bucket_index(rows)
        ready = self._ready.get(bucket)
        if ready is not None or bucket in self.reasons or not EXTENSION.ready or self.built_after_load:
            return ready
        self.reasons[bucket] = self._decide(bucket)
        log.info("decode steps of %s rows: %s", rows, self.reasons[bucket])
        return self._ready.get(bucket)

    def fail(self, rows: int, exc: BaseException) -> None:
        """A native step raised: that bucket (in ``every_step`` mode, every step) runs eager from now on."""
        bucket = 0 if self.every_step else bucket_index(rows)
        self._ready.pop(bucket, None)
        self.reasons[bucket] = f"eager: the native step failed ({type(exc).__name__}: {exc})"
        log.warning("native decode step for %s rows failed; eager from now on: %s", rows, exc)

    def run(
        self,
        handle: int,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        slot_mapping: torch.Tensor,
        slots: torch.Tensor,
        lens: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states after the last layer ([B, hidden]), writing each row's K/V into the pools."""
        s = self.shape
        out = EXTENSION.op()(handle, x, cos, sin, k_pool, v_pool, slot_mapping, slots, lens, s.eps, s.scale, s.num_heads)
        self.steps += 1
        return out

    # --- the verdict per bucket ----------------------------------------------------------------------------------
    def _decide(self, bucket: int) -> str:
        weights = self._layers(bucket)
        if weights is None:
            return "eager: a kernel of this bucket has no native form"
        if self.every_step and any(not _same_kernels(weights, self._layers(b)) for b in range(1, len(BUCKETS))):
            return "eager: the kernels differ between batch buckets"
        try:
            handle = self._pin(weights)
        except Exception as exc:  # noqa: BLE001 -- weights the extension refuses: that bucket stays eager
            return f"eager: the native step refused the weights ({type(exc).__name__}: {exc})"
        if self.every_step or self.mode == "on":
            self._ready[bucket] = handle
            return "native for every step (row-invariant: deterministic mode)" if self.every_step else "native"
        cache = VerdictCache()
        key = VerdictCache.key(self.signature, bucket)
        verdict = cache.get(key)
        remeasures = 0
        if verdict is not None and verdict.get("provisional") and machine_quiet():
            remeasures = int(verdict.get("remeasures", 0)) + 1
            if remeasures <= MAX_REMEASURES:
                verdict = None  # measured on a busy machine: measured again now that it looks quiet
        if verdict is not None and not verdict["native"]:
            self._unpin(handle)
            return f"eager: {verdict['reason']} (cached)"
        if verdict is None:
            busy = not machine_quiet()
            try:
                eager_s, native_s = self._time(bucket, handle)
            except Exception as exc:  # noqa: BLE001 -- a step that cannot run is a step that stays eager
                self._unpin(handle)
                return f"eager: the native step failed a trial run ({type(exc).__name__}: {exc})"
            gain = eager_s / native_s - 1
            reason = f"{gain:+.0%} per step against eager ({eager_s * 1e3:.2f} vs {native_s * 1e3:.2f} ms)"
            if busy:
                reason += "; provisional, timed on a busy machine"
            verdict = {"native": gain >= MIN_GAIN, "reason": reason, "eager_us": eager_s * 1e6}
            verdict.update(native_us=native_s * 1e6, provisional=busy, remeasures=remeasures)
            cache.put(key, verdict)
            if not verdict["native"]:
                self._unpin(handle)
                return f"eager: {reason}"
        else:
            reason = f"{verdict['reason']} (cached)"
        self._ready[bucket] = handle
        return f"native: {reason}"

    def _pin(self, weights: list[LayerWeights]) -> int:
        handle = EXTENSION.pin(*flatten(weights, self._dtype))
        self._handles.append(handle)
        return handle

    def _unpin(self, handle: int) -> None:
        self._handles.remove(handle)
        EXTENSION.unpin([handle])

    def _time(self, bucket: int, handle: int) -> tuple[float, float]:
        """Best-of-rounds time of one step's layers, eager and native, interleaved (seconds per step)."""
        rows, length = BUCKETS[bucket], _SCRATCH_CONTEXT
        num_layers, heads, head_dim = self._kv_layout
        pools = [torch.zeros(num_layers, length + rows, heads, head_dim) for _ in range(2)]
        x = torch.randn(rows, self._hidden).to(self._dtype)
        pos = torch.full((rows,), length - 1, dtype=torch.long)
        cos, sin = self._rotary(x, pos)
        slot_mapping = torch.arange(length, length + rows)
        slots = torch.cat([torch.arange(length - 1).repeat(rows, 1), slot_mapping[:, None]], dim=1)
        lens = torch.full((rows,), length, dtype=torch.long)

        def native() -> None:
            self.run(handle, x, cos, sin, pools[0], pools[1], slot_mapping, slots, lens)

        best = {"eager": float("inf"), "native": float("inf")}
        runs = {"eager": self._eager_trial(rows, length), "native": native}
        with torch.inference_mode():
            native()  # a first call that raises stops here
            for _ in range(5):
                for name, run in runs.items():
                    start = time.perf_counter()
                    run()
                    best[name] = min(best[name], time.perf_counter() - start)
        return best["eager"], best["native"]


def _same_kernels(a: list[LayerWeights], b: list[LayerWeights] | None) -> bool:
    """Whether two buckets' layers run the very same kernels (the same kinds over the same weight tensors)."""
    if b is None:
        return False
    roles = ("qkv", "o", "gate_up", "down")
    return all(
        getattr(x, r).weight is getattr(y, r).weight and getattr(x, r).kind == getattr(y, r).kind
        for x, y in zip(a, b, strict=True)
        for r in roles
    )


def _code_digest() -> str:
    """Names the native code that runs: its sources, or in the bundle (which carries no sources) the prebuilt copy."""
    if sources():
        return source_digest()[:12]
    try:
        return hashlib.sha256(library_path().read_bytes()).hexdigest()[:12]
    except OSError:
        return "unknown"
