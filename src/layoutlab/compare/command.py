"""``layoutlab compare``: check a model's numerics against a reference, for CI gates.

Exit codes: 0 within tolerance, 1 a tolerance exceeded, 2 bad input (one-line error).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from layoutlab.arguments import (
    MODES,
    STDOUT,
    add_image_size,
    add_json,
    add_model_options,
    parse_mode,
)
from layoutlab.nn.conv_names import AUTO
from layoutlab.train.run_flags import REQUIRED, add_run_flags, run_config

__all__ = ["register", "run"]

AGAINST = ("layout", "fp32", "numpy", "torch")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare a model's outputs, layers and gradients against a reference",
        description=(
            "Run a registry model and compare it with a reference holding the same weights: "
            "the other layout, the fp32 policy, a float64 NumPy forward pass or the PyTorch "
            "mirror. Prints the report; exits 0 when within tolerance, 1 when a tolerance is "
            "exceeded, 2 on bad input."
        ),
    )
    # compare runs on jax's default backend, and any classifier size serves a comparison.
    add_run_flags(
        parser,
        {
            "model": REQUIRED,
            "layout": "NHWC",
            "precision": "fp32",
            "batch_size": 8,
            "conv_algo": AUTO,
            "kernel_storage": "auto",
            "activation_storage": "auto",
            "cpu_fast": True,
        },
        omit=("xla_option",),
        notes={
            "precision": "of the model under test",
            "layout": "of the model under test",
            "batch_size": "examples in the input (train-mode BatchNorm over very few values "
            "per channel is ill-conditioned)",
            "conv_algo": "of the model under test; auto: the shipped table's plan, as a short "
            "run of train or bench gets (compare does not autotune)",
            "cpu_fast": "compiles the model under test with the options train and bench use",
        },
    )
    add_model_options(parser, num_classes=10, backend=False)
    parser.add_argument("--against", required=True, choices=AGAINST, help="the reference")
    parser.add_argument("--layerwise", action="store_true", help="compare every layer's output")
    parser.add_argument("--grads", action="store_true", help="compare every parameter gradient")
    parser.add_argument(
        "--mode",
        type=parse_mode,
        choices=MODES,
        default="infer",
        help="infer: running BatchNorm stats; train: batch stats (default infer)",
    )
    parser.add_argument(
        "--torch-weights",
        metavar="FILE.pth",
        default=None,
        help="load these PyTorch weights into the model first",
    )
    add_image_size(
        parser, "input height and width (one number: square; default: the model's default input)"
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and input seed")
    parser.add_argument(
        "--input",
        metavar="X.npy",
        default=None,
        help="compare on this input (a float array in --layout, batch first) instead of a "
        "random one; --batch-size and --image-size are then ignored",
    )
    add_json(parser, "the report, instead of the table,", file=True)
    parser.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance (with --atol; default scales with the dtype)",
    )
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance (with --rtol)")
    parser.set_defaults(func=run)


class _BadInput(ValueError):
    pass


def _tolerance(args):
    from layoutlab.compare.layer_report import LayerTolerance

    if (args.rtol is None) != (args.atol is None):
        given, other = ("--rtol", "--atol") if args.rtol is not None else ("--atol", "--rtol")
        raise _BadInput(
            f"{given} was given without {other}: give both, or neither for the "
            "dtype-scaled defaults."
        )
    if args.rtol is None:
        return None
    for name, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if not (math.isfinite(value) and value >= 0):
            raise _BadInput(f"{name} must be a finite number >= 0, got {value}.")
    return LayerTolerance(args.rtol, args.atol)


def _check_args(args, policy) -> None:
    if args.batch_size < 1:
        raise _BadInput(f"--batch-size must be >= 1, got {args.batch_size}.")
    if args.num_classes < 1:
        raise _BadInput(f"--num-classes must be >= 1, got {args.num_classes}.")
    if args.against == "fp32" and policy.compute_dtype.itemsize == 4 and policy.fp32_ops:
        raise _BadInput(
            f"--against fp32 compares a lower-precision policy with fp32, but --precision "
            f"{args.precision} already computes in float32; pass e.g. --precision mixed_bf16."
        )
    if args.against == "numpy" and args.grads:
        raise _BadInput("--against numpy has no gradients (NumPy has no autodiff); drop --grads.")


def _build(args):
    """``(model, x, model options, conv specs)``: the model under test, built from the
    ``RunSpec`` of the flags (``train.program``: ``create_model``, the torch weights when
    given, then ``configure_model`` with the shipped table's plan for ``auto`` convs, what a
    run too short to pay for a tuning runs; ``xla`` off CPU)."""
    import numpy as np

    from layoutlab import models
    from layoutlab.compare.torch_weights import load_torch_state_dict
    from layoutlab.fast_defaults import default_backend, table_cpu_kind
    from layoutlab.nn.conv_config import check_conv_options, conv_specs, convs, default_conv_plan
    from layoutlab.train.program import configure_model, create_model
    from layoutlab.train.spec import InputSpec, config_for, resolve_spec

    config = run_config(args, config_for(seed=args.seed))
    spec = models.spec(config.model)
    options = dict(config.model_kwargs)
    check_conv_options(config.conv_algorithm)
    layout = models.resolve_layout(config.layout, spec.num_spatial)
    run = resolve_spec(dataclasses.replace(config, model=spec.name, layout=layout.value))
    _check_args(args, run.policy)
    given = None
    if args.input is not None:  # checked before the model is built and initialized
        shape = spec.input_shape(1, layout, tuple(spec.default_input[:-1]))
        given = _read_input(args.input, shape, layout.channel_axis)
    spatial = list(spec.default_input[:-1])
    if args.image_size is not None:
        spatial[-2:] = (args.image_size * 2)[:2]  # N: N x N
    inputs = InputSpec((*spatial, spec.default_input[-1]), args.num_classes, args.batch_size)
    model = create_model(run, inputs)
    if args.torch_weights:
        load_torch_state_dict(model, args.torch_weights)
    shape = spec.input_shape(args.batch_size, layout, tuple(spatial))
    x = np.random.default_rng(args.seed).standard_normal(shape).astype(np.float32)
    if given is not None:
        x = given
    # Traced once: the table's plan and the report's algorithm counts both read them.
    specs = conv_specs(model, x) if convs(model) else {}
    if run.conv_algorithm == AUTO and specs:
        objective = "train" if args.mode == "train" else "inference"
        kind = table_cpu_kind(default_backend())
        run = run.with_plan(default_conv_plan(model, x, objective, kind, specs))
    return configure_model(model, run), x, options, specs, config


def _read_input(path: str, shape: tuple[int, ...], channel_axis: int):
    """The ``--input`` array: ``shape``'s rank and channels (its other sizes are free)."""
    import numpy as np

    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise _BadInput(f"--input {path}: cannot read a .npy array ({err}).") from None
    same_channels = x.ndim == len(shape) and x.shape[channel_axis] == shape[channel_axis]
    if not np.issubdtype(x.dtype, np.floating) or not same_channels:
        raise _BadInput(
            f"--input {path}: a float array shaped like {shape} (batch first, in --layout) "
            f"is needed, got {x.dtype} {x.shape}."
        )
    return x.astype(np.float32)


def _compare(args, config, model, x, options, tolerance):
    from layoutlab.compare import references as refs
    from layoutlab.compare import torch_reference

    kw = dict(
        train=args.mode == "train",
        layerwise=args.layerwise,
        tolerance=tolerance,
        compiler_options=_compiler_options(args, config),
    )
    if args.against == "layout":
        return refs.against_layout(model, x, grads=args.grads, **kw)
    if args.against == "fp32":
        return refs.against_policy(model, x, grads=args.grads, **kw)
    if args.against == "numpy":
        return refs.against_numpy(model, x, **kw)
    return torch_reference.against_torch(
        model,
        x,
        name=args.model,
        model_kwargs={**options, "num_classes": args.num_classes},
        grads=args.grads,
        **kw,
    )


def _compiler_options(args, config) -> dict:
    from layoutlab.models import example_shape
    from layoutlab.train.fast_config import compile_options

    shape = example_shape(config.model, args.image_size)
    return compile_options(config, args.mode, batch=config.batch_size, input_shape=shape)


def _conv_settings(model, specs: dict) -> dict:
    """What the model under test ran with: how many convs ran each algorithm (after the
    plan, and after an algorithm's refusal of a shape), its kernel orders and its activation
    storage. ``specs``: ``conv_specs(model, x)``."""
    from collections import Counter

    from layoutlab.nn.conv_config import convs, running_algorithms
    from layoutlab.nn.convert import activation_storage

    algos = Counter(running_algorithms(model, specs=specs).values())
    kernels = sorted({c.kernel_spec for _, c in convs(model)})
    return {
        "conv_algorithms": dict(sorted(algos.items())),
        "kernel_storage": "/".join(kernels) or "n/a",
        "activation_storage": activation_storage(model),
    }


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def run(args: argparse.Namespace) -> int:
    from layoutlab.compare.torch_weights import StateDictKeyError, StateDictShapeError

    bad_input = (ValueError, FileNotFoundError, ImportError, StateDictKeyError, StateDictShapeError)
    try:
        tolerance = _tolerance(args)
        if args.against == "torch" or args.torch_weights:
            from layoutlab.compare.torch_weights import require_torch

            require_torch()
        model, x, options, specs, config = _build(args)
        report = _compare(args, config, model, x, options, tolerance)
    except bad_input as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    settings = {
        **report.settings,
        "model": args.model,
        "tiny": args.tiny,
        "model_kwargs": options,
        "precision": args.precision,
        "input_shape": list(x.shape),
        "seed": args.seed,
        "conv_algo": args.conv_algo,
        **_conv_settings(model, specs),
    }
    if args.torch_weights:
        settings["torch_weights"] = args.torch_weights
    report = dataclasses.replace(report, settings=settings)
    if args.json == STDOUT:
        print(report.to_json())
        return 0 if report.passed else 1
    print(report)
    if args.json:
        try:
            with open(args.json, "w") as f:
                f.write(report.to_json() + "\n")
        except OSError as err:
            print(f"error: cannot write {args.json}: {_one_line(err)}", file=sys.stderr)
            return 2
    return 0 if report.passed else 1
