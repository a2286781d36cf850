"""Benchmark statistics: intervals, the unstable flag, ``repeats="auto"`` and paired ratios.

The step times are synthetic (an injected timer, clock and load sampler), so the tests are
exact and do not depend on how busy the machine is. The median's interval is checked
against SciPy's binomial quantiles, an independent implementation of the same argument.
"""

import json
import random

import numpy as np
import pytest
from scipy import stats as scipy_stats

from layoutlab.bench.report import markdown_table
from layoutlab.bench.results import add_torch_ratios
from layoutlab.bench.stats import (
    DECISIVE_REPEATS,
    MIN_REPEATS,
    UNSTABLE_DISPERSION,
    Interval,
    dispersion,
    imprecise,
    median_interval,
    paired_ratio,
    ratio_settled,
    unstable_reason,
)
from layoutlab.bench.sweep import run_group


@pytest.mark.parametrize("n", [6, 7, 10, 20, 31, 100])
def test_median_interval_matches_the_binomial_order_statistics(n):
    xs = list(range(n))
    ci = median_interval(xs)
    # The k-th order statistic (1-based) with P(Binomial(n, 1/2) <= k - 1) <= 2.5%.
    k = int(scipy_stats.binom.ppf(0.025, n, 0.5))
    if scipy_stats.binom.cdf(k, n, 0.5) > 0.025:
        k -= 1
    assert (ci.low, ci.high) == (xs[k], xs[n - 1 - k])
    assert scipy_stats.binom.cdf(k, n, 0.5) <= 0.025 < scipy_stats.binom.cdf(k + 1, n, 0.5)


def test_too_few_values_give_no_interval_and_no_verdict():
    assert median_interval([1.0] * (MIN_REPEATS - 1)) is None
    assert dispersion([5.0]) == 0.0
    assert dispersion([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4 - 2) / 3)


class Synthetic:
    """A runner whose step times are drawn, not measured: ``timer`` reads them."""

    def __init__(self, name, times, framework="layoutlab", defaults=None):
        self.name, self.times, self.framework = name, iter(times), framework
        self.defaults = defaults

    def row(self):
        return {"framework": self.framework, "batch_size": 8, "name": self.name,
                "defaults": self.defaults}  # fmt: skip

    def setup(self):
        return {}

    def step(self):
        return next(self.times)

    def finish(self):
        return {}

    def close(self):
        pass


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _group(runners, *, others=0.0, budget_s=60.0, repeats="auto", blocks=False):
    clock = FakeClock()

    def timer(step):
        seconds = step()
        clock.now += seconds
        return seconds

    rows = run_group(
        runners, repeats=repeats, warmup=1, clock=clock, timer=timer, load=lambda: 1.0,
        other_load=lambda: (lambda: others), budget_s=budget_s, blocks=blocks,
        quiet=lambda: None,
    )  # fmt: skip
    return {r["name"]: r for r in rows}


def test_auto_repeats_stop_when_precise_and_noise_makes_rows_unstable():
    rng = random.Random(0)
    steady = Synthetic("steady", (0.100 + rng.uniform(-1e-3, 1e-3) for _ in range(10_000)))
    noisy = Synthetic("noisy", (0.100 * rng.choice([0.5, 1.0, 2.0]) for _ in range(10_000)))
    rows = _group([steady, noisy], budget_s=5.0)
    # The noisy runner never gets its median within 3%, so the group runs until the 5 s
    # budget of measured time is spent (both run each round: ~0.1 + ~0.12 s a round).
    assert rows["noisy"]["unstable"] and "IQR/median" in rows["noisy"]["unstable_reason"]
    assert not rows["steady"]["unstable"] and rows["steady"]["dispersion"] < 0.02
    rounds = rows["steady"]["repeats"]
    assert rounds == rows["noisy"]["repeats"] == len(json.loads(rows["steady"]["round_ms"]))
    assert 5.0 / 0.4 < rounds < 5.0 / 0.1 + 2
    alone = _group([Synthetic("steady", (0.1 for _ in range(100)))])
    assert alone["steady"]["repeats"] == MIN_REPEATS  # precise at once: the minimum, no more


def test_a_ratio_is_settled_by_a_verdict_or_a_tie_known_within_the_target():
    assert ratio_settled(Interval(1.10, 1.02, 1.20), 0.03)  # above 1: faster
    assert ratio_settled(Interval(0.90, 0.80, 0.97), 0.03)  # below 1: slower
    assert ratio_settled(Interval(1.00, 0.98, 1.02), 0.03)  # a tie within 3%
    assert not ratio_settled(Interval(1.02, 0.96, 1.05), 0.03)  # neither yet
    assert not ratio_settled(None, 0.03)


# Each median is known within 3% from the first rounds (the times spread 2% either side),
# but the per-round ratio PyTorch / layoutlab is 1.02, 1.02, 0.96 in turn: its interval
# holds 0.96 until the order rank passes the third of rounds at 0.96 (about 35 rounds),
# then reads [1.02, 1.02].
_TORCH = [0.100, 0.102, 0.098] * 400
_OURS = [0.098, 0.100, 0.102] * 400


def test_auto_repeats_go_on_until_each_ratio_to_a_baseline_is_settled():
    unpaired = _group([Synthetic("ours", _OURS), Synthetic("other", _TORCH)])
    assert unpaired["ours"]["repeats"] == MIN_REPEATS  # no baseline: the medians decide

    rows = _group([Synthetic("ours", _OURS), Synthetic("eager", _TORCH, "torch")])
    rounds = rows["ours"]["repeats"]
    assert 30 < rounds < 60 and rows["eager"]["repeats"] == rounds
    ci = paired_ratio(json.loads(rows["eager"]["round_ms"]), json.loads(rows["ours"]["round_ms"]))
    assert ci.low > 1.0 and ci.value == pytest.approx(1.02, abs=1e-3)
    # It stops there: one round fewer had not settled (the loop checks after each round).
    short = paired_ratio(_TORCH[: rounds - 1], _OURS[: rounds - 1])
    assert not ratio_settled(short, 0.03)

    # Plain XLA is a baseline too; a torch.compile row with a clear ratio does not hold the
    # group, the plain row does.
    runners = [Synthetic("ours", _OURS), Synthetic("plain", _TORCH, defaults="plain"),
               Synthetic("compiled", (0.2 for _ in range(1200)), "torch.compile")]  # fmt: skip
    assert _group(runners)["ours"]["repeats"] == rounds
    # Only each family's fastest row is compared (PyTorch's best memory format): a slower
    # eager row with an undecided ratio does not hold the group.
    runners = [Synthetic("ours", _OURS), Synthetic("contiguous", _TORCH, "torch"),
               Synthetic("channels_last", (0.05 for _ in range(1200)), "torch")]  # fmt: skip
    assert _group(runners)["ours"]["repeats"] == MIN_REPEATS

    # The budget still bounds it: 2 s of ~0.2 s rounds.
    capped = _group([Synthetic("ours", _OURS), Synthetic("eager", _TORCH, "torch")], budget_s=2.0)
    assert MIN_REPEATS <= capped["ours"]["repeats"] <= 12


def test_a_spent_budget_with_an_undecided_ratio_still_gets_decisive_repeats():
    # At 8 rounds the 95% interval of a median is the range of the rounds; from 9 it leaves
    # out the most extreme one on each side, so one slow round no longer decides the ratio
    # (docs/guides/benchmarks.md: "goes on to 9 rounds").
    assert DECISIVE_REPEATS == 9
    values = [float(v) for v in range(1, DECISIVE_REPEATS + 1)]
    assert median_interval(values[:-1])[1:] == (1.0, DECISIVE_REPEATS - 1.0)
    assert median_interval(values)[1:] == (2.0, DECISIVE_REPEATS - 1.0)
    # The budget (0.5 s) is spent after the first rounds of ~0.2 s; the ratio to PyTorch is
    # undecided for about 35 rounds (above), so the group runs DECISIVE_REPEATS, no more.
    pair = [Synthetic("ours", _OURS), Synthetic("eager", _TORCH, "torch")]
    assert _group(pair, budget_s=0.5)["ours"]["repeats"] == DECISIVE_REPEATS
    # Without a baseline there is no ratio to decide: the budget stops it at the minimum.
    alone = [Synthetic("ours", _OURS), Synthetic("other", _TORCH)]
    assert _group(alone, budget_s=0.5)["ours"]["repeats"] == MIN_REPEATS
    # A ratio settled at once (PyTorch twice as slow) stops at the minimum too.
    clear = [Synthetic("ours", _OURS), Synthetic("eager", (0.2 for _ in range(99)), "torch")]
    assert _group(clear, budget_s=0.5)["ours"]["repeats"] == MIN_REPEATS


def test_the_documented_auto_budget_is_the_default_of_the_api_and_the_cli():
    from layoutlab.bench import SweepConfig
    from layoutlab.cli import build_parser
    from layoutlab.train.config import TrainConfig

    # docs/guides/benchmarks.md: "--time-budget seconds (240)".
    assert SweepConfig(TrainConfig()).time_budget_s == 240.0
    args = build_parser().parse_args(["bench", "--model", "small_cnn", "--out", "o"])
    assert args.time_budget == 240.0 and args.repeats == "auto"


def test_auto_repeats_stop_at_the_minimum_when_the_ratio_is_clear():
    fast = Synthetic("ours", (0.080 for _ in range(100)))
    rows = _group([fast, Synthetic("eager", (0.100 for _ in range(100)), "torch")])
    assert rows["ours"]["repeats"] == MIN_REPEATS


def test_a_loaded_machine_flags_every_row():
    rows = _group([Synthetic("a", (0.1 for _ in range(100)))], others=1.2, repeats=8)
    assert rows["a"]["unstable"]
    assert rows["a"]["unstable_reason"] == "other processes used 1.2 cores"
    assert rows["a"]["repeats"] == 8 and rows["a"]["other_cores"] == 1.2
    assert unstable_reason([0.1] * 8, others=0.1) is None


def test_other_load_counts_other_processes_not_this_one(monkeypatch):
    from layoutlab.bench import stats

    # Synthetic clocks: over 2 s of wall time the machine was busy for 3 CPU seconds, 1 of
    # them this process's own (its threads): other processes kept 1 core busy.
    readings = {"busy": iter([100.0, 103.0]), "own": iter([10.0, 11.0]), "wall": iter([0, 2])}
    monkeypatch.setattr(stats, "_busy_seconds", lambda: next(readings["busy"]))
    monkeypatch.setattr(stats, "_sample_runnable", lambda: None)  # no run-queue samples
    monkeypatch.setattr(stats.time, "process_time", lambda: next(readings["own"]))
    monkeypatch.setattr(stats.time, "perf_counter", lambda: next(readings["wall"]))
    assert stats.OtherLoad().cores() == 1.0


# /proc/stat of a 2-core machine: 10 s of wall time apart (100 ticks a second), with 3
# tasks runnable at the second reading.
_PROC_STAT = """cpu  {user} 0 {system} {idle} 0 0 0 0 0 0
cpu0 0 0 0 0 0 0 0 0 0 0
intr 0
procs_running {running}
procs_blocked 0
"""


def test_one_busy_core_is_flagged_even_when_it_gets_less_than_its_share():
    from layoutlab.bench.stats import OTHERS_LIMIT_CORES, other_cores, parse_proc_stat

    before = parse_proc_stat(_PROC_STAT.format(user=1000, system=0, idle=5000, running=1))
    after = parse_proc_stat(_PROC_STAT.format(user=2800, system=100, idle=5100, running=3))
    assert before == (1000.0, 1) and after == (2900.0, 3)
    # Over 10 s both cores were busy 19 of 20 core-seconds; the benchmark's own threads
    # took 15 of them, so the process burning a core beside it got 0.4 cores: under the
    # 0.5 limit by CPU time. It was runnable all the time: each sample saw one runnable
    # task that was not the benchmark's (3 runnable, 2 of them its threads).
    busy_s, own_s = (after[0] - before[0]) / 100, 15.0
    assert other_cores(busy_s, own_s, 10.0, []) == pytest.approx(0.4)
    samples = [(3, 2)] * 50 + [(2, 1)] * 50
    burning = other_cores(busy_s, own_s, 10.0, samples)
    assert burning == pytest.approx(1.0)
    assert burning > OTHERS_LIMIT_CORES
    assert unstable_reason([0.1] * 8, burning) == "other processes used 1.0 cores"
    # An idle machine: only the benchmark's own threads were ever runnable.
    idle = other_cores(0.5 + own_s, own_s, 10.0, [(2, 2)] * 99 + [(3, 2)])
    assert idle == pytest.approx(0.05) and unstable_reason([0.1] * 8, idle) is None


def _pair(layoutlab_ms, torch_ms):
    common = {"model": "m", "model_kwargs": "{}", "input_shape": "8x8x1", "mode": "train",
              "batch_size": 8, "precision_class": "fp32", "status": "ok"}  # fmt: skip
    ll = {**common, "framework": "layoutlab", "images_per_sec": 8e3 / np.median(layoutlab_ms),
          "round_ms": json.dumps(layoutlab_ms)}  # fmt: skip
    pt = {**common, "framework": "torch", "images_per_sec": 8e3 / np.median(torch_ms),
          "round_ms": json.dumps(torch_ms), "memory_format": "contiguous",
          "precision": "fp32"}  # fmt: skip
    return add_torch_ratios([ll, pt])[0]


def test_ratios_carry_intervals_and_say_when_they_cannot_tell():
    rng = random.Random(1)
    torch_ms = [100 * rng.uniform(0.8, 1.2) for _ in range(12)]
    # Clearly faster: 20% less time in every round.
    faster = _pair([t * 0.8 for t in torch_ms], torch_ms)
    assert faster["ratio_verdict"] == "faster" and faster["ratio_ci_low"] > 1.2
    # The same times up to noise larger than any difference: no verdict.
    same = _pair([t * rng.uniform(0.9, 1.11) for t in torch_ms], torch_ms)
    assert same["ratio_verdict"] == "indistinguishable"
    assert same["ratio_ci_low"] <= 1.0 <= same["ratio_ci_high"]
    # Noise of +-20-25% per round: the interval reaches past 20%, too wide to call it even.
    factors = [0.7, 0.75, 0.8, 0.9, 1.0, 1.0, 1.0, 1.05, 1.15, 1.25, 1.3, 1.35]
    noisy = _pair([t * f for t, f in zip(torch_ms, factors, strict=True)], torch_ms)
    assert noisy["ratio_ci_high"] > 1.2 * noisy["ratio_vs_torch_best"]
    assert noisy["ratio_verdict"] == "not trustworthy (imprecise)"
    interval = paired_ratio(torch_ms, [t * 0.8 for t in torch_ms])
    assert interval.value == pytest.approx(1.25)


def test_the_ratio_lies_inside_its_own_interval():
    # Rounds where the ratio of the medians (1.0: both medians are 100 ms) and the median of
    # the per-round ratios (about 1.25: layoutlab is faster in most rounds, slow in a few)
    # disagree; the point printed must be the latter, the one the interval is about.
    torch_ms = [100, 100, 100, 100, 100, 100, 100, 101, 99, 102, 98, 100]
    layoutlab_ms = [80, 80, 81, 79, 80, 100, 100, 100, 120, 125, 130, 135]
    row = _pair(layoutlab_ms, torch_ms)
    assert np.median(torch_ms) / np.median(layoutlab_ms) == pytest.approx(1.0)
    ratios = np.array(torch_ms) / np.array(layoutlab_ms)
    assert row["ratio_vs_torch_best"] == pytest.approx(np.median(ratios))
    assert row["ratio_ci_low"] <= row["ratio_vs_torch_best"] <= row["ratio_ci_high"]
    rng = random.Random(3)
    for _ in range(50):
        t = [100 * rng.uniform(0.5, 1.5) for _ in range(rng.randint(6, 20))]
        ll = [100 * rng.uniform(0.5, 1.5) for _ in t]
        r = _pair(ll, t)
        assert r["ratio_ci_low"] <= r["ratio_vs_torch_best"] <= r["ratio_ci_high"]


def test_an_unstable_row_prints_its_ratio_as_not_trustworthy():
    torch_ms = [100.0 + i % 3 for i in range(12)]
    row = {**_pair([t * 0.8 for t in torch_ms], torch_ms), "layout": "NHWC",
           "precision": "fp32", "step_ms_median": 80.0, "unstable": True,
           "unstable_reason": "other processes used 1.0 cores"}  # fmt: skip
    assert "(not trustworthy: unstable)" in markdown_table([row])
    row["unstable"] = False  # stable itself, but the PyTorch row it is compared with is not
    common = {"model": "m", "model_kwargs": "{}", "input_shape": "8x8x1", "mode": "train",
              "batch_size": 8, "precision_class": "fp32", "status": "ok"}  # fmt: skip
    torch_row = {**common, "framework": "torch", "images_per_sec": 80.0, "unstable": True,
                 "round_ms": json.dumps(torch_ms), "memory_format": "contiguous",
                 "precision": "fp32"}  # fmt: skip
    ll = {**common, "framework": "layoutlab", "images_per_sec": 100.0,
          "round_ms": json.dumps([t * 0.8 for t in torch_ms])}  # fmt: skip
    assert add_torch_ratios([ll, torch_row])[0]["ratio_verdict"] == "not trustworthy (unstable)"
    stable = {**row, "ratio_verdict": "faster"}
    assert "not trustworthy" not in markdown_table([stable])


def test_a_ratio_made_of_outlier_rounds_is_flagged_imprecise():
    # Two stable rows (spread well under 10%), six rounds, one PyTorch round 36x slow: the
    # order-statistics interval of 6 rounds is the minimum to the maximum, so it reaches
    # 36x. The rows are not unstable, but the ratio must not be quoted.
    torch_ms = [100.0, 101.0, 99.0, 100.0, 3600.0, 100.0]
    layoutlab_ms = [100.0, 99.0, 100.0, 101.0, 98.0, 100.0]
    assert dispersion(torch_ms) < UNSTABLE_DISPERSION
    row = _pair(layoutlab_ms, torch_ms)
    assert row["ratio_ci_high"] > 30 and row["ratio_verdict"] == "not trustworthy (imprecise)"
    table = markdown_table([{**row, "layout": "NHWC", "precision": "fp32",
                             "step_ms_median": 100.0}])  # fmt: skip
    assert "(not trustworthy: interval too wide" in table
    # The same rounds without the outlier: a tight interval keeps its verdict.
    torch_ms[4] = 100.0
    assert _pair(layoutlab_ms, torch_ms)["ratio_verdict"] == "indistinguishable"
    # The bound: 20% either side of the median, twice the spread that makes a row unstable.
    assert not imprecise(Interval(1.0, 0.81, 1.19)) and imprecise(Interval(1.0, 0.95, 1.21))
    assert imprecise(Interval(1.0, 0.79, 1.0))


def test_the_table_shows_intervals_and_unstable_rows():
    row = {"framework": "layoutlab", "mode": "train", "batch_size": 8, "layout": "NHWC",
           "precision": "fp32", "status": "ok", "images_per_sec": 80.0, "step_ms_median": 100.0,
           "step_ms_ci_low": 95.0, "step_ms_ci_high": 104.0, "dispersion": 0.31,
           "unstable": True, "unstable_reason": "IQR/median 31% > 10%",
           "ratio_vs_torch_best": 1.02, "ratio_ci_low": 0.97, "ratio_ci_high": 1.08,
           "ratio_verdict": "indistinguishable"}  # fmt: skip
    table = markdown_table([row])
    assert "100.00 [95.00, 104.00]" in table and "31.0%" in table
    assert "1.02 [0.97, 1.08] (same)" in table
    assert "**unstable**: IQR/median 31% > 10%" in table


def test_plots_mark_unstable_rows(tmp_path):
    from layoutlab.bench.plots import plot_all

    base = {"model": "m", "model_kwargs": "{}", "input_shape": "8x8x1", "mode": "train",
            "layout": "NHWC", "precision": "fp32", "status": "ok", "images_per_sec": 80.0,
            "temp_bytes": 1, "argument_bytes": 1}  # fmt: skip
    rows = [
        {**base, "framework": "layoutlab", "batch_size": 8, "unstable": True,
         "ratio_vs_torch_best": 1.1, "ratio_ci_low": 1.15, "ratio_ci_high": 1.3},
        {**base, "framework": "layoutlab", "batch_size": 16, "unstable": False,
         "ratio_vs_torch_best": 1.2, "ratio_ci_low": 1.1, "ratio_ci_high": 1.3},
    ]  # fmt: skip
    paths = plot_all(rows, tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "memory.png", "ratio_vs_torch.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_decide_keeps_the_default_without_separation():
    from layoutlab.bench.stats import decide

    rng = random.Random(2)
    default = [100 * rng.uniform(0.7, 1.3) for _ in range(10)]
    noisy = [100 * rng.uniform(0.65, 1.3) for _ in range(10)]
    clear = [t * 0.7 for t in default]
    tie = decide("xla", {"xla": default, "other": noisy})
    assert tie.choice == "xla" and tie.verdict in ("tie", "default fastest")
    win = decide("xla", {"xla": default, "other": noisy, "fast": clear})
    assert (win.choice, win.verdict) == ("fast", "faster") and win.ratio.low > 1.4
    few = decide("xla", {"xla": default[:3], "fast": clear[:3]})
    assert (few.choice, few.verdict, few.ratio) == ("xla", "tie", None)
    assert decide("xla", {"fast": clear}).verdict == "default failed"


def test_roofline_peaks_and_each_rows_share_of_them():
    from layoutlab.bench.results import add_roofline
    from layoutlab.bench.roofline import measure_peaks

    peaks = measure_peaks("cpu", torch=True)
    # A 1024^3 float32 matmul is compute-bound on any CPU this runs on; both libraries reach
    # a real rate, and the copy moves more than a GB/s.
    assert peaks["xla_matmul_gflops"] > 1 and peaks["copy_gb_per_s"] > 1
    assert peaks["peak_gflops"] == max(peaks["xla_matmul_gflops"], peaks["torch_matmul_gflops"])
    common = {"model": "m", "model_kwargs": "{}", "input_shape": "8x8x1", "mode": "train",
              "batch_size": 8, "status": "ok", "step_ms_median": 10.0}  # fmt: skip
    ll = {**common, "framework": "layoutlab", "flops": 2e9, "gflops_per_sec": 200.0}
    pt = {**common, "framework": "torch", "step_ms_median": 20.0}
    ll, pt = add_roofline([ll, pt], {"peak_gflops": 400.0})
    # The PyTorch row of the same workload is credited with XLA's FLOP count.
    assert pt["flops"] == 2e9 and pt["gflops_per_sec"] == pytest.approx(100.0)
    assert (ll["pct_of_peak"], pt["pct_of_peak"]) == (pytest.approx(50.0), pytest.approx(25.0))
    table = markdown_table([{**ll, "layout": "NHWC", "precision": "fp32"}])
    assert "200.0 (50%)" in table


def test_short_steps_run_in_blocks_so_another_frameworks_step_does_not_slow_them():
    # A step right after another runner's takes 10 ms, back to back with itself 4 ms (the
    # state the other left: caches, threads). Step by step each round reads the 10 ms;
    # with blocks, one unmeasured lead step, then steps of its own loop, 4 ms.
    from layoutlab.bench.timing import MAX_BLOCK, steps_per_round

    class AfterOther(Synthetic):
        last = [None]

        def __init__(self, name):
            super().__init__(name, ())

        def step(self):
            after_other = AfterOther.last[0] not in (None, self.name)
            AfterOther.last[0] = self.name
            return 0.010 if after_other else 0.004

    def group(blocks):
        AfterOther.last[0] = None
        return _group([AfterOther("a"), AfterOther("b")], repeats=8, blocks=blocks)

    step_by_step, blocked = group(False), group(True)
    for name in "ab":
        assert step_by_step[name]["step_ms_median"] == pytest.approx(10.0)
        assert step_by_step[name]["steps_per_round"] == 1
        assert blocked[name]["step_ms_median"] == pytest.approx(4.0)
        assert len(json.loads(blocked[name]["round_ms"])) == blocked[name]["repeats"] == 8
    # Each block holds about 50 ms of the warm step: "a" warmed up first (4 ms: 12, capped),
    # "b" right after it (10 ms: 5).
    assert (blocked["a"]["steps_per_round"], blocked["b"]["steps_per_round"]) == (MAX_BLOCK, 5)
    # About 50 ms of steps a round, at most MAX_BLOCK; a step of 50 ms or more runs alone.
    got = [steps_per_round(s) for s in (0.0, 0.004, 0.013, 0.03, 0.05, 2.0)]
    assert got == [MAX_BLOCK, MAX_BLOCK, 4, 2, 1, 1]


def test_a_group_waits_for_quiet_cores_before_each_runners_turn():
    # A runner that leaves threads spinning after its step (PyTorch's OpenMP workers) slows
    # the next runner's step while they spin; run_group calls quiet() before every turn of
    # a group of several, so the spin is over before the clock starts. Alone, no waiting.
    seen = []

    class Logged(Synthetic):
        def step(self):
            seen.append(self.name)
            return 0.01

    run_group([Logged("a", ()), Logged("b", ())], repeats=3, warmup=1, load=lambda: 1.0,
              other_load=lambda: (lambda: 0.0), timer=lambda step: step(),
              quiet=lambda: seen.append("."))  # fmt: skip
    assert "".join(seen) == ".a.b" * 4  # the warm-up round, then 3 measured ones
    seen.clear()
    run_group([Logged("a", ())], repeats=3, warmup=1, load=lambda: 1.0,
              other_load=lambda: (lambda: 0.0), quiet=lambda: seen.append("."))  # fmt: skip
    assert "".join(seen) == "aaaa"


def test_rounds_begun_with_the_process_still_busy_make_a_row_unstable():
    # settle gives up at SETTLE_MAX_S: a thread of the process's own kept a core busy, so
    # that turn shared the cores. Past one round in ten the row says so; a few do not.
    from layoutlab.bench.stats import BUSY_TURNS_LIMIT
    from layoutlab.bench.timing import SETTLE_MAX_S

    def group(waits):
        waits = iter(waits)
        return {r["name"]: r for r in run_group(
            [Synthetic("a", (0.1 for _ in range(100))), Synthetic("b", (0.1 for _ in range(100)))],
            repeats=20, warmup=1, load=lambda: 1.0, other_load=lambda: (lambda: 0.0),
            timer=lambda step: step(), quiet=lambda: next(waits),
        )}  # fmt: skip

    # Warm-up turns (a, b) do not count; then 20 rounds of (a, b).
    always = group([SETTLE_MAX_S] * 42)
    assert always["a"]["busy_turns"] == always["b"]["busy_turns"] == 20
    assert always["a"]["unstable"] and "20 of 20 rounds began" in always["a"]["unstable_reason"]
    few = int(BUSY_TURNS_LIMIT * 20)  # 2 of 20 for "a": at the limit, not past it
    some = group([SETTLE_MAX_S] * 2 + [SETTLE_MAX_S, 0.002] * few + [0.002] * 50)
    assert some["a"]["busy_turns"] == few and not some["a"]["unstable"]
    assert some["b"]["busy_turns"] == 0
    quiet = group([0.002] * 42)
    assert quiet["a"]["busy_turns"] == 0 and not quiet["a"]["unstable"]
