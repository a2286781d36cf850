"""kill -9 at every commit point of a checkpoint save, then resume: never zero usable
checkpoints, and the resumed run ends bit for bit where the uninterrupted run ends.

The kill is deterministic: ``LAYOUTLAB_TEST_CHECKPOINT_KILL=POINT@STEP`` makes the
checkpoint code SIGKILL its own process at that point of ``Checkpointer.save`` (the hook
reads nothing else and does nothing without the variable). The points cover each state the
directory passes through: before orbax writes, after orbax committed but before the CRC
manifest, after the manifest but before old steps are deleted, and between two deletions.
The killed runs are subprocesses; the resumes run in this process. Kills at steps 2 and 6
fall between evaluations, so the resumed run's metrics rows, train metrics included, must
equal the uninterrupted run's.
"""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from layoutlab import models
from layoutlab.train.checkpoint import KILL_HOOK_ENV, KILL_POINTS, read_checkpoint
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate

# Checkpoints at steps 2, 4, 6, 8; with keep_checkpoints=3 the first deletion is at step 8.
# Evaluations at 4 and 8 only: a resume from step 2 or 6 starts between two evaluations, so
# its first record's train metrics must average steps from before the kill too.
BASE = TrainConfig(
    model_kwargs=models.spec("small_cnn").tiny,
    batch_size=32,
    num_steps=8,
    eval_every=4,
    checkpoint_every=2,
    seed=5,
)

DRIVER = """
import json, sys
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
train_and_evaluate(TrainConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], quiet=True)
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's final checkpoint and metrics (keep_checkpoints does not
    change the numbers, so one reference serves both)."""
    workdir = tmp_path_factory.mktemp("reference")
    train_and_evaluate(BASE, workdir, quiet=True)
    leaves, meta = read_checkpoint(workdir / "checkpoints")
    return leaves, _records(workdir)


def _records(workdir):
    """``metrics.jsonl`` without its timings (images_per_sec, elapsed)."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    timing = ("images_per_sec", "elapsed")
    return [{k: v for k, v in json.loads(x).items() if k not in timing} for x in lines]


def _kill_at(config, workdir, point, env):
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(config.to_dict()), str(workdir)],
        env={**env, KILL_HOOK_ENV: point},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


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


# (keep_checkpoints, kill point, the steps a resume may use right after that kill)
CASES = [
    # The first save: nothing, or only the committed step without its manifest.
    (1, "before_save@2", []),
    (1, "after_save@2", [2]),
    # keep=1, second save: orbax used to delete step 2 inside save(), before the manifest.
    (1, "before_save@4", [2]),
    (1, "after_save@4", [2, 4]),
    (1, "after_manifest@4", [2, 4]),
    (1, "during_delete@4", [4]),
    # keep=3: step 8's save is the first that deletes (step 2).
    (3, "after_save@8", [2, 4, 6, 8]),
    (3, "during_delete@8", [4, 6, 8]),
]


def test_every_kill_point_is_covered():
    assert {case[1].split("@")[0] for case in CASES} == set(KILL_POINTS)


@pytest.mark.parametrize("keep,point,usable", CASES, ids=[f"keep{c[0]}-{c[1]}" for c in CASES])
def test_kill_during_save_then_resume_matches_uninterrupted(
    keep, point, usable, reference, env, tmp_path, capsys
):
    config = TrainConfig(**{**BASE.to_dict(), "keep_checkpoints": keep})
    workdir = tmp_path / "run"
    _kill_at(config, workdir, point, env)
    ckpt_dir = workdir / "checkpoints"
    assert _usable_steps(ckpt_dir) == usable  # never fewer than before the save began
    assert (workdir / "config.json").is_file()

    record = train_and_evaluate(config, workdir, resume=True, quiet=True)
    err = capsys.readouterr().err
    want_leaves, want_records = reference
    got, meta = read_checkpoint(ckpt_dir)
    assert record["step"] == meta["step"] == 8
    assert got.keys() == want_leaves.keys()
    for path in want_leaves:  # params, batch stats, RNG, Adam moments, step: bit for bit
        np.testing.assert_array_equal(got[path], want_leaves[path], err_msg=path)
    # Every record equal, train_loss and train_accuracy included: float64 sums of the same
    # float32 values in the same order (the checkpoint carries the sums since the last eval).
    assert _records(workdir) == want_records
    assert [r["step"] for r in want_records] == [4, 8]
    assert not (ckpt_dir / "corrupt").exists()  # nothing usable was thrown away
    assert not (ckpt_dir / "deleting").exists()
    assert len(_usable_steps(ckpt_dir)) == min(keep, 4)
    if not usable:  # the kill came before any checkpoint existed: a fresh start, said so
        assert "no usable checkpoint" in err and "starting from step 0" in err
    if point.startswith("after_save"):
        assert "had no layoutlab_manifest.json" in err
    # The killed process's lock record was left behind; the resume took it over.
    assert "which is no longer running; taking it over" in err
