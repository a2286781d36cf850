"""Activation storage: a channels-first model computing channels-last inside (the CPU default).

The references are independent of that code path: a float64 NumPy forward
(``compare.numpy_forward``, which runs every layer in the model's own layout) and the same
weights computing in NCHW.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compare_helpers import fill_random
from flax import nnx

from layoutlab import cli, models, nn
from layoutlab.compare.numpy_forward import numpy_forward
from layoutlab.layout import Layout, channels_last
from layoutlab.nn.convert import activation_storage
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.resume import ResumeError

# LLVM's optimization level changes speed, and float32 results by rounding at most (the
# tolerances below are 1e-4, far above it); level 0 compiles in about half the time.
FAST_COMPILE = {"xla_backend_optimization_level": 0}
MODELS = ["small_cnn", "resnet18", "mobilenet_v2", "vgg11_bn", "unet", "small_cnn3d"]


def _tiny(name, seed=0):
    spec = models.spec(name)
    # Computing in its own layout to start with; the tests move it (models.create's CPU
    # default would already compute channels-last inside).
    # Built abstractly and given NumPy weights (eager init compiles each small op per shape).
    build = lambda: models.create(  # noqa: E731
        name,
        layout="NCHW",
        rngs=nnx.Rngs(seed),
        kernel_storage="channels_last",
        activation_storage="layout",
        **spec.tiny,
    )
    model = nnx.eval_shape(build)
    fill_random(model, seed)
    x = np.random.default_rng(seed).standard_normal(spec.input_shape(2, "NCHW"))
    return model, jnp.asarray(x, jnp.float32)


def _jitted(model, x) -> np.ndarray:
    """``model(x)`` as one compiled program (eager calls compile every op apart)."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, v: nnx.merge(graphdef, state)(v))
    return np.asarray(forward.lower(state, x).compile(FAST_COMPILE)(state, x))


def _param_shapes(model):
    return jax.tree.map(jnp.shape, nnx.state(model, nnx.Param))


@pytest.mark.parametrize("name", MODELS)
def test_channels_last_inside_matches_float64_numpy_and_keeps_the_interface(name):
    model, x = _tiny(name)
    model.eval()
    before = _param_shapes(model)
    ref, _ = numpy_forward(model, x)
    model = nn.configure(model, activation_storage="channels_last")
    assert model.compute_layout == channels_last(model.layout.num_spatial)
    assert activation_storage(model) == "channels_last"
    got = _jitted(model, x)
    # Inputs and outputs stay NCHW: U-Net's per-pixel logits come back (N, classes, H, W).
    assert got.shape == ref.shape
    # float32 against float64 through a tiny network: the float32 rounding of sums of a few
    # hundred terms per layer, compounded over at most ~20 layers, stays far below 1e-4.
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    if name != "unet":  # ConvTranspose kernels follow the layers' layout (documented)
        assert _param_shapes(model) == before
    # The float64 reference of the channels-last model is the NCHW one: same weights.
    again, _ = numpy_forward(model, x)
    np.testing.assert_array_equal(again, ref)
    model = nn.configure(model, activation_storage="layout")
    assert model.compute_layout == model.layout and _param_shapes(model) == before


def test_gradients_match_the_model_computing_in_nchw():
    model, x = _tiny("resnet18", seed=1)
    model.train()
    inside = nn.configure(model, activation_storage="channels_last")
    w = jax.random.normal(jax.random.key(2), (2, 10))

    def grads_fn(m):
        graphdef, state = nnx.split(m)

        def run(state):
            return nnx.grad(lambda m: jnp.sum(m(x) * w))(nnx.merge(graphdef, state))

        return run, state

    # Both models' gradients in one program, compiled once (not once per eager op, nor once
    # per model: a third less compile): each side has its own parameters, so neither's ops
    # fuse with or fold into the other's.
    (run_in, state_in), (run_ref, state_ref) = grads_fn(inside), grads_fn(model)
    both = jax.jit(lambda a, b: (run_in(a), run_ref(b)))
    got, want = both.lower(state_in, state_ref).compile(FAST_COMPILE)(state_in, state_ref)
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, r in zip(got, want, strict=True):
        # The same float32 sums, reassociated by XLA in another layout: 1e-4 relative to
        # each gradient's scale.
        scale = float(jnp.max(jnp.abs(r))) or 1.0
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=0, atol=1e-4 * scale)


def test_convert_layout_returns_a_model_computing_in_the_new_layout():
    model, x = _tiny("small_cnn")
    model.eval()
    model = nn.configure(model, activation_storage="channels_last")
    expected = _jitted(model, x)
    for dst in ("NCHW", "NHWC"):
        other = nn.convert_layout(model, dst)
        assert other.compute_layout == other.layout and str(other.layout) == dst
        xin = x if dst == "NCHW" else jnp.moveaxis(x, 1, -1)
        np.testing.assert_allclose(_jitted(other, xin), expected, rtol=1e-5, atol=1e-5)


def test_bad_activation_storage_is_refused():
    model, _ = _tiny("small_cnn")
    with pytest.raises(ValueError, match="Unknown activation_storage 'nhwc'"):
        nn.configure(model, activation_storage="nhwc")
    conv = nn.Conv(1, 2, 3, layout=Layout.NCHW, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="not a layoutlab.models model"):
        nn.configure(conv, activation_storage="channels_last")
    with pytest.raises(ValueError, match="conv settings: Unknown activation_storage"):
        from layoutlab.train.config import validate

        validate(TrainConfig(activation_storage="NHWC"), 1)


@pytest.mark.parametrize("command", [["train"], ["bench", "--out", "unused"], ["inspect"]])
def test_cli_refuses_an_unknown_activation_storage(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--activation-storage", "nhwc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --activation-storage: invalid choice: 'nhwc'" in err


def test_resume_keeps_where_the_run_computed(tmp_path):
    # Runs checked for their config and refusals, not their numbers: LLVM level 0
    # (docs/development.md).
    kw = dict(model="small_cnn", model_kwargs={"width": 4, "hidden": 8}, layout="NCHW",
              batch_size=16, log_every=0, tensorboard=False,
              xla_options=FAST_COMPILE)  # fmt: skip
    train_and_evaluate(TrainConfig(num_steps=1, **kw), tmp_path, quiet=True)
    assert json.loads((tmp_path / "config.json").read_text())["activation_storage"] == (
        "channels_last"
    )
    # Asking for another storage on resume is refused, never silently replaced; "auto" (the
    # default) asks for nothing and keeps the run's.
    other = TrainConfig(num_steps=2, activation_storage="layout", **kw)
    with pytest.raises(ResumeError, match="activation_storage='layout': a run keeps its"):
        train_and_evaluate(other, tmp_path, resume=True, quiet=True)
    record = train_and_evaluate(TrainConfig(num_steps=2, **kw), tmp_path, resume=True, quiet=True)
    assert record["step"] == 2
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["activation_storage"] == "channels_last"


def test_a_run_saved_before_the_option_resumes_computing_in_its_layout(tmp_path):
    from layoutlab.train.config import validate
    from layoutlab.train.resume import check_resume
    from layoutlab.train.spec import resolve_spec

    spec = resolve_spec(validate(TrainConfig(layout="NCHW"), 1))
    assert spec.activation_storage == "channels_last"  # the CPU default
    old = {k: v for k, v in spec.config.to_dict().items() if k != "activation_storage"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    resumed = check_resume(spec, tmp_path, tmp_path / "checkpoints")
    assert resumed.activation_storage == resumed.config.activation_storage == "layout"
