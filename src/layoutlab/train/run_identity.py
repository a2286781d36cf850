"""What makes a run itself: the id it gets at its first start, and the JAX settings that change
its numbers.

The run id goes into ``config.json`` and into every checkpoint's certified meta; readers
(resume, evaluate, predict, export) use no step whose id is another run's
(``train.checkpoint_io.check_identity``). The JAX settings are recorded when a run starts:
a resume under other values would continue the run with other arithmetic (``JAX_ENABLE_X64=1``
moved a small CNN's parameters by 4.4e-3 in three steps), so ``train.resume`` refuses it.
This module imports JAX only when asked for the settings.
"""

from __future__ import annotations

import uuid

__all__ = ["NUMERICS_FLAGS", "environment_change", "new_run_id", "numerics_environment"]

# JAX configuration options that change the numbers a program computes (not only whether
# it raises: dtype and rank promotion are checks, and are left out).
NUMERICS_FLAGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_default_prng_impl",
    "jax_threefry_partitionable",
)


def new_run_id() -> str:
    """A fresh run id: 32 random hex digits."""
    return uuid.uuid4().hex


def numerics_environment() -> dict:
    """``{flag: value}`` of ``NUMERICS_FLAGS`` in this process, as JSON values."""
    import jax

    out = {}
    for name in NUMERICS_FLAGS:
        value = getattr(jax.config, name, None)
        out[name] = value if value is None or isinstance(value, bool | int) else str(value)
    return out


def _variable(name: str) -> str:
    return name.upper()  # jax reads jax_enable_x64 from JAX_ENABLE_X64


def environment_change(recorded: dict | None, have: dict) -> str | None:
    """None when ``have`` sets every flag ``recorded`` holds alike (or nothing was recorded:
    a run from before), else a sentence naming the first flag that differs and the fix."""
    if not isinstance(recorded, dict):
        return None
    for name, saved in recorded.items():
        now = have.get(name)
        if now != saved:
            return (
                f"{name} is {now!r} in this process but the run was trained with {saved!r}, "
                f"which changes its numbers; resume with the run's value ({_variable(name)} "
                f"in the environment, or jax.config.update({name!r}, {saved!r})), or start a "
                "new workdir."
            )
    return None
