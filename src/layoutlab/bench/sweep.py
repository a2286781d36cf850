"""The sweep: a run over axes of its fields (layout x precision x batch size x conv
algorithm, ...) x mode on one backend (``bench.sweep_cases``), with PyTorch side by side.

Configurations run in groups that share a workload (model, input, mode, batch size,
precision class): every layoutlab and PyTorch configuration of a group is set up, warmed up,
and then timed round-robin, A B A B, so the layoutlab/PyTorch ratios come from the same
minutes of the same machine. A configuration with a short step runs a block of steps per
round (``bench.timing.steps_per_round``), so that it is timed as in a loop of its own. A
configuration that fails becomes an ``oom`` or ``error`` row and the sweep goes on; bad
arguments fail before anything runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.results import BenchResults, add_roofline, add_torch_ratios, variant
from layoutlab.bench.stats import (
    AUTO_BUDGET_S,
    DECISIVE_REPEATS,
    MIN_REPEATS,
    OtherLoad,
    dispersion,
    load_average,
    median_interval,
    paired_ratio,
    precise_enough,
    ratio_settled,
    unstable_reason,
)
from layoutlab.bench.status import OK, SKIPPED, classify_failure
from layoutlab.bench.step_limit import predicted_step_s, skip_message
from layoutlab.bench.sweep_cases import sweep_groups
from layoutlab.bench.sweep_checks import validate
from layoutlab.bench.sweep_config import (
    SweepConfig,
    check_compile_options,
    config_dict,
    resolve_input,
)
from layoutlab.bench.timing import (
    SETTLE_MAX_S,
    settle,
    steps_per_round,
    summarize,
    timed,
    timed_block,
)
from layoutlab.xla import resolve_backend

__all__ = [
    "SweepConfig",
    "check_compile_options",
    "resolve_input",
    "run_group",
    "run_sweep",
    "validate",
]


def _interleave(*lists):
    """A1 B1 A2 B2 ...: the frameworks alternate in the timing rounds."""
    return [x for xs in itertools.zip_longest(*lists) for x in xs if x is not None]


def _row(runner, fields: dict, status: str = OK, error: str | None = None) -> dict:
    return {**runner.row(), **fields, "status": status, "error": error}


def _timing_fields(
    seconds: list[float], batch: int, flops, warmup: int, load, others, busy: int = 0
) -> dict:
    stats = summarize(seconds)
    ms = [1e3 * s for s in seconds]
    ci = median_interval(ms)
    reason = unstable_reason(ms, others, busy)
    out = {
        "repeats": len(seconds),
        "warmup": warmup,
        "step_ms_median": stats.median_ms,
        "step_ms_min": stats.min_ms,
        "step_ms_max": stats.max_ms,
        "step_ms_ci_low": None if ci is None else ci.low,
        "step_ms_ci_high": None if ci is None else ci.high,
        "dispersion": dispersion(ms),
        "load_avg": load,
        "other_cores": others,
        "unstable": reason is not None,
        "unstable_reason": reason,
        "round_ms": json.dumps([round(x, 4) for x in ms]),
        "busy_turns": busy,
        "images_per_sec": batch / (stats.median_ms / 1e3),
    }
    if flops:
        out["gflops_per_sec"] = flops / (stats.median_ms / 1e3) / 1e9
    return out


@dataclasses.dataclass
class _Live:
    runner: object
    fields: dict
    seconds: list = dataclasses.field(default_factory=list)
    failure: tuple[str, str] | None = None
    warm_s: float = 0.0  # the last warm-up step
    block: int = 1  # measured steps per round
    busy: int = 0  # measured turns that began with the process still busy (settle's cap)


def _baseline(row: dict) -> str | None:
    """The baseline family a row belongs to (PyTorch eager, torch.compile, plain XLA), or
    None for a layoutlab row that is measured against them."""
    if row.get("framework") != "layoutlab":
        return row.get("framework")
    return "plain" if row.get("defaults") == "plain" else None


def _comparisons(entries: list[_Live]) -> list[tuple[list[float], list[float]]]:
    """``(baseline rounds, layoutlab rounds)`` for the ratios a group's readers look at:
    each layoutlab row that is not a baseline against the fastest row so far (by median)
    of each baseline family in the group, as ``results.add_torch_ratios`` picks PyTorch's
    best. Both lists come from the same interleaved rounds."""
    families: dict[str, list[_Live]] = {}
    ours = []
    for e in entries:
        family = _baseline(e.runner.row())
        (families.setdefault(family, []) if family else ours).append(e)
    best = [
        min(members, key=lambda e: statistics.median(e.seconds))
        for members in families.values()
        if all(e.seconds for e in members)
    ]
    return [(b.seconds, o.seconds) for o in ours for b in best]


def _ratios_settled(entries: list[_Live], target: float) -> bool:
    """Whether every comparison's paired ratio is settled (``bench.stats.ratio_settled``)."""
    return all(
        ratio_settled(paired_ratio(base, ours), target) for base, ours in _comparisons(entries)
    )


def _settled(entries: list[_Live], target: float) -> bool:
    """Whether auto repeats may stop: every median known within ``target`` and every
    comparison's paired ratio settled: a median known to 3% can still leave a 5-10%
    difference undecided when the rounds are few."""
    if not all(precise_enough(e.seconds, target) for e in entries):
        return False
    return _ratios_settled(entries, target)


def run_group(
    runners,
    *,
    repeats: int | str,
    warmup: int,
    log: Callable[[str], None] | None = None,
    max_step_s: float | None = None,
    observed: dict | None = None,
    target: float = 0.03,
    budget_s: float = AUTO_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
    timer: Callable[[Callable], float] = timed,
    load: Callable[[], float | None] = load_average,
    other_load: Callable[[], Callable[[], float | None]] = lambda: OtherLoad().cores,
    blocks: bool = False,
    quiet: Callable[[], Any] = settle,
):
    """Set up, warm up, then time ``runners`` round-robin; one row each, failures included.

    ``repeats="auto"``: at least ``MIN_REPEATS`` rounds, then more until every runner's
    median is known within ``target`` (its 95% interval, ``bench.stats``) and every ratio of
    a layoutlab row to a baseline in the group is settled (``_settled``), or the measured
    rounds have taken ``budget_s``; past the budget a group with a ratio still undecided
    goes on to ``DECISIVE_REPEATS`` rounds. A runner whose first measured step takes longer than
    ``max_step_s`` stops there and gets a ``skipped`` row. ``observed[runner]`` receives
    each runner's median step time. ``clock`` times the budget, ``timer(step)`` a step and
    ``load()`` samples the load average and ``other_load()`` starts a meter of the cores
    other processes use (``bench.stats.OtherLoad``; tests pass synthetic ones).
    ``blocks``: a runner whose warm step is short runs several steps per round, the round's
    time their median after an unmeasured lead step (``bench.timing.steps_per_round``).
    ``quiet()`` runs before each runner's turn when the group has several, so that none
    starts while another's threads still spin (``bench.timing.settle``); a turn it
    returned from only at ``SETTLE_MAX_S`` counts in the row's ``busy_turns``.
    """
    rows, live = [], []
    for r in runners:
        began = time.perf_counter()
        try:
            live.append(_Live(r, r.setup()))
        except Exception as err:  # each configuration fails on its own
            rows.append(_row(r, {}, *classify_failure(err)))
            r.close()
        # A group's rows come only once all of it is timed; this line shows where a run that
        # is stopped early (a time limit, a lost machine) spent its time.
        if log is not None:
            log(f"{_what(r.row())} set up in {time.perf_counter() - began:.1f} s")

    def run(entry: _Live, measured: bool) -> None:
        if len(live) > 1:
            waited = quiet()
            if measured and waited is not None and waited >= SETTLE_MAX_S:
                entry.busy += 1
        try:
            t = timed_block(entry.runner.step, entry.block, timer)
        except Exception as err:
            entry.failure = classify_failure(err)
            entry.runner.close()
            return
        if not measured:
            entry.warm_s = t
            return
        entry.seconds.append(t)
        # Only the first measured step decides: warm-up steps carry one-time costs, and
        # one slow step later on is noise, not a slow configuration.
        if max_step_s is not None and len(entry.seconds) == 1 and t > max_step_s:
            entry.failure = (
                SKIPPED,
                f"stopped: a measured step took {t:.1f} s, over the max_step_s limit of "
                f"{max_step_s:g} s",
            )
            entry.runner.close()

    def round_(measured: bool) -> None:
        for entry in live:
            if entry.failure is None:
                run(entry, measured)

    load_before = load()
    for _ in range(warmup):
        round_(False)
    for entry in live:
        entry.block = steps_per_round(entry.warm_s) if blocks and warmup else 1
    others_meter = other_load()
    started, done = clock(), 0
    while True:
        active = [e for e in live if e.failure is None]
        if repeats != "auto":
            enough = done >= repeats
        else:
            spent = clock() - started >= budget_s
            enough = done >= MIN_REPEATS and (
                _settled(active, target)
                or (spent and (done >= DECISIVE_REPEATS or _ratios_settled(active, target)))
            )
        if enough or not active:
            break
        round_(True)
        done += 1
    others = others_meter()
    loads = [x for x in (load_before, load()) if x is not None]
    group_load = max(loads) if loads else None
    for entry in live:
        r = entry.runner
        if observed is not None and entry.seconds:
            observed[r] = summarize(entry.seconds).median_ms / 1e3
        if entry.failure is not None:
            rows.append(_row(r, entry.fields, *entry.failure))
            continue
        try:
            fields = {**entry.fields, **r.finish()}
            batch = r.row()["batch_size"]
            fields.update(
                _timing_fields(
                    entry.seconds,
                    batch,
                    fields.get("flops"),
                    warmup,
                    group_load,
                    others,
                    entry.busy,
                ),
                steps_per_round=entry.block,
            )
            rows.append(_row(r, fields))
        except Exception as err:
            rows.append(_row(r, entry.fields, *classify_failure(err)))
        finally:
            r.close()
    if log is not None:
        for row in rows:
            log(_describe(row))
    return rows


def _what(row: dict) -> str:
    return (
        f"{row['framework']:<13} {row['mode']:<5} b={row['batch_size']:<4} "
        f"{row['layout']:<5} {row['precision']:<10} {variant(row)}"
    )


def _describe(row: dict) -> str:
    what = _what(row)
    if row["status"] != OK:
        return f"{what} {row['status'].upper()}: {(row.get('error') or '')[:160]}"
    return (
        f"{what} {row['images_per_sec']:10.1f} img/s  median {row['step_ms_median']:.2f} ms "
        f"(min {row['step_ms_min']:.2f}, max {row['step_ms_max']:.2f})"
    )


def _torch_device(config: SweepConfig, notes: list[str]) -> str | None:
    if not config.torch:
        return None
    from layoutlab.bench.torch_runner import TorchUnavailable, require_torch, torch_device

    try:
        require_torch()
        return torch_device(resolve_backend(config.backend).platform)
    except (TorchUnavailable, RuntimeError) as err:
        notes.append(str(err))
        return None


def run_sweep(
    config: SweepConfig,
    *,
    jax_runner: Callable | None = None,
    torch_runner: Callable | None = None,
    log: Callable[[str], None] | None = None,
    peaks: dict | None = None,
) -> BenchResults:
    """Run every configuration of ``config``; returns all rows (ok, oom and error).

    ``jax_runner(case)``/``torch_runner(case, device)`` build the runners (defaults:
    ``JaxRunner``/``TorchRunner``); tests pass fakes. ``peaks``: the machine's limits
    (``bench.roofline.measure_peaks``), measured here when ``config.roofline`` and the
    default runners are used; every ok row then gets ``pct_of_peak``.
    """
    config = validate(config)
    measure_peaks_here = peaks is None and config.roofline and jax_runner is None
    notes: list[str] = []
    device = _torch_device(config, notes)
    for note in notes:
        if log is not None:
            log(f"note: {note}")
    if jax_runner is None:
        from layoutlab.bench.jax_runner import JaxRunner

        # The steps a case runs, which a conv tuning (conv_tune="auto") must pay for.
        steps = config.warmup + (MIN_REPEATS if config.repeats == "auto" else config.repeats)
        jax_runner = lambda case: JaxRunner(
            case,
            backend=config.backend,
            conv_tune_repeats=config.conv_tune_repeats,
            log=log,
            steps=steps,
            pack_convs=config.pack_kernels,
        )
    if torch_runner is None and device is not None:
        from layoutlab.bench.torch_runner import TorchRunner

        torch_runner = lambda case, dev: TorchRunner(case, device=dev)
    machine = machine_info(config.backend, note=config.note)
    if measure_peaks_here:
        from layoutlab.bench.roofline import measure_peaks

        peaks = measure_peaks(config.backend, torch=device is not None)
        if log is not None:
            log(f"peak: {peaks['peak_gflops']:.0f} GFLOP/s float32 matmul, "
                f"{peaks['copy_gb_per_s']:.1f} GB/s copy")  # fmt: skip
    rows, history = [], []
    for jax_cases, torch_cases in sweep_groups(config, device):
        runners = _interleave(
            [jax_runner(c) for c in jax_cases], [torch_runner(c, device) for c in torch_cases]
        )
        if config.max_step_s is not None:
            keep = []
            for r in runners:
                guess = predicted_step_s(r.row(), history)
                if guess is not None and guess[0] > config.max_step_s:
                    message = skip_message(guess[0], guess[1], config.max_step_s)
                    rows.append(_row(r, {}, SKIPPED, message))
                    if log is not None:
                        log(_describe(rows[-1]))
                else:
                    keep.append(r)
            runners = keep
        observed: dict = {}
        rows.extend(
            run_group(
                runners,
                repeats=config.repeats,
                warmup=config.warmup,
                target=config.target,
                budget_s=config.time_budget_s,
                log=log,
                max_step_s=config.max_step_s,
                observed=observed,
                blocks=True,
            )
        )
        history.extend((r.row(), seconds) for r, seconds in observed.items())
    machine = finish_machine_info(machine)
    machine["sweep"] = config_dict(config)
    machine["peaks"] = peaks
    return BenchResults(machine, add_roofline(add_torch_ratios(rows), peaks), notes)
