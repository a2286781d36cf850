"""One resolved run, one builder: the step ``bench`` times and ``inspect`` compiles for the
flags of a ``train`` run is the step that run trains, and a conv algorithm is a value the
model carries, not a name looked up while tracing."""

import hashlib
import sys

import jax
import numpy as np
import pytest

from layoutlab.bench.cases import JaxCase, make_workload
from layoutlab.bench.jax_runner import JaxRunner
from layoutlab.fast_defaults import table_cpu_kind
from layoutlab.loss_scale import DynamicLossScale
from layoutlab.nn import conv_algos as ca
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.program import INIT_COMPILER_OPTIONS, build_program
from layoutlab.train.run_data import load_run_data
from layoutlab.train.run_plan import abstract_model, planned
from layoutlab.train.spec import InputSpec, resolve_spec
from layoutlab.train.step_schedule import make_step_schedule
from layoutlab.xla.inspect import build_abstract, inspect_spec

# A pure-float16 run: a dynamic loss scale ("auto") and float32 optimizer state (AdamW's
# squared gradients underflow float16), the two rules inspect and bench used to write apart.
KWARGS = {"width": 4}
FLAGS = dict(model="small_cnn", model_kwargs=KWARGS, precision="fp16", layout="NCHW")


def _fingerprint(fn, *args) -> str:
    """A hash of ``fn``'s jaxpr on ``args``' shapes and dtypes: the program JAX lowers and
    XLA compiles, before placement (the train loop's one-device mesh annotates its avals
    with shardings that change no op). Equal fingerprints and equal XLA options compile to
    the same executable."""
    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=getattr(x, "weak_type", False)),
        args,
    )
    return hashlib.sha256(str(jax.make_jaxpr(fn)(*shapes)).encode()).hexdigest()


def _same_step(spec_a, spec_b):
    """Two specs build the same train step: the same model, layout, policy, loss scale,
    optimizer, conv plan (its algorithms compared as values) and train XLA options (inspect
    compiles one program, so its options are that program's, whatever the mode)."""
    a, b = spec_a.summary(), spec_b.summary()
    a.pop("xla_options"), b.pop("xla_options")
    assert a == b
    assert spec_a.compile_options("train") == spec_b.compile_options("train")
    assert dict(spec_a.algorithms) == dict(spec_b.algorithms)
    assert spec_a.optimizer == spec_b.optimizer


@pytest.fixture(scope="module")
def train_step():
    return _train_run()


def _train_run():
    """The spec and lowered step of a train run, built as the loop builds it."""
    config = TrainConfig(**FLAGS, data="synthetic:8x8x1:10:8", batch_size=2, num_steps=2)
    config = validate(config, 1)
    dataset = load_run_data(config)
    schedule = make_step_schedule(config, dataset)
    spec = resolve_spec(config, schedule.total_steps)
    inputs = InputSpec.of(dataset, spec.batch_size)
    model = abstract_model(spec, inputs)  # what the loop's dataset check builds
    spec = planned(spec, inputs, schedule.total_steps, None, None, model)
    program = build_program(spec, inputs)
    images, labels = program.batch()
    return program.spec, _fingerprint(
        program.train_step, jax.eval_shape(program.init), images, labels
    )


def test_inspect_and_bench_build_the_step_train_runs(train_step):
    spec, fingerprint = train_step
    assert isinstance(spec.loss_scale, DynamicLossScale) and spec.optimizer.name == "adamw"
    assert spec.optimizer.float32_state and spec.conv_algorithm == "auto"
    options = spec.compile_options("train")

    inspected, inputs = inspect_spec(
        "small_cnn", **{k: v for k, v in FLAGS.items() if k != "model"}, batch_size=2,
        image_size=8, conv_algorithm="auto", kernel_storage=spec.kernel_storage,
        activation_storage=spec.activation_storage, flags=options, num_steps=2,
    )  # fmt: skip
    program, state, _ = build_abstract(inspected, inputs, table=("train", table_cpu_kind("cpu")))
    _same_step(program.spec, spec)
    images, labels = program.batch()
    assert _fingerprint(program.train_step, state, images, labels) == fingerprint
    # The fingerprint tells optimizers apart: the PyTorch runner's SGD is another program.
    sgd_spec, _ = inspect_spec(
        "small_cnn", **{k: v for k, v in FLAGS.items() if k != "model"}, batch_size=2,
        image_size=8, conv_algorithm="auto", kernel_storage=spec.kernel_storage,
        activation_storage=spec.activation_storage, flags=options, optimizer="pytorch",
    )  # fmt: skip
    sgd, sgd_state, _ = build_abstract(sgd_spec, inputs, table=("train", table_cpu_kind("cpu")))
    assert sgd.spec.optimizer.name == "momentum"
    assert _fingerprint(sgd.train_step, sgd_state, images, labels) != fingerprint

    workload = make_workload("small_cnn", KWARGS, (8, 8, 1), 10, "train", 2)
    case = JaxCase.of(
        workload, layout="NCHW", precision="fp16", conv_algorithm="auto",
        kernel_storage=spec.kernel_storage, activation_storage=spec.activation_storage,
        xla_options=options, conv_tune="never",
    )  # fmt: skip
    runner = JaxRunner(case, steps=2)
    runner.prepare()
    _same_step(runner.spec, spec)
    assert _fingerprint(runner.step_fn.fn, *runner.step_fn.args) == fingerprint
    runner.close()


def _scaled_im2col(factor: float) -> ca.Algorithm:
    im2col = ca.get_algorithm("im2col")

    def core(x, w, geometry, preferred_element_type, **kw):
        return factor * im2col.core(x, w, geometry, preferred_element_type, **kw)

    return ca.Algorithm("test_scaled", core, im2col.supports, f"im2col times {factor}")


def _double_conv_kernels(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, p: 2 * p if p.ndim == 4 and "kernel" in jax.tree_util.keystr(path) else p,
        params,
    )


def test_a_reregistered_algorithm_reaches_only_steps_built_after_it():
    """A conv carries its algorithm's value from the spec: re-registering the name changes
    what a program built afterwards runs (a new trace), never one built before, even when
    that one is traced again."""
    config = TrainConfig(model="small_cnn", model_kwargs=KWARGS, conv_algorithm="test_scaled")
    inputs = InputSpec((8, 8, 1), 10, 2)
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 1)).astype(np.float32)

    def forward(program):  # unoptimized: these compiles dominate the test's time
        return jax.jit(lambda s, v: program.forward(s, v), compiler_options=INIT_COMPILER_OPTIONS)

    ca.register_algorithm(_scaled_im2col(1.0))
    try:
        before = build_program(resolve_spec(config), inputs)
        state = jax.jit(before.init, compiler_options=INIT_COMPILER_OPTIONS)()
        run_before = forward(before)
        y_before = run_before(state, x)
        ca.register_algorithm(_scaled_im2col(2.0), replace=True)
        y_after = forward(build_program(resolve_spec(config), inputs))(state, x)
        y_retraced = forward(before)(state, x)  # a new jit: traced again after the change
        # The doubled core is the first one on doubled conv kernels (a conv is linear in its
        # kernel and doubling is exact in float32; rtol 1e-6 for the rounding of the ops
        # fused around the convs, atol 1e-6 for logits near zero).
        doubled = state._replace(params=_double_conv_kernels(state.params))
        y_reference = run_before(doubled, x)
    finally:
        ca.unregister_algorithm("test_scaled")
    np.testing.assert_array_equal(y_retraced, y_before)
    np.testing.assert_allclose(y_after, y_reference, rtol=1e-6, atol=1e-6)
    assert not np.allclose(y_after, y_before, rtol=1e-3, atol=1e-3)


def _spy(monkeypatch, module, name: str, counted=lambda *a, **k: True) -> list:
    """Wraps ``module.name`` wherever ``layoutlab`` has bound it (its own module and every
    ``from ... import name`` already made; later imports take the wrapper from ``module``)
    and returns the list of the calls that ``counted`` accepts, as their arguments."""
    original, calls = getattr(module, name), []

    def spy(*args, **kwargs):
        if counted(*args, **kwargs):
            calls.append(args)
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("layoutlab"):
            if loaded.__dict__.get(name) is original:
                monkeypatch.setattr(loaded, name, spy)
    return calls


def test_a_train_run_resolves_once_and_parses_its_precision_at_most_twice(
    monkeypatch, tmp_path, capsys
):
    """One ``layoutlab train`` run (its planner's conv plan included) resolves its
    ``RunSpec`` once, and reads the precision text at most twice: once when the config is
    checked, once when it is resolved; the model and every layer get the ``Policy`` value.
    Counted by wrapping the functions, so a call under any name or path counts."""
    from layoutlab import cli, precision
    from layoutlab.train import spec as spec_module

    resolved = _spy(monkeypatch, spec_module, "resolve_spec")
    parsed = _spy(monkeypatch, precision, "get_policy", lambda p, *a, **k: isinstance(p, str))
    argv = ["train", "--tiny", "--steps", "1", "--batch-size", "8", "--conv-tune", "never"]
    argv += ["--precision", "mixed_bf16", "--workdir", tmp_path / "run", "--quiet"]
    argv += ["--set", "eval_batch_size=8", "--set", "log_every=0", "--set", "tensorboard=false"]
    argv += ["--xla-option", "xla_backend_optimization_level=0"]  # compiles faster
    assert cli.main([str(a) for a in argv]) == 0, capsys.readouterr().err
    assert len(resolved) == 1, resolved
    assert 1 <= len(parsed) <= 2, parsed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "--model", "small_cnn", "--mode", "train", "--steps", "0"], "--steps"),
        (["bench", "--model", "small_cnn", "--torch", "--optimizer", "train", "--out", "x"],
         "drop --optimizer train"),
    ],
)  # fmt: skip
def test_bad_optimizer_flags_are_one_line(argv, message, capsys):
    from layoutlab import cli

    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
