"""What must be the same on every process of a multi-process run, resolved into one
fingerprint per process (``run_fingerprint``), which ``train.agreement`` compares: the run's
config, data, versions and code, devices, numerics settings and model state."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import zlib
from pathlib import Path

import numpy as np

__all__ = ["run_fingerprint", "source_digest"]

_PACKAGES = ("jax", "jaxlib", "flax", "optax")


def _versions() -> dict[str, str]:
    from layoutlab.version import __version__

    out = {"python": platform.python_version(), "layoutlab": __version__}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "none"
    return out


def source_digest(root: str | None = None) -> str:
    """A digest of the ``.py`` files under ``root`` (by default the imported layoutlab
    package's directory, read once per process: about 300 small files), their paths and
    contents: two copies of the code under one version string differ here."""
    if root is None:
        return _package_digest()
    digest = hashlib.blake2b(digest_size=8)
    base = Path(root)
    for path in sorted(base.rglob("*.py")):
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.cache
def _package_digest() -> str:
    # The package's folder, found without importing the package (whose exports reach above
    # train/).
    return source_digest(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _numerics() -> dict[str, str]:
    """The process's JAX settings that change a run's numbers without changing its config."""
    import jax

    return {
        "jax_enable_x64": str(bool(jax.config.jax_enable_x64)),
        "jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
    }


def _devices() -> dict[str, str]:
    """This process's devices: a process with another count splits the global batch
    otherwise (and crashes in a reshape), another kind computes otherwise."""
    import jax

    local = jax.local_devices()
    return {
        "devices.local_count": str(len(local)),
        "devices.kind": ", ".join(sorted({d.device_kind for d in local})),
    }


def _data_digest(dataset) -> str:
    """The digest of the files the data was read from (or its data source), which loading it
    computed (``Dataset.fingerprint``, what a resume compares too), so the data is hashed
    once. A data set without one (built in Python): a CRC-32 of the images and labels
    themselves, at about five times blake2b's speed (CIFAR's 737 MB of float32 in about a
    second)."""
    known = dataset.fingerprint or {}
    if "sha256" in known or "source" in known:
        return str(known.get("sha256") or known["source"])
    crc = 0
    for array in (*dataset.split("train"), *dataset.split("test")):
        crc = zlib.crc32(str((array.shape, array.dtype.str)).encode(), crc)
        data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        crc = zlib.crc32(memoryview(data).cast("B"), crc)
    return f"{crc:08x}"


def _key_name(entry) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _state_structure(model) -> dict[str, str]:
    """``{"features.0.kernel": "(3, 3, 1, 8) float32", ...}`` of an abstract model's state."""
    import jax
    from flax import nnx

    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.state(model))
    out = {}
    for path, leaf in leaves:
        names = [_key_name(k) for k in path]
        name = ".".join(names[:-1] if names and names[-1] == "value" else names)
        shape = getattr(leaf, "shape", ())
        out[name] = f"{tuple(shape)} {getattr(leaf, 'dtype', type(leaf).__name__)}"
    return out


def run_fingerprint(spec, dataset, schedule, model) -> dict[str, str]:
    """What must be the same on every process, resolved (``learning_rate`` 0.1 and 1e-1 are
    one value; a data set is its contents, wherever its files lie): field -> value text.
    ``spec``: the run's ``RunSpec``, ``model`` abstract (``nnx.eval_shape``)."""
    import dataclasses

    import jax

    from layoutlab.layout import parse_layout

    fields = {}
    for name, value in spec.config.to_dict().items():
        if name == "data":  # the path may differ between hosts: the contents may not
            continue
        if name == "precision":
            value = str(spec.policy)
        elif name == "layout":
            value = parse_layout(value).name
        fields[name] = json.dumps(value, sort_keys=True)
    summary = dataset.summary()
    for name in ("name", "train_size", "test_size", "image_shape", "num_classes", "class_names"):
        fields[f"data.{name}"] = json.dumps(summary[name])
    fields["data.contents"] = _data_digest(dataset)
    for name, value in dataclasses.asdict(schedule).items():
        fields[f"schedule.{name}"] = str(value)
    for name, value in _versions().items():
        fields[f"versions.{name}"] = value
    fields["versions.layoutlab_source"] = source_digest()
    fields["backend"] = jax.default_backend()
    fields.update(_devices())
    fields.update(_numerics())
    for name, value in _state_structure(model).items():
        fields[f"state.{name}"] = value
    return fields
