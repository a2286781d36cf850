"""Layer-by-layer comparison: recording, the first divergent layer, gradients, references."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compare_helpers import fast_model, random_input
from flax import nnx

from layoutlab import nn
from layoutlab.compare.gradient_comparison import compare_gradients
from layoutlab.compare.layer_recording import layer_outputs
from layoutlab.compare.layer_report import LayerTolerance, LayerwiseReport
from layoutlab.compare.layerwise import compare_layerwise
from layoutlab.compare.reference_report import ReferenceReport
from layoutlab.compare.references import (
    against_layout,
    against_numpy,
    against_policy,
    default_layer_tolerance,
    with_policy,
)

# Same-policy float32 comparisons: two correct float32 runs of these tiny models differ by
# < 1e-5 x the layer's largest output (summation order only); a planted bug is O(1) x that.
TOL = LayerTolerance(1e-4, 1e-4, relative_to_max=True)
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _flip_kernel(conv: nn.Conv) -> None:
    """Plant a bug: the kernel mirrored spatially (a classic layout-conversion mistake)."""
    k = conv.kernel[...]
    axes = tuple(conv.layout.kernel_layout.index(a) for a in "HW")
    conv.kernel.set_value(jnp.flip(k, axes))


@jax.custom_vjp
def _double_grad(k):
    return k


_double_grad.defvjp(lambda k: (k, None), lambda _, g: (2 * g,))


class _FlippedConv(nn.Conv):
    """A conv whose computation (not its weights) is wrong: it flips its kernel."""

    def __call__(self, x):
        kernel = self.kernel[...]
        _flip_kernel(self)
        try:
            return super().__call__(x)
        finally:
            self.kernel[...] = kernel


class _BadBackwardConv(nn.Conv):
    """Forward exact, kernel gradient doubled: a bug only the backward pass shows."""

    def __call__(self, x):
        kernel = self.kernel[...]
        self.kernel[...] = _double_grad(kernel)
        try:
            return super().__call__(x)
        finally:
            self.kernel[...] = kernel


def test_record_layers_paths_in_execution_order():
    model = fast_model("small_cnn")
    x = random_input("small_cnn", "NHWC", 2)
    out, records = layer_outputs(model, x)
    assert [r.path for r in records] == [
        "features.0.0", "features.0.1", "features.0.2", "features.1.0", "features.1.1",
        "features.1.2", "features.2", "features.3.0", "features.3.1", "features.3.2",
        "avgpool", "flatten", "classifier.0", "classifier.1", "classifier.2", "classifier.3",
    ]  # fmt: skip
    assert records[0].op == "Conv" and records[6].op == "MaxPool"
    np.testing.assert_array_equal(records[-1].value, out)
    # Recording leaves no trace on the classes.
    assert not getattr(nn.Conv.__call__, "_layoutlab_recording", False)
    assert "__call__" not in vars(nn.ReLU) or not hasattr(
        vars(nn.ReLU)["__call__"], "_layoutlab_recording"
    )


def test_repeated_calls_are_numbered():
    model = fast_model("unet")
    _, records = layer_outputs(model, random_input("unet", "NHWC", 1, (8, 8)))
    paths = [r.path for r in records]
    assert "pool" in paths and "pool#2" in paths
    assert paths.index("pool") < paths.index("enc2.0.0") < paths.index("pool#2")


@pytest.mark.parametrize("candidate_layout", ["NHWC", "NCHW"])
def test_forward_bug_is_the_first_divergence(candidate_layout):
    ref = fast_model("resnet18")
    cand = nn.convert_layout(ref, candidate_layout)
    _flip_kernel(cand.layer2[0].conv1)
    report = compare_layerwise(ref, cand, random_input("resnet18", "NHWC", 2), TOL)
    assert not report.passed
    assert report.first_failure.path == "layer2.0.conv1"
    before = report.rows[: report.first_failure.index]
    assert before and all(r.passed for r in before)
    assert "First divergence: #" in str(report) and "layer2.0.conv1" in str(report)
    data = json.loads(report.to_json())
    assert data["first_failure"] == "layer2.0.conv1"
    assert LayerwiseReport.from_dict(data) == report


def test_backward_bug_is_the_first_gradient_divergence():
    ref = fast_model("small_cnn")
    cand = nnx.clone(ref)
    cand.features[1][0].__class__ = _BadBackwardConv
    x = random_input("small_cnn", "NHWC", 4)
    labels = np.array([0, 1, 2, 3], np.int32)
    acts = compare_layerwise(ref, cand, x, TOL, train=True)
    assert acts.passed  # the forward pass is untouched
    grads = compare_gradients(ref, cand, x, labels, TOL)
    assert grads.settings["order"] == "backprop"
    assert grads.rows[0].path.startswith("classifier.3.")  # the last layer comes first
    assert grads.first_failure.path == "features.1.0.kernel"
    assert [r.path for r in grads.failures] == ["features.1.0.kernel"]
    ratio = (
        grads["features.1.0.kernel"].report.max_abs_actual
        / grads["features.1.0.kernel"].report.max_abs_expected
    )
    assert ratio == pytest.approx(2.0, rel=1e-5)


def test_gradients_across_layouts_convert_kernels():
    ref = fast_model("small_cnn")
    cand = nn.convert_layout(ref, "NCHW")
    x = random_input("small_cnn", "NHWC", 4)
    report = compare_gradients(ref, cand, x, np.array([0, 1, 2, 3], np.int32), TOL)
    assert report.passed, str(report)
    # Rows are in the reference's (HWIO) shapes: the NCHW kernel grads were converted.
    assert report["features.0.0.kernel"].shape == (3, 3, 1, 4)


def test_against_layout_with_grads():
    model = fast_model("unet")
    # Both sides are layoutlab's own programs, so the candidate's LLVM level is free: level 0
    # compiles it ~20% faster (the options also reach the report's settings, checked below).
    report = against_layout(
        model,
        random_input("unet", "NHWC", 2, (8, 8)),
        layerwise=True,
        grads=True,
        train=True,
        compiler_options=FAST_COMPILE,
    )
    assert report.passed, str(report)
    assert report.layers is not None and report.grads is not None
    assert "NCHW" in report.reference and "NHWC" in report.candidate
    again = ReferenceReport.from_dict(json.loads(report.to_json()))
    assert again.passed and len(again.layers.rows) == len(report.layers.rows)
    assert report.settings["candidate_xla_options"] == FAST_COMPILE


def test_against_numpy_catches_a_planted_bug():
    model = fast_model("small_cnn", layout="NCHW")
    x = random_input("small_cnn", "NCHW", 4)
    good = against_numpy(model, x, layerwise=True, train=True)
    assert good.passed, str(good)
    assert good.reference.startswith("float64 NumPy")
    # Flipped weights would be flipped in the reference too: the bug must be in the op.
    model.features[3][0].__class__ = _FlippedConv
    bad = against_numpy(model, x, layerwise=True, train=True)
    assert bad.layers.first_failure.path == "features.3.0"


def test_against_fp32_reports_error_per_depth():
    model = fast_model("small_cnn", policy="mixed_bf16")
    x = random_input("small_cnn", "NHWC", 4)
    report = against_policy(model, x, layerwise=True)
    assert report.against == "fp32"
    # Default tolerance scales with the bfloat16 compute dtype.
    assert report.tolerance == default_layer_tolerance(jnp.bfloat16).describe()
    assert report.passed, str(report)
    profile = report.depth_profile()
    assert [p["depth"] for p in profile] == list(range(len(profile)))
    # bfloat16 rounding shows: the first conv already carries ~eps(bf16) relative error.
    assert 1e-4 < profile[0]["rel_l2"] < 2e-2
    # ... and the fp32 twin itself is float32 with the same weights.
    twin = with_policy(model, "fp32")
    assert twin.features[0][0].policy.compute_dtype == np.float32
    np.testing.assert_array_equal(
        np.asarray(twin.features[0][0].kernel[...]), np.asarray(model.features[0][0].kernel[...])
    )


def test_default_tolerance_scales_with_dtype():
    f32 = default_layer_tolerance(np.float32)
    bf16 = default_layer_tolerance(jnp.bfloat16)
    f16 = default_layer_tolerance(np.float16)
    assert f32.rtol == pytest.approx(3e-4)  # the float32 floor
    assert bf16.rtol == pytest.approx(16 * 2.0**-7)
    assert f16.rtol == pytest.approx(16 * 2.0**-10)
    assert default_layer_tolerance(np.float32, jnp.bfloat16) == bf16


def test_compare_layerwise_compiles_both_sides_with_the_given_xla_options(monkeypatch):
    # The options reach both compiles: an option XLA does not know fails the comparison,
    # and the run's own CPU options give a passing comparison of a layout conversion.
    from layoutlab.fast_defaults import fast_compile_options

    ref = fast_model("small_cnn")
    cand = nn.convert_layout(ref, "NCHW")
    x = random_input("small_cnn", "NHWC", 2)
    with pytest.raises(Exception, match="xla_no_such_option"):
        compare_layerwise(ref, cand, x, TOL, compiler_options={"xla_no_such_option": "1"})
    import layoutlab.compare.layerwise as layerwise

    seen = []

    def recording(model, inputs, **kw):
        seen.append(kw["compiler_options"])
        return layer_outputs(model, inputs, **kw)

    monkeypatch.setattr(layerwise, "layer_outputs", recording)
    options = fast_compile_options("infer", "cpu")
    assert compare_layerwise(ref, cand, x, TOL, compiler_options=options).passed
    assert seen == [options, options]
