"""A sweep's configurations: the points of its axes over its run, each a ``TrainConfig``
(``dataclasses.replace(run, **point)``), made into ``JaxCase``s and grouped with the PyTorch
cases they are timed beside.

A group shares a workload (model, input, mode, batch size) and a precision class; in it the
configurations come in the order of the axes, precision before layout before conv algorithm
(the axes ``CASE_ORDER`` names go innermost, in that order; any other axis outside them).
"""

from __future__ import annotations

import dataclasses
import itertools

from layoutlab.bench.cases import JaxCase, TorchCase, make_workload
from layoutlab.bench.results import precision_class
from layoutlab.bench.sweep_config import (
    MEMORY_FORMATS,
    SweepConfig,
    defaults_label,
    options_for,
    point_input,
)
from layoutlab.train.config import TrainConfig
from layoutlab.xla import resolve_backend

__all__ = ["CASE_ORDER", "points", "sweep_groups"]

# The innermost axes, outermost first: a group's configurations go through its precisions,
# then layouts, then conv algorithms, and groups through batch sizes.
CASE_ORDER = ("batch_size", "precision", "layout", "conv_algorithm")
# What --baseline-plain runs beside each configuration: XLA's own conv, the layout's
# kernels and activations, no compile options.
_PLAIN = {
    "conv_algorithm": "xla",
    "kernel_storage": "layout",
    "activation_storage": "layout",
    "layer_impl": "xla",
    "xla_options": {},
    "cpu_fast": False,
}


def points(config: SweepConfig) -> list[TrainConfig]:
    """Every configuration's run: the sweep's run with each point of its axes, other axes
    outermost (in their order), then ``CASE_ORDER``'s."""
    axes = dict(config.axes)
    order = [a for a in axes if a not in CASE_ORDER] + [a for a in CASE_ORDER if a in axes]
    return [
        dataclasses.replace(config.run, **dict(zip(order, values, strict=True)))
        for values in itertools.product(*(axes[a] for a in order))
    ]


def _case(config: SweepConfig, run: TrainConfig, mode: str, platform: str, label: str):
    shape, classes = point_input(config, run)
    w = make_workload(run.model, run.model_kwargs, shape, classes, mode, run.batch_size)
    options = options_for(config, mode, platform, run.batch_size, run)
    # The options are the ones to compile with: cpu_fast's are in them.
    resolved = dataclasses.replace(run, xla_options=options, cpu_fast=False)
    return JaxCase(w, resolved, label or defaults_label(run, platform), config.conv_tune)


def _jax_cases(config: SweepConfig, mode: str, platform: str) -> list[JaxCase]:
    """The mode's cases in sweep order, each point's plain baseline after the last point
    it stands beside (with ``baseline_plain``)."""
    runs = points(config)
    cases, plains = [], []
    for i, run in enumerate(runs):
        cases.append(_case(config, run, mode, platform, ""))
        if not config.baseline_plain:
            continue
        plain = dataclasses.replace(run, **_PLAIN)
        after = dataclasses.replace(runs[i + 1], **_PLAIN) if i + 1 < len(runs) else None
        if plain != after and plain not in plains:
            plains.append(plain)
            cases.append(_case(config, plain, mode, platform, "plain"))
    return cases


def sweep_groups(config: SweepConfig, torch_device: str | None):
    """``(jax cases, torch cases)`` per group of a validated sweep, in order: modes, then
    the points' workloads and precision classes as they first come."""
    platform = resolve_backend(config.backend).platform
    for mode in config.modes:
        groups: dict = {}
        for case in _jax_cases(config, mode, platform):
            key = (case.workload, precision_class(case.precision))
            groups.setdefault(key, []).append(case)
        for (w, cls), jax_cases in groups.items():
            torch_cases = []
            if torch_device is not None:
                from layoutlab.bench.torch_runner import torch_precisions

                compiled = (False, True) if config.torch_compile else (False,)
                torch_cases = [
                    TorchCase(w, fmt, p, compile=c)
                    for c in compiled
                    for p in torch_precisions(torch_device, cls)
                    for fmt in MEMORY_FORMATS
                ]
            yield jax_cases, torch_cases
