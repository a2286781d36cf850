"""What XLA does to a whole model: one registry model, one layout, one precision, one step.

``inspect_model("resnet18", layout="NCHW", precision="mixed_bf16", mode="train")`` builds the
model and its training state abstractly (shapes only, no weights are computed), lowers and
compiles the inference forward or the full training step ahead of time with
``compile_report``, and reads the result:

- the logical layout the model asked for and, per convolution, the logical layouts written
  in the program (``hlo_before``) next to the physical ones XLA chose (optimized HLO);
- transposes split into *kernel* transposes (an operand or result shaped like a conv kernel
  parameter: the weights, which stay stored in the model's kernel order and so are
  transposed on every call, or their gradients) and *activation* ones, with bytes; copies;
  converts by dtype pair, with bytes. An op XLA duplicated into several fusions counts once
  per copy, as it runs once per copy;
- fusions, XLA's flop and byte counts, the memory analysis, lowering and compile time,
  persistent-cache hit, the flags in force and the device.

``conv_algorithm=`` and ``kernel_storage=`` set every conv's algorithm and kernel order first
(``nn.configure_convs``): with ``kernel_storage="channels_last"`` a channels-first model keeps
its kernels ``HWIO``, and the kernel transposes of every call leave the program.

``auto_layout=True`` compiles a second time with ``Layout.AUTO`` for every input and output
and reports the layouts XLA chose for the parameters and the images, and what that removed.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from layoutlab import models
from layoutlab.layout import channels_first, channels_last
from layoutlab.loss_scale import get_loss_scale
from layoutlab.nn.conv_algos import as_plan
from layoutlab.nn.conv_config import (
    check_conv_options,
    configure_convs,
    convs,
    plan_coverage,
    with_conv_plan,
)
from layoutlab.precision import get_policy
from layoutlab.train.skip import skip_nonfinite
from layoutlab.train.state import create_train_state
from layoutlab.train.steps import make_forward, make_train_step
from layoutlab.xla.backends import resolve_backend
from layoutlab.xla.compile import CompileReport, compile_report
from layoutlab.xla.formats import LayoutAPIUnavailable, LayoutUnsupportedError
from layoutlab.xla.hlo import ConvOp, DataMoveOp, HloReport

__all__ = [
    "MODES",
    "ConvRow",
    "ModelInspection",
    "ModelLayoutComparison",
    "compare_model_layouts",
    "format_conv_rows",
    "inspect_model",
    "match_convs",
]

MODES = ("infer", "train")

# Totals shown side by side; the order is the order of the tables.
TABLE_KEYS = (
    "convolutions",
    "transposes",
    "kernel_transposes",
    "activation_transposes",
    "transpose_bytes",
    "copies",
    "copy_bytes",
    "memory_permutations",
    "memory_permutation_bytes",
    "converts",
    "convert_bytes",
    "fusions",
    "flops",
    "bytes_accessed",
    "temp_bytes",
    "peak_bytes",
)


# ---------------------------------------------------------------- per-conv table


@dataclasses.dataclass(frozen=True)
class ConvRow:
    """One convolution: the layouts the program wrote next to those XLA runs."""

    name: str | None  # instruction in the optimized HLO
    fusion: str | None
    logical: str | None  # e.g. "NCHW*OIHW->NCHW", from the pre-optimization HLO
    physical: str | None  # e.g. "NHWC*HWIO->NHWC", memory order in the optimized HLO
    dtypes_before: str | None  # e.g. "bf16*bf16->f32" as written
    dtypes_after: str | None  # as run, e.g. "f32*f32->f32" on CPU
    shapes: str  # logical shapes as written, "lhs * rhs -> out"
    window: str  # as written
    note: str | None = None  # set when XLA rewrote the conv beyond its layout

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _trio(d: Mapping[str, str | None] | None) -> str | None:
    if not d:
        return None
    return f"{d['input']}*{d['kernel']}->{d['output']}"


def _dtypes(c: ConvOp) -> str:
    return "*".join(s.dtype if s else "?" for s in (c.lhs, c.rhs)) + (
        f"->{c.out.dtype}" if c.out else "->?"
    )


def _roles(letters: str | None, shape) -> tuple:
    if letters is None or shape is None or len(letters) != len(shape.dims):
        return ()
    return tuple(sorted(zip(letters, shape.dims, strict=True)))


def _signature(c: ConvOp, level: int) -> tuple:
    """What survives XLA's rewrites of a conv, from most to least specific.

    0 and 1: the size of each axis role (N, C, H, ...), unchanged when XLA permutes a conv's
    dims, with (0) or without (1) the window; 2: the multiset of all operand and result dims,
    unchanged when XLA swaps the operands (it does for kernels larger than their input).
    """
    if level == 2:
        return tuple(sorted(d for s in (c.lhs, c.rhs, c.out) if s for d in s.dims))
    lg = c.logical or {}
    sig = (
        _roles(lg.get("input"), c.lhs),
        _roles(lg.get("kernel"), c.rhs),
        _roles(lg.get("output"), c.out),
        c.feature_group_count,
        c.batch_group_count,
    )
    if level == 0 and c.window is not None:
        sig += (c.window.size, c.window.stride, c.window.pad, c.window.rhs_dilate)
    return sig


def _window(c: ConvOp) -> str:
    w = c.window
    if w is None:
        return "?"
    text = "x".join(map(str, w.size))
    if any(s != 1 for s in w.stride):
        text += " stride " + "x".join(map(str, w.stride))
    if any(p != (0, 0) for p in w.pad):
        text += " pad " + "x".join(f"{lo}_{hi}" for lo, hi in w.pad)
    for label, values in (("lhs_dilate", w.lhs_dilate), ("rhs_dilate", w.rhs_dilate)):
        if any(v != 1 for v in values):
            text += f" {label} " + "x".join(map(str, values))
    return text


def _dims(c: ConvOp) -> str:
    def d(s):
        return "[" + ",".join(map(str, s.dims)) + "]" if s else "?"

    return f"{d(c.lhs)} * {d(c.rhs)} -> {d(c.out)}"


def match_convs(before: HloReport | None, after: HloReport | None) -> list[ConvRow]:
    """Pair each conv of the pre-optimization HLO (program order) with the optimized conv it
    became.

    XLA renames and re-lays out convs, so they are paired by what a rewrite keeps (see
    ``_signature``); convs with equal signatures are interchangeable and are paired in
    order. A row whose roles XLA changed carries a ``note``; a conv XLA turned into other ops
    has no physical layout; one XLA made up has no logical layout.
    """
    if after is None:
        return []
    sources = list(before.convolutions) if before is not None else []
    pool = list(after.convolutions)
    pairs: dict[int, tuple[ConvOp, int]] = {}
    for level in (0, 1, 2):
        for i, src in enumerate(sources):
            if i in pairs:
                continue
            sig = _signature(src, level)
            for j, cand in enumerate(pool):
                if _signature(cand, level) == sig:
                    pairs[i] = (pool.pop(j), level)
                    break
    rows = []
    for i, src in enumerate(sources):
        if i not in pairs:
            rows.append(_row(src, None, "no convolution left in the optimized HLO"))
            continue
        conv, level = pairs[i]
        note = "rewritten by XLA: operands or axis roles changed" if level == 2 else None
        rows.append(_row(src, conv, note))
    return rows + [_row(None, conv, "made by XLA") for conv in pool]


def _row(src: ConvOp | None, conv: ConvOp | None, note: str | None = None) -> ConvRow:
    shown = src if src is not None else conv
    return ConvRow(
        name=conv.name if conv else None,
        fusion=conv.fusion if conv else None,
        logical=_trio(src.logical) if src else None,
        physical=_trio(conv.physical) if conv else None,
        dtypes_before=_dtypes(src) if src else None,
        dtypes_after=_dtypes(conv) if conv else None,
        shapes=_dims(shown),
        window=_window(shown),
        note=note,
    )


def format_conv_rows(rows: list[ConvRow]) -> str:
    """A text table: logical layout as written, physical as run, dtypes, shapes."""
    if not rows:
        return "(no convolutions)"
    header = ("#", "logical (program)", "physical (XLA)", "dtypes written", "dtypes run", "shapes")
    body = [
        (
            str(i),
            r.logical or "?",
            r.physical or "?",
            r.dtypes_before or "?",
            r.dtypes_after or "?",
            f"{r.shapes} {r.window}" + (f"  ({r.note})" if r.note else ""),
        )
        for i, r in enumerate(rows)
    ]
    widths = [max(len(row[k]) for row in [header, *body]) for k in range(len(header) - 1)]
    lines = []
    for row in [header, *body]:
        cells = [f"{cell:<{w}}" for cell, w in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines)


# ---------------------------------------------------------------- transposes by kind


def _kernel_shapes(params) -> set[tuple[int, ...]]:
    """Shapes of every conv kernel parameter (leaves named ``kernel`` of rank >= 3)."""
    shapes = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        shape = tuple(getattr(leaf, "shape", ()))
        if "kernel" in names and len(shape) >= 3:
            shapes.add(shape)
    return shapes


def count_conv_kernels(params) -> int:
    """How many conv kernel parameters ``params`` holds (one per conv layer)."""
    count = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        if "kernel" in names and len(getattr(leaf, "shape", ())) >= 3:
            count += 1
    return count


def transpose_kind(op: DataMoveOp, kernel_shapes: set, rank: int) -> str:
    """``kernel`` (operand or result shaped like a conv kernel), ``activation`` (rank of the
    model's activations) or ``other``."""
    for s in (op.operand, op.result):
        if s is not None and tuple(s.dims) in kernel_shapes:
            return "kernel"
    if op.result is not None and len(op.result.dims) == rank:
        return "activation"
    return "other"


def transposes_by_kind(hlo: HloReport | None, kernel_shapes: set, rank: int) -> dict:
    """``{"kernel": {"count", "bytes"}, "activation": {...}, "other": {...}}``."""
    out = {k: {"count": 0, "bytes": 0} for k in ("kernel", "activation", "other")}
    for op in hlo.transposes if hlo is not None else []:
        kind = transpose_kind(op, kernel_shapes, rank)
        out[kind]["count"] += 1
        out[kind]["bytes"] += op.bytes_moved or 0
    return out


# ---------------------------------------------------------------- the report


def _format_summary(infos: list[dict] | None, logical: str | None = None) -> dict:
    """How many leaves XLA stored in a non-default (non row-major) order, and which."""
    infos = infos or []
    odd = [i for i in infos if i.get("is_default") is False]
    rows = []
    for i in odd:
        m2m = i.get("major_to_minor")
        letters = logical if logical and len(logical) == len(i["shape"]) else None
        rows.append(
            {
                "path": i["path"],
                "shape": list(i["shape"]),
                "major_to_minor": list(m2m) if m2m is not None else None,
                "physical": "".join(letters[d] for d in m2m) if letters and m2m else None,
            }
        )
    return {
        "leaves": len(infos),
        "non_default": len(odd),
        "unknown": sum(1 for i in infos if i.get("is_default") is None),
        "changed": rows,
    }


def _split_infos(infos: list[dict] | None) -> tuple[list[dict], list[dict], list[dict]]:
    """Input format infos as (state params, images, everything else)."""
    params, images, rest = [], [], []
    for i in infos or []:
        path = i["path"]
        if path.startswith("[0][0]") and ".params" in path:
            params.append(i)
        elif path.startswith("[0][1]"):
            images.append(i)
        else:
            rest.append(i)
    return params, images, rest


@dataclasses.dataclass
class ModelInspection:
    """What XLA made of one model configuration; ``report`` is the default-layout compile,
    ``auto`` the ``Layout.AUTO`` one (None unless ``auto_layout=True``)."""

    model: str
    layout: str  # the logical layout the model was built for
    kernel_layout: str
    precision: str
    policy: str
    mode: str
    batch_size: int
    input_shape: tuple[int, ...]
    model_kwargs: dict
    loss_scale: str
    num_conv_kernels: int  # conv layers in the model, counted from its parameters
    build_seconds: float
    report: CompileReport
    auto: CompileReport | None = None
    auto_error: str | None = None  # why the AUTO compile was refused, when it was
    kernel_shapes: set = dataclasses.field(default_factory=set, repr=False)
    conv_algorithm: str = "xla"
    kernel_storage: str = "layout"
    # "auto" convs with no conv plan entry for their shape (they run xla); None unless auto
    missing_choices: int | None = None
    conv_shapes: int | None = None  # "auto" 2D convs, counted when auto
    conv_plan: dict | None = None  # the plan's {path: algorithm} when auto

    # ----- derived views

    @property
    def backend(self) -> str:
        return self.report.backend

    @property
    def device(self) -> str:
        return self.report.device_kind

    @property
    def hlo(self) -> HloReport | None:
        return self.report.hlo

    @property
    def hlo_before(self) -> HloReport | None:
        return self.report.hlo_before

    def conv_rows(self, report: CompileReport | None = None) -> list[ConvRow]:
        r = report or self.report
        return match_convs(r.hlo_before, r.hlo)

    def conv_layouts(self, report: CompileReport | None = None) -> dict[str, int]:
        """``{"NCHW*OIHW->NCHW => NHWC*HWIO->NHWC": 20}``: logical to physical, counted."""
        counter = collections.Counter(
            f"{r.logical or '?'} => {r.physical or '?'}" + (" (rewritten)" if r.note else "")
            for r in self.conv_rows(report)
        )
        return dict(counter)

    def transposes(self, report: CompileReport | None = None) -> dict:
        r = report or self.report
        return transposes_by_kind(r.hlo, self.kernel_shapes, len(self.input_shape))

    def totals(self, report: CompileReport | None = None) -> dict:
        """The key numbers of one compile (default: ``report``), as plain ints/floats."""
        r = report or self.report
        t = r.hlo.totals() if r.hlo is not None else {}
        kinds = self.transposes(r)
        mem = r.memory or {}
        return {
            "convolutions": t.get("convolutions"),
            "transposes": t.get("transposes"),
            "kernel_transposes": kinds["kernel"]["count"],
            "kernel_transpose_bytes": kinds["kernel"]["bytes"],
            "activation_transposes": kinds["activation"]["count"],
            "activation_transpose_bytes": kinds["activation"]["bytes"],
            "other_transposes": kinds["other"]["count"],
            "transpose_bytes": t.get("transpose_bytes"),
            "copies": t.get("copies"),
            "copy_bytes": t.get("copy_bytes"),
            "memory_permutations": t.get("memory_permutations"),
            "memory_permutation_bytes": t.get("memory_permutation_bytes"),
            "converts": t.get("converts"),
            "convert_bytes": t.get("convert_bytes"),
            "fusions": t.get("fusions"),
            "flops": r.cost.get("flops"),
            "bytes_accessed": r.cost.get("bytes_accessed"),
            "transcendentals": r.cost.get("transcendentals"),
            "argument_bytes": mem.get("argument_size"),
            "output_bytes": mem.get("output_size"),
            "alias_bytes": mem.get("alias_size"),
            "temp_bytes": mem.get("temp_size"),
            "peak_bytes": mem.get("peak_memory"),
            "lower_seconds": r.lower_seconds,
            "compile_seconds": r.compile_seconds,
        }

    def auto_layouts(self) -> dict | None:
        """Which parameter, image and output layouts XLA chose under ``Layout.AUTO``, and
        the transposes of the default and AUTO compiles."""
        if self.auto is None:
            return None if self.auto_error is None else {"error": self.auto_error}
        params, images, rest = _split_infos(self.auto.input_formats)
        d, a = self.totals(self.report), self.totals(self.auto)
        keys = ("transposes", "kernel_transposes", "activation_transposes", "memory_permutations")
        return {
            "params": _format_summary(params, self.kernel_layout),
            "images": _format_summary(images, self.layout),
            "other_inputs": _format_summary(rest),
            "outputs": _format_summary(self.auto.output_formats),
            "default": {k: d[k] for k in keys},
            "auto": {k: a[k] for k in keys},
            "removed": {k: (d[k] or 0) - (a[k] or 0) for k in keys},
        }

    def to_dict(self, include_compile: bool = False) -> dict:
        """JSON-ready; ``include_compile=True`` adds the full ``CompileReport.to_dict``
        (every HLO op record, no HLO text)."""
        r = self.report
        out: dict[str, Any] = {
            "model": self.model,
            "layout": self.layout,
            "kernel_layout": self.kernel_layout,
            "conv_algorithm": self.conv_algorithm,
            "kernel_storage": self.kernel_storage,
            "missing_choices": self.missing_choices,
            "conv_plan": self.conv_plan,
            "conv_shapes": self.conv_shapes,
            "precision": self.precision,
            "policy": self.policy,
            "mode": self.mode,
            "batch_size": self.batch_size,
            "input_shape": list(self.input_shape),
            "model_kwargs": dict(self.model_kwargs),
            "loss_scale": self.loss_scale,
            "num_conv_kernels": self.num_conv_kernels,
            "backend": r.backend,
            "platform": r.platform,
            "device": r.device_kind,
            "platform_version": r.platform_version,
            "versions": dict(r.versions),
            "build_seconds": self.build_seconds,
            "lower_seconds": r.lower_seconds,
            "compile_seconds": r.compile_seconds,
            "cache_hit": r.cache_hit,
            "in_memory_cache_hit": r.in_memory_cache_hit,
            "flags": r.flags,
            "totals": self.totals(),
            "transposes": self.transposes(),
            "conversions": r.hlo.conversions if r.hlo else {},
            "conversions_written": r.hlo_before.conversions if r.hlo_before else {},
            "fusion_kinds": r.hlo.fusion_kinds if r.hlo else {},
            "conv_layouts": self.conv_layouts(),
            "convolutions": [row.to_dict() for row in self.conv_rows()],
            "cost": {k: v for k, v in r.cost.items() if k != "raw"},
            "memory": r.memory,
            "auto_layout": self.auto_layouts(),
        }
        if include_compile:
            out["compile"] = r.to_dict(include_text=False)
            if self.auto is not None:
                out["compile_auto"] = self.auto.to_dict(include_text=False)
        return json.loads(json.dumps(out, default=str))

    def to_json(self, path: str | os.PathLike | None = None, **kw) -> str:
        """The ``to_dict`` as JSON text, also written to ``path`` when given."""
        text = json.dumps(self.to_dict(**kw), indent=2)
        if path is not None:
            write_text(path, text + "\n")
        return text

    def file_stem(self) -> str:
        """``resnet18_NCHW_mixed_bf16_train_cpu``: a name for files about this report."""
        parts = (self.model, self.layout, self.precision, self.mode, self.report.platform)
        # Non-default conv settings only, so the default names stay what they always were.
        parts += tuple(
            p
            for p, default in ((self.conv_algorithm, "xla"), (self.kernel_storage, "layout"))
            if p != default
        )
        return "_".join(re.sub(r"[^\w.\-]+", "-", str(p)) for p in parts)

    def dump_hlo(self, folder: str | os.PathLike) -> list[str]:
        """Write the pre-optimization and optimized HLO texts (and the AUTO compile's);
        returns the paths written."""
        written = []
        for suffix, report in (("", self.report), ("_auto", self.auto)):
            if report is None:
                continue
            for stage, text in (
                ("before_optimizations", report.pre_hlo_text),
                ("after_optimizations", report.hlo_text),
            ):
                if text:
                    name = f"{self.file_stem()}{suffix}.{stage}.hlo.txt"
                    written.append(write_text(os.path.join(folder, name), text))
        return written

    def title(self) -> str:
        kw = ", ".join(f"{k}={v}" for k, v in self.model_kwargs.items())
        return (
            f"{self.model}({kw}) {self.layout} {self.precision} {self.mode}, input "
            f"{list(self.input_shape)}, on {self.backend} ({self.device})"
        )

    def _conv_options_line(self) -> str:
        line = f"  conv algorithm {self.conv_algorithm}; kernel storage {self.kernel_storage}"
        if self.missing_choices is not None:
            line += (
                f"; auto: {self.missing_choices} of {self.conv_shapes} convs have no conv plan "
                "entry for their shape and run xla (inspect does not autotune; pass a plan "
                "from `layoutlab autotune convs --out plan.json` with --conv-plan)"
            )
        for path, name in (self.conv_plan or {}).items():
            line += f"\n    plan: {path or '(model)'} -> {name}"
        return line

    def summary(self) -> str:
        r, t = self.report, self.totals()
        h = r.hlo
        mb = lambda v: "n/a" if v is None else f"{v / 2**20:.2f} MiB"
        yes_no = lambda v: "n/a" if v is None else ("yes" if v else "no")
        lines = [
            self.title(),
            f"  jax {r.versions['jax']}, jaxlib {r.versions['jaxlib']}; policy {self.policy}; "
            f"loss scale {self.loss_scale}",
            f"  build {self.build_seconds:.2f} s, lower {r.lower_seconds:.2f} s, compile "
            f"{r.compile_seconds:.2f} s; persistent cache hit: {yes_no(r.cache_hit)}",
            f"  flags: compiler_options={r.flags['compiler_options']} "
            f"XLA_FLAGS={r.flags['XLA_FLAGS']}",
            f"  cost: {_num(t['flops'])} flops, {_num(t['bytes_accessed'])} bytes accessed",
            f"  memory: arguments {mb(t['argument_bytes'])}, outputs {mb(t['output_bytes'])}, "
            f"aliased {mb(t['alias_bytes'])}, temp {mb(t['temp_bytes'])}, "
            f"peak {mb(t['peak_bytes'])}",
            f"  logical layout {self.layout} (kernels {self.kernel_layout}); "
            f"{self.num_conv_kernels} conv layers, {t['convolutions']} convolutions in the "
            "compiled program",
            self._conv_options_line(),
            f"  transposes: {t['transposes']} ({t['kernel_transposes']} kernel-shaped: conv "
            f"weights or their gradients; {t['activation_transposes']} of activations; "
            f"{t['other_transposes']} other), "
            f"{_num(t['transpose_bytes'])} bytes",
            f"  copies: {t['copies']}, {_num(t['copy_bytes'])} bytes; memory permutations: "
            f"{t['memory_permutations']}, {_num(t['memory_permutation_bytes'])} bytes",
            f"  converts: {t['converts']} {h.conversions if h else {}}, "
            f"{_num(t['convert_bytes'])} bytes (written in the program: "
            f"{self.hlo_before.conversions if self.hlo_before else 'n/a'})",
            f"  fusions: {t['fusions']} {h.fusion_kinds if h else {}}",
            "  conv layouts (logical => physical): "
            + ", ".join(f"{k}: {v}" for k, v in self.conv_layouts().items()),
        ]
        auto = self.auto_layouts()
        if auto is not None:
            lines.append(_auto_summary(auto))
        lines.append("  " + format_conv_rows(self.conv_rows()).replace("\n", "\n  "))
        return "\n".join(lines)


def _num(v) -> str:
    return "n/a" if v is None else f"{int(v):,}"


def _auto_summary(auto: dict) -> str:
    if "error" in auto:
        return f"  Layout.AUTO: refused by the backend: {auto['error']}"
    p, im, o = auto["params"], auto["images"], auto["outputs"]

    def changed(section):
        return "; ".join(
            f"{c['path']} {c['shape']} stored as {c['physical'] or c['major_to_minor']}"
            for c in section["changed"][:6]
        ) + (" ..." if len(section["changed"]) > 6 else "")

    lines = [
        f"  Layout.AUTO: XLA chose non-row-major layouts for {p['non_default']} of "
        f"{p['leaves']} parameters, {im['non_default']} of {im['leaves']} image inputs, "
        f"{o['non_default']} of {o['leaves']} outputs",
    ]
    for label, section in (("parameters", p), ("images", im), ("outputs", o)):
        if section["changed"]:
            lines.append(f"    {label}: {changed(section)}")
    d, a = auto["default"], auto["auto"]
    lines.append("    transposes default -> AUTO: " + ", ".join(f"{k} {d[k]} -> {a[k]}" for k in d))
    return "\n".join(lines)


def write_text(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` to ``path``, creating its folder; returns the path."""
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


# ---------------------------------------------------------------- building and compiling


def _check_config(mode, batch_size, image_size, model_kwargs):
    if mode not in MODES:
        raise ValueError(
            f"Unknown mode {mode!r}; use 'infer' (forward pass) or 'train' (a full training step)."
        )
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    if image_size is not None and (
        not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1
    ):
        raise ValueError(f"image_size must be a positive int or None, got {image_size!r}.")
    if model_kwargs is not None and not isinstance(model_kwargs, Mapping):
        raise ValueError(f"model_kwargs must be a dict, got {type(model_kwargs).__name__}.")
    reserved = sorted(set(model_kwargs or {}) & {"layout", "policy", "rngs", "num_classes"})
    if reserved:
        raise ValueError(
            f"model_kwargs may not set {reserved}: pass layout=, precision= and num_classes= "
            "to inspect_model instead."
        )


def build_abstract(
    name,
    layout,
    policy,
    tx,
    loss_scale,
    model_kwargs,
    *,
    conv_algorithm=None,
    kernel_storage=None,
    images=None,
    conv_plan=None,
):
    """``(defs, abstract_state, missing)``: the model and its train state as shapes,
    computing nothing, and, for ``conv_algorithm="auto"`` with ``images`` given,
    ``(auto convs without a ``conv_plan`` entry for their shape, auto convs)`` (else None).

    Building inside ``jax.eval_shape`` skips the weight initialisation, whose many small
    eager ops would otherwise each be compiled once; only shapes matter to a compile. The
    conv settings are applied before the train state is made, so the state holds the kernels
    in the stored order the compiled program reads.
    """
    box = {"missing": None}

    def build():
        model = models.create(name, layout=layout, policy=policy, **model_kwargs)
        configure_convs(model, conv_algorithm, kernel_storage)
        if conv_algorithm == "auto":
            model = with_conv_plan(model, conv_plan)
        if conv_algorithm == "auto" and images is not None and _has_2d_convs(model):
            box["missing"] = plan_coverage(model, images)
        box["defs"], state = create_train_state(model, tx, loss_scale)
        return state

    state = jax.eval_shape(build)
    return box["defs"], state, box["missing"]


def _has_2d_convs(model) -> bool:
    return any(conv.layout.num_spatial == 2 for _, conv in convs(model))


def default_optimizer() -> optax.GradientTransformation:
    """SGD with momentum 0.9, skipping non-finite steps, as the inspected training step."""
    return skip_nonfinite(optax.sgd(0.1, momentum=0.9))


def inspect_model(
    model: str,
    *,
    layout: str = "NHWC",
    precision: str = "fp32",
    mode: str = "infer",
    batch_size: int = 32,
    image_size: int | None = None,
    stem: str | None = None,
    backend: str | None = "cpu",
    flags: dict | None = None,
    model_kwargs: dict | None = None,
    auto_layout: bool = False,
    num_classes: int = 10,
    conv_algorithm: str = "xla",
    kernel_storage: str = "layout",
    conv_plan=None,
) -> ModelInspection:
    """Compile a registry model's forward (``mode="infer"``) or training step (``"train"``)
    ahead of time and report what XLA did with its layouts and precision.

    ``conv_algorithm`` (``"xla"``, ``"auto"`` or a name from
    ``nn.conv_algos.algorithm_names()``) and ``kernel_storage`` (``"layout"`` or
    ``"channels_last"``) are set on every conv (``nn.configure_convs``) before compiling.
    ``"auto"`` convs run ``conv_plan`` (a ``ConvPlan`` or its dict; None: xla); nothing is
    autotuned here.
    """
    plan = as_plan(conv_plan)
    _check_config(mode, batch_size, image_size, model_kwargs)
    check_conv_options(conv_algorithm, kernel_storage)
    be = resolve_backend(backend)  # fail fast, before anything is built
    s = models.spec(model)
    lay = models.resolve_layout(layout, s.num_spatial)
    policy = get_policy(precision)
    kwargs = dict(model_kwargs or {})
    if stem is not None:
        kwargs["stem"] = stem
    if mode == "train" and s.task != "classification":
        raise ValueError(
            f"mode='train' compiles the classification training step, and {s.name!r} is a "
            f"{s.task} model; inspect it with mode='infer'."
        )
    spatial = None if image_size is None else (image_size,) * s.num_spatial
    shape = s.input_shape(batch_size, lay, spatial=spatial)
    loss_scale = get_loss_scale("dynamic" if policy.needs_loss_scaling else None)
    tx = default_optimizer()

    images = jax.ShapeDtypeStruct(shape, jnp.float32)
    t0 = time.perf_counter()
    defs, state, missing = build_abstract(
        s.name,
        lay,
        policy,
        tx,
        loss_scale,
        dict(kwargs, num_classes=num_classes),
        conv_algorithm=conv_algorithm,
        kernel_storage=kernel_storage,
        images=images,
        conv_plan=plan,
    )
    build_seconds = time.perf_counter() - t0

    if mode == "infer":
        fn, args, donate = make_forward(defs), (state, images), ()
    else:
        labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
        # The state is donated, as a training loop does, so its buffers are reused in place.
        fn, args, donate = make_train_step(defs, tx), (state, images, labels), (0,)

    def compile_with(**formats):
        return compile_report(
            fn, *args, backend=be.name, flags=flags, donate_argnums=donate, **formats
        )

    report = compile_with()
    auto = auto_error = None
    if auto_layout:
        try:
            auto = compile_with(in_formats="auto", out_formats="auto")
        except (LayoutUnsupportedError, LayoutAPIUnavailable) as err:
            auto_error = str(err)
    return ModelInspection(
        model=s.name,
        layout=lay.value,
        kernel_layout=(
            channels_last(lay.num_spatial).kernel_layout
            if kernel_storage == "channels_last"
            else lay.kernel_layout
        ),
        precision=str(precision),
        policy=str(policy),
        mode=mode,
        batch_size=batch_size,
        input_shape=tuple(shape),
        model_kwargs=kwargs,
        loss_scale=type(loss_scale).__name__,
        num_conv_kernels=count_conv_kernels(state.params),
        build_seconds=build_seconds,
        report=report,
        auto=auto,
        auto_error=auto_error,
        kernel_shapes=_kernel_shapes(state.params),
        conv_algorithm=conv_algorithm,
        kernel_storage=kernel_storage,
        missing_choices=None if missing is None else missing[0],
        conv_shapes=None if missing is None else missing[1],
        conv_plan=plan.algorithms() if conv_algorithm == "auto" else None,
    )


# ---------------------------------------------------------------- NHWC vs NCHW


@dataclasses.dataclass
class ModelLayoutComparison:
    """The same configuration compiled channels-last and channels-first."""

    inspections: dict[str, ModelInspection]  # {"NHWC": ..., "NCHW": ...}

    def table(self, keys: tuple[str, ...] = TABLE_KEYS) -> str:
        """Key totals side by side, then each layout's conv layouts."""
        labels = list(self.inspections)
        totals = {k: self.inspections[k].totals() for k in labels}
        width = max(len(k) for k in keys)
        cols = [max(len(label), 14) for label in labels]
        lines = [
            " " * width + "  " + "  ".join(f"{lb:>{w}}" for lb, w in zip(labels, cols, strict=True))
        ]
        for key in keys:
            cells = "  ".join(
                f"{_cell(totals[lb].get(key)):>{w}}" for lb, w in zip(labels, cols, strict=True)
            )
            lines.append(f"{key:<{width}}  {cells}")
        for label in labels:
            layouts = self.inspections[label].conv_layouts()
            lines.append(
                f"conv layouts {label}: " + ", ".join(f"{k}: {v}" for k, v in layouts.items())
            )
        return "\n".join(lines)

    def summary(self) -> str:
        first = next(iter(self.inspections.values()))
        head = (
            f"{first.model} {first.precision} {first.mode}, batch {first.batch_size}, conv "
            f"algorithm {first.conv_algorithm}, kernel storage {first.kernel_storage}, on "
            f"{first.backend} ({first.device}): " + " vs ".join(self.inspections)
        )
        for label, ins in self.inspections.items():
            if ins.missing_choices is not None:
                head += (
                    f"\n{label}: {ins.missing_choices} of {ins.conv_shapes} convs have no "
                    "conv plan entry for their shape and run xla"
                )
        return head + "\n" + self.table()

    def to_dict(self, **kw) -> dict:
        return {label: ins.to_dict(**kw) for label, ins in self.inspections.items()}

    def to_json(self, path: str | os.PathLike | None = None, **kw) -> str:
        text = json.dumps(self.to_dict(**kw), indent=2)
        if path is not None:
            write_text(path, text + "\n")
        return text


def _cell(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.3g}"
    return f"{int(v):,}"


def compare_model_layouts(model: str, **kwargs) -> ModelLayoutComparison:
    """``inspect_model`` in the channels-last and the channels-first layout of the model;
    ``kwargs`` (``conv_algorithm=``, ``kernel_storage=``, ...) go to both."""
    if "layout" in kwargs:
        raise ValueError("compare_model_layouts compiles both layouts; do not pass layout=.")
    s = models.spec(model)
    out = {}
    for lay in (channels_last(s.num_spatial), channels_first(s.num_spatial)):
        out[lay.value] = inspect_model(model, layout=lay.value, **kwargs)
    return ModelLayoutComparison(out)
