"""``layoutlab bench``: the benchmark sweep (``layoutlab autotune`` is in
``bench.tuning.command``; the options both take are ``layoutlab.arguments``' helpers)."""

from __future__ import annotations

import argparse
import os

from layoutlab.arguments import (
    add_conv_tune,
    add_image_size,
    add_model_options,
    output_dir,
    parse_comma_list,
    print_error,
    print_progress,
)
from layoutlab.bench.stats import AUTO_BUDGET_S
from layoutlab.nn.conv_names import BUILTIN_ALGORITHMS  # names, no JAX
from layoutlab.train.run_flags import REQUIRED, add_run_flags, run_axes, run_config

__all__ = ["register"]


def _repeats(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or an integer, got {text!r}") from None


def _checked(convert, ok, expected: str):
    """An argparse type: the flag's bad value is argparse's one ``error:`` line naming the
    flag (``--time-budget``), not the ``SweepConfig`` field validation would name."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):  # nan fails every comparison, so it lands here
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_seconds = _checked(float, lambda v: v > 0, "seconds > 0")
_fraction = _checked(float, lambda v: 0 < v < 1, "a fraction in (0, 1) such as 0.03")
_non_negative = _checked(int, lambda v: v >= 0, "an integer >= 0")


def _sweep_config(args: argparse.Namespace):
    """The ``SweepConfig`` of ``bench``'s flags: the run flags' ``TrainConfig`` (its
    optimizer ``--optimizer``'s: PyTorch's SGD by default with ``--torch``, else train's),
    the comma lists as axes, and the measurement flags."""
    from layoutlab.bench.sweep import SweepConfig
    from layoutlab.train.spec import config_for

    torch = args.torch or args.torch_compile
    optimizer = args.optimizer or ("pytorch" if torch else "train")
    if torch and optimizer != "pytorch":
        raise ValueError(
            "--torch times PyTorch's SGD-with-momentum step beside layoutlab's, which must "
            "make the same update: drop --optimizer train (with --torch it is pytorch), or drop "
            "--torch."
        )
    return SweepConfig(
        run_config(args, base=config_for(optimizer)),
        axes=run_axes(args),
        modes=parse_comma_list(args.modes),
        image_size=args.image_size,
        num_classes=args.num_classes,
        backend=args.backend,
        repeats=args.repeats,
        warmup=args.warmup,
        target=args.target,
        roofline=not args.no_roofline,
        time_budget_s=args.time_budget,
        torch=torch,
        torch_compile=args.torch_compile,
        max_step_s=args.max_step_seconds,
        note=args.note,
        conv_tune_repeats=args.conv_tune_repeats,
        pack_kernels=args.pack_kernels,
        conv_tune=args.conv_tune,
        baseline_plain=args.baseline_plain,
    )


def run_bench(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """``layoutlab bench``; ``argv``: its command line, which a sweep across the host-memory
    threshold runs again per part (None: one process, as parts need the command line)."""
    if args.torch or args.torch_compile:
        # XLA would otherwise take 75% of the GPU up front and leave PyTorch too little.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from layoutlab.bench.best_vs_best import markdown_best_vs_best
    from layoutlab.bench.host_memory_parts import host_memory_parts, run_parts
    from layoutlab.bench.plots import plot_all
    from layoutlab.bench.report import markdown_table
    from layoutlab.bench.results import save_results
    from layoutlab.bench.sweep import run_sweep, validate

    try:
        config = _sweep_config(args)
        output_dir(args.out)  # before the sweep, whose results would be lost at the end
        parts = host_memory_parts(args, argv)
        if parts is None:
            results = run_sweep(config, log=print_progress)
        else:
            validate(config)  # bad flags fail here, before a part starts
            results = run_parts(argv, parts, args.out)
    except ValueError as err:
        print_error(str(err))
        return 2
    except ChildProcessError as err:
        print_error(f"{err.strerror}; its output above says why.")
        return 2 if err.errno == 2 else 1
    out = save_results(args.out, results)
    plots = [] if args.no_plots else plot_all(results.rows, out)
    print(markdown_table(results.rows))
    if best := markdown_best_vs_best(results.rows):
        print(f"\n{best}")
    for note in results.notes:
        print(f"\nnote: {note}")
    written = ["results.csv", "results.json", "machine.json"] + [p.name for p in plots]
    print(f"\nwrote {', '.join(written)} to {out}")
    return 0 if results.ok_rows() else 1


def _algorithm_list() -> str:
    return ", ".join(BUILTIN_ALGORITHMS)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark layouts x precisions x batch sizes, optionally beside PyTorch",
        description=(
            "Time inference and training steps over a grid of layouts, precision policies "
            "and batch sizes; writes results.csv, results.json, machine.json and PNG plots "
            "to --out. With --torch, PyTorch runs the same models (contiguous and "
            "channels_last, fp32 and autocast) interleaved with layoutlab, and "
            "ratio_vs_torch_best is layoutlab's speed over the best PyTorch eager one."
        ),
    )
    add_run_flags(
        p,
        {
            "model": REQUIRED,
            "layout": "NHWC,NCHW",
            "precision": "fp32,mixed_bf16",
            "batch_size": [32],
            "conv_algo": "auto",
            "kernel_storage": "auto",
            "activation_storage": "auto",
            "cpu_fast": True,
        },
        multi=True,
        notes={
            "conv_algo": "auto: a plan per conv shape from the autotune cache, a tuning "
            "(--conv-tune) or the shipped table; one of: " + _algorithm_list(),
            "xla_option": "for layoutlab's steps",
        },
    )
    add_model_options(p)
    add_image_size(p, "spatial size; N: every spatial axis (default: the model's; 224 ImageNet)")
    p.add_argument("--modes", default="infer,train", help="infer, train or infer,train (default)")
    add_conv_tune(p, "the measured steps (so a benchmark uses the cache or the shipped table)")
    p.add_argument(
        "--baseline-plain",
        action="store_true",
        help="also run every layout and precision in plain XLA (xla convs, the layout's "
        "kernels and activations, XLA's batch norms and max pools, no XLA options), "
        "interleaved; rows say defaults=fast or "
        "plain",
    )
    p.add_argument(
        "--conv-tune-repeats", type=int, default=6, help="timing rounds per shape for auto"
    )
    p.add_argument(
        "--pack-kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="inference: oneDNN's convs read kernels packed once before the timed steps, as "
        "predict runs them (default); --no-pack-kernels reorders them inside every call",
    )
    p.add_argument("--torch", action="store_true", help="run PyTorch side by side")
    p.add_argument(
        "--optimizer",
        choices=("train", "pytorch"),
        help="the train step's optimizer: train (what `layoutlab train` runs for these flags, "
        "AdamW; the default) or pytorch (SGD with momentum 0.9, PyTorch's; the default and "
        "the only choice with --torch, so both sides make the same update)",
    )
    p.add_argument(
        "--torch-compile", action="store_true", help="also torch.compile (implies --torch)"
    )
    p.add_argument(
        "--repeats",
        type=_repeats,
        default="auto",
        help="measured steps per configuration, or auto (default): until each median is "
        "known within --target (95%% interval) and each ratio to a baseline (--torch, "
        "--baseline-plain) is settled, at least 6, within --time-budget per group (past it "
        "to 9 rounds while a ratio is undecided)",
    )
    p.add_argument("--target", type=_fraction, default=0.03, help="auto: relative precision")
    p.add_argument(
        "--time-budget",
        type=_positive_seconds,
        default=AUTO_BUDGET_S,
        help=f"auto: seconds of measured rounds per group (default {AUTO_BUDGET_S:g})",
    )
    p.add_argument(
        "--warmup", type=_non_negative, default=2, help="unmeasured steps after compiling"
    )
    p.add_argument(
        "--max-step-seconds",
        type=_positive_seconds,
        help="skip configurations whose step takes (or is predicted to take) longer",
    )
    p.add_argument("--note", help="free text stored with the machine info")
    p.add_argument(
        "--no-roofline",
        action="store_true",
        help="skip measuring the machine's float32 matmul peak and copy bandwidth",
    )
    p.add_argument(
        "--no-plots",
        action="store_true",
        help="write no PNG plots (throughput.png, memory.png, ratio_vs_torch.png), only results",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=run_bench)
