"""``ModelInspection``: what XLA made of one model configuration, as totals, per-conv rows,
transposes by kind, the layouts chosen under ``Layout.AUTO``, a text summary, JSON and HLO
files."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from typing import Any

from layoutlab.xla.compile import CompileReport
from layoutlab.xla.conv_rows import ConvRow, format_conv_rows, match_convs
from layoutlab.xla.hlo import HloReport, onednn_line
from layoutlab.xla.transpose_kinds import transposes_by_kind

__all__ = ["ModelInspection", "json_text", "write_text"]


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
    activation_storage: str = "layout"  # "channels_last": an NCHW model computing in NHWC
    # "auto" convs with no conv plan entry for their shape (they run xla); None unless auto
    missing_choices: int | None = None
    conv_shapes: int | None = None  # "auto" 2D convs, counted when auto
    conv_plan: dict | None = None  # the plan's {path: algorithm} when auto
    optimizer: str | None = None  # the training step's (OptimizerSpec.label); None: infer
    spec: Any = dataclasses.field(default=None, repr=False, compare=False)  # train.spec.RunSpec

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
            "onednn_convs": t.get("onednn_convs"),
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
            "activation_storage": self.activation_storage,
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
            "optimizer": self.optimizer,
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
            "onednn_convs": r.hlo.onednn_convs() if r.hlo else {},
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
        return json_text(self.to_dict(**kw), path)

    def file_stem(self) -> str:
        """``resnet18_NCHW_mixed_bf16_train_cpu``: a name for files about this report."""
        parts = (self.model, self.layout, self.precision, self.mode, self.report.platform)
        # Non-default conv settings only, so the default names stay what they always were.
        parts += tuple(
            p
            for p, default in ((self.conv_algorithm, "xla"), (self.kernel_storage, "layout"))
            if p != default
        )
        if self.activation_storage != "layout":  # "channels_last" would read as the kernels'
            parts += ("channels_last_inside",)
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
        line = (
            f"  conv algorithm {self.conv_algorithm}; kernel storage {self.kernel_storage}; "
            f"activation storage {self.activation_storage}"
        )
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
            f"loss scale {self.loss_scale}"
            + (f"; optimizer {self.optimizer}" if self.optimizer else ""),
            f"  build {self.build_seconds:.2f} s, lower {r.lower_seconds:.2f} s, compile "
            f"{r.compile_seconds:.2f} s; persistent cache hit: {yes_no(r.cache_hit)}",
            f"  flags: compiler_options={r.flags['compiler_options']} "
            f"XLA_FLAGS={r.flags['XLA_FLAGS']}",
            f"  cost: {_num(t['flops'])} flops, {_num(t['bytes_accessed'])} bytes accessed",
            f"  memory: arguments {mb(t['argument_bytes'])}, outputs {mb(t['output_bytes'])}, "
            f"aliased {mb(t['alias_bytes'])}, temp {mb(t['temp_bytes'])}, "
            f"peak {mb(t['peak_bytes'])}",
            f"  logical layout {self.layout} (kernels {self.kernel_layout}); "
            f"{self.num_conv_kernels} conv layers, {t['convolutions']} XLA convolutions in the "
            f"compiled program; {onednn_line(h.onednn_convs() if h else {})}",
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


def json_text(data: dict, path: str | os.PathLike | None = None) -> str:
    """``data`` as indented JSON text, also written to ``path`` when given."""
    text = json.dumps(data, indent=2)
    if path is not None:
        write_text(path, text + "\n")
    return text
