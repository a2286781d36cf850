"""Compiling a run's programs with its ``xla_options``, a rejected option named plainly."""

from __future__ import annotations

import jax

__all__ = ["compile_with_options"]


def _xla_option_error(err: Exception, options: dict) -> ValueError | None:
    """A ``ValueError`` naming ``options`` when XLA rejected one of them, else None."""
    msg = str(err)
    if not options or ("No such compile option" not in msg and "While setting option" not in msg):
        return None
    first = msg.strip().splitlines()[0]
    return ValueError(
        f"XLA rejected xla_options {options}: {first} (fix or drop the option: "
        "--xla-option NAME=VALUE, or xla_options in config.json)"
    )


def compile_with_options(lowered, options: dict, compiler_options: dict | None = None):
    """``lowered.compile(compiler_options)`` with a rejected XLA option turned into a
    ``ValueError`` naming the run's ``options`` instead of a runtime error."""
    try:
        return lowered.compile(compiler_options)
    except (jax.errors.JaxRuntimeError, ValueError) as err:
        clear = _xla_option_error(err, options)
        if clear is None:
            raise
        raise clear from None
