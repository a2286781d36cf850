"""A run is itself (issue 70): readers serve only its own steps under their own numbers, a
resume keeps the JAX numerics it was trained with, and says what a may-change setting changed.

Runs here are ``guarantees_run`` (conftest) and copies of it, driven in-process through
``layoutlab.cli.main``, plus one run of another seed (the same programs: read back from the
compilation cache the modules share).
"""

import json
import shutil

import jax
import numpy as np
import pytest
from test_train_guarantees import _one_line_error, shared_cache_env
from test_train_integrity import RUN

from layoutlab import cli
from layoutlab.infer.load import open_run
from layoutlab.train.checkpoint import MANIFEST, CheckpointError, read_checkpoint
from layoutlab.train.command import build_config
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate

pytestmark = pytest.mark.usefixtures("shared_compiles")
# Its runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): its runs compile the table's conv plan or XLA's convs, no other.
CACHE_PARTITIONED = True


@pytest.fixture(scope="module")
def env(env, tmp_path_factory):
    return shared_cache_env(env, tmp_path_factory)


def _cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def other_seed(guarantees_run, tmp_path_factory):
    """The run of ``guarantees_run``'s settings with another seed: same model, same shapes."""
    workdir = tmp_path_factory.mktemp("other") / "run"
    argv = list(RUN)
    argv[argv.index("--seed") + 1] = "2"
    assert cli.main(["train", *argv, "--workdir", str(workdir), "--quiet"]) == 0
    return workdir


def _swap_in(copy, source_step_dir, step):
    shutil.rmtree(copy / "checkpoints" / str(step), ignore_errors=True)
    shutil.copytree(source_step_dir, copy / "checkpoints" / str(step))


# -- item 6: readers serve only the run's own steps, each under its own number --------------


def test_the_run_id_is_recorded_and_certified(guarantees_run, other_seed):
    run_id = json.loads((guarantees_run / "config.json").read_text())["run_id"]
    other = json.loads((other_seed / "config.json").read_text())["run_id"]
    assert isinstance(run_id, str) and len(run_id) == 32 and other != run_id
    for step in (2, 4):
        _, meta = read_checkpoint(guarantees_run / "checkpoints", step)
        # In the step's meta item, whose files the manifest's CRCs cover.
        assert meta["run_id"] == run_id and meta["step"] == step
        assert any(name.startswith("meta/") for name in _manifest(guarantees_run, step))


def _evaluated_step(capsys, workdir) -> tuple[int, str]:
    """The step ``layoutlab evaluate`` read (the newest it serves), and its stderr."""
    result = workdir.parent / "eval.json"
    code, _, err = _cli(capsys, "evaluate", "--workdir", workdir, "--json-file", result)
    assert code == 0, err
    return json.loads(result.read_text())["step"], err


def _manifest(workdir, step):
    return json.loads((workdir / "checkpoints" / str(step) / MANIFEST).read_text())["files"]


def test_a_step_of_another_run_is_not_served(copy, other_seed, capsys):
    _swap_in(copy, other_seed / "checkpoints" / "4", 4)  # another seed's step 4, as newest
    step, err = _evaluated_step(capsys, copy)
    assert step == 2  # the run's own newest step
    assert "checkpoints/4 belongs to another run" in err and "Reading the step before" in err
    # predict and export open the run as evaluate does (infer.load.open_run).
    assert open_run(copy).step == 2
    assert "belongs to another run" in capsys.readouterr().err
    code, _, err = _cli(capsys, "evaluate", "--workdir", copy, "--checkpoint", "4")
    assert code == 2
    _one_line_error(err, "belongs to another run", "Pick another step")
    code, _, err = _cli(capsys, "export", "--workdir", copy, "--checkpoint", "4", "--out",
                        copy.parent / "model.jax")  # fmt: skip
    assert code == 2
    _one_line_error(err, "belongs to another run")


def test_resume_sets_another_runs_step_aside(copy, other_seed, guarantees_run, capsys):
    _swap_in(copy, other_seed / "checkpoints" / "4", 4)
    code, _, err = _cli(capsys, "train", "--workdir", copy, "--resume", "--quiet")
    assert code == 0, err
    assert "checkpoints/4 belongs to another run" in err and "corrupt/4" in err
    assert "accum_steps" not in err
    # Trained again from the run's own step 2: the uninterrupted run's step 4, bit for bit.
    got, meta = read_checkpoint(copy / "checkpoints", 4)
    want, _ = read_checkpoint(guarantees_run / "checkpoints", 4)
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    assert meta["run_id"] == json.loads((guarantees_run / "config.json").read_text())["run_id"]


def test_a_copied_or_swapped_step_is_not_served(copy, capsys):
    shutil.copytree(copy / "checkpoints" / "2", copy / "checkpoints" / "6")  # cp -a 2 6
    step, err = _evaluated_step(capsys, copy)
    assert step == 4
    assert "checkpoints/6 holds step 2, not 6" in err
    code, _, err = _cli(capsys, "evaluate", "--workdir", copy, "--checkpoint", "6")
    assert code == 2
    _one_line_error(err, "holds step 2, not 6", "copied or renamed")
    shutil.rmtree(copy / "checkpoints" / "6")
    ckpts = copy / "checkpoints"
    (ckpts / "2").rename(ckpts / "swap")
    (ckpts / "4").rename(ckpts / "2")
    (ckpts / "swap").rename(ckpts / "4")
    code, _, err = _cli(capsys, "evaluate", "--workdir", copy, "--checkpoint", "4")
    assert code == 2
    _one_line_error(err, "holds step 2, not 4")


def test_a_run_from_before_run_ids_is_checked_by_step(copy):
    """Without a run id in config.json any run's step is taken (nothing to compare it
    with), but a step under another number still is not."""
    config = json.loads((copy / "config.json").read_text())
    config.pop("run_id", None)
    (copy / "config.json").write_text(json.dumps(config))
    assert open_run(copy).step == 4
    shutil.copytree(copy / "checkpoints" / "2", copy / "checkpoints" / "6")
    assert open_run(copy).step == 4
    with pytest.raises(CheckpointError, match="holds step 2, not 6"):
        open_run(copy, 6)


# -- item 9: the JAX settings that change numbers ---------------------------------------------


def test_resume_under_other_jax_numerics_is_refused(copy):
    config = TrainConfig.from_dict(json.loads((copy / "config.json").read_text()))
    before = (copy / "config.json").read_bytes()
    jax.config.update("jax_enable_x64", True)  # what JAX_ENABLE_X64=1 sets
    try:
        with pytest.raises(ValueError, match="jax_enable_x64 is True in this process") as e:
            train_and_evaluate(config, copy, resume=True, quiet=True)
    finally:
        jax.config.update("jax_enable_x64", False)
    assert "JAX_ENABLE_X64" in str(e.value) and "\n" not in str(e.value)
    assert (copy / "config.json").read_bytes() == before
    recorded = json.loads(before)["jax_numerics"]
    assert recorded["jax_enable_x64"] is False and "jax_default_matmul_precision" in recorded


# -- item 11: what a resume says and takes ----------------------------------------------------


def test_resume_names_the_may_change_settings_it_changes(copy, capsys):
    # A config.json from before layer_impl existed: the run ran "auto", its default.
    saved = json.loads((copy / "config.json").read_text())
    del saved["layer_impl"]
    (copy / "config.json").write_text(json.dumps(saved))
    args = cli.build_parser().parse_args(["train", "--workdir", str(copy), "--resume"])
    assert build_config(args)[0].layer_impl == "auto"
    flags = ["--conv-algo", "xla", "--no-cpu-fast", "--layer-impl", "xla"]
    flags += ["--xla-option", "xla_cpu_enable_fast_math=false"]
    code, _, err = _cli(capsys, "train", "--workdir", copy, "--resume", "--quiet", *flags)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "changed settings" in line]
    assert len(notes) == 1, err
    for part in ("conv_algorithm 'auto' -> 'xla'", "cpu_fast True -> False",
                 "layer_impl 'auto' -> 'xla'",
                 "xla_options {} -> {'xla_cpu_enable_fast_math': False}"):  # fmt: skip
        assert part in notes[0], notes[0]


def test_a_saved_option_that_writes_files_is_not_taken(copy, tmp_path, capsys):
    dump = tmp_path / "dump"
    config = json.loads((copy / "config.json").read_text())
    config["xla_options"] = {"xla_dump_to": str(dump), "xla_cpu_enable_fast_math": False}
    (copy / "config.json").write_text(json.dumps(config))
    args = cli.build_parser().parse_args(["train", "--workdir", str(copy), "--resume"])
    config, _ = build_config(args)
    assert config.xla_options == {"xla_cpu_enable_fast_math": False}
    err = capsys.readouterr().err
    assert "not using xla_options xla_dump_to=" in err and "command line only" in err
    # From the command line it is the user's own ask.
    argv = ["train", "--workdir", str(copy), "--resume", "--xla-option", f"xla_dump_to={dump}"]
    config, _ = build_config(cli.build_parser().parse_args(argv))
    assert config.xla_options["xla_dump_to"] == str(dump)


def test_a_default_spelled_out_is_no_change(copy, capsys):
    # small_cnn's dropout defaults to 0.1: the same model, said explicitly.
    code, _, err = _cli(capsys, "train", "--workdir", copy, "--resume", "--quiet", "--model-arg",
                        "dropout=0.1")  # fmt: skip
    assert code == 0, err
    assert "complete at step 4" in err
    code, _, err = _cli(capsys, "train", "--workdir", copy, "--resume", "--quiet", "--model-arg",
                        "dropout=0.2")  # fmt: skip
    assert code == 2
    _one_line_error(err, "model_kwargs", "may not change within a run")
