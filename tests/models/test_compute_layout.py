"""A model holds one ``compute_layout``, the ``Layout`` its layers are built with:
``models.create``'s ``activation_storage`` chooses it, and building the layers there gives
the model (graph and parameter tree) that moving them there (``nn.configure``) gives. The
same weights under both storages: tests/compare/test_compare_defaults.py."""

import jax
import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.layout import Layout
from layoutlab.models.small_cnn import SmallCNN
from layoutlab.precision import PRESETS
from layoutlab.train.model_checks import check_model, with_builder_defaults
from layoutlab.xla.inspect import inspect_model


def _create(name, storage, then=None):
    # Abstract (eval_shape): only the structure is compared, and nothing compiles.
    def build():
        tiny = models.spec(name).tiny
        model = models.create(
            name, layout="NCHW", rngs=nnx.Rngs(3), activation_storage=storage, **tiny
        )
        return model if then is None else nn.configure(model, activation_storage=then)

    return nnx.eval_shape(build)


def _layer_layouts(model):
    return {m.layout for _, m in nnx.iter_graph(model) if isinstance(m, nn.LayoutModule)}


def _shapes(model):
    return jax.tree.map(lambda v: (v.shape, v.dtype), nnx.state(model))


@pytest.mark.parametrize("name", ["small_cnn", "unet"])
def test_built_in_the_compute_layout_equals_moved_there(name):
    built = _create(name, "channels_last")
    moved = _create(name, "layout", then="channels_last")
    assert (built.layout, built.compute_layout) == (Layout.NCHW, Layout.NHWC)
    assert _layer_layouts(built) == {Layout.NHWC}
    assert nnx.graphdef(built) == nnx.graphdef(moved)
    assert _shapes(built) == _shapes(moved)


def test_compute_layout_is_a_layout_in_every_storage():
    assert _create("small_cnn", "layout").compute_layout == Layout.NCHW
    assert _create("small_cnn", "channels_last", then="layout").compute_layout == Layout.NCHW
    converted = nnx.eval_shape(
        lambda: nn.convert_layout(models.create("small_cnn", layout="NCHW", width=2), "NHWC")
    )
    assert converted.compute_layout == Layout.NHWC


def test_a_builder_takes_the_compute_layout_value():
    kw = dict(num_classes=3, layout=Layout.NCHW, policy=PRESETS["fp32"], width=2, hidden=4)
    build = lambda lay: SmallCNN(**kw, rngs=nnx.Rngs(0), compute_layout=lay)  # noqa: E731
    model = nnx.eval_shape(lambda: build(Layout.NHWC))
    assert model.compute_layout == Layout.NHWC and _layer_layouts(model) == {Layout.NHWC}
    with pytest.raises(ValueError, match="compute_layout must be a Layout of the same rank"):
        build(Layout.NDHWC)


def test_compute_layout_is_not_a_model_option():
    with pytest.raises(ValueError, match=r"unknown options \['compute_layout'\]"):
        models.create("small_cnn", compute_layout=Layout.NHWC)
    with pytest.raises(ValueError, match="may not set.*activation_storage"):
        check_model("small_cnn", {"compute_layout": "NHWC"}, remat=False)
    assert "compute_layout" not in with_builder_defaults("small_cnn", {})
    with pytest.raises(ValueError, match=r"may not set \['compute_layout'\].*activation_storage"):
        inspect_model("small_cnn", model_kwargs={"compute_layout": "NHWC"})
