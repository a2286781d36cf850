"""Conv algorithms (im2col, GEMM weight gradient, Winograd, pointwise, space-to-depth,
depthwise): forward and both gradients against float64 NumPy references, in NHWC and
NCHW; fallbacks; the ``Conv`` layer's algorithm and kernel-storage options.

Tolerance: ``conv_tolerance(dtype, K)`` from ``layoutlab.bench.tuning.conv_reference``, applied as
``|a - e| <= rtol * (|e| + max|e|)`` with ``rtol = u(dtype) + u(float32) * sqrt(K)``:
``u`` is the dtype's default relative tolerance (float32 1.3e-6, bfloat16 1.6e-2), one term
for rounding the operands, one for float32 accumulation over the ``K`` products each output
sums (errors add like a random walk). The references are NumPy float64 only
(``numpy_ref.conv`` / ``conv_transpose``), independent of the jax code under test.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import nn
from layoutlab.bench.tuning.conv_reference import conv_tolerance, reference_conv, spec_inputs
from layoutlab.compare import compare, default_tolerance
from layoutlab.layout import Layout
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import composed
from layoutlab.nn.conv_config import conv_settings, conv_specs
from layoutlab.xla import compile_report

# (x shape NHWC, kernel HWIO, strides, padding) -> algorithms that handle it
CASES = {
    "3x3s1": (
        ((2, 7, 9, 3), (3, 3, 3, 5), 1, "SAME"),
        (
            "im2col",
            "gemm_dw",
            "col2im_dx",
            "phase_dx",
            "winograd2",
            "winograd4",
            "winograd2_xla_dw",
            "winograd4_xla_dw",
            "winograd4_full",
        ),
    ),
    # N * Ho * Wo <= O: im2col's weight gradient is one GEMM over the patches.
    "3x3s1_wide": (((1, 3, 3, 4), (3, 3, 4, 16), 1, "SAME"), ("im2col", "col2im_dx")),
    "3x3s2": (
        ((2, 9, 8, 4), (3, 3, 4, 6), 2, "SAME"),
        ("im2col", "gemm_dw", "col2im_dx", "phase_dx", "s2d"),
    ),
    "1x1s2": (((2, 8, 8, 4), (1, 1, 4, 6), 2, 0), ("im2col", "pointwise", "phase_dx")),
    "1x1s1": (((2, 5, 6, 4), (1, 1, 4, 6), 1, 0), ("im2col", "col2im_dx", "pointwise")),
    "7x7s2": (((1, 11, 11, 3), (7, 7, 3, 4), 2, 3), ("im2col", "s2d", "phase_dx")),
    # Odd sizes, "VALID" and stride 3: phases of unequal length, one past the kernel's reach.
    "3x3s2_valid": (((2, 10, 7, 4), (3, 3, 4, 5), 2, "VALID"), ("phase_dx",)),
    "2x2s3": (((1, 8, 9, 3), (2, 2, 3, 4), 3, "SAME"), ("phase_dx",)),
    # Depthwise (groups = channels, the fifth entry): both strides, odd sizes, explicit pads.
    "dw3x3s1": (((2, 7, 9, 6), (3, 3, 1, 6), 1, "SAME", 6), ("depthwise",)),
    "dw3x3s2": (((2, 9, 8, 5), (3, 3, 1, 5), 2, 1, 5), ("depthwise",)),
    "dw5x5s2_valid": (((1, 11, 10, 4), (5, 5, 1, 4), 2, "VALID", 4), ("depthwise",)),
}
PARAMS = [
    pytest.param(case, alg, layout, id=f"{case}-{alg}-{layout}")
    for case, (_, algs) in CASES.items()
    for alg in algs
    for layout in ("NHWC", "NCHW")
]


def _spec(case, layout, dtype="float32"):
    (xs, ws, s, p, *groups), _ = CASES[case]
    if layout == "NCHW":
        xs = (xs[0], xs[3], xs[1], xs[2])
        ws = (ws[3], ws[2], ws[0], ws[1])
    return ca.conv_spec(
        xs, ws, strides=s, padding=p, groups=groups[0] if groups else 1, layout=layout, dtype=dtype
    )


def _train(spec, algorithm, dtype):
    """``(x, w, dy) -> (y, dx, dw)`` of ``algorithm`` on ``spec`` with ``dtype`` operands."""
    preferred = jnp.float32 if jnp.dtype(dtype) != jnp.float32 else None

    def f(a, b):
        return ca.conv2d(
            a,
            b,
            strides=spec.geometry.strides,
            padding=spec.geometry.padding,
            groups=spec.geometry.groups,
            layout=spec.layout,
            algorithm=algorithm,
            preferred_element_type=preferred,
        )

    def train(a, b, g):
        y, vjp = jax.vjp(f, a, b)
        return (y, *vjp(g.astype(y.dtype)))

    return train


# LLVM's optimization level for the programs of single-conv cases checked against float64
# NumPy: it changes speed and float32 rounding (FMA contraction) only, and the tolerances
# (conv_tolerance: u(dtype) + u(float32) * sqrt(K)) sit far above a rounding's worth; XLA's
# HLO passes and fusions, which decide the algorithm's arithmetic, run alike at every level.
# No case has a ReLU or max-pool, whose ties a rounding could move. Level 0 compiles the
# float32 fixture's program in 14 s instead of 23 s.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _jit_together(cases, compiler_options=None):
    """``{key: (fn, args)}`` -> ``{key: fn(*args)}``, jitted as one program: one XLA compile
    instead of one per case, about half the CPU time (most of a small program's compile is
    fixed cost). Each case gets its own parameters, so no case's ops fuse with or fold into
    another's; a case whose trace raises maps to that error, raised by its own test."""
    errors = {}

    def together(args):
        outs = {}
        for key, (fn, _) in cases.items():
            try:
                outs[key] = fn(*args[key])
            except Exception as err:  # noqa: BLE001 - re-raised by the case's own test
                errors[key] = err
        return outs

    args = {key: args for key, (_, args) in cases.items()}
    outs = jax.jit(together).lower(args).compile(compiler_options)(args)
    return {**outs, **errors}


def _result(together, key):
    """A case's outputs from ``_jit_together``, or the error its trace raised, raised here."""
    outs = together[key]
    if isinstance(outs, Exception):
        raise outs
    return outs


def _outputs(together, key):
    return dict(zip(("y", "dx", "dw"), _result(together, key), strict=True))


def _conv_cases(params, dtype, seed):
    """The cases of ``params`` (case, algorithm, layout) with ``dtype`` operands, by id."""
    cases = {}
    for case, algorithm, layout in params:
        spec = _spec(case, layout, jnp.dtype(dtype).name)
        inputs = tuple(jnp.asarray(a, dtype) for a in spec_inputs(spec, seed=seed))
        cases[f"{case}-{algorithm}-{layout}"] = (_train(spec, algorithm, dtype), inputs)
    return cases


def _check(spec, outs, refs, dtype):
    kh, kw = spec.geometry.kernel_size
    ho, wo = spec.out_size
    reductions = {
        "y": spec.reduction,  # kh * kw * in_features / groups
        "dx": kh * kw * spec.out_features // spec.geometry.groups,
        "dw": spec.batch * ho * wo,
    }
    errors = {}
    for key, red in reductions.items():
        tol = conv_tolerance(dtype, red)
        scale = float(np.max(np.abs(refs[key])))
        actual = np.asarray(outs[key].astype(jnp.float32))
        report = compare(actual, refs[key], rtol=tol.rtol, atol=tol.rtol * scale, name=key)
        assert report.passed, str(report)
        errors[key] = report.max_abs_error / scale
    return errors


@pytest.fixture(scope="module")
def float32_outputs():
    """Every float32 case of ``PARAMS``, compiled as one program (``_jit_together``)."""
    cases = _conv_cases([p.values for p in PARAMS], jnp.float32, seed=1)
    return _jit_together(cases, FAST_COMPILE)


@pytest.mark.parametrize(("case", "algorithm", "layout"), PARAMS)
def test_algorithm_matches_float64_reference(case, algorithm, layout, float32_outputs):
    spec = _spec(case, layout)
    assert ca.select_algorithm(spec, algorithm).name == algorithm  # no silent fallback
    inputs = spec_inputs(spec, seed=1)
    refs = reference_conv(*inputs, spec)
    outs = _outputs(float32_outputs, f"{case}-{algorithm}-{layout}")
    errors = _check(spec, outs, refs, jnp.float32)
    print(f"{case} {algorithm} {layout} float32 max err / max|ref|: {errors}")


BFLOAT16_CASES = [
    ("3x3s1", "im2col"),
    ("3x3s1", "gemm_dw"),
    ("3x3s1", "winograd2"),
    ("3x3s2", "s2d"),
    ("1x1s2", "pointwise"),
    ("dw3x3s2", "depthwise"),
]


@pytest.fixture(scope="module")
def bfloat16_outputs():
    cases = [(case, algorithm, "NHWC") for case, algorithm in BFLOAT16_CASES]
    return _jit_together(_conv_cases(cases, jnp.bfloat16, seed=2), FAST_COMPILE)


@pytest.mark.parametrize(("case", "algorithm"), BFLOAT16_CASES)
def test_bfloat16_operands_accumulate_in_float32(case, algorithm, bfloat16_outputs):
    spec = _spec(case, "NHWC", "bfloat16")
    inputs = spec_inputs(spec, seed=2)
    refs = reference_conv(*inputs, spec)
    outs = _outputs(bfloat16_outputs, f"{case}-{algorithm}-NHWC")
    assert outs["y"].dtype == jnp.float32  # preferred_element_type
    assert outs["dx"].dtype == jnp.bfloat16 and outs["dw"].dtype == jnp.bfloat16
    _check(spec, outs, refs, jnp.bfloat16)


WINOGRAD = ("winograd2", "winograd4", "winograd2_xla_dw", "winograd4_xla_dw")


def _winograd_train(spec, methods, dtype):
    """``(x, w, dy) -> (y, dx)`` of ``methods`` run directly through ``composed_conv`` (no
    ``supports`` check) with ``dtype`` operands."""
    preferred = None if dtype == "float32" else jnp.float32

    def train(a, b, g):
        f = lambda a, b: composed.composed_conv(a, b, spec.geometry, methods, preferred)  # noqa: E731
        y, vjp = jax.vjp(f, a, b)
        return y, vjp(g.astype(y.dtype))[0]

    return train


def _winograd_errors(spec, outs, refs, dtype):
    """``(within conv_tolerance, [normwise error of y, of dx])`` of a core's ``outs``."""
    passed, norms = True, []
    kh, kw = spec.geometry.kernel_size
    for out, ref, k in zip(
        outs,
        (refs["y"], refs["dx"]),
        (kh * kw * spec.in_features, kh * kw * spec.out_features),
        strict=True,
    ):
        a = np.asarray(out.astype(jnp.float32), np.float64)
        tol = conv_tolerance(dtype, k).rtol
        passed &= bool(np.all(np.abs(a - ref) <= tol * (np.abs(ref) + np.abs(ref).max())))
        norms.append(float(np.linalg.norm(a - ref) / np.linalg.norm(ref)))
    return passed, norms


def test_winograd_dtypes_follow_measured_error():
    """Each Winograd variant refuses exactly the compute dtypes where its forward or input
    gradient misses the project's bar, measured here against float64 NumPy.

    The bar is ``conv_tolerance(dtype, K)``, as the autotuner applies it: elementwise
    ``|a - e| <= rtol * (|e| + max|e|)`` with ``rtol = u(dtype) + u(float32) * sqrt(K)``
    (bfloat16 1.6e-2, float16 1e-3, float32 1.3e-6, from ``compare.default_tolerance``).
    The cores run directly (``composed_conv``) so a refused dtype is still measured. Measured
    (normwise, this shape): xla bf16 2.3e-3, F(2,3) bf16 4.6e-3, F(4,3) bf16 2.6e-2 and f16
    3.2e-3 (over the bar), F(4,3) f32 1.5e-6 (K = 288: bar 2.3e-5).
    """
    xs, ws = (2, 12, 12, 32), (3, 3, 32, 32)
    spec32 = ca.conv_spec(xs, ws, padding=1)
    inputs = spec_inputs(spec32, seed=3)
    refs = reference_conv(*inputs, spec32)
    dtypes = ("float32", "bfloat16", "float16")
    # The _xla_dw variants share forward and dX with their plain twin: measure once. Every
    # core and dtype runs in one program (``_jit_together``).
    cores = {}
    for name in WINOGRAD:
        methods = ca.get_algorithm(name).core.methods
        cores.setdefault((methods.forward, methods.input_grad), methods)
    cases = {
        f"{key[0]}-{key[1]}-{dtype}": (
            _winograd_train(spec32, methods, dtype),
            tuple(jnp.asarray(a, dtype) for a in inputs),
        )
        for key, methods in cores.items()
        for dtype in dtypes
    }
    outs = _jit_together(cases)
    measured = {}
    for key in cores:
        for dtype in dtypes:
            got = _result(outs, f"{key[0]}-{key[1]}-{dtype}")
            measured[(key, dtype)] = _winograd_errors(spec32, got, refs, dtype)
    for name in WINOGRAD:
        methods = ca.get_algorithm(name).core.methods
        key = (methods.forward, methods.input_grad)
        for dtype in dtypes:
            passed, norms = measured[(key, dtype)]
            reason = ca.unsupported_reason(name, dtype)
            print(f"{name} {dtype}: y, dx normwise {norms}, within bar {passed}, refused {reason}")
            assert (reason is None) == passed, (name, dtype, norms, reason)
    # What the refusals amount to: F(4x4,3x3) misses bfloat16 and float16 even normwise.
    for dtype in ("bfloat16", "float16"):
        bar = default_tolerance(dtype).rtol
        assert min(measured[(("winograd4", "winograd4"), dtype)][1]) > bar
        assert max(measured[(("winograd2", "winograd2"), dtype)][1]) < bar


@pytest.mark.parametrize("name", WINOGRAD)
def test_winograd_refusals_reach_select_and_auto(name):
    for dtype in ("float32", "bfloat16", "float16"):
        spec = ca.conv_spec((1, 6, 6, 4), (3, 3, 4, 4), padding=1, dtype=dtype)
        refused = ca.unsupported_reason(name, dtype)
        assert (ca.get_algorithm(name).supports(spec) is None) == (refused is None)
        # An explicit request and a planned ``auto`` entry both fall back, saying why.
        planned = ca.PlanEntry(name, spec.key())
        for asked in (name, "auto"):
            sel = ca.select_algorithm(spec, asked, planned)
            if refused is None:
                assert sel == ca.Selection(name, asked, None)
            else:
                assert sel.name == "xla" and f"{name} does not support {dtype}" in sel.reason
                assert "error bar" in sel.reason and "use xla" in sel.reason
    assert ("winograd4" in name) == (ca.unsupported_reason(name, "bfloat16") is not None)
    assert ca.unsupported_reason(name, "float32") is None
    assert "float32" in ca.unsupported_reason(name, "float64")


def test_refused_dtype_runs_natively_with_the_same_result():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 6, 6, 4)), jnp.bfloat16)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3, 3, 4, 4)), jnp.bfloat16)
    y = ca.conv2d(x, w, padding=1, algorithm="winograd4", preferred_element_type=jnp.float32)
    native = ca.conv2d(x, w, padding=1, algorithm="xla", preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(native))  # same native op


def test_unsupported_reason_api():
    assert ca.unsupported_reason("auto", "bfloat16") is None  # auto skips refusing ones
    assert ca.unsupported_reason("xla", jnp.bfloat16) is None
    assert ca.unsupported_reason("winograd4", jnp.dtype(jnp.bfloat16)).startswith(
        "bfloat16 compute (F(4x4,3x3)"
    )
    with pytest.raises(ValueError, match="Unknown conv algorithm 'wino'"):
        ca.unsupported_reason("wino", "float32")
    # Every registered algorithm's supports() honours its own dtype refusals.
    for name in ca.algorithm_names():
        for dtype in ("float32", "bfloat16", "float16", "float64"):
            spec = ca.conv_spec((1, 6, 6, 4), (3, 3, 4, 4), padding=1, dtype=dtype)
            if ca.unsupported_reason(name, dtype) is not None:
                assert ca.get_algorithm(name).supports(spec) is not None, (name, dtype)


@pytest.mark.parametrize(
    ("kwargs", "algorithm", "why"),
    [
        ({"groups": 2}, "im2col", "groups"),
        ({"groups": 4}, "gemm_dw", "groups"),  # depthwise
        ({"groups": 2, "strides": 2}, "phase_dx", "groups"),
        ({"dilation": 2}, "col2im_dx", "dilation"),
        ({"dilation": 2}, "im2col", "dilation"),
        ({"strides": 2}, "winograd4", "stride"),
        ({}, "pointwise", "kernel"),
        ({}, "s2d", "stride"),
        ({}, "depthwise", "one kernel per channel"),  # ungrouped
        ({"groups": 2}, "depthwise", "one kernel per channel"),  # grouped, not depthwise
        ({"groups": 4, "dilation": 2}, "depthwise", "dilation"),
    ],
)
def test_unsupported_shapes_fall_back_to_native(kwargs, algorithm, why):
    groups = kwargs.get("groups", 1)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 6, 6, 4)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3, 3, 4 // groups, 4)), jnp.float32)
    spec = ca.conv_spec(x.shape, w.shape, padding=1, **kwargs)
    sel = ca.select_algorithm(spec, algorithm)
    assert sel.name == "xla" and why in sel.reason
    y = ca.conv2d(x, w, padding=1, algorithm=algorithm, **kwargs)
    native = ca.conv2d(x, w, padding=1, algorithm="xla", **kwargs)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(native))  # same native op


def test_bad_names_raise_clear_errors():
    with pytest.raises(ValueError, match="Unknown conv algorithm 'fast'.*im2col"):
        nn.Conv(2, 2, 3, algorithm="fast", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="2D convs"):
        nn.Conv(2, 2, 3, layout=Layout.NDHWC, algorithm="im2col", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_storage"):
        nn.Conv(2, 2, 3, kernel_storage="OIHW", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="NHWC and NCHW"):
        ca.conv_spec((1, 4, 4, 4, 2), (3, 3, 3, 2, 2), layout="NDHWC")
    with pytest.raises(ValueError, match="reserved"):
        ca.register_algorithm(ca.Algorithm("auto", None, None, ""))


def _hlo_ops(module, x):
    """HLO op totals of ``module(x)`` with the parameters as arguments (not constants)."""
    graphdef, state = nnx.split(module)
    return compile_report(lambda st, a: nnx.merge(graphdef, st)(a), state, x).hlo.totals()


def test_conv_layer_default_is_native_and_algorithms_agree():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 8, 8)), jnp.float32)
    conv = nn.Conv(3, 4, 3, layout=Layout.NCHW, rngs=nnx.Rngs(0))
    assert conv.algorithm == "xla"
    assert _hlo_ops(conv, x)["convolutions"] == 1
    ref = np.asarray(conv(x))
    conv = nn.configure(conv, nn.ConvSettings.named("im2col"))
    totals = _hlo_ops(conv, x)
    assert totals["convolutions"] == 0 and totals["dots"] >= 1  # a GEMM now
    # float32 tolerance for K = 3*3*3 summed terms, as in conv_tolerance.
    tol = conv_tolerance(jnp.float32, 27).rtol
    np.testing.assert_allclose(np.asarray(conv(x)), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_channels_last_kernel_storage_removes_kernel_transposes():
    x = jnp.zeros((2, 8, 16, 16), jnp.float32)
    conv = nn.Conv(8, 16, 3, layout=Layout.NCHW, use_bias=False, rngs=nnx.Rngs(0))
    y_layout = np.asarray(conv(x + 1.0))
    before = _hlo_ops(conv, x)["transposes"]
    conv = nn.configure(conv, nn.ConvSettings(kernel_storage="channels_last"))
    assert conv.kernel_spec == "HWIO" and conv.kernel.shape == (3, 3, 8, 16)
    after = _hlo_ops(conv, x)["transposes"]
    print(f"NCHW conv transposes: OIHW storage {before}, HWIO storage {after}")
    assert after < before
    np.testing.assert_array_equal(np.asarray(conv(x + 1.0)), y_layout)  # same math


def test_channels_last_storage_survives_convert_layout():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 6, 6, 2)), jnp.float32)
    conv = nn.Conv(2, 3, 3, kernel_storage="channels_last", rngs=nnx.Rngs(0))
    ref = np.asarray(conv(x))
    other = nn.convert_layout(conv, "NCHW")
    assert other.kernel_spec == "HWIO"
    y = np.asarray(other(jnp.transpose(x, (0, 3, 1, 2))))
    np.testing.assert_array_equal(np.transpose(y, (0, 2, 3, 1)), ref)


def test_auto_runs_the_plan_entry_for_its_own_shape_only():
    x = jnp.zeros((1, 5, 5, 2), jnp.float32)
    conv = nn.Conv(2, 3, 3, algorithm="auto", rngs=nnx.Rngs(0))
    assert _hlo_ops(conv, x)["convolutions"] == 1  # no plan: xla
    spec = conv.spec(x.shape)
    assert spec == ca.conv_spec(x.shape, conv.kernel.shape, padding=conv.padding)
    plan = ca.ConvPlan({"": ("im2col", spec.key())})
    planned = nn.configure(conv, plan, algorithms={"im2col": ca.get_algorithm("im2col")})
    assert conv.plan_entry is None  # the original is unchanged
    assert ca.select_algorithm(spec, "auto", planned.plan_entry).name == "im2col"
    assert _hlo_ops(planned, x)["convolutions"] == 0
    # Traced at another shape than the entry's: xla, and the selection says why.
    wider = jnp.zeros((1, 7, 7, 2), jnp.float32)
    chosen = ca.select_algorithm(conv.spec(wider.shape), "auto", planned.plan_entry)
    assert chosen.name == "xla" and "chosen for" in chosen.reason
    assert _hlo_ops(planned, wider)["convolutions"] == 1
    # An explicit algorithm has no plan.
    assert _hlo_ops(nn.configure(planned, nn.ConvSettings()), x)["convolutions"] == 1


def test_configure_a_model_and_conv_specs():
    model = nn.configure(nn.Conv(3, 4, 3, rngs=nnx.Rngs(0)), nn.ConvSettings.named("winograd2"))
    assert conv_settings(model) == {"": ("winograd2", "HWIO")}
    specs = conv_specs(model, jax.ShapeDtypeStruct((1, 8, 8, 3), jnp.float32))
    assert {p: s.key() for p, s in specs.items()} == {
        "": "NHWC:n1:8x8:3->4:k3x3:s1x1:p1-1,1-1:d1x1:g1:float32"
    }
    assert model.algorithm == "winograd2"  # traced on a copy
    with pytest.raises(ValueError, match="no layoutlab.nn.Conv"):
        nn.configure(nn.ReLU(), nn.ConvSettings.named("im2col"))
