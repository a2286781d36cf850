"""What ``layoutlab train`` does between parsing its flags and training, in the order JAX
needs: run as a supervised child when distributed, then pick the backend and join the other
processes before JAX starts. The tuning that ``--autotune`` and ``auto`` convs ask for
lives in ``bench/`` (above ``train/`` in the repository map): the ``layoutlab`` command passes
it to ``train.command.run`` as arguments (``bench.tuning.train_run``).
"""

from __future__ import annotations

import argparse
import sys

__all__ = [
    "batch_input",
    "gpu_platform",
    "join_run",
    "start",
    "supervise_distributed",
    "use_backend",
]


def supervise_distributed(args: argparse.Namespace, argv: list[str]) -> int | None:
    """``train --distributed``: the exit status of the child that trains (JAX's aborts become
    one line, see ``train.supervise``); None where this process is that child, or alone."""
    if not args.distributed:
        return None
    from layoutlab.train.supervise import supervise, supervised

    return None if supervised() else supervise(argv)


def batch_input(args: argparse.Namespace) -> tuple[int, int] | None:
    """The batch size ``train`` runs and its images' pixels, read from the config the flags
    make (``--config`` and ``--set`` included: ``train.command.config_from_flags``) when the
    data's image size is known without loading it; None for ``--resume``, whose config is
    the workdir's (reading it needs JAX, which must not start before the host memory is
    set), or a folder of images."""
    if args.resume:
        return None
    from math import prod

    from layoutlab.data.source_forms import known_image_shape
    from layoutlab.train.command import config_from_flags
    from layoutlab.train.image_size import image_size_value

    config = config_from_flags(args)
    if config.image_size is not None:
        return config.batch_size, prod(image_size_value(config.image_size))
    shape = known_image_shape(config.data)
    return None if shape is None else (config.batch_size, prod(shape[:-1]))


def join_run(args: argparse.Namespace) -> int | None:
    """``train --distributed`` (or any of its launch flags): join before JAX starts."""
    from layoutlab.train.distributed import DistributedError, initialize_distributed

    launch = (args.coordinator, args.num_processes, args.process_id)
    if not args.distributed:
        if any(x is not None for x in launch):
            print("error: --coordinator, --num-processes and --process-id need --distributed.",
                  file=sys.stderr)  # fmt: skip
            return 2
        return None
    try:
        initialize_distributed(*launch, timeout_s=args.distributed_timeout)
    except DistributedError as e:
        from layoutlab.train.liveness import stop_with

        return stop_with(str(e))  # once joined, the process then ends without an abort
    return None


def gpu_platform() -> str:
    """The platform name of the installed GPU plugin (``cuda`` or ``rocm``; ``gpu`` when none
    is), found without starting JAX. ``jax_platforms="gpu"`` expands to cuda, rocm and oneapi
    and fails unless every one of them starts (jax 0.11 with only the CUDA plugin: "Unable to
    initialize backend 'rocm'"), and the distributed join must come before any backend
    starts, so trying one platform after another is not an option."""
    import importlib.metadata
    import pkgutil

    names = [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
    try:
        import jax_plugins

        names += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    except ImportError:
        pass
    for platform in ("cuda", "rocm"):
        if any(platform in name for name in names):
            return platform
    return "gpu"  # none installed: jax's own error for its alias, which use_backend reports


def use_backend(name: str) -> int | None:
    """``train --backend``: the only platform JAX starts in this process (before any other)."""
    import jax

    reason = None
    if name == "gpu" and gpu_platform() == "gpu":
        reason = "jax has no GPU plugin installed"
    else:
        try:
            jax.devices()
        except (RuntimeError, AssertionError) as e:
            # A plugin whose hardware is missing is skipped, and jax then asserts that some
            # backend started (jax 0.10: "assert _default_backend is not None").
            reason = " ".join(str(e).split(". (set JAX_PLATFORMS")[0].split()) or (
                f"jax's {name} plugin found no device"
            )
    if reason is not None:
        hint = "install jax's CUDA build (pip install 'layoutlab[gpu]')" if name == "gpu" else ""
        print(
            f"error: --backend {name} is not available here ({reason}); "
            f"{hint + ', or ' if hint else ''}leave --backend out to use jax's default.",
            file=sys.stderr,
        )
        return 2
    return None


def start(args: argparse.Namespace) -> int | None:
    """Backend, then the distributed join: an exit status where one of them failed, else
    None. ``--autotune`` and the conv planner are the train command's own (``train.command.run``
    takes them as arguments)."""
    if args.backend:  # before the distributed join, which picks collectives per platform
        import jax

        jax.config.update("jax_platforms", gpu_platform() if args.backend == "gpu" else "cpu")
    if (failed := join_run(args)) or (args.backend and (failed := use_backend(args.backend))):
        return failed
    return None
