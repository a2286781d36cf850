"""Benchmark results: flat rows (one per configuration and framework) saved as CSV and JSON.

``DIR/results.json`` holds ``{"machine": {...}, "notes": [...], "rows": [...]}``;
``DIR/results.csv`` the same rows, with the machine in the sidecar ``DIR/machine.json``.
``load_results(DIR)`` reads either back to the same ``BenchResults``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from layoutlab.bench.stats import Interval, imprecise, paired_ratio

__all__ = [
    "BenchResults",
    "FIELDS",
    "add_torch_ratios",
    "variant",
    "load_results",
    "precision_class",
    "ratio_fields",
    "ratio_interval",
    "save_results",
]

# Column order of the CSV, with the type each column is read back as.
_SCHEMA: dict[str, type] = {
    "framework": str,  # layoutlab | torch | torch.compile
    "model": str,
    "model_kwargs": str,  # JSON of the builder's extra keywords, e.g. {"stem": "cifar"}
    "input_shape": str,  # spatial x channels, e.g. 32x32x3
    "num_classes": int,
    "layout": str,  # NHWC / NCHW (torch: the memory format's physical order)
    "memory_format": str,  # torch only: contiguous | channels_last
    "precision": str,  # layoutlab policy name, or torch fp32 | amp_bf16 | amp_fp16
    "precision_class": str,  # fp32 | half
    "conv_algo": str,  # layoutlab only: the Conv algorithm (xla, im2col, ..., auto)
    "kernel_storage": str,  # layoutlab only: layout | channels_last
    "activation_storage": str,  # layoutlab only: layout | channels_last (NHWC inside NCHW)
    "layer_impl": str,  # layoutlab only: auto | xla, how batch norms and max pools compute
    "xla_options": str,  # layoutlab only: JSON of the XLA compile options
    "defaults": str,  # layoutlab only: fast (its defaults) | plain (plain XLA) | custom
    "optimizer": str,  # train rows: the step's optimizer (layoutlab: OptimizerSpec.label)
    "conv_plan_source": str,  # layoutlab, conv_algo auto: cache | tuned | table
    "packed_kernels": int,  # layoutlab infer: oneDNN convs reading a kernel packed once
    "mode": str,  # infer | train
    "batch_size": int,
    "backend": str,
    "device_kind": str,
    "repeats": int,
    "warmup": int,
    "images_per_sec": float,
    "step_ms_median": float,
    "step_ms_min": float,
    "step_ms_max": float,
    "step_ms_ci_low": float,  # the median's 95% interval (order statistics; bench.stats)
    "step_ms_ci_high": float,
    "dispersion": float,  # IQR / median of the measured steps
    "load_avg": float,  # 1-minute load average, the higher of before and after the group
    "other_cores": float,  # cores other processes kept busy while the group ran (/proc/stat)
    "unstable": bool,  # dispersion > 10% or other processes > 0.5 core: do not trust it
    "unstable_reason": str,
    "round_ms": str,  # JSON: each measured round's ms, in round order (for paired ratios)
    "steps_per_round": int,  # steps run back to back per round (after a lead step when > 1)
    "busy_turns": int,  # measured rounds begun with this process still busy (timing.settle)
    "compile_s": float,
    "conv_tune_s": float,  # layoutlab, conv_algo auto: seconds autotuning (0 when cached)
    "flops": float,  # XLA's cost analysis of the step; PyTorch rows: the same workload's
    "gflops_per_sec": float,
    "pct_of_peak": float,  # gflops_per_sec over the machine's float32 matmul peak (roofline)
    "tf32": str,  # GPU float32 in TensorFloat32: "on"/"off" (torch: conv and matmul); CPU n/a
    "temp_bytes": int,
    "argument_bytes": int,
    "output_bytes": int,
    "device_peak_bytes": int,
    "peak_rss_bytes": int,
    "transposes": int,
    "memory_permutations": int,
    "converts": int,
    "threads": int,
    "ratio_vs_torch_best": float,
    # The ratio's 95% interval from the per-round paired ratios (interleaved rounds), and
    # "faster", "slower", "indistinguishable" (the interval contains 1), IMPRECISE (the
    # interval reaches more than 20% from the ratio: outlier rounds) or UNTRUSTED (this
    # row or the PyTorch row it is compared with is unstable).
    "ratio_ci_low": float,
    "ratio_ci_high": float,
    "ratio_verdict": str,
    "torch_best": str,
    "status": str,  # ok | oom | error | skipped
    "error": str,
}
FIELDS: tuple[str, ...] = tuple(_SCHEMA)
UNTRUSTED = "not trustworthy (unstable)"
IMPRECISE = "not trustworthy (imprecise)"
_HALF_TORCH = {"amp_bf16", "amp_fp16"}


@dataclasses.dataclass
class BenchResults:
    machine: dict
    rows: list[dict]
    notes: list[str] = dataclasses.field(default_factory=list)

    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r.get("status") == "ok"]


def precision_class(precision: str) -> str:
    """``"half"`` for a 16-bit compute dtype (layoutlab policy or torch autocast), else fp32."""
    if precision in _HALF_TORCH:
        return "half"
    if precision == "fp32":
        return "fp32"
    from layoutlab.precision import get_policy

    return "half" if get_policy(precision).is_half else "fp32"


def variant(row: dict) -> str:
    """A layoutlab row's conv and XLA settings in short: ``defaults`` (layoutlab's fast
    defaults), ``plain XLA`` (``--baseline-plain``), else e.g. ``auto+hwio +ynn_fusion``
    (``+xla_layers``: XLA's batch norms and max pools, ``--layer-impl xla``);
    ``""`` for PyTorch rows."""
    if row.get("framework") != "layoutlab":
        return ""
    label = {"fast": "defaults", "plain": "plain XLA"}.get(row.get("defaults") or "")
    if label:
        return label
    parts = []
    algo = row.get("conv_algo") or "xla"
    storage = row.get("kernel_storage") or "layout"
    # Channels-last activations change only a channels-first model (NCHW, NCDHW).
    channels_first = str(row.get("layout") or "").startswith("NC")
    inside = (row.get("activation_storage") or "layout") if channels_first else "layout"
    if algo != "xla" or storage != "layout" or inside != "layout":
        parts.append(
            algo
            + ("+hwio" if storage == "channels_last" else "")
            + ("+channels_last_inside" if inside == "channels_last" else "")
        )
    if row.get("layer_impl") == "xla":
        parts.append("+xla_layers")
    options = json.loads(row.get("xla_options") or "{}")
    # Option names without their common prefix keep the label short but recognisable.
    parts += [f"+{name.removeprefix('xla_cpu_').removeprefix('xla_gpu_')}" for name in options]
    return " ".join(parts)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def full_row(row: dict) -> dict:
    """``row`` with exactly the columns of ``FIELDS`` (missing ones None), so CSV and JSON
    hold the same values."""
    unknown = sorted(set(row) - set(_SCHEMA))
    if unknown:
        raise ValueError(f"Unknown result columns {unknown}; the columns are: {', '.join(FIELDS)}.")
    return {name: _clean(row.get(name)) for name in FIELDS}


def _same_workload(a: dict, b: dict) -> bool:
    keys = ("model", "model_kwargs", "input_shape", "mode", "batch_size", "precision_class")
    return all(a.get(k) == b.get(k) for k in keys)


def add_torch_ratios(rows: list[dict]) -> list[dict]:
    """Fill ``ratio_vs_torch_best`` on ok layoutlab rows against the fastest ok eager-PyTorch
    row (by median) for the same model, input, mode, batch and precision class: the median
    of the per-round paired ratios (PyTorch's step time over layoutlab's, both timed in the
    same interleaved rounds) with that median's interval, so the point lies inside its own
    interval; rows without per-round times get the ratio of images/s and no interval."""
    torch_rows = [r for r in rows if r.get("framework") == "torch" and r.get("status") == "ok"]
    out = []
    for row in rows:
        row = dict(row)
        if row.get("framework") == "layoutlab" and row.get("status") == "ok":
            peers = [t for t in torch_rows if _same_workload(row, t)]
            if peers:
                best = max(peers, key=lambda t: t["images_per_sec"])
                row["ratio_vs_torch_best"] = row["images_per_sec"] / best["images_per_sec"]
                row["torch_best"] = f"{best['memory_format']}/{best['precision']}"
                row.update(ratio_interval(best, row))
                if row.get("unstable") or best.get("unstable"):
                    row["ratio_verdict"] = UNTRUSTED
        out.append(row)
    return out


def add_roofline(rows: list[dict], peaks: dict | None) -> list[dict]:
    """PyTorch rows get the FLOP count XLA reported for the same workload (the same model,
    input, mode and batch: the same arithmetic), then every ok row its GFLOP/s and
    ``pct_of_peak`` (``bench.roofline``)."""
    from layoutlab.bench.roofline import pct_of_peak

    flops = {_workload(r): r["flops"] for r in rows
             if r.get("framework") == "layoutlab" and r.get("flops")}  # fmt: skip
    out = []
    for row in rows:
        row = dict(row)
        if row.get("status") == "ok":
            if not row.get("flops") and _workload(row) in flops:
                row["flops"] = flops[_workload(row)]
                row["gflops_per_sec"] = row["flops"] / (row["step_ms_median"] / 1e3) / 1e9
            row["pct_of_peak"] = pct_of_peak(row.get("gflops_per_sec"), peaks)
        out.append(row)
    return out


def _workload(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("model", "model_kwargs", "input_shape", "mode",
                                      "batch_size"))  # fmt: skip


def ratio_interval(slow: dict, fast: dict) -> dict:
    """The per-round paired ratio ``slow / fast`` of two rows timed in the same interleaved
    rounds: its median as ``ratio_vs_torch_best``, its interval as ``ratio_ci_low/high`` and
    a verdict; nothing when either lacks its rounds."""
    try:
        a, b = json.loads(slow["round_ms"]), json.loads(fast["round_ms"])
    except (KeyError, TypeError, ValueError):
        return {}
    ci = paired_ratio(a, b)
    if ci is None:
        return {"ratio_verdict": "too few rounds"}
    return ratio_fields(ci)


def ratio_fields(ci: Interval) -> dict:
    """A ratio's median, interval and verdict as a row's ``ratio_*`` columns."""
    if imprecise(ci):
        verdict = IMPRECISE
    elif ci.contains(1.0):
        verdict = "indistinguishable"
    else:
        verdict = "faster" if ci.low > 1 else "slower"
    return {
        "ratio_vs_torch_best": ci.value,
        "ratio_ci_low": ci.low,
        "ratio_ci_high": ci.high,
        "ratio_verdict": verdict,
    }


def save_results(directory: str | Path, results: BenchResults) -> Path:
    """Write ``results.json``, ``results.csv`` and ``machine.json`` under ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rows = [full_row(r) for r in results.rows]
    payload = {"machine": results.machine, "notes": list(results.notes), "rows": rows}
    (out / "results.json").write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n")
    (out / "machine.json").write_text(
        json.dumps({"machine": results.machine, "notes": list(results.notes)}, indent=1) + "\n"
    )
    columns = list(FIELDS)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if r.get(k) is None else r[k] for k in columns})
    return out


def _parse(name: str, text: str) -> Any:
    if text == "":
        return None
    kind = _SCHEMA.get(name, str)
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    if kind is bool:
        return text == "True"
    return text


def load_results(directory: str | Path, *, source: str = "json") -> BenchResults:
    """Read results written by ``save_results``; ``source="csv"`` reads the CSV + sidecar."""
    path = Path(directory)
    if source not in ("json", "csv"):
        raise ValueError(f"source must be 'json' or 'csv', got {source!r}.")
    name = "results.json" if source == "json" else "results.csv"
    if not (path / name).is_file():
        raise FileNotFoundError(
            f"No {name} in {path}; run `layoutlab bench --out {path}` to produce one."
        )
    if source == "json":
        payload = json.loads((path / name).read_text())
        return BenchResults(payload["machine"], payload["rows"], payload.get("notes", []))
    side = path / "machine.json"
    meta = json.loads(side.read_text()) if side.is_file() else {"machine": {}, "notes": []}
    with open(path / name, newline="") as f:
        rows = [{k: _parse(k, v) for k, v in r.items()} for r in csv.DictReader(f)]
    return BenchResults(meta["machine"], rows, meta.get("notes", []))
