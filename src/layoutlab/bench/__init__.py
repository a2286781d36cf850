"""Benchmarks: timed steps, sweeps beside PyTorch, results files, plots and autotuning.

- ``run_sweep(SweepConfig(...))`` -> ``BenchResults`` (flat rows + machine info);
  ``save_results``/``load_results`` write and read ``results.csv``/``results.json``;
  ``plot_all(rows, dir)`` draws the charts; ``markdown_table(rows)`` the summary.
- ``JaxStep``: one step compiled ahead of time and called under a recompilation guard.
- ``autotune(model, batch_size, input_shape, ...)``: the fastest layout x precision whose
  numerics pass, cached on disk; ``autotune_config`` for training; ``ShapeWatcher``;
  ``autotune_model(model, x)``: a ``ConvPlan`` of each conv's fastest algorithm
  (``layoutlab.bench.tuning``).

Names are imported lazily so ``import layoutlab.bench`` stays light (PyTorch is never
imported unless a PyTorch configuration runs).
"""

from __future__ import annotations

from layoutlab.lazy import lazy_exports

_EXPORTS = {
    "SweepConfig": "sweep",
    "run_sweep": "sweep",
    "run_group": "sweep",
    "BenchResults": "results",
    "FIELDS": "results",
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
    "AutotuneResult": "tuning.layout",
    "ShapeChurnWarning": "tuning.shapes",
    "ShapeWatcher": "tuning.shapes",
    "autotune": "tuning.layout",
    "autotune_config": "tuning.layout",
    "cache_key": "tuning.layout",
    "autotune_model": "tuning.convs",
    "ConvTuning": "tuning.convs",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
