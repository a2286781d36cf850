"""Layers take ``Layout`` and ``Policy`` values; a name given to one raises a ``TypeError``
saying which value to pass (names are parsed at the edges: the CLI, ``TrainConfig``,
``models.create``)."""

import pytest
from flax import nnx

from layoutlab import models, nn
from layoutlab.layout import Layout
from layoutlab.precision import PRESETS, get_policy

LAYERS = {
    "Conv": lambda **kw: nn.Conv(3, 4, 3, rngs=nnx.Rngs(0), **kw),
    "ConvTranspose": lambda **kw: nn.ConvTranspose(3, 4, 2, strides=2, rngs=nnx.Rngs(0), **kw),
    "BatchNorm": lambda **kw: nn.BatchNorm(4, **kw),
    "GroupNorm": lambda **kw: nn.GroupNorm(2, 4, **kw),
    "MaxPool": lambda **kw: nn.MaxPool(2, **kw),
    "AvgPool": lambda **kw: nn.AvgPool(2, **kw),
    "GlobalAvgPool": lambda **kw: nn.GlobalAvgPool(**kw),
    "AdaptiveAvgPool": lambda **kw: nn.AdaptiveAvgPool(2, **kw),
    "Upsample": lambda **kw: nn.Upsample(2, **kw),
    "Flatten": lambda **kw: nn.Flatten(**kw),
}


@pytest.mark.parametrize("name", LAYERS)
def test_a_layout_name_raises_naming_the_value(name):
    with pytest.raises(TypeError) as err:
        LAYERS[name](layout="NCHW")
    msg = str(err.value)
    assert msg.startswith(f"{name} got layout='NCHW', a string")
    assert "layout=Layout.NCHW" in msg and "parse_layout('NCHW')" in msg


@pytest.mark.parametrize("name", LAYERS)
def test_a_policy_name_raises_naming_the_value(name):
    with pytest.raises(TypeError, match=r"pass policy=get_policy\('mixed_bf16'\)\.$"):
        LAYERS[name](policy="mixed_bf16")


def test_dense_takes_a_policy_value_only():
    with pytest.raises(TypeError, match=r"Dense got policy='fp32'.*get_policy\('fp32'\)"):
        nn.Dense(2, 3, policy="fp32", rngs=nnx.Rngs(0))
    dense = nn.Dense(2, 3, policy=get_policy("mixed_bf16"), rngs=nnx.Rngs(0))
    assert dense.policy == PRESETS["mixed_bf16"]


def test_an_unknown_layout_name_lists_the_valid_ones():
    with pytest.raises(TypeError, match="layout='CHWN', a string.*valid names: NWC, NCW"):
        nn.Conv(3, 8, 3, layout="CHWN", rngs=nnx.Rngs(0))


def test_other_types_raise_too():
    with pytest.raises(TypeError, match="layout=3; layers take Layout values"):
        nn.BatchNorm(4, layout=3)
    with pytest.raises(TypeError, match="policy=3; layers take Policy values"):
        nn.BatchNorm(4, policy=3)


def test_values_are_taken_and_none_is_fp32():
    conv = nn.Conv(3, 4, 3, layout=Layout.NCHW, policy=PRESETS["bf16"], rngs=nnx.Rngs(0))
    assert (conv.layout, conv.policy) == (Layout.NCHW, PRESETS["bf16"])
    assert nn.BatchNorm(4, policy=None).policy == PRESETS["fp32"]


def test_models_create_still_parses_names_once():
    model = nnx.eval_shape(
        lambda: models.create(
            "small_cnn", layout="NCHW", policy="mixed_bf16", activation_storage="layout"
        )
    )
    layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, nn.LayoutModule)]
    assert layers and {(m.layout, m.policy) for m in layers} == {
        (Layout.NCHW, PRESETS["mixed_bf16"])
    }
