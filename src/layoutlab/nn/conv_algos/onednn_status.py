"""Whether the ``onednn`` conv algorithm runs here, in one line, never a traceback.

``layoutlab --version`` prints ``onednn_status().line`` and bench's ``machine.json`` records
``onednn_status().to_dict()``. The algorithm's module (``nn.conv_algos.onednn``) says it
itself (``available()``, ``unavailable_reason()``, ``status_line()``); where that module is
missing or raises while it loads (no compiler built the extension, another CPU architecture, a
broken oneDNN wheel), the status says unavailable with that reason, and XLA's convs run.
Nothing is imported until the status is asked for.
"""

from __future__ import annotations

import importlib
import re
from typing import NamedTuple

__all__ = ["MODULE", "OnednnStatus", "onednn_status"]

MODULE = "layoutlab.nn.conv_algos.onednn_load"


class OnednnStatus(NamedTuple):
    available: bool
    version: str | None  # oneDNN's, e.g. "3.2.0", where it is available
    reason: str | None  # why not, where it is not
    line: str  # e.g. "onednn convs: oneDNN 3.2.0"
    # OpenMP's wait policy for oneDNN's threads and where it came from, where it is available:
    # it decides whether those threads spin beside XLA's between calls (``onednn_load``).
    wait_policy: str | None = None

    def to_dict(self) -> dict:
        return self._asdict()


def _load():
    return importlib.import_module(MODULE)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def onednn_status() -> OnednnStatus:
    """What the ``onednn`` algorithm's module says of itself, or unavailable with the error
    that kept it from saying so."""
    try:
        module = _load()
        available = bool(module.available())
        reason = None if available else module.unavailable_reason()
        line = str(module.status_line())
    except Exception as e:  # any failure to load means the same: XLA's convs run
        reason = _first_line(e)
        return OnednnStatus(False, None, reason, f"onednn convs: unavailable ({reason}); "
                            "XLA's convs run")  # fmt: skip
    found = re.search(r"oneDNN v?(\d+(?:\.\d+)*)", line) if available else None
    policy = str(module.wait_policy()) if available else None
    return OnednnStatus(available, found.group(1) if found else None, reason, line, policy)
