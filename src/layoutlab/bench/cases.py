"""One benchmark configuration: the workload (model, input, mode, batch) and how it runs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

__all__ = [
    "JaxCase",
    "MODES",
    "TorchCase",
    "Workload",
    "format_shape",
    "make_workload",
    "parse_shape",
]

MODES = ("infer", "train")


def parse_shape(text: str) -> tuple[int, ...]:
    """``"32x32x3"`` -> ``(32, 32, 3)``: spatial sizes then channels (any layout)."""
    parts = str(text).lower().replace(",", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"Input shape {text!r} is not of the form HxWxC (e.g. 32x32x3, or DxHxWxC)."
        ) from None
    if len(shape) < 2 or min(shape) < 1:
        raise ValueError(f"Input shape {text!r} needs positive spatial sizes and channels.")
    return shape


def format_shape(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What is computed, whatever the framework: a model on a batch of inputs."""

    model: str
    model_kwargs: tuple[tuple[str, object], ...]  # sorted items, so the case is hashable
    spatial: tuple[int, ...]
    channels: int
    num_classes: int
    mode: str
    batch_size: int

    @property
    def kwargs(self) -> dict:
        return dict(self.model_kwargs)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (*self.spatial, self.channels)

    def images_channels_last(self, seed: int = 0) -> np.ndarray:
        """The batch as float32 ``(N, *spatial, C)``; the same values in every layout."""
        rng = np.random.default_rng(seed)
        return rng.standard_normal((self.batch_size, *self.input_shape), dtype=np.float32)

    def labels(self, seed: int = 0) -> np.ndarray:
        """Random classes: one per image, or one per pixel for a segmentation model."""
        from layoutlab import models

        per_pixel = models.spec(self.model).per_pixel
        shape = (self.batch_size, *self.spatial) if per_pixel else (self.batch_size,)
        rng = np.random.default_rng(seed + 1)
        return rng.integers(0, self.num_classes, shape).astype(np.int32)

    def row(self) -> dict:
        return {
            "model": self.model,
            "model_kwargs": json.dumps(self.kwargs, sort_keys=True),
            "input_shape": format_shape(self.input_shape),
            "num_classes": self.num_classes,
            "mode": self.mode,
            "batch_size": self.batch_size,
        }


def make_workload(model, model_kwargs, input_shape, num_classes, mode, batch_size) -> Workload:
    return Workload(
        model=model,
        model_kwargs=tuple(sorted(dict(model_kwargs).items())),
        spatial=tuple(input_shape[:-1]),
        channels=int(input_shape[-1]),
        num_classes=int(num_classes),
        mode=mode,
        batch_size=int(batch_size),
    )


@dataclasses.dataclass(frozen=True)
class JaxCase:
    workload: Workload
    layout: str  # canonical layout name, e.g. NHWC
    precision: str  # a precision policy name or spec
    conv_algo: str = "xla"  # a layoutlab.nn.conv_algos name; "auto": a plan per shape
    kernel_storage: str = "layout"  # or "channels_last": HWIO kernels in every layout
    xla_options: tuple[tuple[str, object], ...] = ()  # sorted XLA compile options
    # Which settings these are: "fast" (layoutlab's defaults), "plain" (XLA's conv, the
    # layout's kernels, no options: --baseline-plain) or "custom" (flags changed them).
    defaults: str = "custom"
    conv_tune: str = "auto"  # where an "auto" case's plan comes from (bench.tuning.plan_source)
    # Where a channels-first model computes: "layout" or "channels_last" (NHWC inside).
    activation_storage: str = "layout"
    # The train step's optimizer: "train" (what `layoutlab train` runs) or "pytorch" (the
    # PyTorch runner's SGD with momentum); train.spec.OPTIMIZER_CHOICES.
    optimizer: str = "train"

    @property
    def compiler_options(self) -> dict | None:
        return dict(self.xla_options) or None

    def row(self) -> dict:
        from layoutlab.bench.results import precision_class

        return {
            **self.workload.row(),
            "framework": "layoutlab",
            "layout": self.layout,
            "precision": self.precision,
            "precision_class": precision_class(self.precision),
            "conv_algo": self.conv_algo,
            "kernel_storage": self.kernel_storage,
            "activation_storage": self.activation_storage,
            "xla_options": json.dumps(dict(self.xla_options), sort_keys=True),
            "defaults": self.defaults,
        }


@dataclasses.dataclass(frozen=True)
class TorchCase:
    workload: Workload
    memory_format: str  # contiguous | channels_last
    precision: str  # fp32 | amp_bf16 | amp_fp16
    compile: bool = False

    @property
    def layout(self) -> str:
        """The physical order of the memory format: channels_last is NHWC (NDHWC in 3D)."""
        spatial = "DHW"[-len(self.workload.spatial) :]
        last = self.memory_format == "channels_last"
        return f"N{spatial}C" if last else f"NC{spatial}"

    def row(self) -> dict:
        train = self.workload.mode == "train"
        return {
            **self.workload.row(),
            "framework": "torch.compile" if self.compile else "torch",
            "optimizer": "torch.optim.SGD(lr=0.01, momentum=0.9)" if train else None,
            "layout": self.layout,
            "memory_format": self.memory_format,
            "precision": self.precision,
            "precision_class": "fp32" if self.precision == "fp32" else "half",
        }
