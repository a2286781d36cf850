"""``nn.conv_algos.batch_sharded``: an op the partitioner cannot see into runs per batch shard.

The per-shard function here is ``lax.conv_general_dilated`` standing in for a oneDNN custom
call. The batch-parallel ops (forward, input gradient) move no data, so they must equal the
unsharded op exactly; the weight gradient adds per-shard partial sums in another order, so it
is held to float32 rounding of a sum of 288 products (rtol 1e-5 of its largest entry).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from layoutlab.nn.conv_algos.batch_sharded import batch_parallel, batch_reduced
from layoutlab.train.sharding import DATA_AXIS, fsdp_spec

DN = ("NHWC", "HWIO", "NHWC")
BATCH, DEVICES = 8, 4
X_SHAPE, W_SHAPE = (BATCH, 6, 6, 4), (3, 3, 4, 8)


def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)


def conv_dx(dy, w):
    return jax.vjp(lambda x: conv(x, w), jnp.zeros((dy.shape[0], *X_SHAPE[1:])))[1](dy)[0]


def conv_dw(x, dy):
    return jax.vjp(lambda w: conv(x, w), jnp.zeros(W_SHAPE))[1](dy)[0]


@pytest.fixture(params=[True, False], ids=["shardy", "gspmd"])
def partitioner(request):
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param)
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", before)


@pytest.fixture(scope="module")
def arrays():
    x = jax.random.normal(jax.random.key(0), X_SHAPE)
    w = jax.random.normal(jax.random.key(1), W_SHAPE)
    return x, w, conv(x, w)


def _mesh():
    assert jax.device_count() == DEVICES, "conftest.py sets 4 fake CPU devices"
    return Mesh(np.asarray(jax.devices()), (DATA_AXIS,))


def _put(x, spec):
    return jax.device_put(x, NamedSharding(_mesh(), spec))


def _recording(fn, seen):
    def record(*operands):
        seen.append(operands[0].shape[0])
        return fn(*operands)

    return record


def _gathers(compiled) -> list[str]:
    return [line for line in compiled.as_text().splitlines() if "all-gather(" in line]


@pytest.mark.parametrize("mode", ["replicated", "fsdp"])
@pytest.mark.parametrize(
    "name, fn, n_batched", [("forward", conv, 1), ("input gradient", conv_dx, 1)]
)
def test_batch_parallel_runs_each_shard_and_gathers_only_the_kernel(
    partitioner, arrays, mode, name, fn, n_batched
):
    x, w, dy = arrays
    batched = x if fn is conv else dy
    w_spec = fsdp_spec(W_SHAPE, DEVICES) if mode == "fsdp" else PartitionSpec()
    seen: list[int] = []
    step = jax.jit(lambda a, b: batch_parallel(_recording(fn, seen), n_batched)(a, b))
    args = (_put(batched, PartitionSpec(DATA_AXIS)), _put(w, w_spec))
    out = step(*args)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(fn(batched, w)))
    assert out.sharding.spec[0] == DATA_AXIS, out.sharding
    assert BATCH // DEVICES in seen, f"{name} never ran on one device's shard: {seen}"
    gathers = _gathers(step.lower(*args).compile())
    # FSDP splits the kernel, which is gathered as XLA's own conv gathers it; the
    # activations never are.
    assert len(gathers) == (mode == "fsdp"), gathers
    assert all(f"f32[{','.join(map(str, W_SHAPE))}]" in g for g in gathers), gathers


def test_batch_reduced_sums_the_shards_partial_weight_gradients(partitioner, arrays):
    x, _, dy = arrays
    seen: list[int] = []
    step = jax.jit(lambda a, b: batch_reduced(_recording(conv_dw, seen))(a, b))
    args = (_put(x, PartitionSpec(DATA_AXIS)), _put(dy, PartitionSpec(DATA_AXIS)))
    out = np.asarray(step(*args))
    want = np.asarray(conv_dw(x, dy))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert BATCH // DEVICES in seen, seen
    text = step.lower(*args).compile().as_text()
    assert not _gathers(step.lower(*args).compile()), text
    assert text.count("all-reduce(") == 1, text


def test_unsharded_and_single_device_run_fn_alone(arrays):
    """No sharding, or one device: the lowered program is ``fn``'s, with no partitioning call."""
    x, w, dy = arrays
    for wrapped, plain, args in (
        (batch_parallel(conv), conv, (x, w)),
        (batch_reduced(conv_dw), conv_dw, (x, dy)),
    ):
        text = jax.jit(wrapped).lower(*args).as_text()
        assert "CustomSPMDPartitioning" not in text, text
        np.testing.assert_array_equal(np.asarray(jax.jit(wrapped)(*args)), np.asarray(plain(*args)))


def test_replicated_batch_runs_whole_on_every_device(partitioner, arrays):
    x, w, _ = arrays
    step = jax.jit(lambda a, b: batch_parallel(conv)(a, b))
    args = (_put(x, PartitionSpec()), _put(w, PartitionSpec()))
    np.testing.assert_array_equal(np.asarray(step(*args)), np.asarray(conv(x, w)))
    text = step.lower(*args).compile().as_text()
    assert "all-gather(" not in text and "all-reduce(" not in text, text


def test_n_batched_below_one_is_refused():
    with pytest.raises(ValueError, match="n_batched must be at least 1"):
        batch_parallel(conv, 0)


@jax.custom_vjp
def _opaque_conv(x, w):
    return batch_parallel(conv)(x, w)


def _opaque_fwd(x, w):
    return _opaque_conv(x, w), (x, w)


def _opaque_bwd(res, dy):
    x, w = res
    return batch_parallel(conv_dx)(dy, w), batch_reduced(conv_dw)(x, dy)


_opaque_conv.defvjp(_opaque_fwd, _opaque_bwd)


def test_a_custom_vjp_conv_in_a_data_parallel_gradient_step_stays_sharded(partitioner, arrays):
    """As the onednn algorithm uses them: forward, dx and dw of one custom-VJP conv, between
    other ops, under ``jit(grad)`` with the batch split and the kernel replicated."""
    x, w, _ = arrays

    def loss(w, x, conv_fn):
        return jnp.sum(jax.nn.relu(conv_fn(jnp.tanh(x), w)) ** 2)

    step = jax.jit(jax.grad(lambda w, x: loss(w, x, _opaque_conv)))
    args = (_put(w, PartitionSpec()), _put(x, PartitionSpec(DATA_AXIS)))
    want = np.asarray(jax.grad(lambda w, x: loss(w, x, conv))(w, x))
    np.testing.assert_allclose(np.asarray(step(*args)), want, atol=1e-5 * np.abs(want).max())
    assert not _gathers(step.lower(*args).compile())


def test_a_new_trace_finds_the_op_in_the_persistent_cache_only_without_its_callback_id(
    arrays, tmp_path
):
    """Each trace builds its own ``custom_partitioning`` object, whose Python id is in the
    custom call and so in the persistent cache's key: a resumed run, in this process or
    another, misses what the first run stored. jax's flag takes the id out of the key
    (tests/conftest.py's ``CACHE_PARTITIONED``, docs/development.md)."""
    from layoutlab.xla.cache import compilation_cache, watch_compilation

    x, w, _ = arrays
    args = (_put(x, PartitionSpec(DATA_AXIS)), _put(w, PartitionSpec()))

    def compile_twice():
        with watch_compilation() as events:
            for _ in range(2):
                jax.jit(lambda a, b: batch_parallel(conv)(a, b)).lower(*args).compile()
        return events.hits, events.misses

    flag = "jax_remove_custom_partitioning_ptr_from_cache_key"
    before = getattr(jax.config, flag)
    with compilation_cache(tmp_path / "with_ids"):
        assert compile_twice() == (0, 2)
    try:
        jax.config.update(flag, True)
        with compilation_cache(tmp_path / "without_ids"):
            assert compile_twice() == (1, 1)
    finally:
        jax.config.update(flag, before)
