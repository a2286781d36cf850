"""Runs at the start of a test's subprocess (``kill_hook.environ`` puts this folder on
``PYTHONPATH``): installs the kill its environment names (``kill_hook.KILL_ENV``)."""

import importlib.util
import os
from pathlib import Path

__all__ = []

_spec = os.environ.get("LAYOUTLAB_TEST_CHECKPOINT_KILL")
if _spec:
    _where = Path(__file__).resolve().parents[1] / "kill_hook.py"
    _found = importlib.util.spec_from_file_location("kill_hook", _where)
    _module = importlib.util.module_from_spec(_found)
    _found.loader.exec_module(_module)
    _module.install(_spec)
