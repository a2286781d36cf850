"""kill -9 at every commit point of a checkpoint save, then resume: never zero usable
checkpoints, and the resumed run ends bit for bit where the uninterrupted run ends.

The kill is deterministic: ``kill_hook.install("POINT@STEP")`` makes the
checkpoint code SIGKILL its own process at that point of ``Checkpointer.save`` (through
``checkpoint.set_save_phase_hook``; a run installs no hook). The points cover each state the
directory passes through: before orbax writes, after orbax committed but before the CRC
manifest, after the manifest but before old steps are deleted, and between two deletions.

The kills form chains: a fresh run killed at the first point, then a resume
(``resume=True``) of that directory killed at the next, and so on, each a process of its
own (forked from one that imported layoutlab once). The last kill is in the last save, so
the resume after it, in this process, finds the run complete once it has cleaned up. Every
kill is thus followed by a resume, and every resume but the last is itself killed at a real
commit point (one process start serves both). Kills at steps 2 and 6 fall between
evaluations, so the resumed runs' metrics rows, train metrics included, must equal the
uninterrupted run's.
"""

import json
import signal
from pathlib import Path

import kill_hook
import numpy as np
import pytest
from block_server import BlockServer

from layoutlab import models
from layoutlab.train.checkpoint import SAVE_PHASES, read_checkpoint
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate

# Checkpoints at steps 2, 4, ..., 10. Evaluations at 4, 8 and 10 (the last step): a resume
# from step 2 or 6 starts between two evaluations, so its first record's train metrics must
# average steps from before the kill too.
BASE = TrainConfig(
    model_kwargs=models.spec("small_cnn").tiny,
    batch_size=32,
    num_steps=10,
    eval_every=4,
    checkpoint_every=2,
    seed=5,
    # Not what a kill or a resume is about (metrics.jsonl and the checkpoints are), and its
    # tensorboardX import is ~0.6 s of CPU in each of this module's eight killed processes.
    tensorboard=False,
    # Every comparison is between layoutlab's own runs (resumed against uninterrupted), so
    # they compile at LLVM level 0 (docs/development.md): the same HLO passes, and the
    # reference run, which compiles what every forked run reads back, costs ~3 s less CPU.
    xla_options={"xla_backend_optimization_level": 0},
)

TIMEOUT_S = 300
# The runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True


# keep_checkpoints -> [(kill point, the steps a resume may use right after that kill)], in
# the order of the chain; the first kill is of a fresh run, the others of resumes.
CHAINS = {
    "keep1": (
        1,
        [
            # The first save: nothing, or only the committed step without its manifest.
            ("before_save@2", []),
            ("after_save@2", [2]),
            # The second save: orbax used to delete step 2 inside save(), before the manifest.
            ("before_save@4", [2]),
            ("after_save@4", [2, 4]),
            # The resume from 4 deleted step 2 once it certified 4; 6 replaces 4.
            ("after_manifest@6", [4, 6]),
            # 8 replaced 6 on the way: the kill comes in the deletion of 8, for 10.
            ("during_delete@10", [10]),
        ],
    ),
    # keep=3: step 8's save is the first that deletes (step 2), in the resume from 8.
    "keep3": (3, [("after_save@8", [2, 4, 6, 8]), ("during_delete@10", [6, 8, 10])]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shared_compiles):
    """The uninterrupted run's final checkpoint and metrics (keep_checkpoints does not
    change the numbers, so one reference serves both chains). It compiles into the cache
    the forked runs read (``env``): the first of them, which would otherwise compile the
    same programs itself, reads them back (~8 s of CPU)."""
    workdir = tmp_path_factory.mktemp("reference")
    train_and_evaluate(BASE, workdir, quiet=True)
    leaves, meta = read_checkpoint(workdir / "checkpoints")
    return leaves, _records(workdir)


def _records(workdir):
    """``metrics.jsonl`` without its timings (images_per_sec, elapsed); none before it exists."""
    path = workdir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    timing = ("images_per_sec", "elapsed")
    return [{k: v for k, v in json.loads(x).items() if k not in timing} for x in lines]


@pytest.fixture(scope="module")
def fork_server(env, tmp_path_factory):
    """Each run is a child forked from one process that imported layoutlab once
    (``block_server``), before JAX started a backend: a process of its own, which the hook
    kills with SIGKILL, without the ~4 s of CPU that importing jax, flax and layoutlab costs."""
    server = BlockServer(env, tmp_path_factory.mktemp("fork_server"))
    yield server
    server.close()


def _kill_at(server, config, workdir, point, resume):
    """Runs ``config`` (a resume of ``workdir`` where ``resume``) in a forked process until
    the hook kills it at ``point``; returns what it printed (stdout, then stderr)."""
    code = (
        "import json, os\n"
        "from layoutlab.train.config import TrainConfig\n"
        "from layoutlab.train.loop import train_and_evaluate\n"
        f"{kill_hook.install_code(point)}"
        f"config = TrainConfig.from_dict(json.loads({json.dumps(config.to_dict())!r}))\n"
        f"train_and_evaluate(config, {str(workdir)!r}, resume={resume!r}, quiet=True)\n"
    )
    cwd = workdir.parent / point.replace("@", "_")
    cwd.mkdir()
    rc, out, err = server.run(code, cwd, TIMEOUT_S)
    assert rc == -signal.SIGKILL, (point, out + err)
    return out + err


def _usable_steps(ckpt_dir):
    """Steps a resume can use: those that read back (manifest checked where there is one)."""
    usable = []
    for p in ckpt_dir.iterdir() if ckpt_dir.is_dir() else ():
        if p.name.isdigit():
            try:
                read_checkpoint(ckpt_dir, step=int(p.name))
                usable.append(int(p.name))
            except Exception:
                pass
    return sorted(usable)


def _check_resume_said(err, before, after):
    """A resume's stderr, ``before`` the kill point and usable steps that it started from."""
    point, usable = before
    if not usable:  # the kill came before any checkpoint existed: a fresh start, said so
        assert "no usable checkpoint" in err and "starting from step 0" in err, (after, err)
    if point.startswith("after_save"):
        assert "had no layoutlab_manifest.json" in err, (after, err)
    # The killed process's lock record was left behind; the resume took it over.
    assert "which is no longer running; taking it over" in err, (after, err)


def test_every_kill_point_is_covered():
    points = {point for _, chain in CHAINS.values() for point, _ in chain}
    assert {p.split("@")[0] for p in points} == set(SAVE_PHASES)


@pytest.mark.parametrize("name", list(CHAINS))
def test_kill_during_save_then_resume_matches_uninterrupted(
    name, reference, fork_server, tmp_path, capsys
):
    keep, chain = CHAINS[name]
    config = TrainConfig(**{**BASE.to_dict(), "keep_checkpoints": keep})
    workdir = tmp_path / "run"
    ckpt_dir = workdir / "checkpoints"
    for i, (point, usable) in enumerate(chain):
        err = _kill_at(fork_server, config, workdir, point, i > 0)
        if i > 0:
            _check_resume_said(err, chain[i - 1], point)
        assert _usable_steps(ckpt_dir) == usable, point  # never fewer than before the save
        # The rows so far are the uninterrupted run's, the ones past the last checkpoint too:
        # so even a resume whose state no later run continues (killed before it saved) is
        # checked, through every number it evaluated.
        rows = _records(workdir)
        assert rows == reference[1][: len(rows)], point
        assert (workdir / "config.json").is_file(), point
        assert not (ckpt_dir / "corrupt").exists(), point  # nothing usable was thrown away
        # A kill between two deletions leaves the one moved aside; a resume removes it.
        assert (ckpt_dir / "deleting").exists() == point.startswith("during_delete"), point

    record = train_and_evaluate(config, workdir, resume=True, quiet=True)
    _check_resume_said(capsys.readouterr().err, chain[-1], "the last resume")
    want_leaves, want_records = reference
    got, meta = read_checkpoint(ckpt_dir)
    assert record["step"] == meta["step"] == 10
    assert got.keys() == want_leaves.keys()
    for path in want_leaves:  # params, batch stats, RNG, Adam moments, step: bit for bit
        np.testing.assert_array_equal(got[path], want_leaves[path], err_msg=path)
    # Every record equal, train_loss and train_accuracy included: float64 sums of the same
    # float32 values in the same order (the checkpoint carries the sums since the last eval).
    # Each resume wrote the records after its checkpoint again, so all of them are checked.
    assert _records(workdir) == want_records
    assert [r["step"] for r in want_records] == [4, 8, 10]
    assert not (ckpt_dir / "corrupt").exists()
    assert not (ckpt_dir / "deleting").exists()
    assert len(_usable_steps(ckpt_dir)) == min(keep, 5)


def test_a_save_calls_the_installed_hook_at_each_phase_in_order(tmp_path):
    """The kill points above come from a hook the test installs; a save with none installed
    reads nothing from the environment (no ``os.environ`` on the save path)."""
    import ast

    from layoutlab.train import checkpoint

    state = {"w": np.arange(3.0, dtype=np.float32)}
    calls = []
    previous = checkpoint.set_save_phase_hook(lambda phase, step: calls.append((phase, step)))
    try:
        with checkpoint.Checkpointer(tmp_path, max_to_keep=1) as ckpt:
            ckpt.save(1, state)
            ckpt.save(2, state)
    finally:
        checkpoint.set_save_phase_hook(previous)
    assert calls == [(p, 1) for p in SAVE_PHASES[:3]] + [(p, 2) for p in SAVE_PHASES]
    source = ast.parse(Path(checkpoint.__file__).read_text())
    names = {n.attr for n in ast.walk(source) if isinstance(n, ast.Attribute)}
    assert not names & {"environ", "getenv"}


# Issue 69: every option a recipe adds, on at once. The random ones (crop and flip,
# TrivialAugment, erasing, mixup or cutmix per batch) draw from the seed and the step; the
# EMA, the best checkpoint and its metric ride in the checkpoint; the cosine schedule with its
# warmup and floor, and the clipping, depend on the step alone.
RECIPES = TrainConfig(
    **{
        **BASE.to_dict(),
        "augment": True,
        "auto_augment": "trivial",
        "random_erasing": 0.25,
        "mixup": 0.2,
        "cutmix": 1.0,
        "label_smoothing": 0.1,
        "ema_decay": 0.9,
        "schedule": "cosine",
        "warmup_steps": 2,
        "min_lr": 1e-4,
        "clip_grad_norm": 1.0,
        "val_fraction": 0.1,
        "keep_best": "val_accuracy",
    }
)


def test_a_run_with_every_recipe_option_killed_and_resumed_ends_bitwise_equal(
    fork_server, tmp_path
):
    reference = tmp_path / "reference"
    train_and_evaluate(RECIPES, reference, quiet=True)
    workdir = tmp_path / "run"
    # SIGKILL once step 6's checkpoint is certified: the resume starts between evaluations.
    _kill_at(fork_server, RECIPES, workdir, "after_manifest@6", False)
    assert _usable_steps(workdir / "checkpoints") == [2, 4, 6]  # keep_checkpoints=3
    record = train_and_evaluate(RECIPES, workdir, resume=True, quiet=True)
    assert record["step"] == 10 and "ema_val_accuracy" in record and "test_accuracy" in record
    for sub in ("checkpoints", "best"):  # the newest state, and the best evaluation's
        want, _ = read_checkpoint(reference / sub)
        got, _ = read_checkpoint(workdir / sub)
        assert want.keys() == got.keys(), sub
        assert any(path.startswith(".ema.params") for path in want), sub
        for path in want:
            np.testing.assert_array_equal(got[path], want[path], err_msg=f"{sub}{path}")
    assert _records(workdir) == _records(reference)
