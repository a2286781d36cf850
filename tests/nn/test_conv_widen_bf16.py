"""bfloat16 convs on a CPU without bfloat16 units compute in float32.

On the kind ``avx512`` (AVX-512 without ``avx512_bf16``/AMX), the shipped table gives a
bfloat16 conv its float32 twin's algorithm (in inference without ``ONEDNN_OVERRIDES``) and
marks the entry ``compute_dtype="float32"``
(``default_plan.widened_dtype``); ``conv2d`` then rounds both operands to bfloat16, widens
them to float32 (exact) and runs the float32 algorithm. The CPU kind is passed as a value, so
this holds on any machine.

Numerics reference: float64 of the bfloat16-rounded operands. The forward's float32 result
must sit within float32's own conv tolerance of it (``conv_tolerance("float32", K)``: K terms
summed in float32), which a conv that rounded a product or a partial sum to bfloat16 would
miss; the gradients come back in the operands' dtypes (bfloat16 for the activations; the
float32 kernel's through its bfloat16 rounding), within bfloat16's tolerance.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from onednn_helpers import (
    FAST_COMPILE,
    case_inputs,
    case_spec,
    check_against_float64,
    float64_reference,
    needs_onednn,
)

from layoutlab.bench.tuning.conv_reference import conv_tolerance
from layoutlab.compare import compare
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos.default_plan import default_algorithm, widened_dtype
from layoutlab.nn.conv_algos.plan import ConvPlan, PlanEntry
from layoutlab.precision import get_policy

KINDS_WITHOUT_UNITS = ("avx512",)


def _bf16_specs(batch):
    shapes = [("3x3s1", 1), ("3x3s2", 1), ("7x7s2_rgb", 1)]
    return [case_spec(case, "NHWC", "bfloat16")._replace(batch=batch) for case, _ in shapes]


@pytest.mark.parametrize("objective", ["train", "inference"])
def test_the_table_widens_bfloat16_convs_only_where_the_cpu_has_no_bf16_units(objective):
    for batch in (1, 32, 256):
        for spec in _bf16_specs(batch):
            twin = spec._replace(dtype="float32")
            for kind in KINDS_WITHOUT_UNITS:
                assert widened_dtype(spec, kind) == "float32"
                assert (
                    default_algorithm(spec, objective, kind)[0]
                    == (default_algorithm(twin, objective, kind)[0])
                )
                assert widened_dtype(twin, kind) is None
            # bf16 units, AVX2 (not measured), another architecture, or off CPU: the conv
            # stays bfloat16.
            for kind in ("avx512_bf16", "avx2", "other", None):
                assert widened_dtype(spec, kind) is None


def _widened_train(spec, algorithm, out_dtype=None):
    g = spec.geometry
    entry = PlanEntry(algorithm, spec.key(), "float32")

    def f(x, w):
        return ca.conv2d(
            x, w, strides=g.strides, padding=g.padding, dilation=g.dilation, groups=g.groups,
            layout=spec.layout, kernel_layout="HWIO", algorithm="auto", planned=entry,
            preferred_element_type=jnp.float32, out_dtype=out_dtype,
        )  # fmt: skip

    def train(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        return (y, *vjp(dy.astype(y.dtype)))

    return train


def _algorithms():
    algos = ["xla", "im2col"]
    if ca.onednn.available():
        algos.append("onednn")
    return algos


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_a_widened_conv_is_float32_arithmetic_on_bfloat16_operands(layout):
    for i, case in enumerate(("3x3s1", "3x3s2", "7x7s2_rgb")):
        spec = case_spec(case, layout, "bfloat16")
        x, w, dy = case_inputs(spec, seed=21 + i)
        xb, db = jnp.asarray(x, jnp.bfloat16), jnp.asarray(dy, jnp.bfloat16)
        w32 = jnp.asarray(w, jnp.float32)  # a mixed_bf16 layer's float32 parameter
        rounded = [np.asarray(a.astype(jnp.float32), np.float64)
                   for a in (xb, w32.astype(jnp.bfloat16), db)]  # fmt: skip
        refs = float64_reference(spec._replace(dtype="float32"), *rounded)
        for algorithm in _algorithms():
            train = jax.jit(_widened_train(spec, algorithm), compiler_options=FAST_COMPILE)
            y, dx, dw = train(xb, w32, db)
            assert (y.dtype, dx.dtype, dw.dtype) == (jnp.float32, jnp.bfloat16, jnp.float32)
            check_against_float64(spec, {"y": y, "dx": dx, "dw": dw}, refs, "bfloat16")
            # The forward alone, in float32's tolerance: no product or sum was rounded.
            tol = conv_tolerance("float32", spec.reduction)
            scale = float(np.max(np.abs(refs["y"])))
            report = compare(np.asarray(y, np.float64), refs["y"], rtol=tol.rtol,
                             atol=tol.rtol * scale, name=f"{case} {algorithm} y")  # fmt: skip
            assert report.passed, str(report)


def _conv_dtypes(text: str) -> dict[str, int]:
    """``{"f32*f32->f32": n}``: the operand and result dtypes of every convolution (oneDNN's
    conv calls included) and dot (im2col's GEMMs) in optimized HLO
    (``xla.hlo.HloReport.operand_dtypes``)."""
    from collections import Counter

    from layoutlab.xla.hlo import hlo_report

    report = hlo_report(text)
    found = report.operand_dtypes()
    onednn = Counter(
        "*".join(o.dtype for o in c.operands[:2]) + "->custom-call"
        for c in report.custom_calls
        if c.target.startswith(ca.onednn.TARGET_PREFIX)
    )
    return dict(Counter(found["convolutions"]) + Counter(found["dots"]) + onednn)


# Not "xla": XLA:CPU widens a bfloat16 conv to float32 itself, so its program looks the same
# either way; the float32 twin's other algorithms are what widening brings.
@pytest.mark.parametrize("algorithm", _algorithms()[1:])
def test_the_program_convolves_float32_and_returns_the_layers_dtype(algorithm):
    spec = case_spec("3x3s1", "NHWC", "bfloat16")
    x, w, dy = case_inputs(spec, seed=4)
    args = (jnp.asarray(x, jnp.bfloat16), jnp.asarray(w), jnp.asarray(dy, jnp.bfloat16))
    train = _widened_train(spec, algorithm, out_dtype=jnp.bfloat16)
    text = jax.jit(train).lower(*args).compile().as_text()
    dtypes = _conv_dtypes(text)
    # forward, input and weight gradient: three at least, every one on float32 operands.
    assert sum(dtypes.values()) >= 3 and all(k.startswith("f32*f32") for k in dtypes), dtypes
    y, dx, dw = jax.jit(train)(*args)
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)


def test_an_entry_for_another_shape_does_not_widen():
    """A widened entry made for another batch is not this conv's: XLA's bfloat16 conv runs,
    as for any entry that does not match (``planned_algorithm``)."""
    spec = case_spec("3x3s1", "NHWC", "bfloat16")
    x, w, _ = case_inputs(spec, seed=6)
    other = PlanEntry("xla", spec._replace(batch=spec.batch + 1).key(), "float32")
    g = spec.geometry
    f = jax.jit(lambda x, w: ca.conv2d(x, w, strides=g.strides, padding=g.padding,
                                       algorithm="auto", planned=other,
                                       preferred_element_type=jnp.float32))  # fmt: skip
    text = f.lower(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)).as_text()
    assert "xf32>" in text and "convolution" in text
    conv_lines = [line for line in text.splitlines() if "convolution" in line]
    assert conv_lines and all("bf16" in line for line in conv_lines), conv_lines


def test_a_plan_keeps_its_compute_dtype_through_json_and_refuses_another():
    plan = ConvPlan({"a": PlanEntry("onednn", "k1", "float32"), "b": ("xla", "k2")})
    again = ConvPlan.from_json(plan.to_json())
    assert again == plan and again["a"].compute_dtype == "float32"
    assert again["b"].compute_dtype is None
    # A plan without the field (every plan written before it) reads as before.
    assert "compute_dtype" not in plan.to_dict()["convs"]["b"]
    assert "@float32" in repr(plan)
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        ConvPlan.from_dict({"convs": {"a": {"algorithm": "xla", "spec_key": "k",
                                            "compute_dtype": "float16"}}})  # fmt: skip


def test_a_mixed_bf16_model_plans_widened_convs_by_cpu_kind():
    """Counting the entries: every conv of a ``mixed_bf16`` ResNet-18 CIFAR widens on the
    kinds without bf16 units and none does on the others; a float32 model never does."""
    from flax import nnx

    from layoutlab import models
    from layoutlab.layout import Layout
    from layoutlab.nn.conv_config import default_conv_plan

    def plan(precision, kind):
        model = nnx.eval_shape(lambda: models.create(
            "resnet18", num_classes=10, layout=Layout.NHWC, policy=get_policy(precision),
            stem="cifar", rngs=nnx.Rngs(0)))  # fmt: skip
        x = jax.ShapeDtypeStruct((8, 32, 32, 3), jnp.float32)
        return default_conv_plan(model, x, "train", kind)

    for kind in ("avx2", "avx512", "avx512_bf16", None):
        entries = list(plan("mixed_bf16", kind).items())
        widened = sum(e.compute_dtype == "float32" for _, e in entries)
        assert widened == (len(entries) if kind in KINDS_WITHOUT_UNITS else 0), kind
        assert len(entries) == 20
    assert all(e.compute_dtype is None for _, e in plan("fp32", "avx512").items())


@needs_onednn
def test_a_mixed_bf16_train_step_on_the_widened_plan_matches_the_float32_twin():
    """A whole layer under ``nn.configure`` with the widened plan: its output equals a
    float32 layer's on the same bfloat16-rounded input and kernel, rounded once to
    bfloat16 (the layer's dtype), and its kernel gradient is finite and float32."""
    from flax import nnx

    from layoutlab import nn
    from layoutlab.nn.conv_config import default_conv_plan

    conv = nn.Conv(16, 32, 3, algorithm="auto", use_bias=False,
                   policy=get_policy("mixed_bf16"), rngs=nnx.Rngs(2))  # fmt: skip
    x = jax.random.normal(jax.random.key(1), (4, 8, 8, 16), jnp.float32)
    plan = default_conv_plan(conv, x, "train", "avx512")
    (entry,) = (e for _, e in plan.items())
    assert entry.compute_dtype == "float32"
    conv = nn.configure(conv, plan, algorithms={entry.algorithm: ca.get_algorithm(entry.algorithm)})
    y = jax.jit(lambda m, x: m(x))(conv, x)
    twin = nn.Conv(16, 32, 3, use_bias=False, rngs=nnx.Rngs(2))
    w = conv.kernel[...].astype(jnp.bfloat16).astype(jnp.float32)
    twin.kernel.set_value(w)
    want = twin(x.astype(jnp.bfloat16).astype(jnp.float32))
    assert y.dtype == jnp.bfloat16
    # float32 sums in another order, then one rounding: at most one bfloat16 step apart.
    diff = np.abs(np.asarray(y, np.float32) - np.asarray(want.astype(jnp.bfloat16), np.float32))
    ulp = np.abs(np.asarray(want, np.float32)) * 2.0**-7 + 1e-30
    assert np.all(diff <= ulp), float(np.max(diff / ulp))


@needs_onednn
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_packed_widened_kernels_give_the_unpacked_bits(layout):
    """Inference packs a widened oneDNN conv's kernel (``onednn_packed``): a reordered copy
    where oneDNN reorders it, the rounded and widened HWIO kernel where it reads the kernel as
    it is (a small output), each made once instead of in every call. Both must be what the
    unpacked call multiplies, so the outputs match bit for bit (no tolerance)."""
    from flax import nnx

    from layoutlab import nn
    from layoutlab.layout import Layout
    from layoutlab.nn.conv_algos.onednn_packed import pack_kernels, with_packed_kernels
    from layoutlab.nn.conv_config import default_conv_plan

    kw = dict(layout=Layout(layout), policy=get_policy("mixed_bf16"), use_bias=False,
              algorithm="auto", rngs=nnx.Rngs(0))  # fmt: skip
    # Outputs of 2x12x12 and 2x6x6 pixels reorder their kernels; 2x3x3 (at most
    # onednn.PLAIN_WEIGHTS_MAX_PIXELS) reads its kernel as it is.
    model = nnx.Sequential(nn.Conv(8, 32, 3, **kw), nn.Conv(32, 32, 3, strides=2, **kw),
                           nn.Conv(32, 16, 3, strides=2, **kw))  # fmt: skip
    shape = (2, 12, 12, 8) if layout == "NHWC" else (2, 8, 12, 12)
    x = jax.random.normal(jax.random.key(3), shape, jnp.float32)
    plan = default_conv_plan(model, x, "inference", "avx512")
    assert {e.compute_dtype for _, e in plan.items()} == {"float32"}
    assert {e.algorithm for _, e in plan.items()} == {"onednn"}  # float32 inference, b <= 32
    model = nn.configure(model, plan, algorithms={"onednn": ca.get_algorithm("onednn")})
    graph = nnx.graphdef(model)

    def forward(state, x):
        return nnx.merge(graph, state)(x)

    state = nnx.state(model)
    packed = pack_kernels(forward, state, x)
    kinds = [(b.dtype, b.ndim) for b in packed.blobs]
    assert kinds == [(jnp.uint8, 5), (jnp.uint8, 5), (jnp.float32, 4)], kinds
    plain = jax.jit(forward)(state, x)
    fast = jax.jit(with_packed_kernels(forward, packed.keys))
    got = fast(packed.blobs, state, x)
    assert got.dtype == plain.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(got, np.float32), np.asarray(plain, np.float32))

    # The unpacked program rounds the plain-read kernel (3x3x32x16) in each call; the packed
    # one reads the widened copy.
    def kernel_converts(text):
        found = []
        for line in text.splitlines():
            if " convert(" not in line or "=" not in line:
                continue
            shape = line.split("=", 1)[1].strip().split("{")[0].split(" ")[0]
            dims = shape[shape.find("[") + 1 : shape.find("]")].split(",")
            if all(d.isdigit() for d in dims) and math.prod(map(int, dims)) == 9 * 32 * 16:
                found.append(line)
        return found

    plain_text = jax.jit(forward).lower(state, x).compile().as_text()
    fast_text = fast.lower(packed.blobs, state, x).compile().as_text()
    assert kernel_converts(plain_text) and not kernel_converts(fast_text)


def test_what_runs_is_checked_at_the_widened_dtype_and_the_result_keeps_its_dtype():
    """Winograd refuses bfloat16, but a widened entry runs it in float32: the selection that
    reports what runs (``select_algorithm``, read by ``compare`` and ``running_algorithms``)
    says Winograd. And a widened call returns what the unwidened one would: ``x``'s dtype
    without ``preferred_element_type`` or ``out_dtype``."""
    geom = ca.conv_spec((8, 16, 16, 128), (3, 3, 128, 128), strides=1, padding="SAME",
                        layout="NHWC", kernel_layout="HWIO", dtype="bfloat16")  # fmt: skip
    entry = PlanEntry("winograd4_full", geom.key(), "float32")
    assert ca.select_algorithm(geom, "auto", entry).name == "winograd4_full"
    narrow = PlanEntry("winograd4_full", geom.key())
    assert ca.select_algorithm(geom, "auto", narrow).name == "xla"
    x = jnp.ones((8, 16, 16, 128), jnp.bfloat16)
    w = jnp.ones((3, 3, 128, 128), jnp.float32)
    y = ca.conv2d(x, w, algorithm="auto", planned=entry)
    assert y.dtype == jnp.bfloat16
    y32 = ca.conv2d(x, w, algorithm="auto", planned=entry, preferred_element_type=jnp.float32)
    assert y32.dtype == jnp.float32
