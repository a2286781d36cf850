"""Spread, intervals and stability of step times, without assuming a distribution.

Step times on a shared machine are skewed and have outliers, so everything here is
distribution-free: the dispersion is the interquartile range over the median, the interval
of a median comes from order statistics (the binomial argument behind the sign test), and a
ratio between two configurations is the median of their per-round ratios (they run
interleaved, round by round, so each pair saw the same machine load) with the same kind of
interval. A ratio whose interval contains 1 cannot tell the two apart.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "AUTO_BUDGET_S",
    "CONFIDENCE",
    "MIN_REPEATS",
    "DECISIVE_REPEATS",
    "OTHERS_LIMIT_CORES",
    "OtherLoad",
    "UNSTABLE_DISPERSION",
    "Decision",
    "Interval",
    "decide",
    "dispersion",
    "load_average",
    "median_interval",
    "other_cores",
    "paired_ratio",
    "parse_proc_stat",
    "imprecise",
    "precise_enough",
    "ratio_settled",
    "unstable_reason",
]

CONFIDENCE = 0.95
# IQR / median above this marks a row unstable: on an idle machine a step's spread is a few
# percent, and 10% is where two configurations 10% apart can no longer be told apart.
UNSTABLE_DISPERSION = 0.10
# No verdict (stable, precise, faster) before this many measured rounds: fewer cannot give a
# 95% interval of a median from order statistics at all (0.5**5 * 2 > 0.05).
MIN_REPEATS = 6
# A paired ratio whose interval reaches further than this (relative) from its median on
# either side is imprecise: two stable rows (spread <= UNSTABLE_DISPERSION each) give
# per-round ratios within about twice that, so a wider interval is made of outlier rounds,
# which with few rounds are its ends (at 6-8 rounds the interval is the minimum to the
# maximum): a ResNet-50 row printed 1.01 [1.00, 36.79] from one slow PyTorch round.
IMPRECISE_RATIO = 2 * UNSTABLE_DISPERSION
# Seconds of measured rounds per group under auto repeats. A group that settles stops long before;
# one whose ratio is still undecided needs rounds
# (docs/performance/measurements.md#benchmark-timing).
AUTO_BUDGET_S = 240.0
# Under auto repeats a group whose budget runs out while a ratio to a baseline is still
# undecided goes on to this many rounds: the fewest whose 95% interval of a median leaves
# out the most extreme round on each side (``_order_rank`` is 2 from 9 rounds, 1 below).
# Up to 8 rounds the interval is the whole range, so a single slow round decides it
# (docs/performance/measurements.md#benchmark-timing).
DECISIVE_REPEATS = 9


class Interval(NamedTuple):
    value: float  # the median
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _order_rank(n: int, confidence: float) -> int | None:
    """The largest ``k`` with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2; the
    interval of the median is then the k-th smallest to the k-th largest value."""
    alpha, cdf, k = (1 - confidence) / 2, 0.0, 0
    for j in range(n + 1):
        p = math.comb(n, j) / 2**n
        if cdf + p > alpha:
            break
        cdf += p
        k = j + 1
    return k if k >= 1 else None


def _within(ci: Interval, relative: float) -> bool:
    """Whether ``ci`` stays within ``relative`` of its median on both sides."""
    return max(ci.value - ci.low, ci.high - ci.value) <= relative * ci.value


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """The median and its distribution-free interval; None with too few values."""
    xs = sorted(values)
    k = _order_rank(len(xs), confidence)
    if k is None:
        return None
    return Interval(statistics.median(xs), xs[k - 1], xs[len(xs) - k])


def dispersion(values: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    median = statistics.median(values)
    return (q3 - q1) / median if median > 0 else math.inf


def precise_enough(values: Sequence[float], target: float) -> bool:
    """Whether the median's interval lies within ``target`` (relative) of the median."""
    if len(values) < MIN_REPEATS:
        return False
    ci = median_interval(values)
    return ci is not None and _within(ci, target)


def paired_ratio(slow: Sequence[float], fast: Sequence[float]) -> Interval | None:
    """``slow / fast`` round by round (above 1: ``fast`` is faster), median and interval;
    the rounds are paired by position (both lists from the same interleaved rounds)."""
    n = min(len(slow), len(fast))
    ratios = [s / f for s, f in zip(slow[:n], fast[:n], strict=True) if f > 0]
    return median_interval(ratios)


def ratio_settled(ci: Interval | None, target: float) -> bool:
    """Whether a paired ratio's interval gives a verdict: it lies wholly above or below 1
    (one side is faster), or within ``target`` (relative) of its median (a tie known that
    closely). An interval that contains 1 and is wider than that says neither yet."""
    return ci is not None and (not ci.contains(1.0) or _within(ci, target))


def imprecise(ci: Interval) -> bool:
    """Whether ``ci`` reaches further than ``IMPRECISE_RATIO`` from its median."""
    return max(ci.value - ci.low, ci.high - ci.value) > IMPRECISE_RATIO * ci.value


# Other processes using or waiting for more than this many cores while a group ran make
# it unstable.
OTHERS_LIMIT_CORES = 0.5
# A round that began while this process's own threads were busy (``bench.timing.settle``
# gave up after its cap) shared the cores with them. The median shrugs off a few such
# rounds; past one in ten the row is flagged.
BUSY_TURNS_LIMIT = 0.1
# How often ``OtherLoad`` counts the runnable tasks: often enough for a few hundred samples
# in a minute's group, rarely enough that reading /proc costs well under 1% of a core.
SAMPLE_S = 0.1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not every platform has it
        return None


def parse_proc_stat(text: str) -> tuple[float, int | None]:
    """``(busy_ticks, procs_running)`` from the text of Linux ``/proc/stat``: the ticks all
    CPUs spent busy since boot (everything but idle and iowait) and the number of tasks
    runnable right now (running or waiting for a core)."""
    lines = text.splitlines()
    ticks = [int(x) for x in lines[0].split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    running = None
    for line in lines[1:]:
        if line.startswith("procs_running "):
            running = int(line.split()[1])
    return float(sum(ticks[:8]) - idle), running


def _proc_stat() -> tuple[float, int | None] | None:
    try:
        with open("/proc/stat") as f:
            busy, running = parse_proc_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return busy / os.sysconf("SC_CLK_TCK"), running


def _busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux ``/proc/stat``)."""
    stat = _proc_stat()
    return None if stat is None else stat[0]


def _own_running() -> int | None:
    """This process's threads that are runnable now (state ``R`` in ``/proc/self/task``)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    count = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                # The state follows the command name, which is in parentheses.
                count += f.read().rpartition(")")[2].split()[0] == "R"
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
    return count


def _sample_runnable() -> tuple[int, int] | None:
    stat, own = _proc_stat(), _own_running()
    if stat is None or stat[1] is None or own is None:
        return None
    return stat[1], own


def other_cores(
    busy_s: float, own_s: float, wall_s: float, runnable: Sequence[tuple[int, int]]
) -> float | None:
    """Cores other processes used or waited for over ``wall_s`` seconds: the larger of the
    machine's busy CPU time minus this process's own (``busy_s - own_s``, over the wall
    time) and the mean number of other runnable tasks (``runnable``: samples of
    ``(procs_running, this process's running threads)``).

    The CPU-time share alone misses contention: a process burning one core beside a
    benchmark whose threads fill both cores of a 2-core machine gets only its fair share
    (0.4-0.7 cores, depending on how many threads the benchmark runs), while it is runnable
    all the time, so the runnable count sees the whole core it wants."""
    if wall_s <= 0:
        return None
    used = max(0.0, (busy_s - own_s) / wall_s)
    if not runnable:
        return used
    waiting = sum(max(0, total - own) for total, own in runnable) / len(runnable)
    return max(used, waiting)


class OtherLoad:
    """How many cores other processes kept busy, or wanted, between ``start()`` and
    ``cores()`` (``other_cores``): the machine's busy CPU time (``/proc/stat``) minus this
    process's own (all its threads), and the other runnable tasks, counted every
    ``SAMPLE_S`` seconds by a daemon thread. The 1-minute load average cannot say this: it
    counts the measured process's own threads, and lags by a minute."""

    def __init__(self, sample_s: float = SAMPLE_S):
        self._start = (_busy_seconds(), time.process_time(), time.perf_counter())
        self._samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(sample_s,), daemon=True)
        self._thread.start()

    def _sample(self, sample_s: float) -> None:
        while not self._stop.wait(sample_s):
            sample = _sample_runnable()
            if sample is None:
                return
            self._samples.append(sample)

    def cores(self) -> float | None:
        self._stop.set()
        busy, own, wall = self._start
        now = _busy_seconds()
        if busy is None or now is None:
            return None
        return other_cores(
            now - busy,
            time.process_time() - own,
            time.perf_counter() - wall,
            list(self._samples),
        )


def unstable_reason(
    values: Sequence[float], others: float | None, busy_turns: int = 0
) -> str | None:
    """Why a row's times cannot be trusted, or None: too much spread, other processes
    using or waiting for more than ``OTHERS_LIMIT_CORES`` cores while it was measured, or
    more than ``BUSY_TURNS_LIMIT`` of its rounds starting while this process's own threads
    were still busy (``bench.timing.settle`` gave up waiting)."""
    spread = dispersion(values)
    if spread > UNSTABLE_DISPERSION:
        return f"IQR/median {spread:.0%} > {UNSTABLE_DISPERSION:.0%}"
    if others is not None and others > OTHERS_LIMIT_CORES:
        return f"other processes used {others:.1f} cores"
    if values and busy_turns > BUSY_TURNS_LIMIT * len(values):
        return f"{busy_turns} of {len(values)} rounds began with this process's threads still busy"
    return None


class Decision(NamedTuple):
    """A tuner's choice and why: ``verdict`` is ``"faster"`` (``choice`` beat the default
    with separation), ``"tie"`` (the fastest could not be told from the default: the
    default is kept), ``"default fastest"`` or ``"default failed"``."""

    choice: str
    verdict: str
    fastest: str
    ratio: Interval | None  # default / fastest, per round


def decide(default: str, rounds: dict[str, Sequence[float]]) -> Decision:
    """Keep ``default`` unless another candidate is faster with separation.

    ``rounds[name]``: each passing candidate's times in the same interleaved rounds. The
    test: the 95% interval of the median per-round ratio (default / candidate; the sign
    test's order-statistics interval) must lie above 1. Too few rounds for an interval is
    no evidence, so the default stays.
    """
    if not rounds:
        raise ValueError("decide needs at least one candidate's rounds.")
    fastest = min(rounds, key=lambda name: statistics.median(rounds[name]))
    if default not in rounds:
        return Decision(fastest, "default failed", fastest, None)
    if fastest == default:
        return Decision(default, "default fastest", fastest, None)
    ratio = paired_ratio(rounds[default], rounds[fastest])
    if ratio is not None and ratio.low > 1.0:
        return Decision(fastest, "faster", fastest, ratio)
    return Decision(default, "tie", fastest, ratio)
