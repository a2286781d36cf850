"""``layoutlab inspect``: compile a model's forward or training step and show what XLA did.

Examples::

    layoutlab inspect --model resnet18 --layout NCHW --precision mixed_bf16 --mode train
    layoutlab inspect --model resnet18 --tiny --compare-layouts --json out.json
    layoutlab inspect --model resnet18 --layout NCHW --auto-layout --dump-hlo hlo/
    layoutlab inspect --model resnet18 --layout NCHW --kernel-storage channels_last
"""

from __future__ import annotations

import argparse
import sys

from layoutlab.arguments import (
    MODES,
    STDOUT,
    add_deprecated_flag,
    add_image_size,
    add_json,
    parse_mode,
)
from layoutlab.train.run_flags import add_run_flags, run_config

__all__ = ["register", "run"]


def _inspect(args: argparse.Namespace):
    from layoutlab.fast_defaults import (
        resolve_activation_storage,
        resolve_kernel_storage,
    )
    from layoutlab.models import example_shape
    from layoutlab.nn.conv_algos import load_plan
    from layoutlab.train.fast_config import compile_options
    from layoutlab.train.spec import config_for
    from layoutlab.xla.backends import resolve_backend
    from layoutlab.xla.inspect import inspect_model
    from layoutlab.xla.model_layout_comparison import compare_model_layouts

    platform = resolve_backend(args.backend).platform
    run = run_config(args, config_for(args.optimizer))
    shape = example_shape(run.model, args.image_size)
    options = compile_options(
        run, args.mode, backend=platform, batch=run.batch_size, input_shape=shape
    )
    common = dict(
        precision=run.precision,
        mode=args.mode,
        batch_size=run.batch_size,
        image_size=args.image_size,
        backend=args.backend,
        flags=options or None,
        model_kwargs=dict(run.model_kwargs),
        auto_layout=args.auto_layout,
        conv_algorithm=run.conv_algorithm,
        kernel_storage=resolve_kernel_storage(run.kernel_storage, platform),
        activation_storage=resolve_activation_storage(run.activation_storage, platform),
        layer_impl=run.layer_impl,
        conv_plan=load_plan(args.conv_plan) if args.conv_plan else None,
        optimizer=args.optimizer,
        num_steps=args.steps,
    )
    if args.compare_layouts:
        return compare_model_layouts(run.model, **common)
    return inspect_model(run.model, layout=run.layout, **common)


def run(args: argparse.Namespace) -> int:
    """Run ``layoutlab inspect``; bad input prints one ``error: ...`` line and returns 2."""
    from layoutlab.xla.inspection import write_text
    from layoutlab.xla.model_layout_comparison import ModelLayoutComparison

    try:
        if args.compile_cache:
            from layoutlab.xla.cache import enable_compilation_cache

            enable_compilation_cache(args.compile_cache)
        result = _inspect(args)
        items = (
            list(result.inspections.values())
            if isinstance(result, ModelLayoutComparison)
            else [result]
        )
        if args.dump_hlo:
            for ins in items:
                for path in ins.dump_hlo(args.dump_hlo):
                    print(f"wrote {path}", file=sys.stderr)
        if args.json == STDOUT:
            print(result.to_json())
            return 0
        print(result.summary())
        if args.json:
            write_text(args.json, result.to_json() + "\n")
            print(f"wrote {args.json}", file=sys.stderr)
    except (ValueError, OSError) as err:
        message = " ".join(str(err).split())
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="compile a model ahead of time and report what XLA did with layouts and precision",
        description=(
            "Compile a registry model's forward pass (--mode infer) or training step "
            "(--mode train) for a backend without running it, and report per-conv logical "
            "and physical layouts, transposes, copies, converts, fusions, XLA's cost and "
            "memory analyses, and compile time."
        ),
    )
    add_run_flags(
        p,
        {
            "model": "resnet18",
            "layout": "NHWC",
            "precision": "fp32",
            "batch_size": 32,
            "conv_algo": "auto",
            "kernel_storage": "auto",
            "activation_storage": "auto",
            "cpu_fast": True,
        },
        notes={
            "conv_algo": "auto: the --conv-plan's choice, else the shipped table's (inspect "
            "does not autotune)",
            "xla_option": "for this compile",
        },
    )
    add_deprecated_flag(p, "--flag", "--xla-option", dest="xla_option", append=True)
    p.add_argument(
        "--mode",
        type=parse_mode,
        choices=MODES,
        default="infer",
        help="infer (forward) or train (full step)",
    )
    add_image_size(p, "spatial size; N: every spatial axis (default: the model's)")
    p.add_argument("--backend", default="cpu", help="cpu or gpu (default cpu)")
    p.add_argument(
        "--conv-plan",
        metavar="PATH",
        help="conv plan JSON the auto convs run (`layoutlab autotune convs --out PATH`)",
    )
    p.add_argument(
        "--optimizer",
        choices=("train", "pytorch"),
        default="train",
        help="the training step's optimizer: train (default: what `layoutlab train` runs for "
        "these flags, AdamW) or pytorch (SGD with momentum 0.9, as bench's PyTorch rows)",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="optimizer steps the learning-rate schedule spans, as train --steps (default 1000)",
    )
    p.add_argument(
        "--compare-layouts", action="store_true", help="compile NHWC and NCHW side by side"
    )
    p.add_argument(
        "--auto-layout",
        action="store_true",
        help="also compile with Layout.AUTO inputs/outputs and show the layouts XLA chose",
    )
    add_json(p, "the report, instead of the summary,", file=True)
    p.add_argument("--dump-hlo", metavar="DIR", help="write pre- and post-optimization HLO")
    p.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="JAX's persistent compilation cache directory (not the autotune --cache file)",
    )
    add_deprecated_flag(p, "--cache-dir", "--compile-cache", dest="compile_cache")
    p.set_defaults(func=run)
