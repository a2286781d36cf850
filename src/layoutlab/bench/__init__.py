"""Benchmarks: timed steps, sweeps beside PyTorch, results files, plots and autotuning.

- ``run_sweep(SweepConfig(...))`` -> ``BenchResults`` (flat rows + machine info);
  ``save_results``/``load_results`` write and read ``results.csv``/``results.json``;
  ``plot_all(rows, dir)`` draws the charts; ``markdown_table(rows)`` the summary.
- ``JaxStep``: one step compiled ahead of time and called under a recompilation guard.
- ``autotune(model, batch_size, input_shape, ...)``: the fastest layout x precision whose
  numerics pass, cached on disk; ``autotune_config`` for training; ``ShapeWatcher``;
  ``tuning.autotune_model(model, x)``: a ``ConvPlan`` of each conv's fastest algorithm.

Names are imported lazily so ``import layoutlab.bench`` stays light (PyTorch is never
imported unless a PyTorch configuration runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.bench.jax_runner import JaxRunner
    from layoutlab.bench.machine import machine_info
    from layoutlab.bench.plots import plot_all, plot_memory, plot_ratios, plot_throughput
    from layoutlab.bench.report import markdown_table
    from layoutlab.bench.results import BenchResults, add_torch_ratios, load_results, save_results
    from layoutlab.bench.sweep import SweepConfig, run_group, run_sweep
    from layoutlab.bench.timing import JaxStep, RecompilationError, TimingStats
    from layoutlab.bench.torch_runner import TorchRunner, TorchUnavailable
    from layoutlab.bench.tuning.layout import autotune, autotune_config
    from layoutlab.bench.tuning.shapes import ShapeWatcher

_EXPORTS = {
    "SweepConfig": "sweep",
    "run_sweep": "sweep",
    "run_group": "sweep",
    "BenchResults": "results",
    "save_results": "results",
    "load_results": "results",
    "add_torch_ratios": "results",
    "JaxStep": "timing",
    "RecompilationError": "timing",
    "TimingStats": "timing",
    "JaxRunner": "jax_runner",
    "TorchRunner": "torch_runner",
    "TorchUnavailable": "torch_runner",
    "machine_info": "machine",
    "plot_all": "plots",
    "plot_throughput": "plots",
    "plot_memory": "plots",
    "plot_ratios": "plots",
    "markdown_table": "report",
    "ShapeWatcher": "tuning.shapes",
    "autotune": "tuning.layout",
    "autotune_config": "tuning.layout",
}

__all__ = [
    "BenchResults",
    "JaxRunner",
    "JaxStep",
    "RecompilationError",
    "ShapeWatcher",
    "SweepConfig",
    "TimingStats",
    "TorchRunner",
    "TorchUnavailable",
    "add_torch_ratios",
    "autotune",
    "autotune_config",
    "load_results",
    "machine_info",
    "markdown_table",
    "plot_all",
    "plot_memory",
    "plot_ratios",
    "plot_throughput",
    "run_group",
    "run_sweep",
    "save_results",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
