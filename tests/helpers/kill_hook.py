"""Crash tests' kill at a phase of a checkpoint save: ``install("POINT@STEP")`` makes this
process SIGKILL itself at phase ``POINT`` (``train.checkpoint.SAVE_PHASES``) of the save of
step ``STEP`` (any step without ``@STEP``), through ``checkpoint.set_save_phase_hook``.

A process the test does not run itself (a ``layoutlab`` command and the trainer child it
starts) gets it from its environment: ``environ(spec)`` names the spec in ``KILL_ENV`` and
puts ``kill_hook_site/`` on ``PYTHONPATH``, whose ``sitecustomize`` installs it at start. The
variable is the tests' own: the library reads no environment for it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
from pathlib import Path

__all__ = ["KILL_ENV", "environ", "install", "install_code", "kill_at"]

KILL_ENV = "LAYOUTLAB_TEST_CHECKPOINT_KILL"
HERE = Path(__file__).resolve().parent
CHECKPOINT = "layoutlab.train.checkpoint"


def kill_at(spec: str):
    """The hook that SIGKILLs this process at ``spec`` (``"POINT"`` or ``"POINT@STEP"``)."""
    point, _, at = spec.partition("@")

    def hook(phase: str, step: int) -> None:
        if phase == point and (not at or int(at) == step):
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Installs the hook as the checkpoint module is first imported, so a process that has
    not imported it (nor JAX) yet is not made to at start."""

    def __init__(self, spec: str):
        self.spec = spec

    def find_spec(self, name, path, target=None):
        if name != CHECKPOINT:
            return None
        sys.meta_path.remove(self)
        found = importlib.util.find_spec(name)
        run = found.loader.exec_module

        def exec_module(module):
            run(module)
            module.set_save_phase_hook(kill_at(self.spec))

        found.loader.exec_module = exec_module
        return found


def install(spec: str) -> None:
    """Kills this process at ``spec`` from now on (now, or once the checkpoint module loads)."""
    if CHECKPOINT in sys.modules:
        sys.modules[CHECKPOINT].set_save_phase_hook(kill_at(spec))
    else:
        sys.meta_path.insert(0, _InstallOnImport(spec))


def install_code(spec: str) -> str:
    """Python source that does ``install(spec)``, for code a test runs in another process."""
    return (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import kill_hook; "
        f"kill_hook.install({spec!r}); sys.path.remove({str(HERE)!r})\n"
    )


def environ(spec: str, env: dict | None = None) -> dict:
    """``env`` (default: this process's) for a command that kills itself at ``spec``."""
    env = dict(os.environ if env is None else env)
    path = [str(HERE / "kill_hook_site"), *filter(None, [env.get("PYTHONPATH")])]
    return {**env, KILL_ENV: spec, "PYTHONPATH": os.pathsep.join(path)}
