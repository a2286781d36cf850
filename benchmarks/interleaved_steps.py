"""What the interleaved step benchmarks share: a workload by model name, a runner for one
labelled NHWC fp32 case (optionally with the conv table swapped while it is set up), a
row's median step time as a table cell, and a results file.

Imported by this folder's interleaved step benchmarks, such as ``step_variants.py``
(scripts of this folder, so a plain import finds it), and by some in ``archive/`` (run
those with ``PYTHONPATH=benchmarks``).
"""

from __future__ import annotations

import json
from pathlib import Path

from layoutlab import get_policy, models
from layoutlab.arguments import parse_model_args
from layoutlab.bench.cases import JaxCase, Workload, make_workload
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.bench.machine import finish_machine_info
from layoutlab.bench.stats import paired_ratio
from layoutlab.bench.sweep import run_group
from layoutlab.bench.sweep_config import resolve_input
from layoutlab.fast_defaults import cpu_kind
from layoutlab.nn.conv_algos import default_plan
from layoutlab.train import program

# model -> (model kwargs, input shape, classes): ResNet-18 on CIFAR, ResNet-50 on ImageNet.
_INPUTS = {
    "resnet18": ({"stem": "cifar"}, (32, 32, 3), 10),
    "resnet50": ({"stem": "imagenet"}, (224, 224, 3), 1000),
}


def workload(model: str, mode: str, batch: int) -> Workload:
    """``model``'s workload: ResNet-18 CIFAR at 32x32, ResNet-50 ImageNet at 224x224, any
    other registered model at its default input (``layoutlab models``; U-Net's training
    step with a label per pixel, the 3D CNN on clips) with 10 classes. ``model`` may add
    builder options, read as ``--model-arg`` reads them (``arguments.parse_model_args``):
    ``"unet:width=64"``, ``"resnet18:width=16"``; a ``stem`` among them
    sets the input as ``layoutlab bench --stem`` does (``"resnet34:stem=imagenet"``: 224x224,
    1000 classes)."""
    name, *options = model.split(":")
    kwargs, shape, classes = _INPUTS.get(name, ({}, models.spec(name).default_input, 10))
    extra = parse_model_args(options)
    kwargs = {**kwargs, **extra}
    if "stem" in extra:
        shape, classes = resolve_input(name, kwargs)
    return make_workload(name, kwargs, shape, classes, mode, batch)


def bench_options(w: Workload, optimizer: str = "pytorch", precision: str | None = None) -> dict:
    """The XLA:CPU compile options ``layoutlab bench`` gives ``w``'s step in ``precision`` (a
    policy name; None: not known): they depend on the model's largest activation at this
    batch (at small batches a training step leaves elementwise fusions to XLA's loops) and on
    whether the shipped table runs the step's convs on oneDNN, which the policy's compute
    dtype decides, so ``cpu_fast_options`` without them is another configuration."""
    shape = (*w.spatial, w.channels)
    dtype = None if precision is None else get_policy(precision).compute_dtype
    return models.model_compile_options(
        w.model, w.kwargs, w.mode, "cpu", optimizer, w.batch_size, shape, compute_dtype=dtype
    )


def runner(w: Workload, label: str, options: dict, *, optimizer: str = "pytorch",
           algo: str = "auto", cls=JaxRunner, backend: str = "cpu",
           precision: str = "fp32") -> JaxRunner:  # fmt: skip
    """A ``cls`` runner of ``w`` on ``backend`` in NHWC ``precision`` (a policy name) with
    HWIO kernels, conv algorithm ``algo`` (no tuning), compile ``options`` and
    ``optimizer``, labelled ``label``; 20 steps."""
    case = JaxCase.of(w, optimizer, layout="NHWC", precision=precision, conv_algorithm=algo,
                      kernel_storage="channels_last", activation_storage="channels_last",
                      xla_options=options, defaults=label, conv_tune="never")  # fmt: skip
    return cls(case, backend=backend, steps=20)


def with_rules(rules: dict) -> type[JaxRunner]:
    """A ``JaxRunner`` whose set-up (where its conv plan is made) reads the shipped conv
    table with ``rules`` (``{(cpu kind, objective, dtype): rules}``) in place of those keys'
    own; the table is restored afterwards."""

    class Swapped(JaxRunner):
        def setup(self):
            saved = dict(default_plan.DEFAULT_RULES)
            default_plan.DEFAULT_RULES.update(rules)
            try:
                return super().setup()
            finally:
                default_plan.DEFAULT_RULES.update(saved)

    return Swapped


def with_layer_impls(**impls) -> type[JaxRunner]:
    """A ``JaxRunner`` whose program is set up with ``impls`` (``nn.configure``'s
    ``batch_norm=`` and ``max_pool=``) over its run's ``layer_impl``, which sets both: one
    layer kind on XLA's ops and the other as the run has it, for an A/B of one kind alone."""

    class Configured(JaxRunner):
        def setup(self):
            saved = program.configure
            program.configure = lambda model, *a, **kw: saved(model, *a, **{**kw, **impls})
            try:
                return super().setup()
            finally:
                program.configure = saved

    return Configured


def with_algorithms(**values) -> type[JaxRunner]:
    """A ``JaxRunner`` whose program is set up with the conv algorithm ``values`` (by name,
    e.g. ``onednn=get_algorithm("onednn")._replace(rounds_kernel=False)``) in place of its
    run's, so a variant of one algorithm runs in the same plan."""

    class Swapped(JaxRunner):
        def setup(self):
            saved = program.configure

            def configure(model, *a, algorithms=None, **kw):
                return saved(model, *a, algorithms={**(algorithms or {}), **values}, **kw)

            program.configure = configure
            try:
                return super().setup()
            finally:
                program.configure = saved

    return Swapped


def median_cell(row: dict) -> str:
    """``"71.0 [70.4, 71.6]"``: a result row's median step ms with its 95% interval."""
    ms = [row.get(k) or 0 for k in ("step_ms_median", "step_ms_ci_low", "step_ms_ci_high")]
    return f"{ms[0]:.1f} [{ms[1]:.1f}, {ms[2]:.1f}]"


def run_ab(runners: list[JaxRunner], what: str, base: str, budget_s: float) -> list[dict]:
    """``runners`` timed interleaved (``bench.sweep.run_group``, labelled by their cases'
    ``defaults``); prints each row's median after ``what`` (the case, e.g. ``"resnet50 b16
    fp32"``, after the CPU kind) and, when every row ran, each other label's per-round ratio
    over ``base``'s (``label / base``: above 1, ``base`` is faster). Returns the rows."""
    rows = run_group(runners, repeats="auto", warmup=2, budget_s=budget_s)
    for r in rows:
        print(cpu_kind(), what, r["defaults"], r["status"], median_cell(r), r.get("error") or "")
    if all(r["status"] == "ok" for r in rows):
        rounds = {r["defaults"]: json.loads(r["round_ms"]) for r in rows}
        for label in rounds:
            if label != base:
                print(f"{what}: {label} / {base} per round",
                      paired_ratio(rounds[label], rounds[base]))  # fmt: skip
    return rows


def save_results(out: str, machine: dict, rows: list[dict]) -> None:
    """``out/results.json``: the machine (``bench.machine.machine_info``, finished now) and
    every row."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    result = {"machine": finish_machine_info(machine), "rows": rows}
    (path / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
