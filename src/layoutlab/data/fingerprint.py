"""What a data set was read from, so that a resumed run can tell whether it still is.

Every source has a fingerprint (``Dataset.fingerprint``): data read from files (MNIST,
CIFAR, an image folder, the digits file sklearn ships) has the count, total size and SHA-256
of its files' names and bytes, and for a few files each file's own digest, so a change is
named by its file; synthetic data is its data source, from which it is generated. The files are
hashed once, right after they were read (so from the page cache), and the multi-process
agreement compares this digest instead of hashing the arrays again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["files_fingerprint", "source_fingerprint"]

# Up to this many files each get their own digest in the fingerprint (MNIST's 4, CIFAR's 7),
# so a change names the file; an image folder's thousands are summed up in one.
_NAMED_FILES = 16
_CHUNK = 1 << 20


def _digest_file(path: Path, *digests) -> int:
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            size += len(chunk)
            for digest in digests:
                digest.update(chunk)
    return size


def files_fingerprint(root: Path, paths: list[Path]) -> dict:
    """``{"files", "bytes", "sha256"}`` of ``paths`` (named relative to ``root``): any file
    added, removed, renamed or changed gives another digest. With few files, ``"each"`` maps
    every name to its own SHA-256 too."""
    whole = hashlib.sha256()
    total, each = 0, {}
    for path in sorted(paths):
        name = path.relative_to(root).as_posix()
        encoded, size = name.encode(), path.stat().st_size
        whole.update(len(encoded).to_bytes(8, "little") + encoded + size.to_bytes(8, "little"))
        own = hashlib.sha256()
        total += _digest_file(path, whole, own)
        each[name] = own.hexdigest()
    out = {"files": len(paths), "bytes": total, "sha256": whole.hexdigest()}
    if len(paths) <= _NAMED_FILES:
        out["each"] = each
    return out


def source_fingerprint(source: str) -> dict:
    """The fingerprint of generated data: the data source it is generated from (with the
    seed and test fraction). Runs recorded before the rename hold it as ``{"spec": ...}``,
    which ``train.run_data.data_change`` reads as this."""
    return {"source": source}
