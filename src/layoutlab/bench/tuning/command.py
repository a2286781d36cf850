"""``layoutlab autotune layout`` (the fastest layout and precision for one input shape) and
``layoutlab autotune convs`` (each conv's fastest algorithm, as a conv plan).

The old spellings stay for one release and say so on stderr: ``layoutlab conv-autotune``
(now ``autotune convs``), ``layoutlab autotune --model ...`` without a subcommand (now
``autotune layout``), ``autotune layout --cache-dir DIR`` (now ``--cache FILE``) and
``--input-shape HxWxC`` (now ``--image-size HxW --channels C``).
"""

from __future__ import annotations

import argparse
import json
import sys

from layoutlab.arguments import (
    MODES,
    add_deprecated_flag,
    add_image_size,
    add_json,
    add_model_options,
    deprecated,
    output_file,
    parse_comma_list,
    parse_mode,
    print_error,
    print_progress,
)
from layoutlab.train.run_flags import REQUIRED, add_run_flags, run_config

__all__ = ["autotune_input_shape", "legacy_argv", "register"]

_SUBCOMMANDS = ("layout", "convs")
# autotune layout measures layouts and precisions itself, each with its own conv settings.
_NOT_LAYOUT = (
    "layout",
    "precision",
    "conv_algo",
    "kernel_storage",
    "activation_storage",
    "layer_impl",
    "xla_option",
    "cpu_fast",
)


def _deprecated(old: str, new: str) -> None:
    print(f"warning: `{old}` is deprecated; use `{new}` (same options).", file=sys.stderr)


def _objective(text: str) -> str:
    """The old ``--objective train|inference``: warns, then means ``--mode train|infer``."""
    deprecated(f"--objective {text}", "--mode train|infer")
    return parse_mode("infer" if text.strip().lower() == "inference" else text)


def legacy_argv(argv: list[str]) -> list[str]:
    """``autotune --model ...`` (no subcommand) -> ``autotune layout --model ...``, with the
    deprecation warning on stderr; every other command line is returned as it is."""
    if argv[:1] == ["autotune"] and len(argv) > 1:
        if argv[1] not in (*_SUBCOMMANDS, "-h", "--help"):
            _deprecated("layoutlab autotune --model ...", "layoutlab autotune layout --model ...")
            return ["autotune", "layout", *argv[1:]]
    return argv


def autotune_input_shape(args: argparse.Namespace) -> tuple[int, ...] | str:
    """``--image-size`` and ``--channels`` -> ``(*spatial, channels)``, the model's default
    input for what is not given; the deprecated ``--input-shape HxWxC`` as it was given."""
    if args.input_shape is not None:
        if args.image_size is not None or args.channels is not None:
            raise ValueError(
                "--input-shape is the old spelling of --image-size with --channels; give only "
                "--image-size and --channels."
            )
        return args.input_shape
    if args.channels is not None and args.channels < 1:
        raise ValueError(f"--channels must be >= 1, got {args.channels}.")
    from layoutlab.bench.sweep_config import resolve_input

    run = run_config(args)
    return resolve_input(run.model, dict(run.model_kwargs), args.image_size, args.channels)[0]


def run_layout(args: argparse.Namespace) -> int:
    from layoutlab.bench.tuning.layout import autotune

    if args.cache_dir:
        _deprecated("autotune --cache-dir DIR", "autotune layout --cache DIR/autotune.json")
    try:
        run = run_config(args)
        result = autotune(
            run.model,
            run.batch_size,
            autotune_input_shape(args),
            candidates=args.candidates,
            backend=args.backend,
            cache=args.cache,
            cache_dir=args.cache_dir,
            force=args.force,
            mode=args.mode,
            model_kwargs=dict(run.model_kwargs),
            num_classes=args.num_classes,
            repeats=args.repeats,
            warmup=args.warmup,
            log=print_progress,
        )
    except (ValueError, RuntimeError) as err:
        print_error(str(err))
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return 0
    source = "cache" if result.from_cache else "measured"
    verdict = result.evidence.get("verdict")
    why = f"{verdict}; " if verdict else ""
    print(f"{result.layout} {result.precision} ({why}{source}; {result.cache_path})")
    return 0


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = parse_comma_list(text)
    if not names:
        raise ValueError(f"--algorithms {text!r} names no algorithm; give some, e.g. xla,im2col.")
    return names


def run_convs(args: argparse.Namespace) -> int:
    from layoutlab.bench.tuning.registry_model import autotune_registry_model
    from layoutlab.fast_defaults import resolve_activation_storage, resolve_kernel_storage
    from layoutlab.train.fast_config import compile_options

    try:
        if args.out:  # before the tuning, whose plan would be lost at the end
            output_file(args.out)
        shape = autotune_input_shape(args)
        run = run_config(args)
        # the deprecated --input-shape text gives no size to read
        example = None if isinstance(shape, str) else shape
        options = compile_options(
            run, args.mode, backend=args.backend, batch=run.batch_size, input_shape=example
        )
        tuning = autotune_registry_model(
            run.model,
            run.batch_size,
            shape,
            layout=run.layout,
            precision=run.precision,
            objective="train" if args.mode == "train" else "inference",
            kernel_storage=resolve_kernel_storage(run.kernel_storage, args.backend),
            activation_storage=resolve_activation_storage(run.activation_storage, args.backend),
            compiler_options=options,
            model_kwargs=dict(run.model_kwargs),
            num_classes=args.num_classes,
            backend=args.backend,
            repeats=args.repeats,
            cache=args.cache,
            refresh=args.force,
            algorithms=_names(args.algorithms),
        )
        written = tuning.plan.save(args.out) if args.out else None
    except (ValueError, RuntimeError, OSError) as err:
        print_error(str(err))
        return 2
    if args.json:
        results = [r.to_dict() for r in tuning.results]
        print(json.dumps({"plan": tuning.plan.to_dict(), "results": results}, indent=1))
        return 0
    for r in tuning.results:
        print(r.table())
    cached = sum(r.from_cache for r in tuning.results)
    print(f"\n{len(tuning.results)} conv shapes ({cached} from the cache)")
    if written is not None:
        print(f"wrote the conv plan ({len(tuning.plan)} convs) to {written}")
    return 0


def _run_conv_autotune(args: argparse.Namespace) -> int:
    _deprecated("layoutlab conv-autotune", "layoutlab autotune convs")
    return run_convs(args)


def _add_input_args(p: argparse.ArgumentParser) -> None:
    add_image_size(p, "input spatial size; N: every spatial axis (default: the model's)")
    p.add_argument("--channels", type=int, help="input channels (default: the model's)")
    add_deprecated_flag(p, "--input-shape", "--image-size HxW --channels C", dest="input_shape")


def _add_layout_args(a: argparse.ArgumentParser) -> None:
    add_run_flags(a, {"model": REQUIRED, "batch_size": REQUIRED}, omit=_NOT_LAYOUT)
    add_model_options(a)
    _add_input_args(a)
    a.add_argument("--candidates", help="e.g. NHWC:fp32,NCHW:mixed_bf16 (default: 2x2 grid)")
    a.add_argument("--mode", type=parse_mode, choices=MODES, default="train",
                   help="train (default): time the train step; infer: the forward")  # fmt: skip
    a.add_argument("--repeats", type=int, default=8, help="interleaved rounds (>= 6 to decide)")
    a.add_argument("--warmup", type=int, default=1, help="unmeasured steps after compiling (1)")
    a.add_argument("--cache", help="autotune cache file (default: $LAYOUTLAB_AUTOTUNE_CACHE or "
                   "~/.cache/layoutlab/autotune.json)")  # fmt: skip
    a.add_argument("--cache-dir", help=argparse.SUPPRESS)  # deprecated: a dir for autotune.json
    a.add_argument("--force", action="store_true", help="measure again, ignoring the cache")
    add_json(a, "the full result")
    a.set_defaults(func=run_layout)


def _add_convs_args(c: argparse.ArgumentParser, func) -> None:
    defaults = {
        "model": REQUIRED,
        "batch_size": REQUIRED,
        "layout": "NHWC",
        "precision": "fp32",
        "kernel_storage": "auto",
        "activation_storage": "auto",
        "cpu_fast": True,
    }
    add_run_flags(
        c, defaults, omit=("conv_algo", "layer_impl"), notes={"xla_option": "of the tuned steps"}
    )
    add_model_options(c)
    _add_input_args(c)
    c.add_argument("--mode", type=parse_mode, choices=MODES, default="train",
                   help="train: forward and backward of each conv; infer: forward")  # fmt: skip
    c.add_argument("--objective", type=_objective, dest="mode", help=argparse.SUPPRESS)
    c.add_argument("--repeats", type=int, default=8,
                   help="interleaved rounds per shape (>= 6 to decide)")  # fmt: skip
    c.add_argument("--algorithms", metavar="NAME,NAME",
                   help="the candidates, e.g. xla,im2col (default: every algorithm that applies "
                   "to a shape); keep xla, the baseline a choice must beat")  # fmt: skip
    c.add_argument("--cache", help="autotune cache file (default: $LAYOUTLAB_AUTOTUNE_CACHE or "
                   "~/.cache/layoutlab/autotune.json)")  # fmt: skip
    c.add_argument("--force", action="store_true", help="measure again, ignoring the cache")
    c.add_argument("--out", metavar="PLAN.json", help="write the conv plan (JSON) here")
    add_json(c, "the plan and every result")
    c.set_defaults(func=func)


def register(subparsers) -> None:
    top = subparsers.add_parser(
        "autotune",
        help="pick the fastest layout/precision (`autotune layout`) or conv algorithms "
        "(`autotune convs`), cached",
        description="Measure candidates, keep the fastest whose numerics pass, cache the choice "
        "with its evidence in one file ($LAYOUTLAB_AUTOTUNE_CACHE or "
        "~/.cache/layoutlab/autotune.json); later calls read the cache.",
    )
    which = top.add_subparsers(dest="autotune_what", metavar="WHAT", required=True)
    _add_layout_args(
        which.add_parser(
            "layout",
            help="the fastest layout and precision for one input shape",
            description=(
                "Measure each LAYOUT:PRECISION candidate for this model, batch size, input "
                "shape and backend, keep the fastest whose logits match fp32 NHWC within a "
                "tolerance scaled for its dtype, and cache the choice."
            ),
        )
    )
    convs_help = (
        "For each conv shape the model runs at this batch size, input shape, layout and "
        "precision: check every conv algorithm's output and gradients against float64 NumPy, "
        "time the passing ones (interleaved), cache the fastest, and print (--out: save) the "
        "conv plan that `inspect --conv-plan` reads and `train --conv-algo auto` records."
    )
    _add_convs_args(
        which.add_parser(
            "convs",
            help="the fastest algorithm of each conv, as a conv plan",
            description=convs_help,
        ),
        run_convs,
    )
    # Deprecated alias, kept for one release (no help line: not listed).
    _add_convs_args(
        subparsers.add_parser("conv-autotune", description=convs_help), _run_conv_autotune
    )
