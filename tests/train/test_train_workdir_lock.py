"""One writer per workdir, held by the workdir itself, and a lock that never writes outside
the run (docs/guides/guarantees.md, "One writer per workdir"). The locks are taken in-process
(two ``WorkdirLock`` objects conflict as two processes do: a flock belongs to an open file);
one refusal goes through ``layoutlab train`` to check its line and exit code."""

import json
import os
import socket

import pytest

from layoutlab import cli
from layoutlab.train.checkpoint_io import READERS_LOCK, make_readers_lock, steps_pinned
from layoutlab.train.workdir import LOCK_FILE, WorkdirError, WorkdirLock


@pytest.fixture
def outside(tmp_path):
    """A file outside any run, whose bytes and times must survive."""
    victim = tmp_path / "precious.txt"
    victim.write_text("precious\n")
    os.utime(victim, ns=(1_000_000_000, 1_000_000_000))
    return victim


def _untouched(victim) -> bool:
    st = os.stat(victim)
    return victim.read_text() == "precious\n" and st.st_mtime_ns == 1_000_000_000


def test_lock_linked_to_a_file_outside_the_run_is_refused(tmp_path, outside, capsys):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / LOCK_FILE).symlink_to(outside)
    code = cli.main(["train", "--workdir", str(workdir), "--tiny", "--steps", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "is a symbolic link, not the lock file" in lines[0] and str(workdir) in lines[0]
    assert _untouched(outside)
    assert sorted(p.name for p in workdir.iterdir()) == [LOCK_FILE]  # nothing trained


@pytest.mark.parametrize("kind", ["hard link", "named pipe", "directory"])
def test_lock_path_that_is_not_a_regular_file_is_refused(tmp_path, outside, kind):
    lock = tmp_path / LOCK_FILE
    if kind == "hard link":
        os.link(outside, lock)  # a regular file, but writing it would write the outside one
    elif kind == "named pipe":
        os.mkfifo(lock)  # opening it must not wait for a writer
    else:
        lock.mkdir()
    with pytest.raises(WorkdirError, match=f"is a {kind}.*, not the lock file"):
        WorkdirLock(tmp_path).acquire()
    assert _untouched(outside)


def test_deleting_the_lock_file_does_not_let_a_second_writer_in(tmp_path):
    first = WorkdirLock(tmp_path).acquire()
    (tmp_path / LOCK_FILE).unlink()  # what a user (or a clean-up script) may do
    with pytest.raises(WorkdirError, match="is in use by another layoutlab run"):
        WorkdirLock(tmp_path).acquire()
    first.release()
    with WorkdirLock(tmp_path):  # free again once the first lets go
        pass


def test_the_record_names_its_writer_and_is_marked_released(tmp_path):
    with WorkdirLock(tmp_path):
        held = (tmp_path / LOCK_FILE).read_text()
        record = json.loads(held)
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert "started" in record and "released" not in record
    # Released by writing a longer record over it, never by truncating the file.
    released = (tmp_path / LOCK_FILE).read_text()
    assert released.startswith(held[:-1]) and json.loads(released)["released"]


def test_readers_lock_is_not_followed_out_of_the_run(tmp_path, outside):
    """``checkpoints/readers.lock`` as a link: neither its making (each save's start) nor a
    writer's exclusive pin creates or touches the file it points to."""
    gone = tmp_path / "gone.txt"
    for target in (outside, gone):
        directory = tmp_path / f"checkpoints_{target.stem}"
        directory.mkdir()
        (directory / READERS_LOCK).symlink_to(target)
        make_readers_lock(directory)
        with steps_pinned(directory, exclusive=True):
            pass
    assert _untouched(outside) and not gone.exists()
