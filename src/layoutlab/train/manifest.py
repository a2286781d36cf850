"""A checkpoint step's integrity records, and the checkpoint errors.

``layoutlab_manifest.json`` holds the size and CRC-32 of every file orbax wrote for a step.
It is written once orbax's save has committed and its files are synced to disk (so it never
certifies bytes still in the page cache), and it is checked before orbax reads the step, so
files that were later truncated or altered are named instead of half-read. A manifest that
lists no file of the ``state`` or ``meta`` item certifies nothing and is invalid.

orbax itself records no checksum of the array bytes (zarr3's crc32c covers only a shard's
index), so the step's ``meta`` also carries ``array_crc32s`` of the arrays as they were handed
to orbax: a step whose manifest was never written (a kill between the two) is certified by
reading its arrays back and comparing.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "CorruptCheckpointError",
    "ForeignCheckpointError",
    "IncompatibleCheckpointError",
    "array_crc32s",
    "has_manifest",
    "verify_manifest",
    "write_manifest",
]

MANIFEST = "layoutlab_manifest.json"
_TMP = MANIFEST + ".tmp"
_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint cannot be restored."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are missing, truncated or altered, or its save never finished."""


class ForeignCheckpointError(CorruptCheckpointError):
    """A certified step that is not this run's, or not the step its directory names: it is
    used as an uncertified step is (never; the step before it when the newest is asked)."""


class IncompatibleCheckpointError(CheckpointError):
    """A checkpoint holds a different state (another model, optimizer or precision)."""


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name not in (MANIFEST, _TMP))


def array_crc32s(arrays) -> list[int]:
    """CRC-32 of each host array's bytes (C order), as stored in a step's meta."""
    out = []
    for x in arrays:
        flat = np.ascontiguousarray(np.asarray(x)).reshape(-1)
        out.append(zlib.crc32(flat.view(np.uint8)))
    return out


def has_manifest(step_dir: Path) -> bool:
    return (step_dir / MANIFEST).is_file()


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory; the files themselves were synced
    finally:
        os.close(fd)


def write_manifest(step_dir: Path) -> None:
    """Syncs the step's files to disk, then records their sizes and CRCs (synced too)."""
    paths = _files(step_dir)
    for p in paths:
        _sync(p)
    for d in {p.parent for p in paths} | {step_dir}:
        _sync(d)
    files = {
        str(p.relative_to(step_dir)): {"size": p.stat().st_size, "crc32": _crc32(p)} for p in paths
    }
    tmp = step_dir / _TMP
    with open(tmp, "w") as f:
        f.write(json.dumps({"files": files}, indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MANIFEST)
    _sync(step_dir)


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
        items = {str(name).split("/")[0] for name in files}
        for want in files.values():
            int(want["size"]), int(want["crc32"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpointError(f"Checkpoint {step_dir}: unreadable {MANIFEST} ({e}).") from e
    if not {"state", "meta"} <= items:
        raise CorruptCheckpointError(
            f"Checkpoint {step_dir}: its {MANIFEST} lists no file of "
            f"{sorted({'state', 'meta'} - items)}, so it certifies nothing."
        )
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
