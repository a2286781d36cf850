"""Checkpoints of the whole ``TrainState`` with orbax, verified before they are restored.

Layout of ``<dir>/<step>/``: orbax's ``state`` item (the flattened leaves), its ``meta`` item
(JSON: the leaves' tree paths, shapes and dtypes, plus caller data such as the config) and
``layoutlab_manifest.json``: size and CRC-32 of every file orbax wrote, added once the save
has committed. orbax makes a save atomic (it writes a temporary directory and renames it); the
manifest makes a checkpoint whose files were later truncated or altered detectable *before*
orbax reads it. A step without a manifest was interrupted between the two and counts as
incomplete.

PRNG key arrays are stored as their raw ``key_data`` and wrapped again on restore.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
    "read_checkpoint",
]

MANIFEST = "layoutlab_manifest.json"
QUARANTINE = "corrupt"  # unusable checkpoints are moved to <dir>/corrupt/<step>
_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint cannot be restored."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are missing, truncated or altered, or its save never finished."""


class IncompatibleCheckpointError(CheckpointError):
    """A checkpoint holds a different state (another model, optimizer or precision)."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(step_dir: Path) -> None:
    files = {
        str(p.relative_to(step_dir)): {"size": p.stat().st_size, "crc32": _crc32(p)}
        for p in _files(step_dir)
    }
    tmp = step_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"files": files}, indent=1))
    os.replace(tmp, step_dir / MANIFEST)


def verify_manifest(step_dir: Path) -> None:
    """Raises ``CorruptCheckpointError`` naming ``step_dir`` unless every file checks out."""
    manifest = step_dir / MANIFEST
    if not manifest.is_file():
        raise CorruptCheckpointError(
            f"Checkpoint {step_dir} is incomplete: it has no {MANIFEST} (the run was probably "
            "killed while saving it)."
        )
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"Checkpoint {step_dir}: unreadable {MANIFEST} ({e}).") from e
    for name, want in files.items():
        path = step_dir / name
        if not path.is_file():
            raise CorruptCheckpointError(f"Checkpoint {step_dir} is corrupt: {name} is missing.")
        size = path.stat().st_size
        if size != want["size"]:
            raise CorruptCheckpointError(
                f"Checkpoint {step_dir} is corrupt: {name} has {size} bytes, "
                f"{want['size']} were written."
            )
        if _crc32(path) != want["crc32"]:
            raise CorruptCheckpointError(
                f"Checkpoint {step_dir} is corrupt: {name} fails its CRC-32 check."
            )


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


def _stored_dtype(name: str):
    return jnp.uint32 if name.startswith("key<") else jnp.dtype(name)


def _check_compatible(step_dir: Path, meta: dict, paths, shapes, dtypes) -> None:
    saved = list(zip(meta["paths"], meta["shapes"], meta["dtypes"], strict=True))
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


def _options(max_to_keep: int | None, writing: bool = True):
    # Synchronous saves: save() returns once the checkpoint is committed, so the manifest
    # can be written right after, and the next (buffer-donating) step cannot race it.
    # Readers leave the directory alone (orbax's read_only mode logs warnings instead).
    return ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        create=writing,
        enable_async_checkpointing=False,
        cleanup_tmp_directories=writing,
    )


class Checkpointer:
    """Keeps the last ``max_to_keep`` checkpoints of a ``TrainState`` under ``directory``."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        log: Callable[[str], None] = _stderr,
    ):
        self.directory = Path(directory).absolute()
        self.log = log
        self._manager = ocp.CheckpointManager(
            self.directory, options=_options(max_to_keep), item_names=("state", "meta")
        )

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def save(self, step: int, state, extra: dict | None = None) -> Path:
        """Saves ``state`` as ``step`` (synchronously) and writes its manifest."""
        leaves, paths, shapes, dtypes = _describe(state)
        impls = {
            p: str(jax.random.key_impl(x)) for p, x in zip(paths, leaves, strict=True) if _is_key(x)
        }
        # Host copies: the state is replicated, and orbax would otherwise slice every array
        # per replica on device (one small compile per shape).
        leaves = jax.device_get([jax.random.key_data(x) if _is_key(x) else x for x in leaves])
        meta = {"step": step, "paths": paths, "shapes": shapes, "dtypes": dtypes}
        meta.update(key_impls=impls, extra=extra or {})
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"leaves": leaves}), meta=ocp.args.JsonSave(meta)
            ),
        )
        self._manager.wait_until_finished()
        if jax.process_index() == 0:
            write_manifest(self.step_dir(step))
        return self.step_dir(step)

    def read_meta(self, step: int) -> dict:
        step_dir = self.step_dir(step)
        verify_manifest(step_dir)
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
            )
            return dict(restored["meta"])
        except Exception as e:  # orbax raises many types; all mean the same here
            raise CorruptCheckpointError(f"Checkpoint {step_dir} cannot be read: {e}") from e

    def restore(self, step: int, target):
        """The state saved at ``step``, shaped, typed and sharded like ``target``.

        ``target`` may be abstract (``jax.ShapeDtypeStruct`` leaves with shardings, e.g. from
        ``jax.eval_shape``), so nothing needs initializing before a restore.
        """
        step_dir = self.step_dir(step)
        meta = self.read_meta(step)
        leaves, paths, shapes, dtypes = _describe(target)
        _check_compatible(step_dir, meta, paths, shapes, dtypes)
        abstract = [_stored_spec(x) for x in leaves]
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore({"leaves": abstract})),
            )["state"]["leaves"]
        except Exception as e:
            raise CorruptCheckpointError(f"Checkpoint {step_dir} cannot be read: {e}") from e
        impls = meta.get("key_impls", {})
        values = [
            jax.random.wrap_key_data(r, impl=impls[p]) if _is_key(x) else r
            for r, x, p in zip(restored, leaves, paths, strict=True)
        ]
        return jax.tree.unflatten(jax.tree.structure(target), values)

    def quarantine(self, step: int) -> Path:
        """Moves an unusable step out of the way (to ``corrupt/``) so it is not retried."""
        dest = self.directory / QUARANTINE / str(step)
        n = 1
        while dest.exists():
            dest = self.directory / QUARANTINE / f"{step}.{n}"
            n += 1
        if jax.process_index() == 0:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.step_dir(step)), str(dest))
        self._manager.reload()
        return dest

    def restore_latest(self, target):
        """``(state, step)`` from the newest checkpoint that restores, or ``None`` if none exist.

        A corrupt or incomplete newer checkpoint is moved to ``corrupt/`` with a warning and
        the one before it is tried. An incompatible one raises at once: older ones hold the
        same kind of state.
        """
        for step in reversed(self.steps()):
            try:
                return self.restore(step, target), step
            except CorruptCheckpointError as e:
                moved = self.quarantine(step)
                self.log(f"warning: {e} Moved it to {moved}; trying the previous checkpoint.")
        if (self.directory / QUARANTINE).exists() and not self.steps():
            raise CorruptCheckpointError(
                f"No checkpoint under {self.directory} restores (the unusable ones are in "
                f"{self.directory / QUARANTINE}); start a new run without --resume."
            )
        return None

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_checkpoint(directory: str | os.PathLike, step: int | None = None):
    """``({path: np.ndarray}, meta)`` of a verified checkpoint, without the model that wrote it.

    ``step=None`` reads the newest one. Paths are ``TrainState`` key paths such as
    ``".params['classifier']..."``; PRNG keys appear as their uint32 key data. Works on any
    device count: arrays are read onto the first local device.
    """
    directory = Path(directory).absolute()
    if not directory.is_dir():
        raise FileNotFoundError(f"No checkpoint directory {directory}.")
    manager = ocp.CheckpointManager(
        directory, options=_options(None, writing=False), item_names=("state", "meta")
    )
    try:
        steps = sorted(manager.all_steps())
        if not steps:
            raise FileNotFoundError(f"No checkpoints in {directory}.")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise FileNotFoundError(f"No checkpoint for step {step} in {directory}; have {steps}.")
        step_dir = directory / str(step)
        verify_manifest(step_dir)
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        try:
            meta = dict(
                manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            )
            abstract = [
                jax.ShapeDtypeStruct(tuple(shape), _stored_dtype(dtype), sharding=device)
                for shape, dtype in zip(meta["shapes"], meta["dtypes"], strict=True)
            ]
            leaves = manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore({"leaves": abstract})),
            )["state"]["leaves"]
        except Exception as e:
            raise CorruptCheckpointError(f"Checkpoint {step_dir} cannot be read: {e}") from e
    finally:
        manager.close()
    return dict(zip(meta["paths"], (np.asarray(x) for x in leaves), strict=True)), meta
