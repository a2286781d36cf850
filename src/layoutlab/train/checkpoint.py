"""Checkpoints of the whole ``TrainState`` with orbax, verified before they are restored.

Layout of ``<dir>/<step>/``: orbax's ``state`` item (the flattened leaves), its ``meta`` item
(JSON: the leaves' tree paths, shapes and dtypes, plus caller data such as the config) and
``layoutlab_manifest.json`` (``train.manifest``: size and CRC-32 of every file orbax wrote).

Commit order, so that a kill at any instant leaves a usable checkpoint for any
``max_to_keep >= 1``: (1) orbax saves the step (atomically: a temporary directory renamed
into place); (2) the manifest is written and checked; (3) only then are steps beyond
``max_to_keep`` deleted, each first renamed into ``deleting/`` so none is ever half there.
orbax's own retention is off (it would delete old steps inside (1)). A step that orbax
committed but that has no manifest (a kill between (1) and (2)) is certified by its content:
its arrays are read back and must match the CRC-32s its meta recorded at save time
(``manifest.array_crc32s``; single-process saves record them). Without them, or when they
differ, the step counts as unfinished: a resume moves it to ``corrupt/`` and uses the one
before, a reader refuses it (or, asked for the newest step, reads the one before).

Readers (``read_checkpoint``) hold a shared ``flock`` on ``<dir>/readers.lock`` while they
list and read a step; the writer takes it exclusively to move steps away (pruning,
quarantine), so a step being read is never removed under its reader.

PRNG key arrays are stored as their raw ``key_data`` and wrapped again on restore.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from layoutlab.train.checkpoint_io import (
    certify,
    check_identity,
    check_stored,
    make_readers_lock,
    open_manager,
    read_leaves,
    read_meta,
    steps_pinned,
    stored_dtype,
)
from layoutlab.train.distributed import barrier
from layoutlab.train.manifest import (
    MANIFEST,
    CheckpointError,
    CorruptCheckpointError,
    ForeignCheckpointError,
    IncompatibleCheckpointError,
    array_crc32s,
    has_manifest,
    verify_manifest,
    write_manifest,
)
from layoutlab.train.orbax_failures import quiet_orbax_failure

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "ForeignCheckpointError",
    "IncompatibleCheckpointError",
    "newest_meta",
    "SAVE_PHASES",
    "read_checkpoint",
    "set_save_phase_hook",
]

QUARANTINE = "corrupt"  # unusable checkpoints are moved to <dir>/corrupt/<step>
TRASH = "deleting"  # old steps are renamed here, then removed
# The phases of a save at which ``set_save_phase_hook``'s hook is called, in order: before
# orbax writes, once it committed, once the manifest is checked, and after each old step is
# moved aside (the commit order above: a crash test kills the process at each).
SAVE_PHASES = ("before_save", "after_save", "after_manifest", "during_delete")
# TrainState.model_state was called ``rest`` before; its checkpoints still restore.
_RENAMED_PATHS = ((".rest", ".model_state"),)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _no_hook(phase: str, step: int) -> None:
    """What a save calls at each phase unless a hook is installed: nothing."""


_save_phase_hook: Callable[[str, int], None] = _no_hook


def set_save_phase_hook(
    hook: Callable[[str, int], None] | None,
) -> Callable[[str, int], None] | None:
    """Installs ``hook(phase, step)``, called at each of ``SAVE_PHASES`` of every save in this
    process (None: none); returns the hook it replaces. Crash tests install one that kills the
    process there; a run installs none, so a save reads nothing from its environment."""
    global _save_phase_hook
    previous = _save_phase_hook
    _save_phase_hook = hook or _no_hook
    return None if previous is _no_hook else previous


def _save_phase(phase: str, step: int) -> None:
    _save_phase_hook(phase, step)


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _stored_spec(x) -> jax.ShapeDtypeStruct:
    """Shape and dtype as stored (a key as its key data); ``x`` may be abstract."""
    spec = jax.eval_shape(jax.random.key_data, x) if _is_key(x) else x
    return jax.ShapeDtypeStruct(spec.shape, spec.dtype, sharding=getattr(x, "sharding", None))


def _describe(state) -> tuple[list, list[str], list[list[int]], list[str]]:
    """Leaves, their path strings, stored shapes and dtypes (a key's dtype is its key type)."""
    with_paths = jax.tree_util.tree_flatten_with_path(state)[0]
    leaves = [x for _, x in with_paths]
    paths = [jax.tree_util.keystr(p) for p, _ in with_paths]
    shapes = [list(_stored_spec(x).shape) for x in leaves]
    return leaves, paths, shapes, [str(x.dtype) for x in leaves]


def _saved_paths(meta: dict) -> list[str]:
    paths = []
    for path in meta["paths"]:
        for old, new in _RENAMED_PATHS:
            if path == old or path.startswith((old + "[", old + ".")):
                path = new + path[len(old) :]
        paths.append(path)
    return paths


def _check_compatible(step_dir: Path, meta: dict, paths, shapes, dtypes) -> None:
    saved = list(zip(_saved_paths(meta), meta["shapes"], meta["dtypes"], strict=True))
    want = list(zip(paths, shapes, dtypes, strict=True))
    if saved == want:
        return
    hint = (
        "It was written by a run with another model, optimizer or precision; resume with "
        "that run's config (its config.json) or start a new workdir."
    )
    for (sp, ss, sd), (wp, ws, wd) in zip(saved, want, strict=False):
        if (sp, ss, sd) != (wp, ws, wd):
            raise IncompatibleCheckpointError(
                f"Checkpoint {step_dir} does not match this run's train state: it holds {sp} "
                f"{sd}{ss} where this run has {wp} {wd}{ws}. {hint}"
            )
    raise IncompatibleCheckpointError(
        f"Checkpoint {step_dir} holds {len(saved)} arrays, this run's state has {len(want)}. {hint}"
    )


class Checkpointer:
    """Keeps the last ``max_to_keep`` checkpoints of a ``TrainState`` under ``directory``."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        log: Callable[[str], None] = _stderr,
        run_id: str | None = None,
        barrier_prefix: str | None = None,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}.")
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        self.log = log
        self.run_id = run_id  # recorded in every step saved, checked in every step restored
        self._main = jax.process_index() == 0
        self._manager = open_manager(self.directory, writing=True, barrier_prefix=barrier_prefix)
        if self._main:  # what a kill during deletion left
            shutil.rmtree(self.directory / TRASH, ignore_errors=True)
            make_readers_lock(self.directory)
        barrier("layoutlab-open-checkpoints")

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def save(self, step: int, state, extra: dict | None = None) -> Path:
        """Saves ``state`` as ``step`` (synchronously), writes and checks its manifest, and
        only then deletes the steps beyond ``max_to_keep``."""
        leaves, paths, shapes, dtypes = _describe(state)
        impls = {
            p: str(jax.random.key_impl(x)) for p, x in zip(paths, leaves, strict=True) if _is_key(x)
        }
        leaves = [jax.random.key_data(x) if _is_key(x) else x for x in leaves]
        if jax.process_count() == 1:
            # Host copies: the state is replicated, and orbax would otherwise slice every
            # array per replica on device (one small compile per shape). Across processes
            # orbax writes each array's shards from the processes that hold them instead,
            # so no host fetches the whole state.
            leaves = jax.device_get(leaves)
        meta = {"step": step, "paths": paths, "shapes": shapes, "dtypes": dtypes}
        if self.run_id is not None:
            meta["run_id"] = self.run_id
        meta.update(key_impls=impls, extra=extra or {})
        if jax.process_count() == 1:  # what certifies the step if the manifest never comes
            meta["array_crc32s"] = array_crc32s(leaves)
        _save_phase("before_save", step)
        with quiet_orbax_failure():
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave({"leaves": leaves}), meta=ocp.args.JsonSave(meta)
                ),
            )
            self._manager.wait_until_finished()
        _save_phase("after_save", step)
        step_dir = self.step_dir(step)
        if self._main:
            write_manifest(step_dir)
            verify_manifest(step_dir)
        barrier(f"layoutlab-manifest-{step}")
        _save_phase("after_manifest", step)
        self._prune(step)
        return step_dir

    def _prune(self, newest: int) -> None:
        """Deletes the oldest steps beyond ``max_to_keep``; ``newest`` is verified. Process
        0 moves the files; every process then reloads the step list (after a barrier)."""
        if self.max_to_keep is None:
            return
        old = [s for s in self.steps() if s != newest][: -self.max_to_keep + 1 or None]
        if not old:
            return
        if self._main:
            trash = self.directory / TRASH
            trash.mkdir(exist_ok=True)
            with steps_pinned(self.directory, exclusive=True):
                for step in old:
                    os.replace(self.step_dir(step), trash / str(step))  # atomic: gone or whole
                    _save_phase("during_delete", newest)
            shutil.rmtree(trash)
        barrier(f"layoutlab-prune-{newest}")
        self._manager.reload()

    def read_meta(self, step: int) -> dict:
        return read_meta(self._manager, step, self.step_dir(step))

    def restore(self, step: int, target):
        """The state saved at ``step``, shaped, typed and sharded like ``target``.

        ``target`` may be abstract (``jax.ShapeDtypeStruct`` leaves with shardings, e.g. from
        ``jax.eval_shape``), so nothing needs initializing before a restore.
        """
        step_dir = self.step_dir(step)
        verified = has_manifest(step_dir)
        meta = self.read_meta(step)
        check_identity(step_dir, meta, self.run_id)
        leaves, paths, shapes, dtypes = _describe(target)
        _check_compatible(step_dir, meta, paths, shapes, dtypes)
        if not verified:
            if jax.process_count() > 1:  # no process holds every array to check it
                raise CorruptCheckpointError(
                    f"Checkpoint {step_dir} is unfinished: it has no {MANIFEST} (the run was "
                    "killed while saving it)."
                )
            check_stored(self._manager, step, step_dir, meta)
        abstract = [_stored_spec(x) for x in leaves]
        restored = read_leaves(self._manager, step, step_dir, abstract)
        if not verified:
            certify(step_dir, meta, restored)
            if self._main:
                write_manifest(step_dir)
            barrier(f"layoutlab-late-manifest-{step}")
            self.log(
                f"note: checkpoint {step_dir} had no {MANIFEST} (the run was killed right after "
                "saving it); its arrays match the checksums recorded at save time, so it is "
                "used and its manifest written now."
            )
        impls = meta.get("key_impls", {})
        values = [
            jax.random.wrap_key_data(r, impl=impls[p]) if _is_key(x) else r
            for r, x, p in zip(restored, leaves, _saved_paths(meta), strict=True)
        ]
        return jax.tree.unflatten(jax.tree.structure(target), values)

    def quarantine(self, step: int) -> Path:
        """Moves an unusable step out of the way (to ``corrupt/``) so it is not retried."""
        dest = self.directory / QUARANTINE / str(step)
        n = 1
        while dest.exists():
            dest = self.directory / QUARANTINE / f"{step}.{n}"
            n += 1
        if self._main:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with steps_pinned(self.directory, exclusive=True):
                shutil.move(str(self.step_dir(step)), str(dest))
        barrier(f"layoutlab-quarantine-{step}")  # nobody reloads before the move
        self._manager.reload()
        return dest

    def restore_latest(self, target):
        """``(state, step)`` from the newest checkpoint that restores, or ``None`` if none does.

        A corrupt or incomplete newer checkpoint is moved to ``corrupt/`` with a warning and
        the one before it is tried. An incompatible one raises at once: older ones hold the
        same kind of state.
        """
        for step in reversed(self.steps()):
            try:
                state = self.restore(step, target)
            except CorruptCheckpointError as e:
                moved = self.quarantine(step)
                self.log(f"warning: {e} Moved it to {moved}; trying the previous checkpoint.")
                continue
            self._prune(step)  # what a kill before the last deletion left
            return state, step
        return None

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_step(manager, directory: Path, step: int, run_id: str | None):
    step_dir = directory / str(step)
    meta = read_meta(manager, step, step_dir)
    check_identity(step_dir, meta, run_id)
    verified = has_manifest(step_dir)
    if not verified:
        check_stored(manager, step, step_dir, meta)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = [
        jax.ShapeDtypeStruct(tuple(shape), stored_dtype(dtype), sharding=device)
        for shape, dtype in zip(meta["shapes"], meta["dtypes"], strict=True)
    ]
    leaves = [np.asarray(x) for x in read_leaves(manager, step, step_dir, abstract)]
    if not verified:
        certify(step_dir, meta, leaves)
    return dict(zip(_saved_paths(meta), leaves, strict=True)), meta


def read_checkpoint(
    directory: str | os.PathLike,
    step: int | None = None,
    *,
    log: Callable[[str], None] = _stderr,
    run_id: str | None = None,
):
    """``({path: np.ndarray}, meta)`` of a certified checkpoint, without the model that wrote
    it; reads only (a live run's directory included: the step read cannot be pruned meanwhile).

    ``step=None`` reads the newest step that is certified (its manifest checks, or without one
    its arrays match their recorded checksums), saying on ``log`` which newer one it skipped
    and why. A step of another run than ``run_id`` (None: any), or holding another step than
    its directory names, is not certified (``checkpoint_io.check_identity``). Paths are
    ``TrainState`` key paths such as ``".params['classifier']..."``; PRNG keys appear as their
    uint32 key data. Works on any device count: arrays are read onto the first local device.
    """
    directory = Path(directory).absolute()
    if not directory.is_dir():
        raise FileNotFoundError(f"No checkpoint directory {directory}.")
    with steps_pinned(directory, exclusive=False):
        manager = open_manager(directory, writing=False)
        try:
            steps = sorted(manager.all_steps())
            if not steps:
                raise FileNotFoundError(f"No checkpoints in {directory}.")
            if step is not None:
                if step not in steps:
                    raise FileNotFoundError(
                        f"No checkpoint for step {step} in {directory}; have {steps}."
                    )
                return _read_step(manager, directory, step, run_id)
            for candidate in reversed(steps[1:]):
                try:
                    return _read_step(manager, directory, candidate, run_id)
                except CorruptCheckpointError as e:
                    log(f"note: {e} Reading the step before it.")
            return _read_step(manager, directory, steps[0], run_id)
        finally:
            manager.close()


def newest_meta(
    directory: str | os.PathLike, run_id: str | None = None
) -> tuple[dict, Path] | None:
    """``(meta, step_dir)`` of the newest step under ``directory`` whose meta reads (its
    manifest checked where it has one) and that is run ``run_id``'s own step
    (``check_identity``), or None; reads only, moves nothing."""
    directory = Path(directory).absolute()
    if not directory.is_dir():
        return None
    with steps_pinned(directory, exclusive=False):
        manager = open_manager(directory, writing=False)
        try:
            for step in sorted(manager.all_steps(), reverse=True):
                step_dir = directory / str(step)
                try:
                    meta = read_meta(manager, step, step_dir)
                    check_identity(step_dir, meta, run_id)
                    return meta, step_dir
                except CorruptCheckpointError:
                    continue
        finally:
            manager.close()
    return None
