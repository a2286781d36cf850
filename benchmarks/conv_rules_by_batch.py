"""The shipped conv table's rules against ``xla``, per batch size: the evidence for the
table's batch bounds (``nn/conv_algos/default_plan.py``).

    python benchmarks/conv_rules_by_batch.py [--batches 1,8,32,128] [--repeats 10]
        [--objectives train,inference] [--shapes r18,r50] [--out benchmarks/results/NAME]

For every conv shape of ResNet-18 CIFAR and ResNet-50 ImageNet-stem that one of the table's
rules (for this CPU kind, float32) names at batch 128, and for each batch size: the rule's
algorithm and ``xla`` are checked against float64 NumPy and timed interleaved, round by
round (``bench.tuning.autotune_conv`` with those two candidates, a private cache and the
``cpu_fast_options`` the steps compile with). A row gives the median of the per-round
ratios ``xla / algorithm`` (above 1: the rule's algorithm is faster) with its 95%
interval, and ``bench.stats.decide``'s verdict. The load average and the cores other
processes kept busy are recorded per row, because the machine may be shared.

Writes ``<out>.json`` (machine, every row) and ``<out>.md`` (a table per objective).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.report import markdown_grid
from layoutlab.bench.stats import OtherLoad, load_average, paired_ratio
from layoutlab.bench.tuning.convs import autotune_conv
from layoutlab.fast_defaults import cpu_fast_options, cpu_kind
from layoutlab.nn.conv_algos.default_plan import DEFAULT_RULES
from layoutlab.nn.conv_algos.geometry import make_spec, resolve_geometry

# (model, in, out, kernel, stride, input size): every conv shape of the two models that a
# rule of some CPU kind's float32 table names at batch 128.
SHAPES = {
    "r18": [
        ("resnet18 cifar", 3, 64, 3, 1, 32),
        ("resnet18 cifar", 128, 128, 3, 1, 16),
        ("resnet18 cifar", 256, 256, 3, 1, 8),
        ("resnet18 cifar", 512, 512, 3, 1, 4),
        ("resnet18 cifar", 64, 128, 1, 2, 32),
        ("resnet18 cifar", 128, 256, 1, 2, 16),
        ("resnet18 cifar", 256, 512, 1, 2, 8),
    ],
    "r50": [
        ("resnet50 imagenet", 256, 256, 3, 1, 14),
        ("resnet50 imagenet", 512, 512, 3, 1, 7),
        ("resnet50 imagenet", 256, 512, 1, 2, 56),
        ("resnet50 imagenet", 512, 1024, 1, 2, 28),
        ("resnet50 imagenet", 1024, 2048, 1, 2, 14),
    ],
}


def _spec(batch, cin, cout, k, s, size):
    geom = resolve_geometry((size, size), k, s, "SAME")
    return make_spec((batch, size, size, cin), cout, geom, "float32", "NHWC")


def _rule_algorithm(spec, kind: str, objective: str) -> str | None:
    """The algorithm the batch-128 form of the table gives ``spec``'s shape, or None."""
    big = spec._replace(batch=128)
    for rule in DEFAULT_RULES.get((kind, objective, "float32"), ()):
        if rule._replace(min_batch=1, max_batch=None).matches(big):
            return rule.algorithm
    return None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--objectives", default="train,inference")
    p.add_argument("--shapes", default="r18,r50")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-batch-r50", type=int, default=32, help="R50 shapes above: skipped")
    p.add_argument("--note", default=None)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    kind = cpu_kind()
    machine = machine_info("cpu", note=args.note)
    rows = []
    cache = Path(tempfile.mkdtemp()) / "autotune.json"
    for objective in args.objectives.split(","):
        options = cpu_fast_options("train" if objective == "train" else "infer")
        for group in args.shapes.split(","):
            for model, *shape in SHAPES[group]:
                for batch in (int(b) for b in args.batches.split(",")):
                    if group == "r50" and batch > args.max_batch_r50:
                        continue
                    spec = _spec(batch, *shape)
                    algorithm = _rule_algorithm(spec, kind, objective)
                    if algorithm is None:
                        continue
                    meter, t0 = OtherLoad(), time.perf_counter()
                    result = autotune_conv(
                        spec,
                        algorithms=["xla", algorithm],
                        objective=objective,
                        repeats=args.repeats,
                        cache=cache,
                        compiler_options=options,
                    )
                    row = {
                        "model": model,
                        "objective": objective,
                        "batch": batch,
                        "spec": spec.key(),
                        "algorithm": algorithm,
                        "verdict": result.verdict,
                        "choice": result.choice,
                        "ratio": _ratio(result.rounds_ms, algorithm),
                        "ms": {
                            c.algorithm: (c.train_ms if objective == "train" else c.forward_ms)
                            for c in result.candidates
                        },  # fmt: skip
                        "rounds_ms": result.rounds_ms,
                        "load_avg": load_average(),
                        "other_cores": meter.cores(),
                        "seconds": time.perf_counter() - t0,
                    }
                    rows.append(row)
                    print(json.dumps(row)[:400], flush=True)
                    _write(args.out, finish_machine_info(machine), kind, rows)


def _ratio(rounds: dict, algorithm: str) -> list | None:
    if "xla" not in rounds or algorithm not in rounds:
        return None
    ci = paired_ratio(rounds["xla"], rounds[algorithm])
    return None if ci is None else list(ci)


def _ratio_cell(row) -> str:
    if not row["ratio"]:
        return "n/a"
    value, low, high = row["ratio"]
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def _write(out: str, machine: dict, kind: str, rows: list) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(
        json.dumps({"machine": machine, "cpu_kind": kind, "rows": rows}, indent=1) + "\n"
    )
    lines = [f"# Table rules vs xla by batch ({kind}, float32, NHWC)", ""]
    lines.append("```")
    lines.append(json.dumps(machine, indent=1))
    lines.append("```")
    for objective in sorted({r["objective"] for r in rows}):
        lines += ["", f"## {objective}", ""]
        body = [
            (r["model"], r["spec"].split(":", 2)[2].rsplit(":", 4)[0], r["batch"],
             r["algorithm"], f"{r['ms'].get('xla') or 0:.3f}",
             f"{r['ms'].get(r['algorithm']) or 0:.3f}", _ratio_cell(r), r["verdict"],
             f"{r['load_avg']:.2f}", f"{r['other_cores'] or 0:.2f}")
            for r in rows if r["objective"] == objective
        ]  # fmt: skip
        lines += markdown_grid(
            ("model", "shape", "batch", "rule's algorithm", "xla ms", "algorithm ms",
             "xla/algorithm per round [95%]", "verdict", "load", "other cores"),
            body,
        )  # fmt: skip
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
