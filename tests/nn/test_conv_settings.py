"""A conv's configuration is one frozen value (``nn.ConvSettings``) and ``nn.configure``
applies it functionally: it returns a copy and never changes the model it is given; a plan's
algorithms are values the caller passes (the table of names is read where names are
parsed, not while configuring or tracing); specs are read without a callback on the model."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.layout import Layout
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import registry
from layoutlab.nn.conv_algos.algorithm import plain_2d
from layoutlab.nn.conv_algos.native import native_conv
from layoutlab.nn.conv_config import conv_specs, convs, running_algorithms, settings_of

X_NCHW = jax.ShapeDtypeStruct((2, 1, 8, 8), jnp.float32)


KW = dict(models.spec("small_cnn").tiny)


def _model():
    # Abstract: configuring and tracing need shapes only.
    return nnx.eval_shape(
        lambda: models.create(
            "small_cnn", layout="NCHW", rngs=nnx.Rngs(0), kernel_storage="layout",
            activation_storage="layout", **KW,
        )
    )  # fmt: skip


def _plan(model, algorithm):
    return ca.ConvPlan({p: (algorithm, s.key()) for p, s in conv_specs(model, X_NCHW).items()})


def test_configure_returns_a_copy_and_leaves_the_model_alone():
    model = _model()
    first, second, *_ = (c for _, c in convs(model))
    path = next(p for p, c in convs(model) if c is first)
    before = (nnx.graphdef(model), settings_of(model), model.compute_layout)
    hwio = nn.ConvSettings(kernel_storage="channels_last")
    plan = _plan(model, "im2col")
    values = ca.algorithm_values(["im2col"])
    for settings, kw in [
        (nn.ConvSettings.named("im2col"), {}),
        ({path: hwio}, {}),
        (plan, {"algorithms": values}),
        (None, {}),
    ]:
        new = nn.configure(model, settings, **kw)
        assert new is not model
        assert (nnx.graphdef(model), settings_of(model), model.compute_layout) == before
    assert {c.algorithm for _, c in convs(nn.configure(model, plan, algorithms=values))} == {"auto"}
    # Where the model computes too (concrete: moving layers needs values).
    concrete = models.create("small_cnn", layout="NCHW", activation_storage="layout", **KW)
    inside = nn.configure(concrete, activation_storage="channels_last")
    assert concrete.compute_layout == Layout.NCHW and inside.compute_layout == Layout.NHWC
    stored = [c for _, c in convs(nn.configure(model, {path: hwio}))]
    assert stored[0].kernel_spec == "HWIO" and stored[1].kernel_spec == "OIHW"
    assert stored[0].kernel.shape == (3, 3, 1, first.out_features)
    assert first.kernel_spec == second.kernel_spec == "OIHW"


def test_kernel_storage_moves_the_kernel_of_the_copy_only_and_the_outputs_stay():
    conv = nn.Conv(2, 3, 3, layout=Layout.NCHW, rngs=nnx.Rngs(0))
    kernel = np.asarray(conv.kernel[...])
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 5, 5)), jnp.float32)
    hwio = nn.configure(conv, nn.ConvSettings(kernel_storage="channels_last"))
    np.testing.assert_array_equal(np.asarray(conv.kernel[...]), kernel)  # OIHW still
    np.testing.assert_array_equal(np.asarray(hwio.kernel[...]), kernel.transpose(2, 3, 1, 0))
    # The same products in the same order: XLA's conv reads either kernel order exactly.
    np.testing.assert_array_equal(np.asarray(hwio(x)), np.asarray(conv(x)))


def test_settings_are_frozen_and_a_conv_has_no_setters():
    settings = nn.ConvSettings.named("im2col", kernel_storage="channels_last")
    assert settings.name == "im2col" and settings.algorithm is ca.get_algorithm("im2col")
    assert hash(settings) == hash(nn.ConvSettings.named("im2col", kernel_storage="channels_last"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.kernel_storage = "layout"
    conv = nn.Conv(2, 3, 3, rngs=nnx.Rngs(0))
    for name in ("algorithm", "kernel_storage", "plan_entry"):
        with pytest.raises(AttributeError):
            setattr(conv, name, getattr(conv, name))
    with pytest.raises(ValueError, match="plan entry's algorithm"):
        nn.ConvSettings(None, True, ca.PlanEntry("im2col", "k"))
    with pytest.raises(ValueError, match="Unknown kernel_storage"):
        nn.ConvSettings(kernel_storage="HWIO")
    with pytest.raises(ValueError, match="is for 2D convs"):
        nn.Conv(2, 3, 3, layout=Layout.NCW, algorithm="im2col", rngs=nnx.Rngs(0))


def _halved(x, w, geometry, preferred):
    return native_conv(x, w, geometry, preferred) / 2


def test_a_plans_algorithms_come_from_the_caller_and_tracing_reads_no_table(monkeypatch):
    conv = nn.Conv(2, 3, 3, algorithm="auto", use_bias=False, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 5, 5, 2)), jnp.float32)
    given = ca.Algorithm("test_halved", _halved, plain_2d, "native / 2")
    registry.register_algorithm(given._replace(core=native_conv), replace=True)
    try:
        plan = ca.ConvPlan({"": ("test_halved", conv.spec(x.shape).key())})
        # A value the caller did not pass is refused, though the table holds the name.
        with pytest.raises(ValueError, match="'test_halved', whose value was not given"):
            nn.configure(conv, plan)
        planned = nn.configure(conv, plan, algorithms={"test_halved": given})
    finally:
        registry.unregister_algorithm("test_halved")

    def no_table():
        raise AssertionError("the table of names was read")

    monkeypatch.setattr(registry, "_registry", no_table)
    # The conv runs the value it was given (the table's, gone now, was not halved); halving
    # is exact in float32.
    np.testing.assert_array_equal(np.asarray(planned(x)), np.asarray(conv(x)) / 2)
    assert running_algorithms(planned, x) == {"": "test_halved"}


def test_conv_specs_leave_no_callback_on_the_model():
    model = nn.configure(_model(), nn.ConvSettings.named("im2col"))
    graphdef = nnx.graphdef(model)
    specs = conv_specs(model, X_NCHW)
    assert list(specs) == [p for p, _ in convs(model)]
    assert nnx.graphdef(model) == graphdef
    for _, conv in convs(model):
        held = [k for k, v in vars(conv).items() if isinstance(v, types.FunctionType)]
        assert "spec_sink" not in vars(conv) and not held, held


def test_nn_exports_the_layers_and_configure_only():
    internals = {
        "check_conv_options", "configure_convs", "missing_from_plan", "running_algorithms",
        "set_conv_algorithm", "set_kernel_storage", "with_conv_plan", "activation_storage",
        "check_activation_storage", "set_activation_storage", "ACTIVATION_STORAGES",
        "KERNEL_STORAGES",
    }  # fmt: skip
    assert len(nn.__all__) <= 25
    assert not internals & set(nn.__all__)
    assert {"configure", "ConvSettings", "Conv", "convert_layout"} <= set(nn.__all__)
    for name in nn.__all__:
        assert getattr(nn, name) is not None


def test_a_plan_keeps_one_form_from_the_config_to_the_spec():
    from layoutlab.train.config import TrainConfig, validate
    from layoutlab.train.spec import resolve_spec

    plan = ca.ConvPlan({"conv": ("im2col", "k")}, {"conv": {"source": "given"}})
    # The JSON form is parsed once, where the config is made; from there on a ConvPlan.
    config = validate(TrainConfig(model_kwargs=KW, conv_plan=plan.to_dict()), 1)
    assert isinstance(config.conv_plan, ca.ConvPlan) and config.conv_plan == plan
    spec = resolve_spec(config)
    assert spec.conv_plan is config.conv_plan
    other = ca.ConvPlan({"conv": ("winograd2", "k")})
    assert spec.with_plan(other).conv_plan is other  # no round trip through the dict
    assert set(spec.with_plan(other).algorithms) == {"winograd2"}
    # The JSON form again at the edge: config.json, and read back equal.
    assert config.to_dict()["conv_plan"] == plan.to_dict()
    assert TrainConfig.from_dict(config.to_dict()) == config
