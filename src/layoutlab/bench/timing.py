"""Timing a jitted step: compile apart, warm-up apart, blocking clocks, a recompilation guard.

``JaxStep`` lowers and compiles a step ahead of time (``jax.jit(f).lower(...).compile()``;
that time is ``compile_s``), then calls the same ``jax.jit`` object, which reuses the
executable. Every call blocks with ``jax.block_until_ready`` before the clock is read.

The guard: the traced function bumps a Python counter each time JAX traces it, and
``jax.monitoring`` counts trips to the XLA compiler. Any trace or compile after the AOT
compile means the step's signature changed between calls (e.g. a state whose dtype drifts
from int32 to float32, or a weakly typed scalar), so every step would pay a compile; the
call raises ``RecompilationError`` instead of timing a compile as a step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import jax

from layoutlab.xla import resolve_backend, watch_compilation
from layoutlab.xla.compile import cost_summary, memory_summary
from layoutlab.xla.hlo import hlo_report

__all__ = [
    "JaxStep",
    "RecompilationError",
    "block_rounds",
    "TimingStats",
    "interleaved_ms",
    "interleaved_rounds",
    "settle",
    "steps_per_round",
    "summarize",
    "timed",
    "timed_block",
]


class RecompilationError(RuntimeError):
    """A step was traced or compiled again after its ahead-of-time compile."""


class TimingStats(NamedTuple):
    """Step times in milliseconds over the measured (not warm-up) runs."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int


def summarize(seconds: Sequence[float]) -> TimingStats:
    if not seconds:
        raise ValueError("summarize needs at least one measured time.")
    ms = [1e3 * s for s in seconds]
    return TimingStats(statistics.median(ms), min(ms), max(ms), len(ms))


def timed(call: Callable[[], Any]) -> float:
    """Seconds one ``call()`` takes; ``call`` must block until its work is done."""
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


# A step shorter than this runs several times back to back in each round of an interleaved group,
# after one unmeasured lead step: right after another framework's step a short one runs slower than
# in a loop of its own (docs/performance/measurements.md#benchmark-timing). Rounds still pair up.
BLOCK_S = 0.05
MAX_BLOCK = 8


def steps_per_round(step_s: float) -> int:
    """Measured steps a configuration whose step takes ``step_s`` runs back to back per
    round: about ``BLOCK_S`` of them, 1 to ``MAX_BLOCK``; 1 means no lead step either."""
    if step_s <= 0:
        return MAX_BLOCK
    return max(1, min(MAX_BLOCK, round(BLOCK_S / step_s)))


def timed_block(call: Callable[[], Any], steps: int, timer: Callable = timed) -> float:
    """Seconds of one ``call()`` in a round of ``steps`` measured calls: ``timer(call)`` for
    one, else one unmeasured lead call, then the median of ``steps`` timed ones."""
    if steps <= 1:
        return timer(call)
    timer(call)
    return statistics.median(timer(call) for _ in range(steps))


# PyTorch's OpenMP workers (GNU libgomp) keep spinning on a core for about 10 ms after each call
# returns; XLA's threads go idle at once, so a step timed right after PyTorch's shares the cores
# with that spin (docs/performance/measurements.md#benchmark-timing). Waiting for this process to go
# idle before each configuration's turn gives every one quiet cores.
QUIET_CORES = 0.2
SETTLE_WINDOW_S = 0.002
SETTLE_MAX_S = 0.1


def settle(
    cpu: Callable[[], float] = time.process_time,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Sleep until this process's threads are idle: until one ``SETTLE_WINDOW_S`` sleep
    used under ``QUIET_CORES`` cores of CPU time, or ``SETTLE_MAX_S`` passed. Returns the
    seconds waited."""
    start = clock()
    while True:
        c0, t0 = cpu(), clock()
        sleep(SETTLE_WINDOW_S)
        cores = (cpu() - c0) / max(clock() - t0, 1e-9)
        if cores < QUIET_CORES or clock() - start >= SETTLE_MAX_S:
            return clock() - start


K = TypeVar("K", bound=Hashable)


def interleaved_rounds(
    calls: Mapping[K, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    rotate: bool = False,
    quiet: Callable[[], Any] | None = None,
) -> dict[K, list[float]]:
    """Milliseconds of each blocking call in each round, all called in turn each round (A B
    C A B C ...) after ``warmup`` unmeasured calls each, so every one sees the same machine
    load and round ``i`` of one pairs with round ``i`` of another.

    ``rotate``: round ``i`` starts at call ``i mod n`` (A B C, B C A, C A B, ...), so each
    call follows every other one equally often. Without it a call always runs after the
    same neighbour, and inherits what that one leaves behind (its data in the caches, or
    other memory in them).

    ``quiet``: called before each measured call, e.g. ``settle`` when one of the calls
    leaves threads spinning after it returns (PyTorch on CPU)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"Need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}.")
    for call in calls.values():
        for _ in range(warmup):
            call()
    order = list(calls)
    times: dict[K, list[float]] = {k: [] for k in calls}
    for i in range(repeats):
        shift = i % len(order) if rotate else 0
        for k in order[shift:] + order[:shift]:
            if quiet is not None:
                quiet()
            times[k].append(1e3 * timed(calls[k]))
    return times


def block_rounds(
    cases: Mapping[K, Callable[[], Any]], rounds: int, block: int, warmup: int = 2
) -> dict[K, list[float]]:
    """Per round and case: the mean milliseconds of ``block`` consecutive calls, after one
    unmeasured lead call, once this process is idle (``settle``); every case in turn each
    round, after ``warmup`` unmeasured calls each. Blocks let each side run as in a loop of
    its own rather than right after the other framework's call, whose threads and caches slow
    a millisecond-long call (docs/performance/measurements.md#benchmark-timing)."""
    for run in cases.values():
        for _ in range(warmup):
            run()
    times: dict[K, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            settle()
            run()
            start = time.perf_counter()
            for _ in range(block):
                run()
            times[name].append((time.perf_counter() - start) * 1e3 / block)
    return times


def interleaved_ms(
    calls: Mapping[K, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[K, float]:
    """Median milliseconds of each call over ``interleaved_rounds``."""
    rounds = interleaved_rounds(calls, repeats, warmup)
    return {k: statistics.median(v) for k, v in rounds.items()}


class JaxStep:
    """``fn(*args)`` compiled once for ``backend`` and then called under the guard.

    ``carry``: the output index fed back as argument 0 on the next call (a train step's new
    state), or None when the arguments stay the same. ``donate_argnums`` go to ``jax.jit``.
    ``compiler_options``: XLA options for this executable only.
    """

    def __init__(
        self,
        fn: Callable,
        args: Sequence[Any],
        *,
        donate_argnums: Sequence[int] = (),
        carry: int | None = None,
        backend: str | None = None,
        name: str | None = None,
        compiler_options: dict | None = None,
    ):
        self.name = name or getattr(fn, "__name__", "step")
        self.fn = fn  # the step as given, unwrapped (what make_jaxpr of the step traces)
        self.compiler_options = dict(compiler_options or {}) or None
        self.backend = resolve_backend(backend)
        self.traces = 0
        self.carry = carry
        self.outputs = None

        def counted(*a):
            self.traces += 1  # runs only while JAX traces, never in the compiled step
            return fn(*a)

        # Options given to jit (not to compile()) so that calls reuse the AOT executable.
        self._jitted = jax.jit(
            counted,
            donate_argnums=tuple(donate_argnums),
            compiler_options=self.compiler_options,
        )
        self._args = list(jax.device_put(tuple(args), self.backend.device))
        self.compiled = None

    @property
    def args(self) -> tuple:
        """The arguments the next call passes (a train step's: the state it carries)."""
        return tuple(self._args)

    def lower(self):
        """The step lowered for its arguments (``jax.stages.Lowered``), not compiled."""
        return self._jitted.lower(*self._args)

    def compile(self) -> dict:
        """AOT lower + compile; returns timings, XLA's cost and memory analyses, HLO totals."""
        t0 = time.perf_counter()
        lowered = self.lower()
        t1 = time.perf_counter()
        self.compiled = lowered.compile()
        t2 = time.perf_counter()
        memory = memory_summary(self.compiled) or {}
        try:
            totals = hlo_report(self.compiled.as_text()).totals()
        except Exception:  # a runtime without optimized HLO text still gets timed
            totals = {}
        return {
            "lower_s": t1 - t0,
            "compile_s": (t1 - t0) + (t2 - t1),
            "flops": cost_summary(self.compiled)["flops"],
            "temp_bytes": memory.get("temp_size"),
            "argument_bytes": memory.get("argument_size"),
            "output_bytes": memory.get("output_size"),
            "alias_bytes": memory.get("alias_size"),
            "transposes": totals.get("transposes"),
            "memory_permutations": totals.get("memory_permutations"),
            "converts": totals.get("converts"),
        }

    def __call__(self) -> None:
        """One step, blocked until done; raises ``RecompilationError`` if it retraced."""
        if self.compiled is None:
            raise RuntimeError(f"{self.name}: call compile() before running the step.")
        traces = self.traces
        with watch_compilation() as events:
            out = self._jitted(*self._args)
            jax.block_until_ready(out)
        compiles = events.backend_compiles or 0
        if self.traces != traces or compiles:
            raise RecompilationError(
                f"{self.name} was {'traced' if self.traces != traces else 'compiled'} again "
                "after its ahead-of-time compile: the step's input signature changed between "
                "calls (shapes, dtypes or weak types of the carried state or inputs), so "
                "every call would recompile. Make the step return its state with the same "
                "shapes and dtypes it takes."
            )
        if self.carry is not None:
            self._args[0] = out[self.carry]
        self.outputs = out

    def close(self) -> None:
        self._args = []
        self.outputs = None
