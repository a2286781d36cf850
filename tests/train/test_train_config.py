"""TrainConfig parsing and validation, the optimizer factory and the CLI's error path.

Nothing here compiles a train step: validation must fail before that.
"""

import argparse
import json
import re

import jax
import numpy as np
import optax
import pytest

from layoutlab.train import loop, run_start
from layoutlab.train.command import build_config, main, register
from layoutlab.train.config import TrainConfig, apply_overrides, validate
from layoutlab.train.optim import make_optimizer, make_schedule
from layoutlab.train.skip import SkipNonFiniteState

NDEV = jax.device_count()  # 4 fake CPU devices under conftest


def test_round_trip_through_json():
    config = TrainConfig(model_kwargs={"width": 8}, epochs=3, data_parallel=False)
    again = TrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config


def test_from_dict_rejects_unknown_fields_and_wrong_types():
    with pytest.raises(ValueError, match="Unknown TrainConfig fields.*'epoch'"):
        TrainConfig.from_dict({"epoch": 3})
    with pytest.raises(ValueError, match="TrainConfig.epochs must be int"):
        TrainConfig.from_dict({"epochs": "3"})
    # An int is a valid float.
    assert TrainConfig.from_dict({"learning_rate": 1}).learning_rate == 1.0


def test_overrides_parse_by_field_type():
    config = apply_overrides(
        TrainConfig(),
        [
            "epochs=3",
            "learning_rate=1e-2",
            "remat=true",
            "augment=no",
            "data_parallel=none",
            "num_steps=7",
            "model_kwargs.width=8",
            "model_kwargs.stem=cifar",
            "data=synthetic:8x8x1:10:64",
        ],
    )
    assert config.epochs == 3 and isinstance(config.epochs, int)
    assert config.learning_rate == 0.01
    assert config.remat is True and config.augment is False
    assert config.data_parallel is None and config.num_steps == 7
    assert config.model_kwargs == {"width": 8, "stem": "cifar"}
    assert config.data == "synthetic:8x8x1:10:64"
    whole = apply_overrides(TrainConfig(), ['model_kwargs={"width": 4, "hidden": 16}'])
    assert whole.model_kwargs == {"width": 4, "hidden": 16}


@pytest.mark.parametrize(
    "item, message",
    [
        ("epoch=3", "Unknown config field 'epoch'"),
        ("epochs=three", "Bad value for epochs: 'three' is not an integer"),
        ("remat=maybe", "Bad value for remat: 'maybe' is not true/false"),
        ("learning_rate=fast", "Bad value for learning_rate"),
        ("model_kwargs=[1]", "Bad value for model_kwargs"),
        ("epochs", "not of the form field=value"),
    ],
)
def test_bad_overrides_name_the_field(item, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(TrainConfig(), [item])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_size": 30}, r"batch_size=30 is not divisible by the 4 devices.*multiple of 4"),
        ({"eval_batch_size": 6}, "eval_batch_size=6 is not divisible"),
        ({"optimizer": "lamb"}, "Unknown optimizer 'lamb'; use one of: sgd"),
        ({"accum_steps": 0}, "accum_steps must be a positive integer, got 0"),
        ({"epochs": 0}, "epochs must be a positive integer"),
        ({"model": "resnet9"}, "Unknown model 'resnet9'; known models are"),
        ({"model": "unet"}, "'unet' is a segmentation model"),
        ({"model": "small_cnn3d"}, "takes 3D inputs"),
        ({"precision": "fp8"}, "precision: Unknown precision policy 'fp8'"),
        ({"loss_scale": "sometimes"}, "loss_scale: Unknown loss scale 'sometimes'"),
        ({"data": "imagenet:/x"}, "Unknown data source 'imagenet:/x'"),
        ({"layout": "NDHWC"}, "layout must be NHWC or NCHW"),
        ({"remat": True}, "remat=True is not supported by 'small_cnn'.*resnet18"),
        ({"model_kwargs": {"depth": 3}}, r"model_kwargs \['depth'\] are not options"),
        ({"model_kwargs": {"layout": "NCHW"}}, "model_kwargs may not set"),
        ({"learning_rate": 0.0}, "learning_rate must be a finite number > 0"),
        ({"schedule": "linear"}, "Unknown schedule 'linear'"),
        ({"seed": -1}, "seed must lie in"),
        (
            {"conv_algorithm": "winograd4", "precision": "mixed_bf16"},
            r"conv_algorithm='winograd4' with precision 'mixed_bf16' \(compute bfloat16\)",
        ),
        (
            {"conv_algorithm": "winograd4_xla_dw", "precision": "mixed_fp16"},
            "compute float16.*choose --conv-algo auto",
        ),
    ],
)
def test_validate_names_the_field_and_fix(changes, message):
    with pytest.raises(ValueError, match=message):
        validate(TrainConfig(**changes), NDEV)


def test_winograd_refusals_follow_the_compute_dtype():
    # F(2x2,3x3) stays within the bfloat16 bar and F(4x4,3x3) within float32's
    # (tests/nn/test_conv_algos.py measures both against float64 NumPy).
    for algo, precision in (
        ("winograd2", "mixed_bf16"),
        ("winograd4", "fp32"),
        ("auto", "mixed_fp16"),
    ):
        validate(TrainConfig(conv_algorithm=algo, precision=precision), NDEV)


def test_batch_divisibility_only_matters_when_data_parallel():
    config = validate(TrainConfig(batch_size=30, data_parallel=False), NDEV)
    assert config.batch_size == 30


def test_resolve_fills_automatic_fields():
    from layoutlab.train.spec import resolve_spec

    def resolved(config, devices=NDEV):
        checked = validate(config, devices)
        assert checked == config  # validate checks; resolve_spec fills in
        return resolve_spec(checked, num_devices=devices)

    assert resolved(TrainConfig(precision="mixed_fp16")).config.loss_scale == "dynamic"
    assert resolved(TrainConfig(precision="mixed_bf16")).config.loss_scale == "none"
    assert resolved(TrainConfig(), 1).data_parallel is False
    spec = resolved(TrainConfig(batch_size=36))
    assert spec.data_parallel is True and spec.eval_batch_size == 512 and spec.batch_size == 36
    assert (spec.config.data_parallel, spec.config.eval_batch_size) == (True, 512)
    assert resolved(TrainConfig(remat=True, model="resnet18")).remat is True


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_size": 30}, "batch_size=30 is not divisible"),
        ({"optimizer": "lamb"}, "Unknown optimizer"),
        ({"accum_steps": 0}, "accum_steps must be a positive integer"),
        ({"batch_size": 4000}, "larger than the 1438 training examples"),
    ],
)
def test_bad_configs_fail_before_building_or_compiling(tmp_path, monkeypatch, changes, message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("built a model or compiled before validating the config")

    monkeypatch.setattr(run_start, "_check_dataset", must_not_run)
    monkeypatch.setattr(loop, "compile_train_step", must_not_run)
    with pytest.raises(ValueError, match=message):
        loop.train_and_evaluate(TrainConfig(**changes), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_warmup_cosine_schedule_matches_closed_form():
    config = TrainConfig(learning_rate=0.1, warmup_steps=10)
    schedule = make_schedule(config, total_steps=110)
    steps = np.arange(0, 111)
    # Reference: linear warmup from 0, then half a cosine period down to 0, in float64.
    t = np.clip((steps - 10) / 100, 0, 1)
    want = np.where(steps < 10, 0.1 * steps / 10, 0.05 * (1 + np.cos(np.pi * t)))
    # optax schedules rely on standard promotion (int step * float), as in the train step.
    with jax.numpy_dtype_promotion("standard"):
        got = np.array([float(schedule(s)) for s in steps])
    # float32 schedule arithmetic: a few ulps of 0.1.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_constant_schedule_warms_up_then_holds():
    schedule = make_schedule(TrainConfig(schedule="constant", learning_rate=0.5), 100)
    with jax.numpy_dtype_promotion("standard"):
        values = [float(schedule(s)) for s in (0, 5, 99)]
    assert values == [0.0, 0.5, 0.5]  # warmup is 5% of 100 steps


def test_accumulation_is_wrapped_inside_skip_nonfinite():
    params = {"w": np.ones((2, 2), np.float32)}
    tx = make_optimizer(TrainConfig(accum_steps=2), 10)
    state = tx.init(params)
    assert isinstance(state, SkipNonFiniteState)
    assert isinstance(state.inner_state, optax.MultiStepsState)


def _train_args(argv):
    parser = argparse.ArgumentParser(prog="layoutlab")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def test_cli_flags_and_set_build_the_config(tmp_path):
    args = _train_args(
        [
            "--steps",
            "5",
            "--lr",
            "0.01",
            "--remat",
            "--model",
            "resnet18",
            "--set",
            "model_kwargs.stem=cifar",
            "--workdir",
            str(tmp_path),
        ]
    )
    config, workdir = build_config(args)
    assert (config.num_steps, config.learning_rate, config.remat) == (5, 0.01, True)
    assert config.model_kwargs == {"stem": "cifar"} and workdir == tmp_path


def test_cli_resume_starts_from_the_saved_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TrainConfig(epochs=5, seed=3).to_dict()))
    config, _ = build_config(_train_args(["--workdir", str(tmp_path), "--resume", "--epochs", "6"]))
    assert (config.epochs, config.seed) == (6, 3)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_config_file_then_flags_then_set(tmp_path, suffix):
    fields = {"model": "resnet18", "model_kwargs": {"stem": "cifar"}, "epochs": 4, "seed": 9}
    path = tmp_path / f"run{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(fields))
    else:
        path.write_text("model: resnet18\nmodel_kwargs:\n  stem: cifar\nepochs: 4\nseed: 9\n")
    argv = ["--config", str(path), "--epochs", "6", "--set", "seed=2", "--workdir", "w"]
    config, _ = build_config(_train_args(argv))
    # The file sets model and model_kwargs; the flag beats the file; --set beats both.
    assert (config.model, config.model_kwargs) == ("resnet18", {"stem": "cifar"})
    assert (config.epochs, config.seed) == (6, 2)
    assert config.batch_size == TrainConfig().batch_size  # not in the file: the default


def test_an_earlier_runs_config_json_is_a_config_file(tmp_path):
    saved = TrainConfig(epochs=3, precision="mixed_bf16", layout="NCHW")
    (tmp_path / "config.json").write_text(json.dumps(saved.to_dict()))
    config, _ = build_config(_train_args(["--config", str(tmp_path / "config.json")]))
    assert config == saved


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("c.json", '{"epochs": 2', r"c.json does not parse \(Expecting"),
        ("c.yaml", "model: [unclosed", r"c.yaml does not parse"),
        ("c.yaml", "- a\n- b\n", "holds a list, not a mapping of TrainConfig fields"),
        ("c.json", '{"epoch": 2}', r"Unknown TrainConfig fields \['epoch'\]"),
        ("c.json", '{"epochs": "many"}', "epochs"),
        ("c.toml", "epochs = 2", "use a .json, .yaml or .yml file"),
        (None, None, "cannot be read"),
    ],
)
def test_bad_config_files_exit_2_with_one_line(tmp_path, capsys, name, text, message):
    path = tmp_path / (name or "missing.json")
    if text is not None:
        path.write_text(text)
    assert main(["train", "--config", str(path), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --config {path}") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert not (tmp_path / "w").exists()  # refused before the workdir was made


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--optimizer", "lamb"], "error: Unknown optimizer 'lamb'"),
        (["--batch-size", "30"], "error: batch_size=30 is not divisible"),
        (["--set", "accum_steps=0"], "error: accum_steps must be a positive integer"),
        (["--epochs", "x"], "error: Bad value for epochs"),
        (["--resume"], "error: --resume needs --workdir"),
        (["--data", "cifar10"], "error: Bad data source 'cifar10'"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    workdir = [] if "--resume" in argv else ["--workdir", str(tmp_path / "w")]
    assert main(["train", *workdir, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_half_params_keep_optimizer_state_in_float32():
    params = {"w": np.full((4,), 1.0, np.float16)}
    grads = {"w": np.full((4,), 1e-5, np.float16)}  # squared: 1e-10, zero in float16
    config = TrainConfig(
        precision="fp16",
        optimizer="adam",
        schedule="constant",
        warmup_steps=0,
        weight_decay=0.0,
        learning_rate=1e-3,
    )
    with jax.numpy_dtype_promotion("standard"):  # optax relies on it, as in the train step
        plain = optax.adam(1e-3)
        updates, _ = plain.update(grads, plain.init(params), params)
        assert not np.isfinite(np.asarray(updates["w"])).all()  # the failure being avoided
        tx = make_optimizer(config, 10)
        updates, state = tx.update(grads, tx.init(params), params)
    assert updates["w"].dtype == np.float16
    moments = [x for x in jax.tree.leaves(state.inner_state) if x.ndim == 1]
    assert moments and all(x.dtype == np.float32 for x in moments)
    # Adam's bias-corrected first step is -lr * g / (|g| + eps), here in float64 with g as
    # stored in float16; the float16 update may differ by its 2**-11 relative spacing.
    g = float(np.float16(1e-5))
    want = -1e-3 * g / (g + 1e-8)
    np.testing.assert_allclose(np.asarray(updates["w"], np.float64), want, rtol=2**-11)


@pytest.mark.parametrize("field", ["conv_plan", "eval_conv_plan"])
def test_another_models_conv_plan_names_the_plan_and_the_fix(tmp_path, capsys, field):
    # A small_cnn run's config.json (its conv plan included) reused for another model: the
    # error is about the plan, not the model's kwargs, and says how to drop that field.
    key = "NHWC:n32:8x8:{}:k3x3:s1x1:p1-1,1-1:d1x1:g1:float32"
    plan = {
        "features/layers/0/layers/0": {"algorithm": "xla", "spec_key": key.format("1->32")},
        "features/layers/1/layers/0": {"algorithm": "xla", "spec_key": key.format("32->64")},
    }
    saved = TrainConfig(**{field: {"convs": plan}}).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(saved))
    argv = ["train", "--config", str(tmp_path / "config.json"), "--model", "resnet18"]
    assert main([*argv, "--workdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}: "), err
    assert f"--set {field}=null" in err[0] and "model_kwargs" not in err[0], err
    other = {"conv_plan": "eval_conv_plan", "eval_conv_plan": "conv_plan"}[field]
    assert f"--set {other}=null" not in err[0], err
