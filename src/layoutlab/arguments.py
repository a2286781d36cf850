"""Command-line spellings every ``layoutlab`` command shares, and the old ones they replace.

One vocabulary: ``--mode train|infer``, ``--xla-option NAME=VALUE``, ``--model-arg
NAME=VALUE``, ``--cache FILE`` (the autotune cache), ``--image-size N|HxW|H,W``. An old
spelling keeps working for one release and prints one ``warning:`` line on stderr naming the
new one. Standard library only, so every command module can use it without importing JAX.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

__all__ = [
    "CONV_TUNE_CHOICES",
    "MODES",
    "OneLineParser",
    "STDOUT",
    "UsageError",
    "add_conv_tune",
    "add_deprecated_flag",
    "add_json",
    "add_model_options",
    "deprecated",
    "output_dir",
    "output_file",
    "parse_assignments",
    "parse_comma_list",
    "parse_image_size",
    "parse_mode",
    "parse_model_args",
    "print_error",
    "print_progress",
]

MODES = ("train", "infer")
CONV_TUNE_CHOICES = ("auto", "always", "never")
# Values other commands used for the forward-only mode.
_MODE_ALIASES = {"eval": "infer", "inference": "infer"}


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (unknown flag, missing argument, bad choice) as the one
    ``error:`` line and exit status 2 that every other bad input gets; its subcommand parsers
    are of this class too, as ``add_subparsers`` takes the parent's class."""

    def error(self, message: str):
        self.exit(2, f"error: {' '.join(message.split())} (see '{self.prog} --help')\n")


class UsageError(ValueError):
    """A command-line value that cannot be used."""


def print_error(message: str) -> None:
    """The one ``error:`` line of a command's bad input, on stderr."""
    print(f"error: {message}", file=sys.stderr)


def print_progress(message: str) -> None:
    """A progress line of a long command, on stderr (standard output is for its result)."""
    print(message, file=sys.stderr, flush=True)


def deprecated(old: str, new: str) -> None:
    print(
        f"warning: {old} is deprecated and will be removed in the next release; use {new}.",
        file=sys.stderr,
    )


def add_conv_tune(parser: argparse.ArgumentParser, weighed_against: str) -> None:
    """``--conv-tune``: when the plan of ``auto`` convs may come from a new tuning; the
    tuning's estimated cost is weighed against ``weighed_against`` (help text)."""
    parser.add_argument(
        "--conv-tune",
        choices=CONV_TUNE_CHOICES,
        default="auto",
        help="with auto convs: auto (default) tunes the conv shapes the autotune cache lacks "
        f"only when tuning costs <= 10%% of {weighed_against}; always tunes what the cache "
        "lacks; never takes the shipped table",
    )


def add_image_size(parser: argparse.ArgumentParser, help: str) -> None:
    """``--image-size N|HxW|H,W``, read by ``parse_image_size``."""
    parser.add_argument("--image-size", type=parse_image_size, metavar="N|HxW|H,W", help=help)


def add_model_options(
    parser: argparse.ArgumentParser, *, num_classes: int | None = None, backend: bool = True
) -> None:
    """``--num-classes`` (default ``num_classes``; None: by the stem) and, with ``backend``,
    ``--backend``: what the commands that build one registry model on synthetic input
    (``bench``, ``autotune``, ``compare``) take besides the run's own flags
    (``train.run_flags.add_run_flags``: the model, its layout, precision and conv options)."""
    parser.add_argument(
        "--num-classes",
        type=int,
        default=num_classes,
        help="classifier outputs (default: "
        + (f"{num_classes})" if num_classes else "1000 for an ImageNet stem, else 10)"),
    )
    if backend:
        parser.add_argument("--backend", help="cpu or gpu (default: jax's default backend)")


def _value(text: str) -> bool | int | float | str:
    """``"true"`` -> True, ``"3"`` -> 3, ``"0.5"`` -> 0.5, anything else stays a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_assignments(items: list[str] | None, what: str) -> dict:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``; a malformed item is a ``UsageError``."""
    out = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        name = name.strip().lstrip("-")
        if not eq or not name:
            raise UsageError(f"{what} expects name=value, got {item!r}")
        out[name] = _value(value)
    return out


def parse_comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: a flag's comma-separated names, blanks dropped."""
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_mode(text: str) -> str:
    """``train`` or ``infer``; ``eval`` and ``inference`` still mean ``infer``, with a warning."""
    value = text.strip().lower()
    if value in _MODE_ALIASES:
        deprecated(f"--mode {value}", f"--mode {_MODE_ALIASES[value]}")
        return _MODE_ALIASES[value]
    if value not in MODES:
        raise argparse.ArgumentTypeError(f"choose train or infer, got {text!r}")
    return value


def parse_image_size(text: str) -> tuple[int, ...]:
    """``--image-size`` in every command: ``N`` -> ``(N,)`` (every spatial axis N: a square
    image, a cube for a 3D model), ``HxW`` or ``H,W`` -> ``(H, W)``; sizes are positive."""
    parts = re.split(r"\s*[x,]\s*", text.strip().lower())
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        sizes = ()
    if len(sizes) not in (1, 2) or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected N, HxW or H,W of positive sizes (e.g. 32, 64x48 or 64,48), got {text!r}"
        )
    return sizes


def parse_model_args(items: list[str] | None) -> dict:
    """``--model-arg NAME=VALUE`` items -> model keyword arguments; a value is JSON where it
    parses (``8``, ``0.5``, ``true``, ``[1, 2]``), else the text itself (``stem=cifar``)."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--model-arg {item!r} is not of the form NAME=VALUE (e.g. width=8).")
        try:
            out[name.strip()] = json.loads(value)
        except ValueError:
            out[name.strip()] = value.strip()
    return out


class _DeprecatedFlag(argparse.Action):
    """An old option string that stores into the new option's ``dest``, after a warning."""

    def __init__(self, option_strings, dest, *, new: str, append: bool = False, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.append = new, append

    def __call__(self, parser, namespace, values, option_string=None):
        deprecated(option_string, self.new)
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


STDOUT = "-"


class _JsonFlag(argparse.Action):
    """``--json``: JSON on standard output. Where ``--json FILE`` used to write a file
    (``legacy_file``), that form still does, with a warning naming ``--json-file FILE``."""

    def __init__(self, option_strings, dest, *, legacy_file: bool = False, **kwargs):
        super().__init__(option_strings, dest, nargs="?" if legacy_file else 0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if values in (None, [], STDOUT):
            values = STDOUT
        else:
            deprecated(f"--json {values}", f"--json-file {values}")
        setattr(namespace, self.dest, values)


def add_json(parser: argparse.ArgumentParser, what: str, *, file: bool = False) -> None:
    """One meaning for ``--json`` in every command: print ``what`` as JSON on standard output
    (``args.json == STDOUT``). ``file=True`` adds ``--json-file FILE``, which writes it to
    FILE (``args.json`` is then the path)."""
    # The old `--json FILE` makes the value optional: shown as what it is, a FILE, where
    # argparse would show `--json [JSON]`, a flag that seems to want JSON given to it.
    old = " (--json FILE, which writes FILE, is deprecated: use --json-file FILE)"
    parser.add_argument(
        "--json",
        action=_JsonFlag,
        legacy_file=file,
        default=None,
        metavar="FILE" if file else None,
        help=f"print {what} as JSON on standard output" + (old if file else ""),
    )
    if file:
        parser.add_argument(
            "--json-file", dest="json", metavar="FILE", help=f"write {what} as JSON to FILE"
        )


def add_deprecated_flag(
    parser: argparse.ArgumentParser, old: str, new: str, *, dest: str, append: bool = False
) -> None:
    """``old`` (hidden from ``--help``) does what ``new`` does; ``append`` for repeatable ones."""
    parser.add_argument(
        old, dest=dest, action=_DeprecatedFlag, new=new, append=append, help=argparse.SUPPRESS
    )


def output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The directory ``path`` of a command's ``flag``, created if need be and checked to be
    writable: call it before the work, so that a bad output path fails in a moment instead
    of losing a long run's results at the end. ``ValueError`` names the path and the fix."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out} is a file, not a directory; choose a directory.")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"Cannot create {flag} {out}: {e.strerror or e}.") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"Cannot write into {flag} {out}: permission denied.")
    return out


def output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The file ``path`` of a command's ``flag``, checked before the work: not a directory,
    in an existing directory that can be written. ``ValueError`` names the path and the fix."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {out} is a directory; give a file name.")
    parent = out.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {out}: its directory {parent} does not exist; create it first.")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"Cannot write {flag} {out}: permission denied.")
    return out
