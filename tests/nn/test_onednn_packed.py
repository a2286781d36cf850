"""Inference with oneDNN conv kernels packed once (``nn.conv_algos.onednn_packed``).

Reference: the same forward without packing, which reorders each kernel inside every call.
The packed forward runs the same primitive on the same reordered kernel, so the outputs must
match bit for bit (no tolerance), in both layouts and both precisions.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from onednn_helpers import needs_onednn, simulate_no_onednn

from layoutlab import nn
from layoutlab.layout import Layout
from layoutlab.nn.conv_algos import onednn
from layoutlab.nn.conv_algos.onednn_packed import pack_kernels, with_packed_kernels
from layoutlab.precision import get_policy
from layoutlab.xla import watch_compilation
from layoutlab.xla.hlo import hlo_report


def _model(layout: str, precision: str):
    """Three convs: two that reorder their kernel, between them a 1x1 stride-2 one."""
    policy, rngs = get_policy(precision), nnx.Rngs(0)
    kw = dict(layout=Layout(layout), policy=policy, use_bias=False, rngs=rngs,
              kernel_storage="layout")  # fmt: skip
    convs = [nn.Conv(8, 32, 3, **kw), nn.Conv(32, 32, 1, strides=2, **kw),
             nn.Conv(32, 16, 3, **kw)]  # fmt: skip
    model = nnx.Sequential(*convs)
    return nn.configure(model, nn.ConvSettings.named("onednn", kernel_storage="layout"))


def _forward(model):
    graph = nnx.graphdef(model)

    def forward(state, x):
        return nnx.merge(graph, state)(x)

    return forward


def _input(layout, batch):
    shape = (batch, 12, 12, 8) if layout == "NHWC" else (batch, 8, 12, 12)
    return jax.random.normal(jax.random.key(1), shape, jnp.float32)


@needs_onednn
@pytest.mark.parametrize("precision", ["fp32", "mixed_bf16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_packed_kernels_give_the_same_bits_and_no_per_call_reorder(layout, precision):
    model = _model(layout, precision)
    forward, state, x = _forward(model), nnx.state(model), _input(layout, 4)
    packed = pack_kernels(forward, state, x)
    assert sum(k is not None for k in packed.keys) == len(packed.blobs) >= 2
    assert all(b.dtype == jnp.uint8 and b.ndim == 5 for b in packed.blobs)
    plain = jax.jit(forward)(state, x)
    fast = jax.jit(with_packed_kernels(forward, packed.keys))
    got = fast(packed.blobs, state, x)
    assert got.dtype == plain.dtype
    assert np.asarray(got).tobytes() == np.asarray(plain).tobytes()
    calls = hlo_report(fast.lower(packed.blobs, state, x).compile().as_text()).custom_calls
    targets = sorted(c.target.removeprefix(onednn.TARGET_PREFIX) for c in calls)
    packed_calls = targets.count("conv_fwd_packed")
    assert packed_calls == len(packed.blobs) and len(targets) == len(packed.keys), targets
    # A conv called at another batch than it was packed for reorders as before.
    other = _input(layout, 2)
    want = jax.jit(forward)(state, other)
    assert np.asarray(fast(packed.blobs, state, other)).tobytes() == np.asarray(want).tobytes()


@needs_onednn
def test_packing_again_neither_traces_nor_compiles():
    model = _model("NHWC", "mixed_bf16")
    forward, state, x = _forward(model), nnx.state(model), _input("NHWC", 4)
    first = pack_kernels(forward, state, x)
    with watch_compilation() as events:
        again = pack_kernels(forward, state, x)
    assert events.backend_compiles == 0 and again.keys == first.keys
    for a, b in zip(first.blobs, again.blobs, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@needs_onednn
def test_a_blob_of_the_wrong_size_is_refused_with_the_sizes():
    model = _model("NHWC", "fp32")
    forward, state, x = _forward(model), nnx.state(model), _input("NHWC", 4)
    packed = pack_kernels(forward, state, x)
    short = tuple(b[..., :1] if i == 0 else b for i, b in enumerate(packed.blobs))
    fast = jax.jit(with_packed_kernels(forward, packed.keys))
    with pytest.raises(Exception, match="the packed kernel has .* bytes, the conv's takes"):
        jax.block_until_ready(fast(short, state, x))


def test_without_the_extension_nothing_is_packed(monkeypatch):
    simulate_no_onednn(monkeypatch)
    model = _model("NHWC", "fp32")
    forward, state, x = _forward(model), nnx.state(model), _input("NHWC", 4)
    packed = pack_kernels(forward, state, x)
    assert packed.blobs == () and all(k is None for k in packed.keys)
    got = jax.jit(with_packed_kernels(forward, packed.keys))((), state, x)
    assert np.asarray(got).tobytes() == np.asarray(jax.jit(forward)(state, x)).tobytes()


@pytest.mark.gpu
def test_on_a_gpu_nothing_is_packed():
    """The pack handlers are CPU custom calls: a forward whose arguments sit on a GPU (a
    ``--conv-algo onednn`` run predicting there) is left as it is."""
    gpu = next(d for d in jax.devices() if d.platform == "gpu")
    model = _model("NHWC", "fp32")
    state = jax.device_put(nnx.state(model), gpu)
    x = jax.device_put(_input("NHWC", 4), gpu)
    packed = pack_kernels(_forward(model), state, x)
    assert packed == ((), ())
