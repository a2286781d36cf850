"""A checkpoint step's integrity record, ``layoutlab_manifest.json``, and the checkpoint errors.

The manifest holds the size and CRC-32 of every file orbax wrote for a step. It is written
once orbax's save has committed and is checked before orbax reads the step, so files that
were later truncated or altered are named instead of half-read.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

__all__ = [
    "MANIFEST",
    "CheckpointError",
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
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


def has_manifest(step_dir: Path) -> bool:
    return (step_dir / MANIFEST).is_file()


def write_manifest(step_dir: Path) -> None:
    files = {
        str(p.relative_to(step_dir)): {"size": p.stat().st_size, "crc32": _crc32(p)}
        for p in _files(step_dir)
    }
    tmp = step_dir / _TMP
    with open(tmp, "w") as f:
        f.write(json.dumps({"files": files}, indent=1))
        f.flush()
        os.fsync(f.fileno())
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
