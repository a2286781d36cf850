"""Where the conv plan of an ``"auto"`` run comes from: the autotune cache, a new tuning, or
the shipped table (``nn.conv_algos.default_plan``).

``tune="auto"`` (the default of ``train`` and ``bench``): the cache when it holds every
shape (free), else a tuning when it costs at most ``budget.TUNE_SHARE`` of the run
(``budget.estimate_tuning``), else the shipped table. ``"always"`` tunes what the cache
lacks; ``"never"`` takes the shipped table.
"""

from __future__ import annotations

from typing import NamedTuple

from flax import nnx

from layoutlab.arguments import CONV_TUNE_CHOICES
from layoutlab.bench.tuning.budget import cannot_pay, estimate_tuning
from layoutlab.bench.tuning.cache import device_for
from layoutlab.bench.tuning.convs import autotune_model, candidates_for
from layoutlab.fast_defaults import table_cpu_kind
from layoutlab.nn.conv_algos import ConvPlan
from layoutlab.nn.conv_config import conv_specs, default_conv_plan

__all__ = ["CONV_TUNE_CHOICES", "PlanSource", "conv_plan_for_run"]


class PlanSource(NamedTuple):
    plan: ConvPlan
    source: str  # "cache", "tuned", "table"
    detail: str  # one line for the log


def _table(model, x, objective: str, backend: str, why: str, specs=None) -> PlanSource:
    kind = table_cpu_kind(backend)
    plan = default_conv_plan(model, x, objective, kind, specs)
    counts: dict[str, int] = {}
    for entry in plan.algorithms().values():
        counts[entry] = counts.get(entry, 0) + 1
    shown = ", ".join(f"{a} x{n}" for a, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    where = f"{kind} CPU" if kind else backend
    wide = sum(e.compute_dtype is not None for _, e in plan.items())
    if wide:  # bfloat16 convs on a CPU without bf16 units (default_plan.widened_dtype)
        shown += f"; {wide} widened to float32, this CPU has no bfloat16 units"
    return PlanSource(plan, "table", f"shipped table for {where} ({shown}); {why}")


def conv_plan_for_run(
    model: nnx.Module,
    x,
    *,
    steps: int,
    objective: str = "train",
    tune: str = "auto",
    compiler_options: dict | None = None,
    backend: str | None = None,
    repeats: int = 6,
    warmup: int = 1,
) -> PlanSource:
    """The plan for ``model(x)``'s convs in a run of ``steps`` passes (see the module doc)."""
    if tune not in CONV_TUNE_CHOICES:
        raise ValueError(f"conv tuning must be one of {CONV_TUNE_CHOICES}, got {tune!r}.")
    device = device_for(backend)
    platform = device.platform
    common = dict(objective=objective, compiler_options=compiler_options, backend=backend)
    if tune == "never":
        return _table(model, x, objective, platform, "--conv-tune never")
    specs = conv_specs(model, x)  # traced once, here, for every path below
    cached = autotune_model(model, x, specs=specs, cached_only=True, **common)
    if len(cached.plan) == len(specs):
        return PlanSource(cached.plan, "cache", f"autotune cache ({cached.summary()})")
    if tune == "auto":

        def n_candidates(spec):
            return len(candidates_for(spec, objective=objective, platform=platform))

        rounds = repeats + warmup
        if cannot_pay(specs, steps, platform, n_candidates, rounds):
            why = f"a {steps}-step run is too short for tuning to pay (--conv-tune always)"
            return _table(model, x, objective, platform, why, specs)
        estimate = estimate_tuning(
            specs, steps, n_candidates=n_candidates, rounds=rounds, device=device,
            compiler_options=compiler_options,
        )  # fmt: skip
        if not estimate.pays:
            return _table(model, x, objective, platform, estimate.describe(), specs)
    tuning = autotune_model(model, x, specs=specs, repeats=repeats, warmup=warmup, **common)
    return PlanSource(tuning.plan, "tuned", f"autotuned ({tuning.summary()})")
