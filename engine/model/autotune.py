"""Kernel choice by measurement: per weight shape and batch bucket, the fastest kernel of a precision class.

Which matmul is fastest depends on the CPU far more than on the model: on a CPU with AVX512_BF16 a plain bf16
GEMM beats fbgemm's packed fp16 at 16 rows, on one without it the packed kernel is several times faster; int4
wins a one-row GEMV and may lose a 64-row GEMM. So at load, each distinct weight shape is timed on every
candidate kernel at one row count per bucket (:data:`BUCKETS`), and :func:`choose` makes a plan: the kernel each
bucket runs.

The candidates never change the precision class the level fixes (``engine/model/quantization.py`` builds them):
bf16/fp16 models choose between dense and packed fp16 (exact for bf16 weights); int4 between torch's packed kernel
and the native extension's VNNI kernel over the same bytes; the lm_head between int8 forms and the dense
embedding. A plan keeps one kernel per shape unless a second is at least :data:`MIN_GAIN` faster in some bucket
and its memory is allowed; kernels that share memory already held (the lm_head reading the embedding) are free,
and so is a kernel that reads another candidate's bytes (its ``base``: :func:`memory_owner`).

**Deterministic mode** (``Tuner(deterministic=True)``): a greedy reply must not depend on what else shares a
step, so a row's result must not depend on how many rows share its matmul, nor on the bucket. One kernel runs
every bucket: the fastest of the row-invariant candidates (:func:`row_multiple`: probe rows computed alone and
inside calls of several sizes, bitwise equal), padding calls to a multiple of 2, 4, 8 or 16 rows where that makes
one invariant (BLAS kernels often treat a partial block of rows differently). Probing is the costlier part on a
large matrix, so the candidates are timed first and probed fastest first, and a candidate that ranks after one
found invariant whatever the others is not probed: it could not be chosen (:func:`_cannot_win`).

**Cost.** A large matrix's big buckets (the lm_head's 64 rows) cost most of a load's measuring, so each kernel,
bucket gets a budget of calls (:func:`time_kernel`: a long call is timed once a round, a short one up to
:data:`_REPEATS` times; only the first round warms up, and a long warm-up call counts as its timed call), and a
kernel already several times slower than the fastest at a bucket is not timed there again (:func:`outpaced`).

**Noise.** On a shared machine other processes may hold the cores while a load measures, and a plan built on
timings several times off would be used by every later load. So :func:`measure` keeps every call, and a plan
records its *noise*: how far the median call is from the best one, the worst over its timings (small on a quiet
machine, several-fold under contention). A plan chosen on the best calls is too noisy to separate the candidates
when its noise exceeds :data:`MAX_NOISE` and the median calls would choose another plan: it runs, and is cached as
*provisional* (its reason, logged at INFO, says so). A later load measures that shape again when the machine looks
quiet (:func:`machine_quiet`), at most :data:`MAX_REMEASURES` times; a busy one runs the provisional plan rather than
measure again. A clear winner is trusted on a busy machine too.

Plans are cached per machine (``engine/model/plan_cache.py``: :class:`PlanCache`), so later loads measure
nothing. Every plan records its timings, noise and a reason. The cache is keyed by shape, not by file: a copy of a
model under another folder finds its plans.

**After the load** (``Tuner(defer=True)``, the engine's default: ``HEARTH_AUTOTUNE``): measuring every shape of a 1B
model took most of a first load on two cores, so a shape whose plan is not cached runs an untimed plan
(:meth:`Tuner.untimed_plan`: the preferred kernel; in deterministic mode the first row-invariant one) and only the
kernels it runs are built (:class:`LazyKernels`). Once the model has answered its warm-up, :class:`BackgroundTuning`
measures those shapes on a thread of its own while the engine has no work, and caches their plans. The loaded
layers keep their kernels: a kernel swapped mid-conversation could change a greedy reply's tokens, so the
measured plans apply from the next load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from engine.model.autotune_progress import announce
from engine.model.kernel_timing import (
    BUCKET_NAMES,
    BUCKETS,
    Measurement,
    machine_quiet,
    measure,
)
from engine.model.plan_cache import Plan, PlanCache
from engine.model.row_invariance import Kernel, PaddedRows, row_multiple
from engine.model.tuned_linear import memory_owner

log = logging.getLogger("engine")

#: A second kernel for a shape is kept only where it is at least this much faster (0.15 = 15 %).
MIN_GAIN = 0.15
#: Noise (median call / best call - 1) up to which the best calls are trusted whatever the median calls choose.
MAX_NOISE = 0.5
#: Loads that may measure a shape again after its plan was judged too noisy (only when the machine looks quiet).
MAX_REMEASURES = 2


def choose(timings_us: Mapping[str, list[float]], preferred: str, may_add: Callable[[str, str], bool]) -> Plan:
    """The plan for one shape from its measured timings.

    Args:
        timings_us: Each candidate's time per bucket (microseconds), in :data:`BUCKETS` order.
        preferred: The kernel to keep when timings tie (the one the level stores anyway).
        may_add: Whether a second kernel may be held beside the first: ``may_add(second, first)`` (memory allows
            it, or it is free).

    Returns:
        One kernel for all buckets (the one with the least total slowdown against each bucket's best), plus a
        second for the buckets where another is at least :data:`MIN_GAIN` faster, when ``may_add`` allows.
    """
    names = list(timings_us)
    main = rank(timings_us, preferred)[0]
    plan = [main] * len(BUCKETS)
    second: str | None = None
    gains: dict[str, float] = {}
    for b in range(len(BUCKETS)):
        fastest = min(names, key=lambda n: timings_us[n][b])
        gain = timings_us[main][b] / max(timings_us[fastest][b], 1e-9) - 1
        if fastest != main and gain >= MIN_GAIN:
            gains[fastest] = max(gains.get(fastest, 0.0), gain)
    if gains:
        candidate = max(gains, key=lambda n: gains[n])
        if may_add(candidate, main):
            second = candidate
            for b in range(len(BUCKETS)):
                if timings_us[main][b] / max(timings_us[second][b], 1e-9) - 1 >= MIN_GAIN:
                    plan[b] = second
    if second is None:
        why = f"{main} is fastest overall"
        if gains:
            why += f"; {max(gains, key=lambda n: gains[n])} would be faster in some buckets but is not kept (memory)"
    else:
        buckets = ", ".join(BUCKET_NAMES[b] for b in range(len(BUCKETS)) if plan[b] == second)
        why = f"{main}, and {second} for {buckets} rows (>= {MIN_GAIN:.0%} faster there)"
    return Plan(tuple(plan), {n: [round(t, 1) for t in timings_us[n]] for n in names}, why)


def rank(timings_us: Mapping[str, list[float]], preferred: str) -> list[str]:
    """The candidates by their total slowdown against each bucket's fastest, least first (``preferred`` first
    among equals): the order in which :func:`choose` would take one kernel for every bucket."""
    names = list(timings_us)
    best = [min(timings_us[n][b] for n in names) for b in range(len(BUCKETS))]

    def slowdown(name: str) -> float:
        return sum(t / max(b, 1e-9) for t, b in zip(timings_us[name], best, strict=True))

    return sorted(names, key=lambda n: (round(slowdown(n), 3), n != preferred))


def judge(plan: Plan, measured: Measurement, by_median: tuple[str, ...]) -> Plan:
    """Record ``plan``'s noise, and whether its timings separate the candidates well enough to trust it (an
    untrusted plan is cached as provisional: :meth:`Tuner.plan_for` measures it again on a quiet load).

    Args:
        plan: The plan chosen on the best calls.
        measured: The timings behind it.
        by_median: The kernels per bucket that the median calls choose.
    """
    plan.noise = measured.noise
    if plan.noise > MAX_NOISE and by_median != plan.kernels:
        plan.trusted = False
        plan.reason += (
            f"; provisional, too noisy to separate the candidates (median calls up to {plan.noise:.0%} slower than"
            f" the best; by them: {', '.join(by_median)})"
        )
    return plan


def _extra_bytes(kernels: Mapping[str, Kernel], name: str, beside: str) -> int:
    """Bytes candidate ``name`` adds beside candidate ``beside``: nothing of the bytes both read."""
    k, other = kernels[name], kernels[beside]
    shared = memory_owner(k) is memory_owner(other)
    return k.nbytes - memory_owner(k).nbytes if shared else k.nbytes


@dataclass(slots=True)
class Choice:
    """One tuned shape, for ``python -m engine info``."""

    role: str
    shape: tuple[int, int]
    plan: Plan


class LazyKernels(Mapping[str, Kernel]):
    """A shape's candidates, each built the first time it is looked up: a load that measures nothing later (its
    plan untimed, :meth:`Tuner.untimed_plan`) builds only the kernels it runs, and the background measurement the
    others (the lm_head's packed copy of a 1B model takes seconds to build)."""

    def __init__(self, builds: Mapping[str, Callable[[], Kernel]]) -> None:
        self._builds = dict(builds)
        self._built: dict[str, Kernel] = {}

    def __getitem__(self, name: str) -> Kernel:
        kernel = self._built.get(name)
        if kernel is None:
            kernel = self._built[name] = self._builds[name]()
        return kernel

    def __iter__(self) -> Iterator[str]:
        return iter(self._builds)

    def __len__(self) -> int:
        return len(self._builds)

    @property
    def built(self) -> list[str]:
        """The candidates built so far."""
        return list(self._built)


@dataclass(slots=True)
class Pending:
    """A shape a load ran untimed, with what :meth:`Tuner.tune_pending` measures it with."""

    role: str
    shape: tuple[int, int]
    key: str
    kernels: Mapping[str, Kernel]
    preferred: str
    free: frozenset[str]
    noisy_before: int


class Tuner:
    """Makes (or reads) one plan per role and shape while a model's layers are built.

    Args:
        dtype: The activation dtype the model runs in.
        cache: Where plans persist; None measures every load.
        extra_budget: Bytes of second kernels the model may hold in all.
        layers: How many layers share each decoder shape (a second kernel costs that many copies).
        deterministic: Choose only row-invariant kernels, one per shape for every bucket (see the module doc).
        timed: Measure the candidates; otherwise the preferred one runs (the first invariant one, if it is not).
        defer: A shape whose plan is not cached runs its untimed plan (:meth:`untimed_plan`) for this load, and is
            measured later by :meth:`tune_pending` (in the background, once the model answers); the plan it makes
            is cached for the next load, never swapped into this one.
    """

    def __init__(
        self,
        dtype: torch.dtype,
        cache: PlanCache | None,
        extra_budget: int,
        layers: int,
        deterministic: bool = False,
        timed: bool = True,
        defer: bool = False,
    ) -> None:
        self.dtype = dtype
        self.deterministic = deterministic
        self.timed = timed
        self.defer = defer and timed and cache is not None
        self.cache = cache
        self.budget = extra_budget
        self.layers = layers
        self.plans: dict[tuple[str, tuple[int, int]], Plan] = {}
        self.choices: list[Choice] = []
        #: shapes this load runs untimed, to measure after it (:meth:`tune_pending`), with their candidates
        self.pending: list[Pending] = []

    def plan_for(
        self,
        role: str,
        shape: tuple[int, int],
        kernels: Mapping[str, Kernel],
        preferred: str,
        free: frozenset[str],
    ) -> Plan:
        """The plan for ``role`` at ``shape``; ``kernels`` are this shape's candidates (first instance)."""
        known = self.plans.get((role, shape))
        if known is not None:
            return known
        names = sorted(kernels)
        key = PlanCache.key(role, shape, self.dtype, names, self.deterministic) if self.cache is not None else ""
        plan = self.cache.get(key) if self.cache is not None else None
        noisy_before = 0
        if plan is not None and (any(name not in kernels for name in plan.kernels) or self._measure_again(plan)):
            noisy_before, plan = plan.noisy_loads, None
        if plan is None and self.defer and len(kernels) > 1:
            plan = self.untimed_plan(shape, kernels, preferred)
            self.pending.append(Pending(role, shape, key, kernels, preferred, free, noisy_before))
        elif plan is None:
            announce(f"{role} {shape[0]}x{shape[1]}")
            plan = self._measured_plan(role, shape, key, kernels, preferred, free, noisy_before)
        return self.adopt(role, shape, plan, kernels, free)

    def cached(self, role: str, shape: tuple[int, int], candidates: list[str]) -> Plan | None:
        """The cached plan of ``role`` at ``shape`` over these candidates, when it runs as it is (nothing to measure
        again): the caller then builds only the kernels it uses and hands them to :meth:`adopt`."""
        if self.cache is None:
            return None
        plan = self.cache.get(PlanCache.key(role, shape, self.dtype, sorted(candidates), self.deterministic))
        if plan is None or any(name not in candidates for name in plan.kernels) or self._measure_again(plan):
            return None
        return plan

    def adopt(
        self, role: str, shape: tuple[int, int], plan: Plan, kernels: Mapping[str, Kernel], free: frozenset[str]
    ) -> Plan:
        """Run ``plan`` for ``role`` at ``shape`` (every later instance of the shape takes it too); ``kernels`` holds
        at least the ones it uses."""
        for name in plan.used:
            if name != plan.kernels[0] and name not in free:
                self.budget -= _extra_bytes(kernels, name, plan.kernels[0]) * (1 if role == "lm_head" else self.layers)
        self.plans[(role, shape)] = plan
        self.choices.append(Choice(role, shape, plan))
        log.info("kernels for %s %dx%d: %s", role, shape[0], shape[1], plan.reason)
        return plan

    def _measured_plan(
        self,
        role: str,
        shape: tuple[int, int],
        key: str,
        kernels: Mapping[str, Kernel],
        preferred: str,
        free: frozenset[str],
        noisy_before: int,
    ) -> Plan:
        """Measure the candidates of one shape, choose its plan, and cache it."""
        if self.deterministic:
            plan = self._invariant_plan(shape, kernels, preferred)
        else:
            measured = measure({name: kernels[name] for name in sorted(kernels)}, shape[1], self.dtype)
            copies = 1 if role == "lm_head" else self.layers

            def may_add(name: str, main: str) -> bool:
                return name in free or _extra_bytes(kernels, name, main) * copies <= self.budget

            by_median = choose(measured.median, preferred, may_add).kernels
            plan = judge(choose(measured.best, preferred, may_add), measured, by_median)
        if not plan.trusted:
            plan.noisy_loads = noisy_before + 1
        if self.cache is not None:
            self.cache.put(key, plan)
        return plan

    def untimed_plan(self, shape: tuple[int, int], kernels: Mapping[str, Kernel], preferred: str) -> Plan:
        """The plan of a shape nothing was measured for yet: the preferred kernel in every bucket (in deterministic
        mode the first row-invariant kernel, the preferred one probed first). Not cached."""
        if self.deterministic:
            timed, self.timed = self.timed, False
            try:
                plan = self._invariant_plan(shape, kernels, preferred)
            finally:
                self.timed = timed
        else:
            plan = Plan((preferred,) * len(BUCKETS), {}, f"{preferred} for every bucket")
        plan.reason += "; not measured yet: measured after this load, for the next"
        plan.untimed = True
        return plan

    def tune_pending(self, wait: Callable[[], bool] | None = None) -> int:
        """Measure every shape this load left untimed (:attr:`pending`), and cache its plan for the next load; the
        layers of this load keep the kernels they run. Then the candidates are let go.

        ``wait``, called before each shape, blocks while the machine is wanted for something else (a reply) and
        returns False to stop here: the shapes not measured yet are measured by a later load. Returns how many
        shapes were measured.
        """
        done = 0
        while self.pending:
            if wait is not None and not wait():
                break
            job = self.pending.pop(0)
            with torch.inference_mode():
                plan = self._measured_plan(job.role, job.shape, job.key, job.kernels, job.preferred, job.free,
                                           job.noisy_before)
            log.info("kernels for %s %dx%d, measured after the load (for the next load): %s", job.role,
                     job.shape[0], job.shape[1], plan.reason)
            done += 1
        self.pending.clear()
        return done

    @staticmethod
    def _measure_again(plan: Plan) -> bool:
        """Whether a cached provisional plan is measured again: at most :data:`MAX_REMEASURES` times, and only when
        the machine looks quiet (:func:`machine_quiet`); otherwise it runs, as the best calls chose it."""
        return not plan.trusted and plan.noisy_loads <= MAX_REMEASURES and machine_quiet()

    def _invariant_plan(self, shape: tuple[int, int], kernels: Mapping[str, Kernel], preferred: str) -> Plan:
        """One row-invariant kernel for every bucket: the fastest overall of those that are (padded if need be).
        Timed, the candidates are probed fastest first, except those that :func:`_cannot_win` against one found
        invariant; untimed, the preferred kernel is probed first, and the first invariant one runs."""
        timed = self.timed and len(kernels) > 1
        measured = measure(kernels, shape[1], self.dtype) if timed else None
        order = rank(measured.best, preferred) if measured else [preferred, *sorted(set(kernels) - {preferred})]
        ok: dict[str, int] = {}
        left_out: list[str] = []
        not_probed: dict[str, str] = {}
        for name in order:
            if ok and not timed:
                break
            beater = next((n for n in ok if measured and _cannot_win(measured.best, name, n)), None)
            if beater is not None:
                not_probed[name] = beater
                continue
            multiple = row_multiple(kernels[name], shape[1], self.dtype)
            if multiple is None:
                left_out.append(name)
                continue
            ok[name] = multiple
            if multiple > 1 and measured is not None:  # time it as it would run, padded
                again = measure({name: PaddedRows(kernels[name], multiple)}, shape[1], self.dtype)
                measured.best[name], measured.median[name] = again.best[name], again.median[name]
        if not ok:
            log.warning("no row-invariant kernel for %dx%d: greedy replies may vary with batching", *shape)
            return Plan((preferred,) * len(BUCKETS), {}, f"{preferred}; no candidate is row-invariant")
        first, invariant = preferred if preferred in ok else min(ok), None
        if measured is not None:
            invariant = Measurement({n: measured.best[n] for n in ok}, {n: measured.median[n] for n in ok})
            by_median = choose(invariant.median, first, lambda name, main: False).kernels[0]
            first = choose(invariant.best, first, lambda name, main: False).kernels[0]
        pad = ok[first]
        why = f"{first} for every bucket (row-invariant{f' on multiples of {pad} rows' if pad > 1 else ''})"
        if left_out:
            why += f"; {', '.join(sorted(left_out))} not row-invariant"
        if not_probed:
            why += "; " + ", ".join(f"{n} not probed (slower than {b} overall)" for n, b in not_probed.items())
        timings = {n: [round(t, 1) for t in ts] for n, ts in invariant.best.items()} if invariant else {}
        plan = Plan((first,) * len(BUCKETS), timings, why, row_multiple=pad)
        return plan if invariant is None else judge(plan, invariant, (by_median,) * len(BUCKETS))


def _cannot_win(best: Mapping[str, list[float]], name: str, by: str) -> bool:
    """Whether ``name`` (timed unpadded: padding only adds rows to a call) ranks after ``by`` (invariant, timed as
    it runs) in any set of candidates that holds both, however fast each bucket's fastest kernel turns out.

    :func:`choose` ranks by total slowdown against each bucket's fastest call: ``name``'s lead over ``by`` in a
    bucket counts most when that fastest is the least call timed there, its lag least when ``by`` is the fastest;
    if ``name`` is still behind by more than the ranking's rounding, it is never chosen.
    """
    total = 0.0
    for b, (mine, theirs) in enumerate(zip(best[name], best[by], strict=True)):
        least = min(times[b] for times in best.values())
        total += (mine - theirs) / max(theirs if mine >= theirs else least, 1e-9)
    return total > 1e-3
