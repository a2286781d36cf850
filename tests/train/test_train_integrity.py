"""What a checkpoint certifies, what a resume compares, and readers of a live run (README,
"What layoutlab guarantees about your run"): each test names the promise it checks.

Most runs here are one small in-process run (``run_dir``) and copies of it; the CLI is
driven in-process through ``layoutlab.cli.main``.
"""

import hashlib
import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image
from test_train_guarantees import LEVEL_0, _one_line_error, shared_cache_env

from layoutlab import cli, models
from layoutlab.infer.load import open_run
from layoutlab.train.checkpoint import MANIFEST, CorruptCheckpointError, read_checkpoint
from layoutlab.train.command import build_config
from layoutlab.train.config import TrainConfig, validate
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.model_checks import builder_options
from layoutlab.train.resume import check_resume
from layoutlab.train.spec import resolve_spec

# A resume of ``guarantees_run`` and the evaluations repeat its programs: they read them back
# from the cache this module shares with test_train_guarantees. The first test uses no run,
# so ``guarantees_run``, when this module builds it, compiles into that cache.
pytestmark = pytest.mark.usefixtures("shared_compiles")
# Its runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): its runs compile the table's conv plan or XLA's convs, no other.
CACHE_PARTITIONED = True

TINY = ["--set", "model_kwargs.width=4", "--set", "model_kwargs.hidden=16"]
RUN = ["--steps", "4", "--batch-size", "32", "--seed", "1", "--set", "eval_every=2", *TINY]


@pytest.fixture(scope="module")
def env(env, tmp_path_factory):
    return shared_cache_env(env, tmp_path_factory)


def _cli(capsys, *argv):
    code = cli.main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def _digests(workdir, *names):
    return {n: hashlib.sha256((workdir / n).read_bytes()).hexdigest() for n in names}


@pytest.fixture
def run_dir(guarantees_run):
    """A finished 4-step CLI run of ``RUN`` (checkpoints and evaluations at steps 2 and 4)."""
    return guarantees_run


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)


# -- item 3: model kwargs in the model's declared ranges ----------------------------------


def test_declared_ranges_name_builder_arguments():
    for name in models.names():
        ranges = models.spec(name).ranges
        assert set(ranges) <= set(builder_options(name)), name
        defaults = {p: v for p, v in models.spec(name).tiny.items() if p in ranges}
        assert all(v in ranges[p] for p, v in defaults.items()), name


# -- item 1: a checkpoint is certified by its content -------------------------------------


def _forge_recorded_checksum(step_dir):
    """A step whose arrays no longer match what was saved, as a power loss before the data
    reached the disk leaves it; here the record is changed instead of the bytes, so that
    the arrays still decode (damaged zstd data may fail to decode or read back as garbage)."""
    (step_dir / MANIFEST).unlink()
    meta_file = step_dir / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["array_crc32s"][0] ^= 1
    meta_file.write_text(json.dumps(meta))


def test_manifestless_step_that_differs_from_its_checksums_is_not_used(copy, run_dir, capsys):
    ckpt = copy / "checkpoints"
    _forge_recorded_checksum(ckpt / "4")
    with pytest.raises(CorruptCheckpointError, match="differ from the checksums recorded"):
        read_checkpoint(ckpt, step=4)
    # Readers (evaluate, predict, export) asked for the newest step read the one before it.
    notes = []
    assert read_checkpoint(ckpt, log=notes.append)[1]["step"] == 2
    assert "differ from the checksums" in notes[0] and "Reading the step before it" in notes[0]
    assert open_run(copy).step == 2
    # A resume moves it aside and retrains from step 2: the run's own step 4, bit for bit.
    code, _, err = _cli(capsys, "train", "--workdir", str(copy), "--resume", "--quiet")
    assert code == 0, err
    assert f"warning: Checkpoint {ckpt / '4'} is corrupt" in err
    assert (ckpt / "corrupt" / "4").is_dir()
    _assert_same(read_checkpoint(ckpt)[0], read_checkpoint(run_dir / "checkpoints")[0])
    records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4] and np.isfinite(records[-1]["test_loss"])


def test_manifestless_step_without_checksums_is_unfinished(copy):
    ckpt = copy / "checkpoints"
    (ckpt / "4" / MANIFEST).unlink()
    meta_file = ckpt / "4" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    del meta["array_crc32s"]  # as a multi-process save writes it
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(CorruptCheckpointError, match="is unfinished: it has no"):
        read_checkpoint(ckpt, step=4)
    assert read_checkpoint(ckpt)[1]["step"] == 2


@pytest.mark.parametrize(
    "manifest", [{"files": {}}, {"files": {"commit_success.txt": {"size": 63, "crc32": 1}}}]
)
def test_a_manifest_that_lists_no_data_certifies_nothing(copy, manifest):
    step_dir = copy / "checkpoints" / "4"
    (step_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match="certifies nothing"):
        read_checkpoint(copy / "checkpoints", step=4)


# -- item 5: no restart over a run's history ----------------------------------------------


def test_resume_without_checkpoints_but_with_history_is_refused(copy, capsys):
    shutil.rmtree(copy / "checkpoints")
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "learning_rate": 0.1}))
    before = _digests(copy, "config.json", "metrics.jsonl")
    code, _, err = _cli(capsys, "train", "--workdir", str(copy), "--resume", "--quiet")
    assert code == 2
    _one_line_error(err, "no usable checkpoint", "up to step 4", "without --resume")
    assert _digests(copy, "config.json", "metrics.jsonl") == before


# -- item 9: what a resume compares, and how it says so -----------------------------------


def test_equivalent_spellings_resume(run_dir):
    """The comparison itself (the CLI's path to it is the one refusals take above)."""
    argv = ["train", "--workdir", str(run_dir), "--resume", "--layout", "nhwc"]
    argv += ["--precision", "p=f32,c=f32,o=f32", "--model", "Small_CNN"]
    asked, _ = build_config(cli.build_parser().parse_args(argv))
    spec = resolve_spec(validate(asked, 4), num_devices=4)
    config = check_resume(spec, run_dir, run_dir / "checkpoints", asked).config
    got = (config.layout, config.precision, config.model)
    assert got == ("NHWC", "fp32", "small_cnn")  # the run's own spelling is kept


@pytest.mark.parametrize(
    "flags,fragments",
    [
        (["--steps", "2"], ["for 2 steps", "is at step 4 already", "--steps N with N >= 4"]),
        (["--model", "vgg11_bn"], ["with model='vgg11_bn'", "may not change within a run"]),
        (["--activation-storage", "layout"], ["activation_storage='layout'", "keeps its"]),
        (["--set", "conv_plan=null"], ["--set conv_plan cannot be used with --resume"]),
        (["--set", "eval_conv_plan=null"], ["--set eval_conv_plan cannot be used with"]),
    ],
)
def test_resume_messages_name_the_change(copy, capsys, flags, fragments):
    before = _digests(copy, "config.json", "metrics.jsonl", "checkpoints/4/" + MANIFEST)
    code, _, err = _cli(capsys, "train", "--workdir", str(copy), "--resume", "--quiet", *flags)
    assert code == 2
    _one_line_error(err, *fragments)
    assert _digests(copy, "config.json", "metrics.jsonl", "checkpoints/4/" + MANIFEST) == before


def test_resume_of_a_run_stopped_before_it_began(tmp_path, capsys):
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)  # what a kill before config.json leaves
    (workdir / "layoutlab.lock").write_text("")
    code, _, err = _cli(capsys, "train", "--workdir", str(workdir), "--resume", "--quiet")
    assert code == 2
    _one_line_error(err, "stopped before it began training", "start it again without --resume")


# -- item 7: orbax failures are one line --------------------------------------------------


def test_checkpoints_that_is_a_file_is_one_line(copy, tmp_path, capsys):
    shutil.rmtree(copy / "checkpoints")
    (copy / "checkpoints").write_text("not a directory")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "checkpoints").write_text("not a directory")
    for argv in (
        ["train", *RUN, "--workdir", str(fresh), "--quiet"],
        ["train", "--workdir", str(copy), "--resume", "--quiet"],
        ["evaluate", "--workdir", str(copy)],
    ):
        code, _, err = _cli(capsys, *argv)
        assert code == 2
        _one_line_error(err, "checkpoints")


# -- item 4: readers never write into a run -----------------------------------------------


def _files(workdir):
    return sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))


def test_evaluate_writes_nothing_into_the_run(run_dir, tmp_path, capsys):
    before = _files(run_dir)
    code, out, err = _cli(capsys, "evaluate", "--workdir", str(run_dir))
    assert code == 0, err
    assert "confusion matrix plot" not in out and _files(run_dir) == before
    code, out, err = _cli(capsys, "evaluate", "--workdir", str(run_dir), "--out", str(tmp_path))
    assert code == 0, err
    assert (tmp_path / "confusion_step4.png").is_file() and _files(run_dir) == before


def test_evaluate_on_a_read_only_run(run_dir, tmp_path, capsys):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        shutil.copytree(run_dir, mnt / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        code, out, err = _cli(capsys, "evaluate", "--workdir", str(mnt / "run"))
        assert code == 0, err
        code, _, err = _cli(capsys, "evaluate", "--workdir", str(mnt / "run"), "--out", str(mnt))
        assert code == 2
        _one_line_error(err, "Cannot write into --out", "Read-only file system")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert out.splitlines()[0].endswith("step 4 on digits (359 test images)")


def test_readers_write_nothing_into_the_runs_checkpoints(copy, tmp_path, capsys):
    """An output path inside ``checkpoints/`` (directly, through a link or through ``..``),
    or one of the run's own files, is refused before any work, with the run unchanged."""
    manifest = copy / "checkpoints" / "4" / MANIFEST
    (tmp_path / "link").symlink_to(copy / "checkpoints")
    dotdot = copy / "tensorboard" / ".." / "checkpoints" / "r.json"
    before = _digests(copy, "config.json", "checkpoints/4/" + MANIFEST)
    files = _files(copy)
    for argv, inside in [
        (["evaluate", "--json-file", manifest], "inside the run's checkpoints/"),
        (["evaluate", "--json-file", tmp_path / "link" / "4" / "r.json"], "checkpoints/"),
        (["evaluate", "--json-file", dotdot], "inside the run's checkpoints/"),
        (["evaluate", "--out", copy / "checkpoints" / "4"], "inside the run's checkpoints/"),
        (["evaluate", "--json-file", copy / "config.json"], "the run's own config.json"),
        (["export", "--out", copy / "checkpoints" / "m.jax"], "inside the run's checkpoints/"),
        (["export", "--out", tmp_path / "link"], "inside the run's checkpoints/"),
    ]:
        code, out, err = _cli(capsys, argv[0], "--workdir", str(copy), *map(str, argv[1:]))
        assert code == 2 and out == "", (argv, out)
        _one_line_error(err, inside, "write nothing into the run")
    assert _digests(copy, "config.json", "checkpoints/4/" + MANIFEST) == before
    assert _files(copy) == files


def test_evaluate_of_a_file_says_it_is_a_file(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a run")
    for command in (["evaluate"], ["predict", str(tmp_path)]):
        code, _, err = _cli(capsys, command[0], "--workdir", str(notes), *command[1:])
        assert code == 2
        _one_line_error(err, f"Workdir {notes} is a file, not a run's directory", "config.json")


# -- item 6: a reader during a keep=1 run -------------------------------------------------

LIVE = """
import sys
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
config = TrainConfig(model_kwargs={"width": 4, "hidden": 16}, batch_size=8, num_steps=20,
                     eval_every=20, checkpoint_every=1, keep_checkpoints=1, log_every=0,
                     tensorboard=False, xla_options={"xla_backend_optimization_level": 0})
train_and_evaluate(config, sys.argv[1], quiet=True)
"""


def test_reader_in_a_loop_during_a_keep_1_run_never_fails(tmp_path, env):
    # The run checks files, not numbers: it compiles at LLVM level 0 (docs/development.md).
    workdir = tmp_path / "live"
    proc = subprocess.Popen(
        [sys.executable, "-c", LIVE, str(workdir)], env=env, stderr=subprocess.PIPE, text=True
    )
    steps, deadline = set(), time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                steps.add(read_checkpoint(workdir / "checkpoints")[1]["step"])
            except FileNotFoundError:
                if steps:  # once a step exists, some step is always there to read
                    raise
                time.sleep(0.05)
    finally:
        proc.kill() if proc.poll() is None else None
        stderr = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, stderr
    assert len(steps) >= 5, steps  # it read while the run saved and pruned


# -- item 2: the data a run trains on ------------------------------------------------------


def _folder(root, seed=0):
    rng = np.random.default_rng(seed)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
            Image.fromarray(pixels, "L").save(root / f"c{c}" / f"{i}.png")


def test_resume_on_changed_folder_data_is_refused(tmp_path, capsys):
    data = tmp_path / "images"
    _folder(data)
    workdir = tmp_path / "run"
    argv = ["train", "--workdir", str(workdir), "--data", f"folder:{data}", "--quiet"]
    # A run for its config.json only (refusals, no numbers): LLVM level 0 (docs/development.md).
    code, _, err = _cli(capsys, *argv, "--steps", "2", "--batch-size", "8", *TINY, *LEVEL_0)
    assert code == 0, err
    before = _digests(workdir, "config.json", "metrics.jsonl")

    Image.fromarray(np.zeros((8, 8), np.uint8), "L").save(data / "c0" / "3.png")  # replaced
    code, _, err = _cli(capsys, "train", "--workdir", str(workdir), "--resume", "--steps", "4")
    assert code == 2
    _one_line_error(err, "is not what the run was trained on", "bytes now")
    (data / "c1" / "5.png").unlink()
    code, _, err = _cli(capsys, "train", "--workdir", str(workdir), "--resume", "--steps", "4")
    assert code == 2
    _one_line_error(err, "23 files now, 24 when the run started")
    config = TrainConfig(data=f"folder:{data}", batch_size=8)
    with pytest.raises(ValueError, match="is not what the run was trained on"):
        train_and_evaluate(config, workdir, resume=True, quiet=True)
    assert _digests(workdir, "config.json", "metrics.jsonl") == before
    recorded = json.loads((workdir / "config.json").read_text())["data_fingerprint"]
    assert recorded["files"] == 24 and recorded["bytes"] > 0
