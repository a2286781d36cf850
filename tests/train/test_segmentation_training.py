"""A segmentation model's training step: per-pixel cross-entropy over the layout's class axis.

References: the loss against float64 NumPy on the step's own logits, and the whole step
(loss, gradients through one update) against the other layout.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import pytest
from flax import nnx

from layoutlab.bench import command
from layoutlab.bench.results import load_results
from layoutlab.train.program import INIT_COMPILER_OPTIONS, build_program
from layoutlab.xla.inspect import inspect_model, inspect_spec

CLASSES, BATCH, SIZE = 3, 2, 8
# The steps below are compiled without LLVM optimizations, as the training loop compiles init
# (train.program.INIT_COMPILER_OPTIONS): half the compile time of a U-Net step on CPU. The
# per-pixel loss and its gradients are decided by the HLO, which every level runs the same
# passes on; the level changes float32 results by rounding alone (no FMA contraction),
# ~1e-7 relative, far below the tolerances here.
FAST_COMPILE = INIT_COMPILER_OPTIONS


def _program(layout: str):
    spec, inputs = inspect_spec("unet", layout=layout, batch_size=BATCH, image_size=SIZE,
                                num_classes=CLASSES, model_kwargs={"width": 4},
                                optimizer="pytorch")  # fmt: skip
    return build_program(spec, inputs, "cpu")


def _batch(layout: str):
    rng = np.random.default_rng(0)
    images = rng.standard_normal((BATCH, SIZE, SIZE, 3), dtype=np.float32)
    if layout == "NCHW":
        images = np.ascontiguousarray(np.moveaxis(images, -1, 1))
    labels = rng.integers(0, CLASSES, (BATCH, SIZE, SIZE)).astype(np.int32)
    return images, labels


def _numpy_cross_entropy(logits_class_last: np.ndarray, labels: np.ndarray) -> float:
    z = logits_class_last.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-np.take_along_axis(log_p, labels[..., None], axis=-1).mean())


def _two_steps():
    """``{layout: (logits, labels, first metrics, second metrics)}`` for NHWC and NCHW.

    Each stage (init, forward, step) runs both layouts in one program, compiled once (a
    third less compile than one per layout): each layout has its own state and batch, so
    neither's ops fuse with or fold into the other's."""
    layouts = ("NHWC", "NCHW")
    programs = [_program(layout) for layout in layouts]
    batches = [_batch(layout) for layout in layouts]
    images = tuple(b[0] for b in batches)
    labels = tuple(b[1] for b in batches)
    states = jax.jit(lambda: tuple(p.init() for p in programs), compiler_options=FAST_COMPILE)()
    # The train-mode forward the step differentiates (jitted: eager would compile op by op).
    forward = jax.jit(
        lambda sts, xs: tuple(
            nnx.merge(p.defs.train, st.params, st.model_state)(x)
            for p, st, x in zip(programs, sts, xs, strict=True)
        ),
        compiler_options=FAST_COMPILE,
    )
    logits = [np.asarray(y) for y in forward(states, images)]
    logits[1] = np.moveaxis(logits[1], 1, -1)  # NCHW
    step = jax.jit(
        lambda sts, xs, ys: tuple(
            p.train_step(st, x, y) for p, st, x, y in zip(programs, sts, xs, ys, strict=True)
        ),
        compiler_options=FAST_COMPILE,
    )
    firsts = step(states, images, labels)
    seconds = step(tuple(st for st, _ in firsts), images, labels)
    return {
        layout: (logits[i], labels[i], firsts[i][1], seconds[i][1])
        for i, layout in enumerate(layouts)
    }


def test_per_pixel_loss_matches_float64_and_the_other_layout():
    runs = _two_steps()
    nhwc, nchw = runs["NHWC"], runs["NCHW"]
    for logits, labels, first, _ in (nhwc, nchw):
        assert logits.shape == (BATCH, SIZE, SIZE, CLASSES)
        # float32 log-softmax over 3 classes, averaged over 128 pixels, against float64 on
        # the same logits: a few float32 roundings, ~1e-7 relative; 1e-5 leaves headroom.
        assert float(first["loss"]) == pytest.approx(_numpy_cross_entropy(logits, labels),
                                                     rel=1e-5)  # fmt: skip
        # Per-pixel accuracy: exact (the same argmax of the same logits).
        assert float(first["accuracy"]) == pytest.approx(
            np.mean(np.argmax(logits, -1) == labels), abs=1e-7
        )
    # The layouts sum the convs in different orders (float32, ~1e-6 relative on the
    # logits); the second loss also carries one SGD update made from each layout's
    # gradients, so a class axis taken wrongly in either layout's backward shows here.
    assert float(nchw[2]["loss"]) == pytest.approx(float(nhwc[2]["loss"]), rel=1e-5)
    assert float(nchw[3]["loss"]) == pytest.approx(float(nhwc[3]["loss"]), rel=1e-4)
    assert float(nhwc[3]["loss"]) != float(nhwc[2]["loss"])  # the update did something


def test_bench_and_inspect_train_a_segmentation_model(tmp_path):
    out = tmp_path / "unet"
    # NHWC here and NCHW in inspect: each layout's program compiles once in this test. The
    # rows are checked for their status, not their times: LLVM level 0 (docs/development.md).
    argv = ["bench", "--model", "unet", "--tiny", "--image-size", str(SIZE), "--layouts",
            "NHWC", "--precisions", "fp32", "--batch-sizes", "2", "--modes", "train",
            "--repeats", "1", "--warmup", "0", "--backend", "cpu", "--no-plots",
            "--no-roofline", "--xla-option", "xla_backend_optimization_level=0",
            "--out", str(out)]  # fmt: skip
    try:
        import torch  # noqa: F401

        argv.append("--torch")  # PyTorch's cross_entropy takes (N, C, H, W) logits as is
    except ImportError:
        pass
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    rows = load_results(out, source="csv").rows
    assert rows and all(r["status"] == "ok" and r["mode"] == "train" for r in rows), rows
    assert [r["layout"] for r in rows if r["framework"] == "layoutlab"] == ["NHWC"]
    # Only the compiled HLO is read, which every LLVM level shares: FAST_COMPILE halves the
    # U-Net step's compile.
    report = inspect_model("unet", mode="train", layout="NCHW", batch_size=BATCH,
                           image_size=SIZE, model_kwargs={"width": 4},
                           flags=FAST_COMPILE)  # fmt: skip
    # The compiled training step takes one int32 label per pixel.
    assert report.mode == "train" and f"s32[{BATCH},{SIZE},{SIZE}]" in report.report.hlo_text
