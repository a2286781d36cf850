"""Where mixed-precision error accumulates in ResNet-18: every layer of mixed_bf16 and
mixed_fp16 against fp32 with the same weights and input.

Writes ``results/mixed_precision_error_resnet18.json`` (all numbers, machine, versions) and
``.md`` (the per-layer table and a per-stage summary). The model is torchvision's ResNet-18
with the CIFAR stem (3x3 conv, no max pool) at reduced width (``--width``, default 32 instead
of 64) so the run takes about a minute on a laptop CPU; BatchNorm uses batch statistics
(train mode), as during training.

    python benchmarks/mixed_precision_error.py [--width 32] [--batch-size 8] [--image-size 32]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections import OrderedDict
from importlib import metadata

import numpy as np
from flax import nnx

from layoutlab import models
from layoutlab.compare.references import against_policy
from layoutlab.data.synthetic import make_synthetic

POLICIES = ("mixed_bf16", "mixed_fp16")


def _versions() -> dict:
    names = ("jax", "jaxlib", "flax", "numpy", "layoutlab")
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine() -> dict:
    import jax

    return {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
    }


def _stage(path: str) -> str:
    head = path.split(".")[0]
    if head.startswith("layer"):
        return head
    return {"conv1": "stem", "bn1": "stem"}.get(head, "head")


def run(width: int, batch_size: int, image_size: int, seed: int) -> dict:
    data = make_synthetic((image_size, image_size, 3), 10, max(64, batch_size), seed=seed)
    x = data.train_images[:batch_size]
    results = OrderedDict()
    for name in POLICIES:
        model = models.create(
            "resnet18",
            num_classes=10,
            layout="NHWC",
            policy=name,
            rngs=nnx.Rngs(seed),
            stem="cifar",
            width=width,
        )
        report = against_policy(model, x, train=True, layerwise=True)
        results[name] = report
    return results


def _summary(report) -> dict:
    rows = []
    for r in report.layers.rows:
        rows.append({
            "depth": r.index,
            "path": r.path,
            "op": r.op,
            "shape": list(r.shape),
            "rel_l2": r.rel_l2,
            "max_abs_error": r.report.max_abs_error,
            "max_abs_over_rms": r.report.max_abs_error / r.rms_expected
            if r.rms_expected else None,
            "cosine_similarity": r.report.cosine_similarity,
            "within_default_tolerance": r.passed,
        })  # fmt: skip
    stages = OrderedDict()
    for row in rows:
        stages.setdefault(_stage(row["path"]), []).append(row["rel_l2"])
    return {
        "tolerance": report.tolerance,
        "passed": report.passed,
        "first_failure": report.layers.first_failure.path if report.layers.first_failure else None,
        "output_max_abs_error": report.output.max_abs_error,
        "layers": rows,
        "per_stage_mean_rel_l2": {k: float(np.mean(v)) for k, v in stages.items()},
        "per_stage_max_rel_l2": {k: float(np.max(v)) for k, v in stages.items()},
    }


def _markdown(doc: dict) -> str:
    s = doc["settings"]
    lines = [
        "# Mixed-precision error per layer: ResNet-18 against fp32",
        "",
        f"ResNet-18, CIFAR stem, width {s['width']} (torchvision: 64), input "
        f"{s['batch_size']}x{s['image_size']}x{s['image_size']}x3 (synthetic images), "
        "NHWC, train-mode BatchNorm (batch statistics), same weights for every policy. "
        "Error of each layer's output against the fp32 policy's: relative L2 "
        "`||y - y_fp32|| / ||y_fp32||` and the largest element error over the layer's rms.",
        "",
        f"Machine: {doc['machine']['cpu']} ({doc['machine']['cpu_count']} CPUs), "
        f"{doc['machine']['platform']}, JAX backend {doc['machine']['jax_backend']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()) + ".",
        f"Generated {doc['generated']} by `python benchmarks/mixed_precision_error.py`.",
        "",
        "## Per stage (rel. L2, mean / max over the stage's layers)",
        "",
        "| stage | " + " | ".join(POLICIES) + " |",
        "|---|" + "---|" * len(POLICIES),
    ]
    first = doc["results"][POLICIES[0]]
    for stage in first["per_stage_mean_rel_l2"]:
        cells = [
            f"{doc['results'][p]['per_stage_mean_rel_l2'][stage]:.2e} / "
            f"{doc['results'][p]['per_stage_max_rel_l2'][stage]:.2e}"
            for p in POLICIES
        ]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Output logits, max abs error: "
        + ", ".join(f"{p} {doc['results'][p]['output_max_abs_error']:.3g}" for p in POLICIES)
        + ".",
        "",
        "## Per layer (depth = execution order)",
        "",
        "| depth | layer | op | shape | "
        + " | ".join(f"{p} rel L2 | {p} max/rms" for p in POLICIES)
        + " |",
        "|---|---|---|---|" + "---|---|" * len(POLICIES),
    ]
    for i, row in enumerate(first["layers"]):
        cells = []
        for p in POLICIES:
            r = doc["results"][p]["layers"][i]
            cells += [f"{r['rel_l2']:.2e}", f"{r['max_abs_over_rms']:.2e}"]
        shape = "x".join(str(d) for d in row["shape"])
        lines.append(f"| {row['depth']} | {row['path']} | {row['op']} | {shape} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    lines += [
        "",
        "Default tolerance of `layoutlab compare --against fp32` per policy: "
        + "; ".join(
            f"{p}: {doc['results'][p]['tolerance']} "
            f"({'passed' if doc['results'][p]['passed'] else 'exceeded'})"
            for p in POLICIES
        )  # fmt: skip
        + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    reports = run(args.width, args.batch_size, args.image_size, args.seed)
    doc = {
        "benchmark": "mixed_precision_error",
        "model": "resnet18",
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "settings": {
            "width": args.width,
            "stem": "cifar",
            "batch_size": args.batch_size,
            "image_size": args.image_size,
            "layout": "NHWC",
            "mode": "train (batch statistics)",
            "seed": args.seed,
            "reference": "fp32 policy, same weights",
            "jax_matmul_precision": "highest",
        },
        "machine": _machine(),
        "versions": _versions(),
        "results": {name: _summary(r) for name, r in reports.items()},
    }
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "mixed_precision_error_resnet18")
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")
    with open(base + ".md", "w") as f:
        f.write(_markdown(doc))
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
