"""One model configuration compiled channels-last and channels-first, side by side."""

from __future__ import annotations

import dataclasses
import os

from layoutlab import models
from layoutlab.layout import channels_first, channels_last
from layoutlab.xla.inspect import inspect_model
from layoutlab.xla.inspection import ModelInspection, json_text

__all__ = ["ModelLayoutComparison", "compare_model_layouts", "format_total"]

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
                f"{format_total(totals[lb].get(key)):>{w}}"
                for lb, w in zip(labels, cols, strict=True)
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
            f"algorithm {first.conv_algorithm}, kernel storage {first.kernel_storage}, "
            f"activation storage {first.activation_storage}, on "
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
        return json_text(self.to_dict(**kw), path)


def format_total(v, float_format: str = ".3g") -> str:
    """A total as a table cell: ``n/a``, a fraction in ``float_format``, or an int with
    thousands separators."""
    if v is None:
        return "n/a"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:{float_format}}"
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
