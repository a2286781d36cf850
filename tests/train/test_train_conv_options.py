"""Conv algorithm, kernel storage and XLA compile options of a training run: config, loop, CLI.

Runs train a test-only one-conv classifier in NCHW on 8x8x3 synthetic images, batch 8, on one
device, for 1 to 3 steps: one conv shape keeps the train-step compiles and the CLI's conv
autotuning (every candidate compiled forward and backward) to seconds on 2 busy cores. The
CLI runs' conv is 1x1: it has 6 training candidates where a 3x3 one has 10, whose four
Winograd ones are the costly compiles (the tuning run took 8 s of CPU against 28), and which
plan source a run takes does not depend on the kernel. The CLI's tuning runs once, in this
process (``tuned``); the tests that read its cache or resume its run take copies, and only
the resume that must start from nothing runs in a fresh process.
This process and that one share a persistent compilation cache, so a run that repeats an
earlier run's programs (a resume, a cached plan) reads them back instead of compiling them.
"""

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

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
from layoutlab.train.program import build_model
from layoutlab.train.spec import InputSpec, resolve_spec

pytestmark = pytest.mark.usefixtures("shared_compiles")

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
    "--model-arg", "kernel=1",
    "--quiet",
]  # fmt: skip


class _OneConv(nnx.Module):
    """conv 3x3 (or ``kernel``, "same" padded) -> relu -> global average pool -> dense."""

    def __init__(self, *, num_classes, layout, policy, rngs, in_channels=3, kernel=3):
        pad = kernel // 2
        self.conv = nn.Conv(
            in_channels, 4, kernel, padding=pad, layout=layout, policy=policy, rngs=rngs
        )
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
    loop.train_and_evaluate(_config(**CONV), workdir, quiet=True)
    return workdir


def test_im2col_channels_last_matches_the_default_trajectory(conv_run, tmp_path):
    # The default run also shows that a valid XLA option reaches the compile and runs
    # (fast math is off by default on CPU, so the numerics are unchanged).
    loop.train_and_evaluate(_config(xla_options=FAST_MATH_OFF), tmp_path, quiet=True)
    spec = resolve_spec(validate(_config(**CONV), 1))
    inputs = InputSpec.of(get_dataset(spec.data), spec.batch_size)
    model = nnx.eval_shape(lambda: build_model(spec, inputs))
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
        loop.train_and_evaluate(_config(kernel_storage="layout"), copy, resume=True, quiet=True)
    record = loop.train_and_evaluate(_config(**CONV), copy, resume=True, quiet=True)
    assert record["step"] == 3
    resumed, _ = read_checkpoint(copy / "checkpoints")
    assert resumed.keys() == leaves.keys()
    for path in leaves:
        np.testing.assert_array_equal(resumed[path], leaves[path], err_msg=path)


def test_rejected_xla_option_is_a_clear_error(tmp_path, capsys):
    config = _config(conv_algorithm="auto", xla_options={"xla_no_such_option": True})
    with pytest.raises(ValueError, match="XLA rejected xla_options.*xla_no_such_option"):
        loop.train_and_evaluate(config, tmp_path, quiet=False)
    # A partial plan: the convs it lacks run XLA's conv, and the loop says how many. (With
    # the default trajectory's option its programs are that run's: read back, not compiled.)
    plan = {"convs": {}}
    config = _config(conv_algorithm="auto", conv_plan=plan, xla_options=FAST_MATH_OFF)
    loop.train_and_evaluate(config, tmp_path / "p")
    err = capsys.readouterr().err
    assert "conv_algorithm=auto: 1 of 1 conv(s) have no conv_plan entry" in err
    with pytest.raises(ValueError, match="While setting option xla_cpu_enable_fast_math"):
        loop.check_xla_options({"xla_cpu_enable_fast_math": "sometimes"})


TUNE_FLAGS = [
    "--conv-algo", "auto",
    "--conv-tune", "always",  # a 3-step run is too short for tuning to pay by itself
    "--kernel-storage", "channels_last",
    "--xla-option", "xla_cpu_enable_fast_math=false",
]  # fmt: skip


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """``(workdir, autotune cache, stdout)`` of one CLI run, in this process, that tuned its
    conv into a cache of its own: read-only, the tests below copy what they change."""
    root = tmp_path_factory.mktemp("tuned")
    cache, out = root / "conv_cache.json", io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(cache))
        assert cli.main(["train", *TINY_ARGS, *TUNE_FLAGS, "--workdir", str(root / "a")]) == 0
    return root / "a", cache, out.getvalue()


def _copy_cache(tuned, tmp_path, monkeypatch):
    cache = tmp_path / "conv_cache.json"
    shutil.copyfile(tuned[1], cache)
    monkeypatch.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(cache))
    return cache


def test_cli_conv_flags_autotune_then_read_the_cache(tuned, tmp_path, monkeypatch, capsys):
    workdir, _, out = tuned
    line = next(s for s in out.splitlines() if s.startswith("conv plan:"))
    assert line.startswith("conv plan: autotuned (1 shapes (0 cached): "), line
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["conv_algorithm"] == "auto" and saved["kernel_storage"] == "channels_last"
    assert saved["xla_options"] == FAST_MATH_OFF
    plan = conv_algos.ConvPlan.from_dict(saved["conv_plan"])
    assert list(plan) == ["conv"] and plan["conv"].spec_key.startswith("NCHW:n8:8x8:3->4:k1x1:")
    meta = read_checkpoint(workdir / "checkpoints")[1]
    assert meta["extra"]["config"]["conv_plan"] == saved["conv_plan"]

    # A second run, with the default --conv-tune auto, reads every choice from the cache.
    _copy_cache(tuned, tmp_path, monkeypatch)
    flags = [*TUNE_FLAGS[:2], *TUNE_FLAGS[4:]]
    assert cli.main(["train", *TINY_ARGS, *flags, "--workdir", str(tmp_path / "b")]) == 0
    assert "conv plan: autotune cache (1 shapes (1 cached): " in capsys.readouterr().out
    again = json.loads((tmp_path / "b" / "config.json").read_text())["conv_plan"]
    assert dict(conv_algos.ConvPlan.from_dict(again).items()) == dict(plan.items())


def test_cli_rejects_a_bad_xla_option_before_tuning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(tmp_path / "conv_cache.json"))
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


def test_bad_conv_plan_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="conv_plan: conv plan entry 'conv'.*Unknown conv algo"):
        validate(_config(conv_plan={"convs": {"conv": {"algorithm": "fft", "spec_key": "k"}}}), 1)
    with pytest.raises(ValueError, match="conv_plan: A conv plan is a mapping with a 'convs'"):
        validate(_config(conv_plan={"conv": "im2col"}), 1)
    plan = {"convs": {"nope": {"algorithm": "im2col", "spec_key": "k"}}}
    with pytest.raises(ValueError, match="names 1 conv.*does not have \\(nope\\)"):
        loop.train_and_evaluate(_config(conv_algorithm="auto", conv_plan=plan), tmp_path)
    bad = ["--conv-algo", "auto", "--set", 'conv_plan={"convs": {"conv": {"algorithm": "fft"}}}']
    assert cli.main(["train", *TINY_ARGS, *bad, "--workdir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: conv_plan: conv plan entry 'conv' needs string")
    assert err.count("\n") == 1  # one line
    oops = ["--set", "conv_plan={oops", "--workdir", str(tmp_path)]
    assert cli.main(["train", *TINY_ARGS, *oops]) == 2
    assert "Bad value for conv_plan" in capsys.readouterr().err


def test_a_given_eval_conv_plan_is_checked_and_kept(tmp_path):
    with pytest.raises(ValueError, match="eval_conv_plan: A conv plan is a mapping"):
        validate(_config(eval_conv_plan={"conv": "im2col"}), 1)
    wrong = {"convs": {"nope": {"algorithm": "im2col", "spec_key": "k"}}}
    with pytest.raises(ValueError, match="eval_conv_plan: .*does not have \\(nope\\).*eval_conv"):
        loop.train_and_evaluate(_config(conv_algorithm="auto", eval_conv_plan=wrong), tmp_path)
    # A given eval plan is the user's: the run's own planning leaves it as it is.
    given = {"convs": {"conv": {"algorithm": "im2col", "spec_key": "a shape of its own"}}}
    config = _config(conv_algorithm="auto", eval_conv_plan=given)
    loop.train_and_evaluate(config, tmp_path / "run", quiet=True)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["eval_conv_plan"]["convs"] == given["convs"]
    assert saved["conv_plan"]["convs"]["conv"]["evidence"]["source"].startswith("default table")


def test_a_tuned_plan_keeps_its_shapes_and_the_table_plans_the_eval_batch():
    # A plan from a tuning or the autotune cache (conv_planner) is keyed by the training
    # batch: at another eval batch it would give every conv XLA's, so the eval step gets the
    # table's inference rules there; at the training batch the tuned entries stand.
    from layoutlab.nn.conv_algos import ConvPlan, as_plan
    from layoutlab.nn.conv_config import default_conv_plan
    from layoutlab.train import run_plan

    spec = resolve_spec(_config(conv_algorithm="auto"))
    inputs = InputSpec(image_shape=(8, 8, 3), num_classes=4, batch_size=8)
    model = run_plan.abstract_model(spec, inputs)

    def tuned(model, images, steps, options):
        table = default_conv_plan(model, images, "train", "avx2")
        return ConvPlan({p: e._replace(algorithm="im2col") for p, e in table.items()},
                        {p: {"source": "autotune"} for p in table})  # fmt: skip

    other = run_plan.planned(spec, inputs, 3, None, tuned, model, eval_batch=16).config
    train_plan, eval_plan = as_plan(other.conv_plan), as_plan(other.eval_conv_plan)
    assert train_plan["conv"].algorithm == "im2col" and ":n8:" in train_plan["conv"].spec_key
    assert ":n16:" in eval_plan["conv"].spec_key
    assert eval_plan.evidence("conv")["source"].startswith("default table")
    same = run_plan.planned(spec, inputs, 3, None, tuned, model, eval_batch=8).config
    assert same.eval_conv_plan is None and as_plan(same.conv_plan) == train_plan


# A fresh process that registers the test model, then runs the real CLI.
DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from test_train_conv_options import MODEL, _OneConv
from layoutlab import cli, models
models.register(MODEL, description="test only: one conv", default_input=(8, 8, 3))(_OneConv)
sys.exit(cli.main(sys.argv[2:]))
"""


def _train_in_a_fresh_process(args, cache, env):
    env = {**env, "LAYOUTLAB_AUTOTUNE_CACHE": str(cache)}
    tests = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, tests, "train", *TINY_ARGS, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_resume_in_a_fresh_process_runs_the_checkpointed_plan(
    tuned, tmp_path, monkeypatch, capsys, env
):
    workdir = tmp_path / "run"
    shutil.copytree(tuned[0], workdir)
    cache = _copy_cache(tuned, tmp_path, monkeypatch)
    recorded = json.loads((workdir / "config.json").read_text())["conv_plan"]
    (chosen,) = conv_algos.ConvPlan.from_dict(recorded).algorithms().values()

    # Another machine state: the cache now says another algorithm is the fastest.
    other = "im2col" if chosen != "im2col" else "xla"
    data = json.loads(cache.read_text())
    for entry in data["entries"].values():
        entry["choice"] = other
    cache.write_text(json.dumps(data))

    # A process that has tuned nothing and holds no plan: only the checkpoint has it.
    resumed = _train_in_a_fresh_process(
        [*TUNE_FLAGS[:4], "--workdir", str(workdir), "--resume", "--steps", "2"], cache, env
    )
    assert "conv plan:" not in resumed.stdout  # the run's own plan: neither tuned nor read
    leaves, meta = read_checkpoint(workdir / "checkpoints")
    assert meta["step"] == 2 and meta["extra"]["config"]["conv_plan"] == recorded
    assert json.loads((workdir / "config.json").read_text())["conv_plan"] == recorded

    # The changed cache is read by a new run: the resumed one would have changed algorithm.
    assert cli.main(["train", *TINY_ARGS, *TUNE_FLAGS, "--workdir", str(tmp_path / "new")]) == 0
    assert "conv plan: autotune cache (1 shapes (1 cached)" in capsys.readouterr().out
    new_plan = json.loads((tmp_path / "new" / "config.json").read_text())["conv_plan"]
    assert conv_algos.ConvPlan.from_dict(new_plan).algorithms() == {"conv": other}
