"""``--keep-host-memory`` of the commands that run steps over and over, where a per-call temp
buffer's page faults add up: the flag, and what the ``layoutlab`` command does with it
before any command starts JAX (``keep_host_memory`` must come first)."""

from __future__ import annotations

import argparse
import sys

__all__ = [
    "KEEP_HOST_MEMORY_COMMANDS",
    "add_keep_host_memory",
    "apply_keep_host_memory",
    "batch_groups",
    "host_memory_arenas",
    "huge_pages_wanted",
]

KEEP_HOST_MEMORY_COMMANDS = ("train", "bench", "autotune convs", "conv-autotune")

# Below this many input pixels per batch the commands keep host memory with per-thread malloc
# arenas, from it up with one arena for every thread. One arena keeps every freed block, however
# large, but every thread then takes its lock, which small steps pay for; per-thread arenas keep
# blocks up to 64 MiB (docs/performance/measurements.md#host-memory). One process cannot have both,
# so a bench sweep across the threshold runs a process per side (bench.host_memory_parts); its
# parent process keeps per-thread arenas, and runs no step.
HOST_MEMORY_MIN_PIXELS = 32 * 32 * 32
# From this many input pixels per batch up, the commands that keep host memory also start with
# transparent huge pages (host.huge_pages): heavy steps from this size ran faster with them, and
# none clearly slower; below it the digits job ran slower
# (docs/performance/measurements.md#huge-pages).
HUGE_PAGES_MIN_PIXELS = 8 * 32 * 32


def _subparser(subparsers, path: str) -> argparse.ArgumentParser:
    """The parser of ``path`` (``"autotune convs"``: a subcommand's subcommand)."""
    names = path.split()
    parser = subparsers.choices[names[0]]
    for name in names[1:]:
        nested = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = nested.choices[name]
    return parser


def add_keep_host_memory(subparsers) -> None:
    """The flag, on each of ``KEEP_HOST_MEMORY_COMMANDS`` among ``subparsers``."""
    for name in KEEP_HOST_MEMORY_COMMANDS:
        _subparser(subparsers, name).add_argument(
            "--keep-host-memory",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="keep freed host memory in the process with one malloc arena for every "
            "thread (glibc malloc settings, see layoutlab.host.keep_host_memory): XLA:CPU "
            "stops page-faulting its temp buffer on every call; process-wide, so PyTorch in "
            "the same process gets it too. Default: on, with per-thread arenas where the flags "
            "show any batch under 32,768 input pixels, else one arena, and from 8,192 pixels "
            "per batch with transparent huge pages (the command starts again with "
            "GLIBC_TUNABLES=glibc.malloc.hugetlb=1; a bench sweep across these sizes runs a "
            "process per setting). --no-keep-host-memory leaves glibc's defaults",
        )


def _shown(args: argparse.Namespace) -> tuple[list[int], int] | None:
    try:
        return _batches_and_pixels(args)
    except ValueError:  # a malformed flag: the command's own checks name it
        return None


def _group(batch: int, pixels: int) -> int:
    """0: per-thread arenas; 1: per-thread arenas and huge pages; 2: one arena and huge
    pages (``HUGE_PAGES_MIN_PIXELS`` is under ``HOST_MEMORY_MIN_PIXELS``)."""
    size = batch * pixels
    return (size >= HUGE_PAGES_MIN_PIXELS) + (size >= HOST_MEMORY_MIN_PIXELS)


def batch_groups(args: argparse.Namespace) -> list[list[tuple[int, int]]] | None:
    """The command's ``(batch, pixels)`` pairs grouped by the host-memory setting each gets
    alone (``_group``), smallest setting first, each group in the order given, empty groups
    left out, when the flags say (else None)."""
    shown = _shown(args)
    if shown is None:
        return None
    batches, pixels = shown
    groups = [[(b, pixels) for b in batches if _group(b, pixels) == g] for g in range(3)]
    return [g for g in groups if g]


def _batches_and_pixels(args: argparse.Namespace) -> tuple[list[int], int] | None:
    """The command's batch sizes and its images' pixels, when the flags say."""
    if args.command == "train":
        from layoutlab.train.launch import batch_input

        shown = batch_input(args)
        return None if shown is None else ([shown[0]], shown[1])
    if args.command == "bench" and args.image_size:
        h, w = (args.image_size * 2)[:2]  # N: N x N
        return list(args.batch_sizes), h * w
    return None


def _keep_host_memory(asked: bool, arenas: str) -> int | None:
    """Keep host memory before anything starts JAX's backend (see keep_host_memory): the
    default of the commands that run steps over and over. Only an explicit
    ``--keep-host-memory`` that comes too late (JAX already started in this process, as
    when ``main`` is called from Python) is an error; the default then changes nothing."""
    from layoutlab.host.memory import HostMemoryError, backend_started, keep_host_memory

    # Per-thread arenas could still be set, but a process that started JAX before the command
    # (``main`` called from a notebook) keeps its malloc as it was unless asked.
    if not asked and backend_started():
        return None
    try:
        state = keep_host_memory(arenas)
    except HostMemoryError as e:
        if not asked:
            return None
        print(f"error: {e}", file=sys.stderr)
        return 2
    if asked and not state.kept:
        print(f"note: --keep-host-memory changes nothing here: {state.how}", file=sys.stderr)
    return None


def host_memory_arenas(args: argparse.Namespace) -> str | None:
    """The ``keep_host_memory`` arenas a parsed command line asks for, None for none:
    ``--keep-host-memory``, one; ``--no-keep-host-memory`` or a command without the flag,
    none. The default, by the batches' input pixels against ``HOST_MEMORY_MIN_PIXELS``:
    per-thread arenas where any batch is under it (a bench sweep across it runs a process per
    setting, ``bench.host_memory_parts``), one arena where none is or the flags do not show
    the batches."""
    keep = getattr(args, "keep_host_memory", False)
    if keep is not None:
        return "one" if keep else None
    groups = batch_groups(args)  # smallest setting first
    return "per_thread" if groups and _group(*groups[0][0]) < 2 else "one"


def huge_pages_wanted(args: argparse.Namespace) -> bool:
    """Whether a parsed command line keeps host memory (``host_memory_arenas``) and shows
    only batches of at least ``HUGE_PAGES_MIN_PIXELS`` input pixels, which then come with
    transparent huge pages (``host.huge_pages``). Batches the flags do not show get none (no
    evidence), nor does ``--no-keep-host-memory`` or a command without the flag. A bench
    sweep with batches on both sides runs a process per group (``batch_groups``), each of
    which decides for itself."""
    if getattr(args, "keep_host_memory", False) is False:
        return False
    groups = batch_groups(args)
    return groups is not None and _group(*groups[0][0]) >= 1


def apply_keep_host_memory(args: argparse.Namespace) -> int | None:
    """The flag of a parsed command line, applied (``host_memory_arenas``): an exit status
    where it failed, else None."""
    arenas = host_memory_arenas(args)
    if arenas is None:
        return None
    return _keep_host_memory(asked=args.keep_host_memory is True, arenas=arenas)
