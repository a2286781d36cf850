"""``train --init``: starting from PyTorch weights or another run, a new classifier head, a
frozen backbone, the init's fingerprint on resume, and the bad inputs' one-line errors.

The weights are made here from a seed with torchvision's key names (the repository's torch
mirror of small_cnn, or a layoutlab model exported), never downloaded; tiny small_cnn on
digits, two steps.
"""

import contextlib
import hashlib
import io
import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from layoutlab import cli, models
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.init_weights import initial_values, read_init
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.program import build_model, build_program
from layoutlab.train.run_data import load_run_data
from layoutlab.train.spec import InputSpec, resolve_spec

# The resume reads the first run's programs back from the module's compilation cache.
pytestmark = pytest.mark.usefixtures("shared_compiles")

TINY = models.spec("small_cnn").tiny
FAST = {"xla_backend_optimization_level": 0}
HEAD = ("classifier.3.weight", "classifier.3.bias")  # small_cnn's last Dense


def _config(**kw) -> TrainConfig:
    fields = dict(model_kwargs=TINY, batch_size=32, num_steps=2, eval_every=2, xla_options=FAST)
    return TrainConfig(**{**fields, **kw})


def _save_mirror(path, num_classes: int, seed: int = 0, **kw) -> dict:
    """A torchvision-style state dict of the small_cnn torch mirror, from ``seed``, with
    random BatchNorm statistics (a fresh module's 0 and 1 would check nothing), saved."""
    torch = pytest.importorskip("torch")
    from layoutlab.compare.torch_mirrors import build_torch_mirror

    torch.manual_seed(seed)
    module = build_torch_mirror("small_cnn", num_classes=num_classes, **{**TINY, **kw})
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name.endswith("running_mean"):
                buffer.normal_()
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 2.0)
    torch.save(module.state_dict(), path)
    return {k: v.numpy().copy() for k, v in module.state_dict().items()}


def _started(config: TrainConfig, images_nhwc: np.ndarray) -> np.ndarray:
    """The logits of ``config``'s model as a run starts it (``initial_values`` into
    ``Program.init``, as ``train_and_evaluate`` does), before any step."""
    config = validate(config, 1)
    dataset = load_run_data(config)
    spec = resolve_spec(config, 1, 1)
    inputs = InputSpec.of(dataset, len(images_nhwc))
    abstract = nnx.eval_shape(lambda: build_model(spec, inputs))
    values = initial_values(spec, inputs, abstract, read_init(config.init), print)
    program = build_program(spec, inputs)
    state = jax.jit(lambda w: program.init(weights=w))(values)
    images = images_nhwc if spec.layout.is_channels_last else images_nhwc.transpose(0, 3, 1, 2)
    return np.asarray(jax.jit(program.forward)(state, images))


@pytest.fixture(scope="module")
def pth(tmp_path_factory):
    """small_cnn weights for 5 classes (digits has 10): the head is re-initialized."""
    path = tmp_path_factory.mktemp("weights") / "small_cnn.pth"
    return path, _save_mirror(path, num_classes=5)


@pytest.fixture(scope="module")
def frozen_run(pth, tmp_path_factory):
    """Two linear-probing steps from ``pth`` (NHWC); its stderr."""
    workdir = tmp_path_factory.mktemp("frozen") / "run"
    config = _config(init=str(pth[0]), freeze_backbone=True, learning_rate=0.1)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        train_and_evaluate(config, workdir, quiet=True)
    return workdir, stderr.getvalue().splitlines()


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_init_from_a_state_dict_gives_the_torch_modules_logits(tmp_path, layout):
    torch = pytest.importorskip("torch")
    from layoutlab.compare.torch_mirrors import build_torch_mirror

    path = tmp_path / "w.pth"
    weights = _save_mirror(path, num_classes=10, seed=1)
    images = np.random.default_rng(0).normal(size=(4, 8, 8, 1)).astype(np.float32)
    got = _started(_config(init=str(path), layout=layout), images)
    module = build_torch_mirror("small_cnn", num_classes=10, **TINY).eval()
    module.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    with torch.no_grad():
        want = module(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
    # float32 on both sides, each conv summing at most 72 products in its own order: the
    # logits (of size ~1) agree to a few float32 ulps; 1e-5 leaves room for that and catches
    # any wrong weight (a transposed kernel or a missing BatchNorm statistic moves them ~0.1).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.torch
def test_frozen_backbone_keeps_its_weights_bit_for_bit_and_the_head_is_new(pth, frozen_run):
    _, weights = pth
    workdir, said = frozen_run
    notes = [line for line in said if "re-initialized" in line]
    assert notes == [
        "note: classifier head classifier.3 re-initialized for the data's classes "
        "(5 -> 10 classes; the init weights' head is not used)."
    ]
    trained = read_init(str(workdir)).state_dict  # the run's newest checkpoint, exported
    for key, value in weights.items():
        if key in HEAD or key.endswith("num_batches_tracked"):
            continue
        np.testing.assert_array_equal(trained[key], value, err_msg=key)  # weights and BN stats
    assert trained["classifier.3.weight"].shape == (10, 16)


@pytest.mark.torch
def test_init_source_and_fingerprint_are_recorded(pth, frozen_run):
    path, _ = pth
    saved = json.loads((frozen_run[0] / "config.json").read_text())
    assert saved["init"] == str(path) and saved["freeze_backbone"] is True
    assert saved["init_fingerprint"] == {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


@pytest.mark.torch
def test_init_from_a_run_in_the_other_layout_gives_its_logits(frozen_run):
    from layoutlab.infer import load_model

    workdir, _ = frozen_run
    images = np.random.default_rng(1).normal(size=(4, 8, 8, 1)).astype(np.float32)
    want = np.asarray(load_model(workdir)(images))
    got = _started(_config(init=str(workdir), layout="NCHW"), images)
    # The same float32 weights in the other layout: only the convs' summation order differs
    # (see the state dict test above for the size).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    run = read_init(str(workdir))
    saved = json.loads((workdir / "config.json").read_text())
    assert run.fingerprint["run_id"] == saved["run_id"] and run.fingerprint["step"] == 2


def _train(argv, capsys) -> tuple[int, str]:
    base = ["train", "--tiny", "--steps", "2", "--batch-size", "32", "--quiet"]
    code = cli.main([*base, "--xla-option", "xla_backend_optimization_level=0", *argv])
    return code, capsys.readouterr().err


def _one_error(code, err) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.torch
def test_resume_checks_the_init_weights(pth, frozen_run, tmp_path, capsys):
    path, _ = pth
    workdir = tmp_path / "run"
    shutil.copytree(frozen_run[0], workdir)
    resume = ["--workdir", str(workdir), "--resume", "--steps", "4"]
    other = tmp_path / "other.pth"
    _save_mirror(other, num_classes=5, seed=7)
    line = _one_error(*_train([*resume, "--init", str(other)], capsys))
    assert "init=" in line and "may not change" in line, line
    moved = tmp_path / "moved.pth"
    path.rename(moved)
    try:
        line = _one_error(*_train(resume, capsys))
        assert "no such file" in line and str(path) in line, line
        shutil.copy(other, path)  # the same name, other weights
        line = _one_error(*_train(resume, capsys))
        assert "init weights are not those the run started from" in line, line
    finally:
        moved.replace(path)
    # The same weights (named again, or not at all: config.json names them) resume the run.
    code, err = _train([*resume, "--init", str(path)], capsys)
    assert code == 0, err
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["init_fingerprint"] == {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


@pytest.mark.torch
def test_bad_init_inputs_are_one_line(pth, frozen_run, tmp_path, capsys, monkeypatch):
    path, weights = pth
    work = ["--workdir", str(tmp_path / "new")]
    line = _one_error(*_train([*work, "--init", str(tmp_path / "nope.pth")], capsys))
    assert "no such file or directory" in line
    text = tmp_path / "notes.pth"
    text.write_text("not weights")
    line = _one_error(*_train([*work, "--init", str(text)], capsys))
    assert "torch.save(model.state_dict())" in line
    wide = tmp_path / "wide.pth"
    _save_mirror(wide, num_classes=10, width=8)  # the tiny model has width 4
    line = _one_error(*_train([*work, "--init", str(wide)], capsys))
    assert "features.0.0.weight" in line and "Shape mismatch" in line, line
    extra = tmp_path / "extra.pth"
    torch = pytest.importorskip("torch")
    torch.save({**{k: torch.from_numpy(v) for k, v in weights.items()}, "aux.w": torch.ones(1)},
               extra)  # fmt: skip
    line = _one_error(*_train([*work, "--init", str(extra)], capsys))
    assert "Unexpected keys (1): aux.w" in line, line
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(frozen_run[0] / "config.json", bare / "config.json")
    line = _one_error(*_train([*work, "--init", str(bare)], capsys))
    assert "has no checkpoint" in line, line
    line = _one_error(*_train([*work, "--freeze-backbone"], capsys))
    assert "--init PATH" in line
    monkeypatch.setattr(
        "layoutlab.models.torch_weights.require_torch",
        lambda: (_ for _ in ()).throw(ImportError("no torch")),
    )
    line = _one_error(*_train([*work, "--init", str(path)], capsys))
    assert "pip install 'layoutlab[torch]'" in line, line
    assert not (tmp_path / "new").exists()  # nothing was written for a refused run


def test_a_frozen_parameter_keeps_every_bit_and_gets_no_optimizer_state():
    import optax

    from layoutlab.train.freeze import frozen_updates

    head = frozenset({(jax.tree_util.DictKey("head"),)})
    tx = frozen_updates(optax.adamw(0.1, weight_decay=0.5), head)
    params = {"head": np.ones(3, np.float32), "body": np.array([-0.0, 1.5, -2.0], np.float32)}
    state = tx.init(params)
    alone = optax.adamw(0.1).init(params["head"])  # the state of the head alone
    assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(alone))
    grads = jax.tree.map(np.ones_like, params)
    with jax.numpy_dtype_promotion("standard"):  # as the train step runs optax
        updates, _ = tx.update(grads, state, params)
        new = optax.apply_updates(params, updates)
    # -0.0 included (a +0.0 update would turn it into +0.0): the same bits, not just equal.
    assert new["body"].tobytes() == params["body"].tobytes()
    assert not np.array_equal(new["head"], params["head"])


def test_a_frozen_backbone_is_not_differentiated():
    """The train step of a frozen backbone computes the head's gradients only: the
    backbone's convs run forward alone (about a third of the step's FLOPs)."""

    def flops(**kw):
        spec = resolve_spec(validate(_config(**kw), 1), 2, 1)
        program = build_program(spec, InputSpec((8, 8, 1), 10, 32))
        state = jax.eval_shape(program.init)
        lowered = jax.jit(program.train_step).lower(state, *program.batch())
        return lowered.cost_analysis()["flops"]

    assert flops(init="w.pth", freeze_backbone=True) < 0.5 * flops()
