"""The orbax side of checkpoints: opening a step directory, reading a step's meta and arrays,
certifying a step without a manifest, and the readers' lock (``train.checkpoint`` uses these).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from layoutlab.train.manifest import (
    MANIFEST,
    CheckpointError,
    CorruptCheckpointError,
    ForeignCheckpointError,
    array_crc32s,
    has_manifest,
    verify_manifest,
)
from layoutlab.train.orbax_failures import quiet_orbax_failure

__all__ = [
    "READERS_LOCK",
    "certify",
    "check_identity",
    "make_readers_lock",
    "check_stored",
    "open_manager",
    "read_leaves",
    "read_meta",
    "steps_pinned",
    "stored_dtype",
]

READERS_LOCK = "readers.lock"  # shared by readers, exclusive while steps are moved away
# A link planted at the lock's path is not followed to a file outside the run (that file
# would be created or touched), and a named pipe there must not block the open.
_NO_LINK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def make_readers_lock(directory: Path) -> None:
    """Creates ``directory``'s readers' lock file unless something is at its path already."""
    try:
        os.close(os.open(directory / READERS_LOCK, os.O_RDONLY | os.O_CREAT | _NO_LINK, 0o644))
    except OSError:
        pass  # a link or worse there: steps_pinned then pins nothing, as without the file


def stored_dtype(name: str):
    return jnp.uint32 if name.startswith("key<") else jnp.dtype(name)


def _options(writing: bool = True, barrier_prefix: str | None = None):
    # Synchronous saves: save() returns once the checkpoint is committed, so the manifest
    # can be written right after, and the next (buffer-donating) step cannot race it.
    # max_to_keep=None: retention is ours (see the module docstring).
    # Readers leave the directory alone (orbax's read_only mode logs warnings instead).
    return ocp.CheckpointManagerOptions(
        max_to_keep=None,
        create=writing,
        enable_async_checkpointing=False,
        cleanup_tmp_directories=writing,
        # A second manager of the run (its best checkpoint) saves the same step numbers: its
        # own prefix keeps orbax's barriers of the two apart across processes.
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            barrier_sync_key_prefix=barrier_prefix
        ),
    )


def open_manager(
    directory: Path, writing: bool, barrier_prefix: str | None = None
) -> ocp.CheckpointManager:
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(
            f"Cannot use {directory}: it exists and is not a directory (checkpoints are kept "
            "there); move that file away or choose another --workdir."
        )
    # Handlers named up front: a fresh manager otherwise knows no handler for ``state`` and
    # returns no metadata for a step it did not save itself.
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    try:
        with quiet_orbax_failure():
            return ocp.CheckpointManager(
                directory, options=_options(writing, barrier_prefix), item_handlers=handlers
            )
    except OSError:
        raise  # the caller names the path and the fix (train.workdir.filesystem_error)
    except Exception as e:  # orbax raises many types; one line, the cause named
        raise CheckpointError(f"Cannot open checkpoints in {directory}: {_first_line(e)}") from e


@contextlib.contextmanager
def steps_pinned(directory: Path, exclusive: bool):
    """Readers pin the steps (shared); the writer moves steps away only exclusively. A
    directory without the lock file (a run saved before it existed, or none writing it) or
    where it cannot be opened pins nothing: nothing can move steps there then."""
    flags = os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY
    try:
        fd = os.open(directory / READERS_LOCK, flags | _NO_LINK)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    except OSError:
        pass  # a filesystem without flock: as before, unpinned
    try:
        yield
    finally:
        os.close(fd)  # drops the lock


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _unreadable(step_dir: Path, e: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"Checkpoint {step_dir} cannot be read: {_first_line(e)}")


def read_meta(manager, step: int, step_dir: Path) -> dict:
    """The step's ``meta`` item, its files verified first when it has a manifest."""
    if has_manifest(step_dir):
        verify_manifest(step_dir)
    try:
        with quiet_orbax_failure():
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = dict(meta["meta"])
    except Exception as e:  # orbax raises many types; all mean the same here
        raise _unreadable(step_dir, e) from e
    missing = [k for k in ("paths", "shapes", "dtypes") if k not in meta]
    if missing:
        raise CorruptCheckpointError(f"Checkpoint {step_dir}: its meta lacks {missing}.")
    return meta


def check_identity(step_dir: Path, meta: dict, run_id: str | None) -> None:
    """A step is the run's own and the step its directory names: its certified meta records
    both (``step``, ``run_id``). A step copied in from another run, copied or renamed to
    another step number, or swapped with another, raises ``ForeignCheckpointError``. A step
    or run from before run ids (no ``run_id`` on either side) is checked by its step only."""
    recorded = meta.get("step")
    if isinstance(recorded, int) and str(recorded) != step_dir.name:
        raise ForeignCheckpointError(
            f"Checkpoint {step_dir} holds step {recorded}, not {step_dir.name}: it was copied "
            "or renamed from another step."
        )
    theirs = meta.get("run_id")
    if run_id is not None and theirs is not None and theirs != run_id:
        raise ForeignCheckpointError(
            f"Checkpoint {step_dir} belongs to another run (run id {theirs}; this run's, in "
            f"its config.json, is {run_id}): it was copied in from another workdir."
        )


def check_stored(manager, step: int, step_dir: Path, meta: dict) -> None:
    """For a step without a manifest: the arrays orbax stored have the shapes and dtypes its
    meta records (restoring into other shapes could pad or cut them silently)."""
    try:
        with quiet_orbax_failure():
            stored = jax.tree.leaves(manager.item_metadata(step)["state"]["leaves"])
        got = [(tuple(x.shape), np.dtype(x.dtype)) for x in stored]
    except Exception as e:
        raise _unreadable(step_dir, e) from e
    want = [
        (tuple(s), np.dtype(stored_dtype(d)))
        for s, d in zip(meta["shapes"], meta["dtypes"], strict=True)
    ]
    if got != want:
        raise CorruptCheckpointError(
            f"Checkpoint {step_dir} is incomplete: it has no {MANIFEST} and its stored arrays "
            "do not match its recorded shapes."
        )


def certify(step_dir: Path, meta: dict, leaves: list) -> None:
    """A step without a manifest: its arrays as read must match the CRC-32s recorded when
    they were saved; without those it is an unfinished save."""
    want = meta.get("array_crc32s")
    if not isinstance(want, list) or len(want) != len(leaves):
        raise CorruptCheckpointError(
            f"Checkpoint {step_dir} is unfinished: it has no {MANIFEST} and no checksums of "
            "its arrays to verify it by (the run was killed while saving it)."
        )
    if array_crc32s(jax.device_get(leaves)) != want:
        raise CorruptCheckpointError(
            f"Checkpoint {step_dir} is corrupt: it has no {MANIFEST} and its arrays differ "
            "from the checksums recorded when they were saved."
        )


def read_leaves(manager, step: int, step_dir: Path, abstract: list) -> list:
    try:
        with quiet_orbax_failure():  # a damaged step without a manifest fails half way
            restored = manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore({"leaves": abstract})),
            )
        return restored["state"]["leaves"]
    except Exception as e:
        raise _unreadable(step_dir, e) from e
