"""PyTorch parity: every registry model against its torch mirror with the same weights, and
the state_dict importer/exporter."""

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from compare_helpers import fast_model, random_input  # noqa: E402

from layoutlab import models, nn  # noqa: E402
from layoutlab.compare.layer_recording import set_mode  # noqa: E402
from layoutlab.compare.torch_layerwise import pinned_torch_precision, set_torch_mode  # noqa: E402
from layoutlab.compare.torch_mirrors import build_torch_mirror  # noqa: E402
from layoutlab.compare.torch_reference import against_torch  # noqa: E402
from layoutlab.compare.torch_weights import (  # noqa: E402
    StateDictKeyError,
    StateDictShapeError,
    load_torch_state_dict,
    to_torch_state_dict,
    torch_keys,
)
from layoutlab.layout import channels_first, to_layout  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Two cores shared with XLA: torch's OpenMP pool spin-waits and slows ~100x when
    # oversubscribed, so the small forwards here run single-threaded.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# Spatial size per model: the smallest that keeps >= 2x2 positions (x batch 4) in the last
# BatchNorm. With fewer values per channel, train-mode BatchNorm divides by the std of a few
# nearly equal numbers and amplifies float32 rounding: MobileNetV2 at 32x32 (1x1 at the end)
# has both PyTorch and JAX ~2e-4 away from a float64 reference, at 64x64 ~1e-5.
_SPATIAL = {"vgg11_bn": (32, 32), "mobilenet_v2": (64, 64), "small_cnn": (8, 8)}
_BATCH = 4
# The stated bound: logits of two float32 implementations at highest matmul precision.
_LOGITS_ATOL = 1e-4


@pytest.fixture(scope="module")
def build():
    """``build(name, layout)``: ``fast_model(name, layout=layout)``, each call a copy of one
    NHWC build per model (most of fast_model's time is nnx.eval_shape tracing
    models.create; the NCHW model is converted from the NHWC one, as fast_model does)."""
    built = {}

    def model(name, layout="NHWC"):
        if name not in built:
            built[name] = fast_model(name)
        copy = nnx.clone(built[name])
        if models.resolve_layout(layout, models.spec(name).num_spatial).is_channels_last:
            return copy
        return nn.convert_layout(copy, layout)

    return model


def _calibrate_running_stats(mirror, x_cf):
    norms = [m for m in mirror.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.momentum = 1.0
    with torch.no_grad():
        set_torch_mode(mirror, True)(torch.from_numpy(x_cf))
    for m in norms:
        m.momentum = 0.1


def _jax_logits(model, x):
    """Train-mode and eval-mode logits from one compiled function."""
    train_def, train_state = nnx.split(set_mode(model, True))
    eval_def, eval_state = nnx.split(set_mode(model, False))

    def both(ts, es, x):
        return nnx.merge(train_def, ts)(x), nnx.merge(eval_def, es)(x)

    with jax.default_matmul_precision("highest"):
        lowered = jax.jit(both).lower(train_state, eval_state, x)
        # LLVM's optimization level changes speed, not the float32 arithmetic XLA emits; at
        # level 0 the registry compiles in about half the time.
        compiled = lowered.compile({"xla_backend_optimization_level": 0})
        return [np.asarray(v) for v in compiled(train_state, eval_state, x)]


def _torch_logits(mirror, x_cf):
    out = {}
    with pinned_torch_precision(), torch.no_grad():
        # Eval first: a train-mode pass updates the running statistics.
        for train in (False, True):
            set_torch_mode(mirror, train)
            out[train] = mirror(torch.from_numpy(x_cf)).numpy()
    return [out[True], out[False]]


def _to_cf_output(y, layout):
    # Per-pixel logits come back in the model's layout; torch's are channels-first.
    if y.ndim == layout.rank:
        return np.asarray(to_layout(y, layout, channels_first(layout.num_spatial)))
    return y


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("name", models.names())
def test_registry_model_matches_torch(name, layout, record_property, build):
    spec = models.spec(name)
    model = build(name, layout)
    lay = models.resolve_layout(layout, spec.num_spatial)
    x = random_input(name, lay, _BATCH, _SPATIAL.get(name, (16,) * spec.num_spatial))
    if spec.num_spatial == 3:
        x = random_input(name, lay, _BATCH, (8, 16, 16))
    mirror = build_torch_mirror(name, num_classes=5, **spec.tiny)
    # The exporter's keys are exactly the mirror's (checked here rather than in a test of
    # its own, which built every registry model once more).
    exported = to_torch_state_dict(model, tensors=True)
    theirs = set(mirror.state_dict())
    assert set(exported) == theirs, (name, set(exported) ^ theirs)
    mirror.load_state_dict(exported)
    x_cf = np.ascontiguousarray(to_layout(x, lay, channels_first(spec.num_spatial)))
    # Eval mode gets the running statistics of this very input (as after training) and
    # they come back through the importer, which is thereby tested in both directions.
    _calibrate_running_stats(mirror, x_cf)
    load_torch_state_dict(model, mirror.state_dict())

    ours = [_to_cf_output(y, lay) for y in _jax_logits(model, x)]
    theirs = _torch_logits(mirror, x_cf)
    for mode, a, e in zip(("train", "eval"), ours, theirs, strict=True):
        err = float(np.max(np.abs(a.astype(np.float64) - e)))
        record_property(f"logits_max_abs_error_{mode}", err)
        print(f"{name} {layout} {mode}: logits max abs error {err:.3g}")
        assert a.shape == e.shape
        assert err <= _LOGITS_ATOL, f"{name} {layout} {mode}: {err:.3g} > {_LOGITS_ATOL}"


def test_layerwise_and_grads_against_torch():
    spec = models.spec("small_cnn")
    model = fast_model("small_cnn")
    x = np.random.default_rng(2).standard_normal(spec.input_shape(4, "NHWC")).astype(np.float32)
    report = against_torch(
        model, x, name="small_cnn", model_kwargs=spec.tiny, train=True, layerwise=True, grads=True
    )
    assert report.passed, str(report)
    # Every layer of the model has a torch counterpart and was compared.
    assert not report.layers.unmatched_candidate
    assert [r.path for r in report.layers.rows][:3] == [
        "features.0.0",
        "features.0.1",
        "features.0.2",
    ]
    assert len(report.grads.rows) == len(torch_keys(model)) - 2 * 3  # BN running stats
    assert report.settings["torch_float32_matmul_precision"] == "highest"
    assert report.settings["jax_matmul_precision"] == "highest"
    assert report.grads.settings["reference_loss"] == pytest.approx(
        report.grads.settings["candidate_loss"], rel=1e-5
    )
    # No flip here, and what is left is float32's rounding: within a small multiple of
    # PyTorch float32's own error against float64 on the same (pinned) case.
    assert report.grads.decision_flips == ()
    assert report.grads.settings["decisions"].startswith("matched")
    assert report.grads.settings["float32_check"].startswith("within float32's own"), str(
        report.grads
    )


@jax.custom_vjp
def _slip(kernel):
    return kernel


_slip.defvjp(lambda k: (k, None), lambda _, g: (g * (1 + 1e-4),))


class _SlippedBackwardConv(nn.Conv):
    """Forward exact, kernel gradient 1e-4 too large: inside the gradient tolerance (3e-4),
    but a thousand times float32's own error."""

    def __call__(self, x):
        kernel = self.kernel[...]
        self.kernel[...] = _slip(kernel)
        try:
            return super().__call__(x)
        finally:
            self.kernel[...] = kernel


def test_float32_check_names_an_error_beyond_float32s_own():
    spec = models.spec("small_cnn")
    model = fast_model("small_cnn")
    model.features[1][0].__class__ = _SlippedBackwardConv
    x = np.random.default_rng(2).standard_normal(spec.input_shape(4, "NHWC")).astype(np.float32)
    report = against_torch(model, x, name="small_cnn", model_kwargs=spec.tiny, train=True,
                           grads=True)  # fmt: skip
    check = report.grads.settings["float32_check"]
    assert check.startswith("BEYOND float32's own") and "worst features.1.0.weight" in check, check
    assert "float32_check: BEYOND" in str(report)


def test_torchvision_names(build):
    m = fast_model("resnet18", num_classes=10)
    sd = to_torch_state_dict(m)
    for key in (
        "conv1.weight",
        "bn1.running_mean",
        "bn1.num_batches_tracked",
        "layer1.0.conv1.weight",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.running_var",
        "fc.weight",
        "fc.bias",
    ):
        assert key in sd, key
    assert sd["conv1.weight"].shape == (8, 3, 3, 3)  # OIHW
    assert sd["fc.weight"].shape == (10, 64)  # (out, in)
    mb = build("mobilenet_v2")
    keys = torch_keys(mb)
    assert "features.0.0.weight" in keys and "features.1.conv.0.0.weight" in keys
    assert "classifier.1.weight" in keys
    vgg = build("vgg11_bn")
    assert {
        "features.0.weight",
        "features.1.running_mean",
        "classifier.0.weight",
        "classifier.6.weight",
    } <= set(torch_keys(vgg))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_round_trip_in_both_layouts(layout):
    models.spec("unet")  # has a transposed conv, biased convs and BatchNorm
    src = fast_model("unet", layout=layout, seed=0)
    dst = fast_model("unet", layout=layout, seed=7)
    load_torch_state_dict(dst, to_torch_state_dict(src, tensors=True))
    a, b = nnx.state(src), nnx.state(dst)
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # exact: a permutation


def test_cross_layout_import_equals_convert_layout():
    models.spec("resnet18")
    nhwc = fast_model("resnet18", seed=0)
    nchw = fast_model("resnet18", layout="NCHW", seed=3)
    load_torch_state_dict(nchw, to_torch_state_dict(nhwc))
    expected = nnx.state(nn.convert_layout(nhwc, "NCHW"), nnx.Param)
    got = nnx.state(nchw, nnx.Param)
    for x, y in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_pth_file_on_disk(tmp_path):
    spec = models.spec("small_cnn")
    mirror = build_torch_mirror("small_cnn", num_classes=10, **spec.tiny)
    path = tmp_path / "small_cnn.pth"
    torch.save(mirror.state_dict(), path)
    model = fast_model("small_cnn", layout="NCHW", num_classes=10)
    assert load_torch_state_dict(model, path) is model
    conv = model.features[0][0]
    kernel = np.asarray(conv.kernel[...])
    # Stored HWIO by default on CPU, OIHW (PyTorch's order) elsewhere: either way the
    # importer wrote PyTorch's values, only permuted.
    if conv.kernel_spec == "HWIO":
        kernel = kernel.transpose(3, 2, 0, 1)
    else:
        assert conv.kernel_spec == "OIHW"
    np.testing.assert_array_equal(kernel, mirror.features[0][0].weight.detach().numpy())
    np.testing.assert_array_equal(
        np.asarray(model.classifier[0].kernel[...]), mirror.classifier[0].weight.detach().numpy().T
    )


def test_missing_file_is_clear(tmp_path):
    model = fast_model("small_cnn")
    with pytest.raises(FileNotFoundError, match="No PyTorch weights file"):
        load_torch_state_dict(model, tmp_path / "nope.pth")


def test_key_mismatch_lists_missing_and_unexpected():
    model = fast_model("small_cnn")
    sd = to_torch_state_dict(model)
    sd.pop("classifier.3.bias")
    sd["classifier.9.weight"] = np.zeros((2, 2), np.float32)
    before = np.asarray(model.classifier[0].kernel[...]).copy()
    with pytest.raises(StateDictKeyError) as info:
        load_torch_state_dict(model, sd)
    msg = str(info.value)
    assert "Missing keys (1): classifier.3.bias" in msg
    assert "Unexpected keys (1): classifier.9.weight" in msg
    np.testing.assert_array_equal(np.asarray(model.classifier[0].kernel[...]), before)


def test_module_prefix_hint():
    model = fast_model("small_cnn")
    sd = {f"module.{k}": v for k, v in to_torch_state_dict(model).items()}
    with pytest.raises(StateDictKeyError, match="strip that prefix"):
        load_torch_state_dict(model, sd)


def test_shape_mismatch_names_key_and_both_shapes():
    model = fast_model("small_cnn")
    wider = fast_model("small_cnn", width=6)
    with pytest.raises(StateDictShapeError) as info:
        load_torch_state_dict(model, to_torch_state_dict(wider))
    msg = str(info.value)
    assert (
        "features.0.0.weight: the state_dict has shape (6, 1, 3, 3), the model expects "
        "(4, 1, 3, 3)" in msg
    )


def test_nested_checkpoint_is_explained():
    model = fast_model("small_cnn")
    with pytest.raises(ValueError, match=r"checkpoint\['state_dict'\]"):
        load_torch_state_dict(model, {"state_dict": to_torch_state_dict(model), "epoch": 3})
