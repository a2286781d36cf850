"""``predict`` and ``export`` run the shipped table's inference rules at their own batch.

A tiny MobileNetV2 (``width_mult`` 0.25) planned for training at batch 32 on 32x32 images,
as ``layoutlab train`` plans it on an AVX2 CPU (the CPU kind is fixed here so the test does
not depend on the machine's). Its depthwise convs carry the table's ``depthwise`` entries
keyed at batch 32; the run is built without training (the plan does not depend on the
weights, and ``Run`` is the same object ``open_run`` makes from a checkpoint).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab.infer import export as export_module
from layoutlab.infer import load as load_module
from layoutlab.infer.load import Run
from layoutlab.infer.plan import inference_plan, planned_by_table
from layoutlab.nn.conv_algos import XLA, ConvPlan
from layoutlab.nn.conv_algos.dispatch import planned_algorithm
from layoutlab.nn.conv_config import (
    conv_specs,
    default_conv_plan,
    planned_entries,
    running_algorithms,
)
from layoutlab.nn.convert import convert_layout
from layoutlab.train import TrainConfig, fast_config
from layoutlab.train.program import INIT_COMPILER_OPTIONS as INIT
from layoutlab.train.program import build_model
from layoutlab.train.run_data import load_run_data
from layoutlab.train.spec import InputSpec, resolve_spec
from layoutlab.train.state import split_model
from layoutlab.train.steps import make_forward

KIND = "avx2"
TINY = {"width_mult": 0.25, "last_channel": 64}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = TrainConfig(
        model="mobilenet_v2", model_kwargs=TINY, data="synthetic:32x32x3:10:64", batch_size=32
    )
    inputs = InputSpec(image_shape=(32, 32, 3), num_classes=10, batch_size=32)
    spec = resolve_spec(config)
    abstract = nnx.eval_shape(lambda: build_model(spec, inputs))
    images, _ = inputs.batch(spec.layout)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fast_config, "table_cpu_kind", lambda platform: KIND)
        config = fast_config.with_default_plan(config, abstract, images)
    spec = resolve_spec(config)
    defs = split_model(nnx.eval_shape(lambda: build_model(spec, inputs)))[0]
    # One compiled init, not an eager compile per initializer op (as bench builds it).
    init = jax.jit(lambda: split_model(build_model(spec, inputs))[1:], compiler_options=INIT)
    params, model_state = init()
    dataset = load_run_data(config)
    return Run(tmp_path_factory.mktemp("plan"), config, dataset, 0, defs, params, model_state)


@pytest.fixture(autouse=True)
def avx2_table(monkeypatch):
    # The forward plans for an AVX2 CPU whatever runs the test (the algorithms are plain JAX).
    monkeypatch.setattr(load_module, "default_backend", lambda: "cpu")
    monkeypatch.setattr(load_module, "table_cpu_kind", lambda p: KIND if p == "cpu" else None)


def _depthwise(plan: ConvPlan) -> dict:
    return {p: e for p, e in plan.items() if e.algorithm == "depthwise"}


def _running_depthwise(model, x) -> set:
    return {p for p, a in running_algorithms(model, x).items() if a == "depthwise"}


def test_the_training_plan_matches_no_conv_at_batch_1(run):
    # Why predict needs a plan of its own: the entries are keyed by the shape at batch 32,
    # so the training plan gives every conv of a one-image forward XLA's conv.
    train = run.spec.conv_plan
    assert planned_by_table(run.spec) and _depthwise(train)
    one = conv_specs(run.model(), run.dataset.test_images[:1])
    for path, entry in _depthwise(train).items():
        algorithm, why = planned_algorithm(one[path], entry)
        assert algorithm == XLA and "chosen for" in why


def test_a_one_image_forward_gets_the_inference_rules_at_batch_1(run):
    x = run.dataset.test_images[:1]
    model = nnx.merge(run.inference_defs(x).eval, run.params, run.model_state)
    want = default_conv_plan(run.model(), x, "inference", KIND)
    assert planned_entries(model) == dict(want.items())
    assert _depthwise(want) and all(":n1:" in e.spec_key for _, e in want.items())
    assert set(_depthwise(want)) == set(_depthwise(run.spec.conv_plan))


def test_logits_with_the_batch_plan_match_xla_convs(run):
    # The depthwise rule's shifted multiply-adds against XLA's grouped conv (what the
    # training plan runs at batch 1, above): the same float32 products summed in another
    # order, through 17 depthwise layers. 1e-5 of the largest logit is ~80 float32 ulps.
    x = run.dataset.test_images[:1]
    got = np.asarray(run.logits(x))
    want = np.asarray(jax.jit(make_forward(run.defs))(run.state(), x))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    assert run.inference_defs(x) is run.inference_defs(x)  # planned once per batch


def test_load_model_plans_for_the_batch_it_is_given(run, monkeypatch):
    # load_model rebuilds the run as open_run does; the fixture's run stands in for one read
    # from a checkpoint.
    monkeypatch.setattr(load_module, "open_run", lambda workdir, step, weights="raw": run)
    x = run.dataset.test_images[:1]
    depthwise = set(_depthwise(run.spec.conv_plan))
    trained = load_module.load_model("run")
    assert not _running_depthwise(trained, x)
    one = load_module.load_model("run", batch_size=1)
    want_plan = default_conv_plan(run.model(), x, "inference", KIND)
    assert planned_entries(one) == dict(want_plan.items())
    assert _running_depthwise(one, x) == depthwise
    # The depthwise rule against XLA's grouped convs, 1e-5 of the largest logit as in
    # test_logits_with_the_batch_plan_match_xla_convs. Jitted: op by op, every op of both
    # models would compile on its own (half a minute on 2 cores).
    want = np.asarray(jax.jit(lambda x: trained(x))(x))
    got = np.asarray(jax.jit(lambda x: one(x))(x))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # Converted first, then planned in the new layout: its keys are NCHW shapes.
    x_nchw = x.transpose(0, 3, 1, 2)
    nchw = load_module.load_model("run", layout="NCHW", batch_size=1)
    want_nchw = default_conv_plan(convert_layout(run.model(), "NCHW"), x_nchw, "inference", KIND)
    assert planned_entries(nchw) == dict(want_nchw.items())
    assert _running_depthwise(nchw, x_nchw) == depthwise
    for bad in (0, -2, 1.5, "8", True):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            load_module.load_model("run", batch_size=bad)


def test_tuned_entries_stand_at_their_batch_and_the_table_plans_other_batches(run):
    x1 = run.dataset.test_images[:1]
    x32 = jax.ShapeDtypeStruct((32, *x1.shape[1:]), x1.dtype)  # the training batch
    measured = ConvPlan(
        dict(run.spec.conv_plan.items()),
        {p: {"source": "autotune", "ms": 1.0} for p in run.spec.conv_plan},
    )
    tuned = run.spec.with_plan(measured)
    assert not planned_by_table(tuned)
    # At the batch it was tuned for, every entry fits: the run's plan, the same object.
    assert inference_plan(tuned, run.model(), x32, KIND) is tuned.conv_plan
    # A plan without an entry for one conv: its own entries stand, the table fills the gap.
    dropped = next(iter(measured))
    partial = tuned.with_plan(
        ConvPlan(
            {p: e for p, e in measured.items() if p != dropped},
            {p: measured.evidence(p) for p in measured if p != dropped},
        )
    )
    filled = inference_plan(partial, run.model(), x32, KIND)
    assert filled.evidence(dropped)["source"].startswith("default table")
    assert all(filled[p] == e for p, e in partial.conv_plan.items())
    assert {filled.evidence(p)["source"] for p in partial.conv_plan} == {"autotune"}
    # At batch 1 none does: the table's inference rules, as for a run on the table's plan.
    one = inference_plan(tuned, run.model(), x1, KIND)
    assert one == default_conv_plan(run.model(), x1, "inference", KIND) and _depthwise(one)
    # One algorithm for every conv is kept whatever the batch.
    xla = resolve_spec(dataclasses.replace(run.config, conv_algorithm="xla"))
    assert not planned_by_table(xla)
    assert inference_plan(xla, run.model(), x1, KIND) is xla.conv_plan
    # A run without an eval plan (from before it existed) evaluates on its training plan.
    assert run.spec.eval_conv_plan is None and run.eval_defs is run.defs


def _grouped_convs(exported) -> int:
    return exported.mlir_module().count("feature_group_count = 8")


@pytest.mark.parametrize("batch", [2, None], ids=["fixed", "symbolic"])
def test_export_runs_the_plan_of_its_batch(run, tmp_path, batch):
    # The tiny model's first depthwise conv has 8 channels: a grouped XLA conv of 8 groups
    # appears in the program only where the depthwise rule did not apply. A symbolic batch
    # runs XLA's convs (the custom algorithms need concrete shapes).
    if jax.default_backend() != "cpu":
        pytest.skip("calls an export for CPU alone")
    out, _ = export_module.export_run(run, tmp_path / "m.jax", batch=batch)
    exported = jax.export.deserialize(out.read_bytes())
    assert (_grouped_convs(exported) == 0) == (batch is not None)
    x = jnp.asarray(run.dataset.test_images[:2])
    want = np.asarray(jax.jit(make_forward(run.defs))(run.state(), x))
    # As above: another summation order of the same products.
    np.testing.assert_allclose(exported.call(x), want, rtol=0, atol=1e-5 * np.abs(want).max())
    if batch is not None:  # several platforms share one program: no CPU rules
        several = export_module.export_run(run, tmp_path / "c.jax", platforms=("cpu", "cuda"),
                                           batch=batch)  # fmt: skip
        assert _grouped_convs(jax.export.deserialize(several[0].read_bytes())) > 0
