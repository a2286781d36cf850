"""The ``onednn`` conv algorithm (oneDNN primitives through XLA FFI custom calls): forward and
both gradients against float64 over fuzzed shapes, both layouts, float32 and bfloat16; inside
``jit``, ``grad`` and remat; bitwise repeatable; and XLA's convs, with the reason, where the
extension is absent.

Reference: XLA's conv in float64 (``jax.enable_x64``) of the same float32 inputs, and its VJP,
which is independent of oneDNN. Tolerance: ``conv_tolerance(dtype, K)`` as in
``tests/nn/test_conv_algos.py``, ``|a - e| <= rtol * (|e| + max|e|)`` with
``rtol = u(dtype) + u(float32) * sqrt(K)``: one term for rounding the operands to ``dtype``
(for bfloat16, 1.6e-2: operands, cotangent and the bf16 input gradient each rounded once
to 8 bits, about 4e-3 each), one for float32 accumulation over the ``K`` products each output
sums, whose rounding errors add like a random walk.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from onednn_helpers import (
    BF16_CASES,
    CASES,
    case_inputs,
    case_spec,
    check_against_float64,
    conv_fn,
    float64_reference,
    float64_references,
    needs_onednn,
    train_fn,
    train_together,
)

from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import onednn, onednn_load
from layoutlab.precision import get_policy

LAYOUTS = ("NHWC", "NCHW")
F32_PARAMS = [(c, lay) for c in CASES for lay in LAYOUTS]
BF16_PARAMS = [(c, lay) for c in BF16_CASES for lay in LAYOUTS]


@pytest.fixture(scope="module")
def float32_outputs():
    return train_together(F32_PARAMS, jnp.float32, None)


@pytest.fixture(scope="module")
def bfloat16_outputs():
    return train_together(BF16_PARAMS, jnp.bfloat16, jnp.float32)


@pytest.fixture(scope="module")
def references():
    """Float64 results of every case's float32 inputs (bfloat16 cases round the same ones)."""
    specs = {}
    for case, layout in F32_PARAMS:
        spec = case_spec(case, layout)
        specs[f"{case}-{layout}"] = (spec, case_inputs(spec, seed=3))
    return float64_references(specs)


@needs_onednn
@pytest.mark.parametrize(("case", "layout"), F32_PARAMS)
def test_float32_matches_float64(case, layout, float32_outputs, references):
    spec = case_spec(case, layout)
    assert ca.select_algorithm(spec, "onednn").reason is None  # oneDNN runs, no fallback
    outs = dict(zip(("y", "dx", "dw"), float32_outputs[f"{case}-{layout}"], strict=True))
    check_against_float64(spec, outs, references[f"{case}-{layout}"], jnp.float32)


@needs_onednn
@pytest.mark.parametrize(("case", "layout"), BF16_PARAMS)
def test_bfloat16_operands_accumulate_in_float32(case, layout, bfloat16_outputs, references):
    spec = case_spec(case, layout, "bfloat16")
    assert ca.select_algorithm(spec, "onednn").reason is None
    outs = dict(zip(("y", "dx", "dw"), bfloat16_outputs[f"{case}-{layout}"], strict=True))
    assert outs["y"].dtype == jnp.float32  # preferred_element_type
    assert outs["dx"].dtype == jnp.bfloat16 and outs["dw"].dtype == jnp.bfloat16
    check_against_float64(spec, outs, references[f"{case}-{layout}"], jnp.bfloat16)


def test_bfloat16_cases_cover_every_weight_gradient_primitive():
    """The weight gradient runs one of three primitives by its shape (``onednn.choice``):
    HWIO weights, float32 on converted activations, or oneDNN's bfloat16 kernel; the bfloat16
    cases above check each against float64, the bfloat16 kernel on a strided conv too."""
    seen = {}
    for case in BF16_CASES:
        spec = case_spec(case, "NHWC", "bfloat16")
        pixels = spec.batch * math.prod(spec.out_size)
        slow = onednn.slow_bf16_weight_gradient(spec.geometry, spec.in_features, spec.batch)
        seen[case] = onednn.choice(onednn._BWD_WEIGHTS, "bfloat16", spec.batch, pixels, slow)
    assert set(seen.values()) == {(True, False), (False, True), (False, False)}
    assert seen["3x3s2_batch8"] == (False, False)


def test_bfloat16_weight_gradient_runs_in_float32_where_the_bfloat16_kernel_was_slow():
    """oneDNN 3.2's direct bfloat16 weight-gradient kernel (no AMX) ran 25-35x slower than its
    float32 one on a 3-channel stem at every batch, and several times slower at batch 1 on
    strided 3x3 convs and small images; from batch 8 on it ran those faster, and whole
    training steps 1.05-1.11x (docs/performance/onednn_kernels.md). Where it was slow, the
    weight gradient takes float32 on converted activations."""

    def spec(x, w, strides=1):
        return ca.conv_spec(x, w, strides=strides, padding=1, kernel_layout="HWIO")

    def f32_compute(spec):
        pixels = spec.batch * math.prod(spec.out_size)
        slow = onednn.slow_bf16_weight_gradient(spec.geometry, spec.in_features, spec.batch)
        # float32 activations never convert
        assert onednn.choice(onednn._BWD_WEIGHTS, "float32", spec.batch, pixels, slow)[1] is False
        return onednn.choice(onednn._BWD_WEIGHTS, "bfloat16", spec.batch, pixels, slow)[1]

    for n in (1, 4, 8, 32, 256):
        small = n < onednn.BF16_WEIGHT_GRADIENT_MIN_BATCH
        cases = {
            "stem 3->64": (spec((n, 32, 32, 3), (3, 3, 3, 64)), True),
            "3x3 stride 2": (spec((n, 64, 64, 64), (3, 3, 64, 128), 2), small),
            "1x1 stride 2": (spec((n, 64, 64, 64), (1, 1, 64, 128), 2), False),
            # 1,024 output pixels in all at batch 1: float32 there
            "3x3 stride 1, 32x32": (spec((n, 32, 32, 64), (3, 3, 64, 64)), n == 1),
            # 64 output pixels per image: float32 below batch 8 (at 1, HWIO weights)
            "3x3 stride 1, 8x8": (spec((n, 8, 8, 256), (3, 3, 256, 256)), 1 < n < 8),
        }
        for name, (s, want) in cases.items():
            assert f32_compute(s) is want, (name, n)


@needs_onednn
@pytest.mark.parametrize("algorithm", ["onednn", "onednn_xla_dw"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_half_output_written_by_onednn_has_the_bits_of_a_float32_output_cast(layout, algorithm):
    """``out_dtype``: oneDNN accumulates in float32 whatever it writes, so asked for
    bfloat16 it writes the float32 result rounded once. Reference: the same conv writing
    float32, cast by XLA after it (what a bias-free layer ran before); forward and both
    gradients must match bit for bit, and the program's forward call must write bfloat16.
    ``onednn_xla_dw`` (the RGB stem's algorithm in bf16 training) too: its XLA weight
    gradient still accumulates in float32."""
    from layoutlab.xla.hlo import hlo_report

    for case in ("3x3s1", "3x3s2", "1x1s2"):
        spec = case_spec(case, layout, "bfloat16")
        g = spec.geometry
        x, w, dy = (jnp.asarray(a, jnp.bfloat16) for a in case_inputs(spec, seed=7))
        kw = dict(strides=g.strides, padding=g.padding, layout=layout, kernel_layout="HWIO",
                  algorithm=algorithm, preferred_element_type=jnp.float32)  # fmt: skip

        def cast_after(x, w, kw=kw):
            return ca.conv2d(x, w, **kw).astype(jnp.bfloat16)

        def written(x, w, kw=kw):
            return ca.conv2d(x, w, out_dtype=jnp.bfloat16, **kw)

        outs = {}
        for name, f in (("cast after", cast_after), ("written", written)):
            y, vjp = jax.vjp(f, x, w)
            outs[name] = (y, *vjp(dy.astype(y.dtype)))
        for a, b in zip(outs["cast after"], outs["written"], strict=True):
            assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), case
        calls = hlo_report(jax.jit(written).lower(x, w).compile().as_text()).custom_calls
        fwd = [c for c in calls if c.target.endswith("_fwd")]
        assert [c.result.dtype for c in fwd] == ["bf16"], (case, fwd)


@needs_onednn
def test_a_bias_free_mixed_bf16_conv_layer_lets_onednn_write_bfloat16():
    """A layer with a bias adds it in float32 before the cast, so only a bias-free one asks
    oneDNN for the compute dtype (the ResNets' convs, each followed by a normalization)."""
    from flax import nnx

    from layoutlab import nn
    from layoutlab.xla.hlo import hlo_report

    x = jnp.ones((2, 8, 8, 16), jnp.float32)
    for bias, want in ((False, "bf16"), (True, "f32")):
        mixed = get_policy("mixed_bf16")
        conv = nn.Conv(16, 16, 3, use_bias=bias, algorithm="onednn", policy=mixed,
                       rngs=nnx.Rngs(0))  # fmt: skip
        text = jax.jit(lambda x, conv=conv: conv(x)).lower(x).compile().as_text()
        fwd = [c for c in hlo_report(text).custom_calls if c.target.endswith("_fwd")]
        assert [c.result.dtype for c in fwd] == [want], bias


@needs_onednn
def test_bfloat16_output_dtype_and_custom_calls_in_the_program():
    spec = case_spec("3x3s1", "NHWC", "bfloat16")
    x, w, dy = (jnp.asarray(a, jnp.bfloat16) for a in case_inputs(spec, seed=4))
    train = train_fn(spec, "onednn")  # no preferred type: bf16 out, f32 accumulation inside
    hlo = jax.jit(train).lower(x, w, dy).as_text()
    for target in onednn_load.TARGETS.values():
        assert target.startswith(onednn.TARGET_PREFIX) and target in hlo
    y, dx, dw = jax.jit(train)(x, w, dy)
    assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16
    check_against_float64(
        spec, {"y": y, "dx": dx, "dw": dw}, float64_reference(spec, x, w, dy), jnp.bfloat16
    )


def _loss(algorithm, spec, remat=False):
    conv = conv_fn(spec, algorithm)

    def block(x, w):
        return jax.nn.relu(conv(x, w))

    block = jax.checkpoint(block) if remat else block
    return lambda x, w: jnp.sum(jnp.sin(block(block(x, w), w)))


@needs_onednn
def test_grad_under_remat_equals_plain_and_is_bitwise_repeatable():
    spec = case_spec("3x3s1", "NHWC")
    x = jax.random.normal(jax.random.key(0), (2, 7, 9, 16))
    w = jax.random.normal(jax.random.key(1), (3, 3, 16, 16)) * 0.1
    plain = jax.jit(jax.grad(_loss("onednn", spec), argnums=(0, 1)))
    remat = jax.jit(jax.grad(_loss("onednn", spec, remat=True), argnums=(0, 1)))
    first = plain(x, w)
    # Remat recomputes the forward with the same primitive: the same bits, not just close.
    for a, b in zip(first, remat(x, w), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for _ in range(3):  # same inputs, same bits, call after call
        for a, b in zip(first, plain(x, w), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # And the gradient is XLA's conv's within float32 rounding (1e-4 relative: two convs of
    # 144 products each and their gradients, far above float32's 1e-7, far below an error).
    xla = jax.jit(jax.grad(_loss("xla", spec), argnums=(0, 1)))(x, w)
    for a, b in zip(first, xla, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


@needs_onednn
def test_handler_errors_come_back_as_python_errors():
    x = jnp.ones((1, 4, 4, 6))
    w = jnp.ones((3, 3, 4, 8))  # 4 in-channels per group with groups=1: wrong for C=6
    geom = ca.resolve_geometry((4, 4), 3)
    with pytest.raises(Exception, match="kernel in-channels"):
        jax.block_until_ready(jax.jit(lambda a, b: onednn.onednn_conv(a, b, geom, None))(x, w))


def test_float16_and_cropping_pads_run_xla_with_the_reason():
    assert "float16" in onednn.dtype_reason("float16")
    assert ca.unsupported_reason("onednn", jnp.float16) is not None
    spec = ca.conv_spec((1, 8, 8, 4), (3, 3, 4, 4), padding=((-1, 0), (0, 0)))
    chosen = ca.select_algorithm(spec, "onednn")
    assert chosen.name == "xla" and "negative padding" in chosen.reason


@pytest.fixture
def extension_absent(monkeypatch):
    """The loader as on a machine where the extension did not build."""

    def fail():
        raise OSError("the layoutlab._onednn extension was not built (simulated)")

    onednn_load.reset_for_tests()
    monkeypatch.setattr(onednn_load, "_load_extension", fail)
    yield
    monkeypatch.undo()
    onednn_load.reset_for_tests()


def test_absent_extension_falls_back_to_xla_with_the_reason(extension_absent):
    assert not onednn.available()
    assert "simulated" in onednn.unavailable_reason()
    assert onednn.status_line() == (
        "onednn convs: unavailable (the layoutlab._onednn extension was not built "
        "(simulated)); XLA's convs run"
    )
    spec = case_spec("3x3s2", "NHWC")
    chosen = ca.select_algorithm(spec, "onednn")
    assert chosen.name == "xla" and "simulated" in chosen.reason
    x, w, dy = (jnp.asarray(a) for a in case_inputs(spec, seed=5))
    hlo = jax.jit(train_fn(spec, "onednn")).lower(x, w, dy).as_text()
    assert onednn.TARGET_PREFIX not in hlo
    got = jax.jit(train_fn(spec, "onednn"))(x, w, dy)
    want = jax.jit(train_fn(spec, "xla"))(x, w, dy)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The core itself, reached without supports (a plan naming it), runs XLA's conv too.
    geom = spec.geometry
    y = onednn.onednn_core(x, w, geom, None)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want[0]))


@needs_onednn
def test_nchw_activations_read_directly_match_the_nhwc_conv():
    """``onednn_conv`` takes NCHW itself (oneDNN's GEMM-based kernel; the registry core
    transposes instead, see the module docstring): the same values as NHWC, within float32
    rounding of the 72-product sums (1e-5 relative to the largest output)."""
    spec = case_spec("3x3s2", "NHWC")
    x, w, dy = (jnp.asarray(a) for a in case_inputs(spec, seed=6))
    t = (0, 3, 1, 2)
    ys = []
    for layout, xi, dyi in (("NHWC", x, dy), ("NCHW", x.transpose(t), dy.transpose(t))):
        conv = lambda a, b, lay=layout: onednn.onednn_conv(a, b, spec.geometry, None, lay)  # noqa: E731
        y, vjp = jax.vjp(conv, xi, w)
        dx, dw = vjp(dyi)
        if layout == "NCHW":
            y, dx = y.transpose(0, 2, 3, 1), dx.transpose(0, 2, 3, 1)
        ys.append((y, dx, dw))
    for a, b in zip(*ys, strict=True):
        scale = float(jnp.max(jnp.abs(a)))
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * scale, rtol=0)


def test_off_cpu_the_program_holds_xla_convs_only():
    """Lowered for a GPU, the algorithm's convs are XLA's (``lax.platform_dependent``): no
    custom call that the GPU could not run. On CPU, the forward's result is unused by the
    gradient of a sum, so the program holds the two gradient calls."""
    spec = case_spec("3x3s1", "NHWC")
    x, w, _ = (jnp.asarray(a) for a in case_inputs(spec, seed=7))
    grad = jax.jit(jax.grad(lambda a, b: jnp.sum(conv_fn(spec, "onednn")(a, b)), argnums=(0, 1)))
    gpu = grad.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert onednn.TARGET_PREFIX not in gpu and "convolution" in gpu
    if onednn.available():
        cpu = grad.trace(x, w).lower(lowering_platforms=("cpu",)).as_text()
        assert cpu.count(onednn.TARGET_PREFIX) == 2 and "convolution" not in cpu


def _setup_module(monkeypatch):
    """``setup.py`` as a module, with ``setuptools.setup`` not run."""
    import importlib.util
    from pathlib import Path

    import setuptools

    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    path = Path(__file__).resolve().parents[2] / "setup.py"
    spec = importlib.util.spec_from_file_location("layoutlab_setup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_leaves_the_extension_out_rather_than_fail(monkeypatch):
    """The extension is optional to setuptools (a failed compile still installs the package),
    and without the oneDNN wheels or XLA's FFI headers it is not attempted at all."""
    setup = _setup_module(monkeypatch)
    for ext in setup._extensions():
        assert ext.name == "layoutlab._onednn" and ext.optional
    monkeypatch.setattr(setup, "_jaxlib_include", lambda: None)
    assert setup._extensions() == []


WAIT_PROBE = """
import os
from layoutlab.nn.conv_algos import onednn_load
print(onednn_load.available(), onednn_load.wait_policy(), os.environ.get("OMP_WAIT_POLICY"))
"""


@needs_onednn
@pytest.mark.parametrize(
    ("given", "runtime", "source"),
    [(None, "PASSIVE", "set by layoutlab"), ("active", "ACTIVE", "(OMP_WAIT_POLICY)")],
)
def test_openmp_wait_policy_is_passive_unless_the_environment_says(env, given, runtime, source):
    """libgomp reports the policy it read at start-up (``OMP_DISPLAY_ENV``); the process's
    environment is left as it was."""
    import subprocess
    import sys

    run_env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
    run_env["OMP_DISPLAY_ENV"] = "TRUE"
    if given is not None:
        run_env["OMP_WAIT_POLICY"] = given
    proc = subprocess.run(
        [sys.executable, "-c", WAIT_PROBE], env=run_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert f"OMP_WAIT_POLICY = '{runtime}'" in proc.stderr
    loaded, *rest = proc.stdout.split()
    assert loaded == "True" and source in proc.stdout and rest[-1] == str(given)


@needs_onednn
def test_shapes_onednn_runs_by_reference_kernels_run_xla(monkeypatch):
    """Where oneDNN has only its reference kernel for one of the three primitives (none of
    the shapes above on this CPU), or none at all, the conv runs XLA's, saying which."""
    spec = case_spec("3x3s1", "NHWC")
    assert onednn.supports(spec) is None
    monkeypatch.setattr(onednn, "impl_info", lambda params: ("ref:any", False, 0))
    assert "reference kernel 'ref:any'" in ca.select_algorithm(spec, "onednn").reason
    monkeypatch.setattr(onednn, "impl_info", lambda params: "oneDNN: could not create")
    assert "could not create" in ca.select_algorithm(spec, "onednn").reason
