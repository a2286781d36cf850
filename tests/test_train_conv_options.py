"""Conv algorithm, kernel storage and XLA compile options of a training run: config, loop, CLI.

Runs train a test-only one-conv classifier in NCHW on 8x8x3 synthetic images, batch 8, on one
device, for 1 to 3 steps: one conv shape keeps the train-step compiles and the CLI's conv
autotuning (every candidate compiled forward and backward) to seconds on 2 busy cores.
"""

import json
import shutil

import numpy as np
import pytest
from flax import nnx

from layoutlab import cli, models, nn
from layoutlab.data import get_dataset
from layoutlab.nn import conv_algos
from layoutlab.nn.conv_config import conv_settings
from layoutlab.train import loop
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.config import TrainConfig, apply_overrides, validate

MODEL = "test_one_conv"
FAST_MATH_OFF = {"xla_cpu_enable_fast_math": False}
TINY = TrainConfig(
    model=MODEL,
    data="synthetic:8x8x3:4:64",
    layout="NCHW",
    batch_size=8,
    eval_batch_size=16,
    num_steps=3,
    eval_every=1,
    keep_checkpoints=3,
    data_parallel=False,
)
CONV = dict(conv_algorithm="im2col", kernel_storage="channels_last")
TINY_ARGS = [
    "--model", MODEL,
    "--data", "synthetic:8x8x3:4:64",
    "--layout", "NCHW",
    "--steps", "1",
    "--batch-size", "8",
    "--set", "data_parallel=false",
    "--set", "eval_batch_size=16",
    "--quiet",
]  # fmt: skip


class _OneConv(nnx.Module):
    """conv 3x3 -> relu -> global average pool -> dense."""

    def __init__(self, *, num_classes, layout, policy, rngs, in_channels=3):
        self.conv = nn.Conv(in_channels, 4, 3, padding=1, layout=layout, policy=policy, rngs=rngs)
        self.act = nn.ReLU()
        self.pool = nn.GlobalAvgPool(layout=layout, policy=policy)
        self.dense = nn.Dense(4, num_classes, policy=policy, rngs=rngs)

    def __call__(self, x):
        return self.dense(self.pool(self.act(self.conv(x))))


@pytest.fixture(scope="module", autouse=True)
def one_conv_model():
    """Registered only while this module runs, so registry-wide tests never see it."""
    models.register(MODEL, description="test only: one conv", default_input=(8, 8, 3))(_OneConv)
    yield
    models.unregister(MODEL)


def _config(**changes) -> TrainConfig:
    return TrainConfig(**{**TINY.to_dict(), **changes})


def _records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def empty_choice_table():
    """The ``"auto"`` table is process-wide: start and leave every test with it empty."""
    conv_algos.clear_choices()
    yield
    conv_algos.clear_choices()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"conv_algorithm": "fft"}, "conv settings: Unknown conv algorithm 'fft'.*im2col"),
        ({"kernel_storage": "hwio"}, "conv settings: Unknown kernel_storage 'hwio'"),
        ({"xla_options": ["xla_cpu_enable_fast_math"]}, "TrainConfig.xla_options must be dict"),
        ({"xla_options": {"xla_cpu_enable_fast_math": [1]}}, "xla_options must map XLA option"),
        ({"xla_options": {1: True}}, "xla_options must map XLA option names"),
    ],
)
def test_validate_rejects_bad_conv_settings(changes, message):
    with pytest.raises(ValueError, match=message):
        validate(TrainConfig(**changes), 1)


def test_conv_fields_override_and_round_trip():
    config = apply_overrides(
        TrainConfig(),
        [
            "conv_algorithm=auto",
            "kernel_storage=channels_last",
            "xla_options.xla_cpu_enable_fast_math=False",
            "xla_options.some_level=2",
            "xla_options.some_ratio=0.5",
            "xla_options.some_name=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
        ],
    )
    assert config.xla_options == {
        "xla_cpu_enable_fast_math": False,
        "some_level": 2,
        "some_ratio": 0.5,
        "some_name": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
    }
    assert validate(config, 1).conv_algorithm == "auto"
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    # A config.json written before these fields existed loads with the defaults.
    new_fields = ("conv_algorithm", "kernel_storage", "xla_options")
    old = {k: v for k, v in TrainConfig().to_dict().items() if k not in new_fields}
    loaded = TrainConfig.from_dict(old)
    assert [getattr(loaded, k) for k in new_fields] == ["xla", "layout", {}]


@pytest.fixture(scope="module")
def conv_run(tmp_path_factory):
    """TINY with im2col convs and HWIO kernels, a checkpoint at every step."""
    workdir = tmp_path_factory.mktemp("conv")
    conv_algos.clear_choices()
    loop.train_and_evaluate(_config(**CONV), workdir, quiet=True)
    return workdir


def test_im2col_channels_last_matches_the_default_trajectory(conv_run, tmp_path):
    # The default run also shows that a valid XLA option reaches the compile and runs
    # (fast math is off by default on CPU, so the numerics are unchanged).
    loop.train_and_evaluate(_config(xla_options=FAST_MATH_OFF), tmp_path, quiet=True)
    config = _config(**CONV)
    model = nnx.eval_shape(lambda: loop.build_model(config, get_dataset(config.data)))
    assert conv_settings(model) == {"conv": ("im2col", "HWIO")}
    want, got = _records(tmp_path), _records(conv_run)
    assert [r["step"] for r in got] == [1, 2, 3]
    # Both start from the same weights (channels_last moves the initialized kernels). im2col
    # sums each conv as a matmul, possibly in another order than XLA's conv, so float32
    # rounding may differ by ~1e-7 relative per conv (for this 27-term reduction the two
    # happen to agree bit for bit on XLA:CPU today); Adam normalizes each gradient, so a
    # near-zero gradient component can flip sign and move its weight by up to lr=3e-3, which
    # changes a loss of ~1.4 by far less than 1e-4 over 3 steps. A wrong algorithm or
    # kernel order would change the losses at step 1 by whole percents.
    for key in ("train_loss", "test_loss"):
        np.testing.assert_allclose(
            [r[key] for r in got], [r[key] for r in want], rtol=1e-4, err_msg=key
        )


def test_channels_last_checkpoint_resumes_bit_for_bit(conv_run, tmp_path):
    leaves, _ = read_checkpoint(conv_run / "checkpoints")
    kernels = {p: v.shape for p, v in leaves.items() if p.startswith(".params") and v.ndim == 4}
    assert kernels and all(s[:2] == (3, 3) for s in kernels.values()), kernels  # HWIO, not OIHW
    copy = tmp_path / "copy"
    shutil.copytree(conv_run, copy)
    shutil.rmtree(copy / "checkpoints" / "3")
    with pytest.raises(ValueError, match="kernel_storage='layout'.*with kernel_storage='channels_"):
        loop.train_and_evaluate(_config(), copy, resume=True, quiet=True)
    record = loop.train_and_evaluate(_config(**CONV), copy, resume=True, quiet=True)
    assert record["step"] == 3
    resumed, _ = read_checkpoint(copy / "checkpoints")
    assert resumed.keys() == leaves.keys()
    for path in leaves:
        np.testing.assert_array_equal(resumed[path], leaves[path], err_msg=path)


def test_rejected_xla_option_is_a_clear_error(tmp_path, capsys):
    # conv_algorithm=auto with an empty table also logs the untuned shapes first.
    config = _config(conv_algorithm="auto", xla_options={"xla_no_such_option": True})
    with pytest.raises(ValueError, match="XLA rejected xla_options.*xla_no_such_option"):
        loop.train_and_evaluate(config, tmp_path, quiet=False)
    err = capsys.readouterr().err
    assert "conv_algorithm=auto: 1 conv shape(s) have no autotuned choice" in err
    assert "layoutlab train --conv-algo auto" in err
    with pytest.raises(ValueError, match="While setting option xla_cpu_enable_fast_math"):
        loop.check_xla_options({"xla_cpu_enable_fast_math": "sometimes"})


def test_cli_conv_flags_autotune_then_read_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(conv_algos.CACHE_ENV, str(tmp_path / "conv_cache.json"))
    flags = [
        "--conv-algo", "auto",
        "--kernel-storage", "channels_last",
        "--xla-option", "xla_cpu_enable_fast_math=false",
    ]  # fmt: skip
    assert cli.main(["train", *TINY_ARGS, *flags, "--workdir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith("conv autotune:"))
    assert line.startswith("conv autotune: 1 shapes (0 cached): "), line
    assert len(conv_algos.choices()) == 1
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["conv_algorithm"] == "auto" and saved["kernel_storage"] == "channels_last"
    assert saved["xla_options"] == FAST_MATH_OFF

    # A second run reads every choice from the disk cache (its training is not needed).
    conv_algos.clear_choices()
    trained = {}

    def fake_train(config, workdir, **kw):
        trained["choices"] = dict(conv_algos.choices())
        return {"step": 0, "test_accuracy": 0.0, "test_loss": 0.0}

    monkeypatch.setattr(loop, "train_and_evaluate", fake_train)
    assert cli.main(["train", *TINY_ARGS, *flags, "--workdir", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "conv autotune: 1 shapes (1 cached): " in out
    assert len(trained["choices"]) == 1


def test_cli_rejects_a_bad_xla_option_before_tuning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(conv_algos.CACHE_ENV, str(tmp_path / "conv_cache.json"))
    flags = ["--conv-algo", "auto", "--xla-option", "xla_no_such_option=1"]
    assert cli.main(["train", *TINY_ARGS, *flags, "--workdir", str(tmp_path / "a")]) == 2
    assert "XLA rejected xla_options" in capsys.readouterr().err
    assert not (tmp_path / "conv_cache.json").exists()
    assert cli.main(["train", "--xla-option", "fast", "--workdir", str(tmp_path / "b")]) == 2
    assert "--xla-option 'fast' is not of the form NAME=VALUE" in capsys.readouterr().err


def test_cli_flags_map_to_the_config_fields(tmp_path):
    from layoutlab.train.command import build_config

    argv = [
        "train",
        "--conv-algo", "im2col",
        "--kernel-storage", "channels_last",
        "--xla-option=--xla_cpu_enable_fast_math=false",  # a leading -- as in XLA_FLAGS
        "--xla-option", "xla_backend_optimization_level=1",
        "--workdir", str(tmp_path),
    ]  # fmt: skip
    config, _ = build_config(cli.build_parser().parse_args(argv))
    assert (config.conv_algorithm, config.kernel_storage) == ("im2col", "channels_last")
    assert config.xla_options == {**FAST_MATH_OFF, "xla_backend_optimization_level": 1}
