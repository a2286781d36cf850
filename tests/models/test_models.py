"""Every registry model, converted between layouts, gives the same outputs, gradients and
batch statistics; bad inputs give clear errors.

Tolerances: both layouts run the same float32 arithmetic up to summation order (XLA may pick
different loop orders per layout), so differences are a few float32 ulps accumulated over
the network's depth. rtol=1e-5 / atol=1e-5 on outputs and batch statistics (values of
order 1) leaves two orders of magnitude over float32's 1.2e-7 epsilon; gradients pass
through BatchNorm's backward, which subtracts nearly equal sums, so they use atol=1e-4.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compare_helpers import fast_model, fill_random
from flax import nnx

from layoutlab import convert_layout, models, to_layout
from layoutlab.compare import assert_close, assert_trees_close

NAMES = models.names()
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _input(name, layout, batch=2):
    s = models.spec(name)
    spatial = (8, 8, 8) if s.num_spatial == 3 else s.default_input[:-1]
    shape = s.input_shape(batch, layout, spatial=spatial)
    return jax.random.normal(jax.random.key(1), shape, jnp.float32)


def _forward_and_grads_fn(model, segmentation=False):
    """``(fn, state)``: ``fn(*state, x)`` gives train-mode logits, grads of a fixed projection
    of the logits, and new batch stats; ``_as_model`` makes the last two a model."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    layout = model.layout

    def run(params, rest, x):
        def loss(params):
            m = nnx.merge(graphdef, params, rest, copy=True)
            y = m(x)
            if segmentation:  # project per-pixel logits in one layout for both models
                y = to_layout(
                    y, layout, layout.counterpart if not layout.is_channels_last else layout
                )
            weights = jax.random.normal(jax.random.key(2), y.shape, y.dtype)
            _, _, new_rest = nnx.split(m, nnx.Param, ...)
            return jnp.sum(y * weights), (y, new_rest)

        grads, (y, new_rest) = jax.grad(loss, has_aux=True)(params)
        return y, grads, new_rest

    return run, (params, rest), graphdef


def _as_model(graphdef, out):
    y, grads, new_rest = out
    return y, nnx.merge(graphdef, grads, new_rest)


def _compile_and_run(fn, *args):
    # LLVM's optimization level changes speed and, at most, float32 rounding; both sides of
    # every comparison here compile alike, and level 0 compiles in about half the time.
    return jax.jit(fn).lower(*args).compile(FAST_COMPILE)(*args)


def _forward_and_grads(model, x, segmentation=False):
    """Train-mode logits, grads of a fixed projection of the logits, and new batch stats."""
    fn, state, graphdef = _forward_and_grads_fn(model, segmentation)
    return _as_model(graphdef, _compile_and_run(fn, *state, x))


@functools.cache
def _both_layouts_run(name):
    """``(nhwc, nchw, x, (logits, grads) of nhwc, (logits, grads) of nchw)`` of registry
    model ``name``, tiny, with NumPy-drawn weights (compare_helpers: eager init compiles each
    small op at every layer shape), ``nchw`` converted from ``nhwc``.

    Both layouts' runs are one program, compiled once: each side has its own parameters and
    input, so neither's ops fuse with or fold into the other's, and the XLA compile costs
    about a third less than two programs (its fixed cost is paid once, and kernels the two
    layouts share are built once). Cached: the remat test compares against the ResNet-18 run.
    """
    seg = models.spec(name).task == "segmentation"
    nhwc = fast_model(name)
    nchw = convert_layout(nhwc, "NCHW")
    x = _input(name, nhwc.layout)
    fn_a, state_a, graphdef_a = _forward_and_grads_fn(nhwc, seg)
    fn_b, state_b, graphdef_b = _forward_and_grads_fn(nchw, seg)
    out_a, out_b = _compile_and_run(
        lambda a, b, x: (fn_a(*a, x), fn_b(*b, to_layout(x, nhwc.layout, nchw.layout))),
        state_a,
        state_b,
        x,
    )
    return nhwc, nchw, x, _as_model(graphdef_a, out_a), _as_model(graphdef_b, out_b)


# ResNet-34 is ResNet-18's code with more blocks (both are models/resnet.py's ``ResNet`` of
# ``BasicBlock``): its layers convert as ResNet-18's do, at 1.6x the compile.
CONVERTED = [name for name in NAMES if name != "resnet34"]


@pytest.mark.parametrize("name", CONVERTED)
def test_converted_model_matches(name):
    # A layout conversion must hold for any weights: NumPy-drawn ones will do.
    nhwc, nchw, x, (y_a, grads_a), (y_b, grads_b) = _both_layouts_run(name)
    src = nhwc.layout
    assert_close(y_b, y_a, rtol=1e-5, atol=1e-5, msg=f"{name} logits")

    # ``grads_b`` is a model whose params are the gradients: converting it back to the
    # source layout moves kernel gradients exactly as weights are moved.
    grads_b = convert_layout(grads_b, src)
    assert_trees_close(
        nnx.state(grads_b, nnx.Param), nnx.state(grads_a, nnx.Param), rtol=1e-4, atol=1e-4
    )
    # A training step in either layout updates the same BatchNorm running statistics.
    assert_trees_close(
        nnx.state(grads_b, nnx.BatchStat),
        nnx.state(grads_a, nnx.BatchStat),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("name", ["small_cnn", "small_cnn3d"])
def test_same_seed_builds_the_same_model_in_both_layouts(name):
    s = models.spec(name)
    a = models.create(name, layout="NHWC", rngs=nnx.Rngs(3), **s.tiny)
    b = models.create(name, layout="NCHW", rngs=nnx.Rngs(3), **s.tiny)
    # Init happens in channels-last order and is then transposed: bitwise equal weights.
    b_as_a = convert_layout(b, "NHWC")
    for pa, pb in zip(
        jax.tree.leaves(nnx.state(a, nnx.Param)),
        jax.tree.leaves(nnx.state(b_as_a, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(pa), np.asarray(pb))
    assert b.layout.value == ("NCHW" if s.num_spatial == 2 else "NCDHW")


def test_convert_layout_leaves_the_original_alone():
    m = models.create("small_cnn", layout="NHWC", rngs=nnx.Rngs(0), **models.spec("small_cnn").tiny)
    before = [np.asarray(p) for p in jax.tree.leaves(nnx.state(m, nnx.Param))]
    convert_layout(m, "NCHW")
    after = [np.asarray(p) for p in jax.tree.leaves(nnx.state(m, nnx.Param))]
    for p, q in zip(before, after, strict=True):
        np.testing.assert_array_equal(p, q)
    assert m.layout.value == "NHWC"


def test_unknown_model_and_options():
    with pytest.raises(ValueError, match="Unknown model 'resnet19'; known models are: .*resnet18"):
        models.create("resnet19")
    with pytest.raises(ValueError, match="unknown options \\['depth'\\]; it accepts: .*stem"):
        models.create("resnet18", depth=3)
    with pytest.raises(ValueError, match="Unknown ResNet stem 'tiny'"):
        models.create("resnet18", stem="tiny")
    with pytest.raises(ValueError, match="Unknown layout 'NHCW'"):
        models.create("small_cnn", layout="NHCW")
    with pytest.raises(ValueError, match="Unknown precision policy"):
        models.create("small_cnn", policy="fp8")
    with pytest.raises(ValueError, match="num_classes"):
        models.create("small_cnn", num_classes=0)


def test_layout_mismatch_errors():
    m = models.create(
        "small_cnn", layout="NHWC", in_channels=3, rngs=nnx.Rngs(0), width=4, hidden=8
    )
    nchw_batch = jnp.zeros((2, 3, 8, 8), jnp.float32)
    with pytest.raises(
        ValueError,
        match="expects NHWC input with 3 channels on axis 3, got shape "
        "\\(2, 3, 8, 8\\).*looks like NCHW",
    ):
        m(nchw_batch)
    with pytest.raises(
        ValueError,
        match=r"SmallCNN expects a 4-D array \(N, H, W, C\) for layout NHWC, got shape "
        r"\(3, 8, 8\); add the batch axis, e.g. x\[None\]\.",
    ):
        m(jnp.zeros((3, 8, 8), jnp.float32))
    with pytest.raises(ValueError, match="with 3 channels on axis 3, got shape \\(2, 8, 8, 1\\)"):
        m(jnp.zeros((2, 8, 8, 1), jnp.float32))


# Every model, both layouts; built abstractly (nnx.eval_shape: the check runs before any
# layer, and eager init dominates the time) except the two small ones, given concrete
# (NumPy-drawn: compare_helpers.fill_random) weights and statistics to show that a refused
# empty batch leaves BatchNorm's running statistics alone.
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("name", NAMES)
def test_list_empty_and_unbatched_inputs_are_clear_errors(name, layout):
    """One check in ``models.base.ImageModel`` covers every registered model (run, an empty
    batch would store the NaN mean of nothing in BatchNorm, or fail in a reshape)."""
    s = models.spec(name)
    concrete = name in ("small_cnn", "small_cnn3d")
    build = lambda: models.create(name, layout=layout, rngs=nnx.Rngs(0), **s.tiny)  # noqa: E731
    m = nnx.eval_shape(build)
    if concrete:
        fill_random(m)
    lay, cls = m.layout, type(m).__name__
    axes = "\\(" + ", ".join(lay.value) + "\\)"
    x = np.asarray(_input(name, layout))
    before = nnx.state(m, nnx.BatchStat)
    with pytest.raises(
        ValueError,
        match=rf"^{cls} expects a {lay.rank}-D array {axes} for layout {lay.value}, got a "
        r"list; convert it first, e.g. jnp.asarray\(x\)\.$",
    ):
        m(x.tolist())
    with pytest.raises(
        ValueError,
        match=rf"^{cls} got an empty batch, shape {re.escape(str((0, *x.shape[1:])))}: pass at "
        r"least one example \(BatchNorm would average over nothing and store NaN statistics\)\.$",
    ):
        m(x[:0])
    with pytest.raises(
        ValueError, match=rf"got shape {re.escape(str(x.shape[1:]))}; add the batch"
    ):
        m(x[0])
    if concrete:
        assert_trees_close(nnx.state(m, nnx.BatchStat), before, rtol=0, atol=0)
        if layout == "NHWC":  # a NumPy batch is fine (once: eager calls are slow)
            assert m(x).shape == (x.shape[0], 10)


def test_imagenet_stem_and_resnet50_shapes():
    build = lambda: models.create(  # noqa: E731
        "resnet50", layout="NCHW", rngs=nnx.Rngs(0), width=4, num_classes=3
    )
    m = nnx.eval_shape(build)  # structure and shapes only: no weights are drawn
    assert m.maxpool is not None
    # torchvision's ResNet-50 puts the stride on the 3x3 conv of the bottleneck (v1.5).
    block = m.layer2[0]
    assert block.conv1.strides == (1, 1) and block.conv2.strides == (2, 2)
    assert block.conv3.out_features == 4 * 2 * 4
    m.eval()
    y = nnx.eval_shape(lambda m, x: m(x), m, jax.ShapeDtypeStruct((1, 3, 64, 64), jnp.float32))
    assert y.shape == (1, 3)


def test_too_small_input_is_a_clear_error():
    m = nnx.eval_shape(
        lambda: models.create("vgg11_bn", rngs=nnx.Rngs(0), **models.spec("vgg11_bn").tiny)
    )
    with pytest.raises(ValueError, match="too small"):
        nnx.eval_shape(lambda m, x: m(x), m, jax.ShapeDtypeStruct((1, 16, 16, 3), jnp.float32))


def test_remat_gives_the_same_gradients():
    # The plain side is test_converted_model_matches[resnet18]'s run (tiny: CIFAR stem).
    _, _, x, (y_a, g_a), _ = _both_layouts_run("resnet18")
    remat = fast_model("resnet18", remat=True)
    y_b, g_b = _forward_and_grads(remat, x)
    # Rematerialisation recomputes the same ops: equal to float32 rounding.
    assert_close(y_b, y_a, rtol=1e-6, atol=1e-6)
    assert_trees_close(nnx.state(g_b, nnx.Param), nnx.state(g_a, nnx.Param), rtol=1e-5, atol=1e-5)


def test_abstract_model_facts_are_cached_unless_an_option_cannot_be_hashed():
    """``has_depthwise_convs`` and ``largest_conv_output`` build the model abstractly once
    per name and options; an option value that cannot be hashed (a list) is built anew,
    not refused."""
    from layoutlab.models.registry import cached_when_hashable

    calls = []

    @cached_when_hashable
    def fact(name, items):
        calls.append(items)
        return len(calls)

    assert fact("m", (("width", 8),)) == fact("m", (("width", 8),)) == 1
    assert fact("m", (("sizes", [2, 2]),)) == 2
    assert fact("m", (("sizes", [2, 2]),)) == 3
    assert len(calls) == 3
