"""``layoutlab evaluate | predict | export``: use a trained run's checkpoint.

Only argparse at import time: ``layoutlab --help`` must not start JAX.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from layoutlab.arguments import STDOUT, add_deprecated_flag, add_json, output_file

__all__ = ["register"]


def _fail(e: Exception) -> int:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


def _guarded(fn):
    """Bad input (ValueError, FileNotFoundError) -> one ``error:`` line and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (ValueError, FileNotFoundError) as e:
            return _fail(e)

    return run


def _checkpoint(text: str) -> int | str | None:
    if text in ("best", "latest"):
        return None if text == "latest" else text
    try:
        step = int(text)
    except ValueError:
        step = -1
    if step < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number, latest or best")
    return step


def _parser(subparsers, name: str, func, **texts) -> argparse.ArgumentParser:
    """A sub-command reading one run: ``--workdir`` and ``--checkpoint``, errors guarded."""
    p = subparsers.add_parser(name, **texts)
    p.set_defaults(func=_guarded(func))
    p.add_argument("--workdir", required=True, help="the run's directory (`layoutlab train`)")
    p.add_argument(
        "--checkpoint",
        type=_checkpoint,
        metavar="STEP|latest|best",
        help="the checkpoint's step, latest (the default) or best (the run's --keep-best one)",
    )
    p.add_argument(
        "--weights",
        choices=("raw", "ema"),
        default="raw",
        help="the trained weights (raw, default) or their moving average (ema: a run trained "
        "with --ema-decay)",
    )
    return p


def _positive_int(text: str) -> int:
    """``--batch-size N``: a whole number of at least 1 (argparse reports anything else)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _add_batch_size(p: argparse.ArgumentParser, what: str) -> None:
    """``--batch-size N`` of ``evaluate`` and ``predict``: it sets how many images go through
    the model at once (memory, speed), never what comes out."""
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        metavar="N",
        help=f"at most N {what} per forward pass, rounded up to a multiple of the devices "
        "(default: the run's eval_batch_size); the results do not depend on it",
    )


def register(subparsers) -> None:
    p = _parser(
        subparsers,
        "evaluate",
        run_evaluate,
        help="test metrics of a trained run: loss, accuracy, confusion matrix",
        description="Evaluate a run's checkpoint on the test split with the training loop's "
        "own eval step (the run's final test metrics are reproduced exactly); prints loss, "
        "accuracy, top-5 accuracy (more than 5 classes), the confusion matrix and per-class "
        "accuracy; with --out DIR it also writes the confusion matrix there as a PNG (nothing "
        "is written into the run's workdir unless --out names it).",
    )
    p.add_argument("--data", metavar="SOURCE", help="evaluate on this data source's test split")
    add_json(p, "the results, instead of text,", file=True)
    p.add_argument("--out", metavar="DIR", help="also write confusion_step<STEP>.png into DIR")
    _add_batch_size(p, "test images")

    p = _parser(
        subparsers,
        "predict",
        run_predict,
        help="top-k classes of image files under a trained run's model",
        description="Classify image files (or folders of them) of any size: each is converted "
        "to the run's channels, resized to its image size and normalized like its training "
        "data.",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders")
    p.add_argument("--top-k", type=int, default=5, metavar="K", help="classes per image (5)")
    _add_batch_size(p, "image files")
    add_json(p, "the predictions, instead of text,")

    p = _parser(
        subparsers,
        "export",
        run_export,
        help="a trained run's model as serialized StableHLO (jax.export)",
        description="Write the run's eval-mode model, weights included, as a serialized "
        "jax.export artifact that runs without layoutlab "
        "(jax.export.deserialize(bytes).call(images)), plus FILE.json describing its input.",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the artifact to write")
    p.add_argument(
        "--platforms",
        default="cpu,cuda",
        help="comma-separated platforms the artifact runs on (default cpu,cuda)",
    )
    p.add_argument(
        "--batch-size",
        dest="batch",
        default="symbolic",
        metavar="N|symbolic",
        help="a fixed batch size, or 'symbolic' (default): any batch size",
    )
    # after --batch-size: argparse takes a dest's default from its first flag
    add_deprecated_flag(p, "--batch", "--batch-size", dest="batch")
    p.add_argument(
        "--torch-state-dict",
        metavar="FILE.pth",
        help="also write the weights as a torchvision-named PyTorch state_dict (needs torch)",
    )


def run_evaluate(args: argparse.Namespace) -> int:
    from layoutlab.infer.evaluate import evaluate_workdir, format_report, plot_confusion
    from layoutlab.infer.outputs import check_outputs

    json_file = None if args.json in (None, STDOUT) else args.json
    check_outputs(args.workdir, {"--json-file": json_file, "--out": args.out})
    result = evaluate_workdir(
        args.workdir,
        args.checkpoint,
        data=args.data,
        batch_size=args.batch_size,
        weights=args.weights,
    )
    to_stdout = args.json == STDOUT
    print(json.dumps(result, indent=1) if to_stdout else format_report(result))
    if args.out:
        out = Path(args.out)
        # Another data set's plot gets its own name: it must not replace the run's.
        suffix = "_" + re.sub(r"[^A-Za-z0-9._-]+", "_", args.data).strip("_") if args.data else ""
        try:
            out.mkdir(parents=True, exist_ok=True)
            png = plot_confusion(result, out / f"confusion_step{result['step']}{suffix}.png")
        except OSError as e:
            raise ValueError(f"Cannot write into --out {out}: {e.strerror or e}.") from None
        print(f"confusion matrix plot: {png}", file=sys.stderr if to_stdout else sys.stdout)
    if args.json and not to_stdout:
        try:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        except OSError as e:
            raise ValueError(f"Cannot write --json-file {args.json}: {e.strerror or e}.") from None
        print(f"results: {args.json}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from layoutlab.infer.load import open_run
    from layoutlab.infer.predict import predict_files

    run = open_run(args.workdir, args.checkpoint, weights=args.weights)
    results = predict_files(run, args.images, args.top_k, batch_size=args.batch_size)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for r in results:
        best = ", ".join(f"{t['name']} {t['probability']:.3f}" for t in r["top_k"])
        print(f"{r['file']}: {best}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from layoutlab.infer.export import export_run, parse_batch, parse_platforms, sidecar_path
    from layoutlab.infer.load import open_run
    from layoutlab.infer.outputs import check_outputs

    outputs = {"--out": args.out, "--out's sidecar": sidecar_path(args.out)}
    check_outputs(args.workdir, {**outputs, "--torch-state-dict": args.torch_state_dict})
    platforms, batch = parse_platforms(args.platforms), parse_batch(args.batch)
    output_file(args.out)
    if args.torch_state_dict:
        output_file(args.torch_state_dict, "--torch-state-dict")
    run = open_run(args.workdir, args.checkpoint, weights=args.weights)
    out, sidecar = export_run(run, args.out, platforms=platforms, batch=batch)
    print(
        f"wrote {out} ({out.stat().st_size} bytes, platforms {','.join(platforms)}, batch "
        f"{args.batch}) and {sidecar}"
    )
    if args.torch_state_dict:
        _write_torch(run, args.torch_state_dict)
    return 0


def _write_torch(run, path: str) -> None:
    # compare/ sits above this package in the import map: joined only when asked, here.
    from layoutlab.compare.torch_weights import require_torch, to_torch_state_dict

    try:
        torch = require_torch()
    except ImportError as e:
        raise ValueError(str(e)) from None
    state_dict = to_torch_state_dict(run.model(), tensors=True)
    torch.save(state_dict, path)
    print(f"wrote {path} ({len(state_dict)} tensors, PyTorch names)")
