"""What a benchmark ran on: CPU, device, core counts, library versions, machine load."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

__all__ = [
    "cpu_id",
    "cpu_model",
    "finish_machine_info",
    "library_versions",
    "machine_fingerprint",
    "machine_info",
]

# The CPU features that change which code XLA and oneDNN run (and so which choice wins).
_FEATURE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "fma")

_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "numpy", "torch")


def _processor_fields(text: str) -> dict[str, str]:
    """The first processor's block of a /proc/cpuinfo text, field name -> value."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() and fields:  # the first processor's block is enough
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """This machine's first processor in /proc/cpuinfo ({} where there is none), read once:
    the autotune cache builds a fingerprint for every conv it looks up, and the CPU does not
    change under a running process."""
    try:
        return _processor_fields(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_id(text: str | None = None) -> str | None:
    """``vendor/family/model`` of the first processor in /proc/cpuinfo (or ``text``), e.g.
    ``"AuthenticAMD/25/17"``; None where those fields are missing (not x86, not Linux). A
    model name such as "AMD EPYC" covers generations whose convs run at different speeds
    (first-generation Zen with AVX2, Zen 4 with AVX-512); these numbers tell them apart."""
    fields = _cpuinfo() if text is None else _processor_fields(text)
    try:
        return f"{fields['vendor_id']}/{fields['cpu family']}/{fields['model']}"
    except KeyError:
        return None


def _cpu_flags() -> list[str]:
    have = set(_cpuinfo().get("flags", "").split())
    return [f for f in _FEATURE_FLAGS if f in have]


def machine_fingerprint() -> str:
    """What a timing-based choice depends on besides the software: CPU model (its name and,
    where known, vendor, family and model numbers), usable cores and the vector features
    present. An autotune cache entry made under another fingerprint is not reused (the
    choice is measured again)."""
    ident = cpu_id()
    name = cpu_model() + (f" ({ident})" if ident else "")
    return f"{name}|cores={_usable_cores()}|{'+'.join(_cpu_flags()) or 'no-flags'}"


def library_versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (torch is not imported for this)."""
    out: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # not on every platform
        return None


def _usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count()


def _torch_threads() -> int | None:
    # Only report it when the run imported torch: importing it here would cost seconds.
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def machine_info(backend=None, *, note: str | None = None) -> dict:
    """A JSON-ready description of this machine and the backend the run used."""
    from layoutlab.fast_defaults import table_cpu_kind
    from layoutlab.host import host_memory_state, huge_pages_state
    from layoutlab.nn.conv_algos.onednn_status import onednn_status
    from layoutlab.xla import resolve_backend

    be = resolve_backend(backend)
    host = host_memory_state()
    return {
        "cpu_model": cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_flags": _cpu_flags(),
        # The kind that keys the shipped conv table (avx2, avx512, avx512_bf16 or other).
        "cpu_kind": table_cpu_kind("cpu"),
        "fingerprint": machine_fingerprint(),
        "cpu_count": os.cpu_count(),
        "usable_cores": _usable_cores(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "backend": be.name,
        "platform": be.platform,
        "device_kind": be.device_kind,
        "device_count": len(be.device.client.local_devices()),
        "versions": library_versions(),
        # Whether the onednn conv algorithm runs here (available, version, reason, line).
        "onednn": onednn_status().to_dict(),
        "torch_threads": _torch_threads(),
        "load_average": _load(),
        # Process-wide malloc settings change every framework's step time in the run.
        "host_memory_kept": host.kept,
        "host_memory": host.how,
        "huge_pages": huge_pages_state().how,
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "note": note,
    }


def finish_machine_info(info: dict) -> dict:
    """Adds what is only known after the run: the load at the end, torch's thread count."""
    out = dict(info)
    out["load_average_end"] = _load()
    out["finished_utc"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if out.get("torch_threads") is None:
        out["torch_threads"] = _torch_threads()
    return out
