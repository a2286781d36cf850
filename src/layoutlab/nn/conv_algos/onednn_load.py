"""Loading the optional extension ``layoutlab._onednn`` (``native/``) and registering its FFI
handlers with XLA.

Nothing loads at ``import layoutlab``: the first ``load()`` (a conv's ``supports`` at trace
time, or a status line) does it once. ``libdnnl.so.3`` comes from the ``onednn-cpu-gomp``
wheel, which installs it as data outside site-packages, so it is loaded by absolute path with
``RTLD_GLOBAL`` before the extension, which was linked against it without an rpath. Any
failure (no wheel, another architecture, a build that left the extension out) becomes the
reason ``unavailable_reason()`` returns, never a traceback; the convs then run XLA's.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import os
import threading
from types import ModuleType

__all__ = [
    "NORM_TARGETS",
    "PACK_TARGETS",
    "POOL_TARGETS",
    "TARGET_PREFIX",
    "TARGETS",
    "WAIT_POLICY",
    "available",
    "impl_info",
    "load",
    "onednn_version",
    "register_targets",
    "status_line",
    "unavailable_reason",
    "wait_policy",
]

# Every custom-call target this algorithm lowers to starts with this prefix.
TARGET_PREFIX = "layoutlab_onednn_"
# The extension's handler names -> their custom-call targets.
TARGETS = {
    "fwd": TARGET_PREFIX + "conv_fwd",
    "bwd_data": TARGET_PREFIX + "conv_bwd_data",
    "bwd_weights": TARGET_PREFIX + "conv_bwd_weights",
}
# The batch-normalization handlers' (``nn.norm_onednn``), named so that
# ``xla.hlo_extract.onednn_kind`` tells them from the convs'.
NORM_TARGETS = {
    "norm_fwd": TARGET_PREFIX + "batch_norm",
    "norm_bwd": TARGET_PREFIX + "batch_norm_grad",
}
# The max-pooling handlers' (``nn.pool_onednn``).
POOL_TARGETS = {
    "pool_fwd": TARGET_PREFIX + "max_pool",
    "pool_bwd": TARGET_PREFIX + "max_pool_grad",
}
# The packed-kernel inference handlers' (``onednn_packed``).
PACK_TARGETS = {
    "conv_pack": TARGET_PREFIX + "conv_pack",
    "fwd_packed": TARGET_PREFIX + "conv_fwd_packed",
}
_LIBRARY = "libdnnl.so.3"
_DIST = "onednn-cpu-gomp"

_lock = threading.Lock()
_state: dict[str, object] = {}


def library_path() -> str:
    """The absolute path of ``libdnnl.so.3`` from the ``onednn-cpu-gomp`` wheel's files."""
    try:
        files = importlib.metadata.files(_DIST) or ()
    except importlib.metadata.PackageNotFoundError:
        raise OSError(f"the {_DIST} wheel is not installed") from None
    for f in files:
        if f.name == _LIBRARY:
            path = os.path.normpath(os.path.abspath(str(f.locate())))
            if os.path.isfile(path):
                return path
    raise OSError(f"the {_DIST} wheel lists no {_LIBRARY}")


# OpenMP's wait policy for oneDNN's threads, unless the environment sets one. libgomp reads it
# once, when it is loaded (with libdnnl, here), so it is set around that load only. With
# libgomp's default, threads that finish a parallel region spin before sleeping, and on a
# busy 2-core Zen 4 a 3x3 conv (N1 32x32x64) then ran 10-40 ms instead of 0.7-2.5 ms with
# PASSIVE, against XLA's 1-4 ms in the same runs: a spinning thread holds the core that
# XLA's threads, or the other oneDNN thread, need. There is one libgomp per process: PyTorch's
# wheel ships its own under the same soname, so whichever of the two loads first decides the
# policy for both, and where an OpenMP runtime is already loaded nothing is set here.
WAIT_POLICY = "PASSIVE"


def _openmp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


def _load_library(path: str) -> str:
    """Load ``path``; returns where OpenMP's wait policy came from (for ``wait_policy``)."""
    if "OMP_WAIT_POLICY" in os.environ:
        source = f"{os.environ['OMP_WAIT_POLICY']} (OMP_WAIT_POLICY)"
    elif _openmp_loaded():
        source = "the OpenMP runtime loaded before layoutlab's (e.g. PyTorch's)"
    else:
        source = f"{WAIT_POLICY} (set by layoutlab)"
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        finally:
            del os.environ["OMP_WAIT_POLICY"]
        return source
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return source


def wait_policy() -> str | None:
    """OpenMP's wait policy for oneDNN's threads and where it came from, once loaded."""
    load()
    return _state.get("wait_policy")  # type: ignore[return-value]


def _load_extension() -> ModuleType:
    _state["wait_policy"] = _load_library(library_path())
    try:
        module = importlib.import_module("layoutlab._onednn")
    except ImportError as err:
        why = f"the layoutlab._onednn extension was not built or does not load ({err})"
        raise OSError(why) from err
    return module


def register_targets() -> None:
    """Register the handlers with XLA (once), where the extension loaded. Apart from ``load``
    so that a status line (``layoutlab --version``) loads the extension without JAX."""
    module = load()
    with _lock:
        if module is None or _state.get("registered"):
            return
        import jax

        targets = {**TARGETS, **NORM_TARGETS, **POOL_TARGETS, **PACK_TARGETS}
        for name, capsule in module.handlers().items():
            jax.ffi.register_ffi_target(targets[name], capsule, platform="cpu")
        _state["registered"] = True


def load() -> ModuleType | None:
    """The extension, loaded and its handlers registered on the first call; None (and the
    reason recorded) when it cannot be."""
    with _lock:
        if "module" not in _state:
            try:
                _state["module"], _state["reason"] = _load_extension(), None
            except Exception as err:  # noqa: BLE001 - any failure means XLA's convs run
                _state["module"], _state["reason"] = None, str(err) or type(err).__name__
    return _state["module"]  # type: ignore[return-value]


def available() -> bool:
    return load() is not None


def unavailable_reason() -> str | None:
    """Why the oneDNN convs cannot run here, or None when they can."""
    load()
    return _state["reason"]  # type: ignore[return-value]


def onednn_version() -> str | None:
    """oneDNN's version, e.g. ``"3.2.0"``, or None when the extension is unavailable."""
    module = load()
    return None if module is None else ".".join(str(v) for v in module.version()[:3])


def status_line() -> str:
    """One line for ``--version`` and reports: which convs the ``onednn`` algorithm runs."""
    version = onednn_version()
    if version is not None:
        return f"onednn convs: oneDNN {version}"
    return f"onednn convs: unavailable ({unavailable_reason()}); XLA's convs run"


_impl_cache: dict[tuple[int, ...], tuple[str, bool, int, int] | str] = {}


def impl_info(params: tuple[int, ...]) -> tuple[str, bool, int, int] | str:
    """``(oneDNN implementation, kernel reordered, scratchpad bytes, reordered kernel bytes)``
    of the primitive for
    ``params`` (the extension's parameter tuple), or the error text when oneDNN has none.
    Creating the descriptor also creates and caches the primitive the handler will run."""
    if params not in _impl_cache:
        module = load()
        if module is None:
            return str(unavailable_reason())
        try:
            _impl_cache[params] = tuple(module.impl_info(params))
        except (RuntimeError, ValueError) as err:
            _impl_cache[params] = str(err)
    return _impl_cache[params]


def reset_for_tests() -> None:
    """Forget the loaded state, so a test can load again (e.g. with the library hidden)."""
    with _lock:
        _state.clear()
        _impl_cache.clear()
