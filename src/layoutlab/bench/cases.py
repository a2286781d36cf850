"""One benchmark configuration: the workload (model, input, mode, batch) and how it runs
(a layoutlab run as its ``TrainConfig``, or PyTorch's memory format and precision)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from layoutlab.train.config import TrainConfig

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
    """A layoutlab configuration: ``run`` on ``workload``'s batches. ``run`` is the
    ``TrainConfig`` its step is resolved from (``train.spec.resolve_spec``, as for
    ``layoutlab train``): its model, kwargs and batch size are the workload's, its
    ``xla_options`` the compile options of the workload's mode, with ``cpu_fast``'s
    already in them (so ``cpu_fast`` is off). A sweep makes one per point of its axes
    (``bench.sweep_cases``); ``JaxCase.of`` makes one by hand."""

    workload: Workload
    run: TrainConfig
    # Which settings these are: "fast" (layoutlab's defaults), "plain" (XLA's conv, the
    # layout's kernels, no options: --baseline-plain) or "custom" (flags changed them).
    defaults: str = "custom"
    conv_tune: str = "auto"  # where an "auto" case's plan comes from (bench.tuning.plan_source)

    def __post_init__(self):
        w, run = self.workload, self.run
        if (run.model, dict(run.model_kwargs), run.batch_size) != (w.model, w.kwargs, w.batch_size):
            raise ValueError(
                f"A JaxCase's run ({run.model} {run.model_kwargs} b{run.batch_size}) must be "
                f"its workload's ({w.model} {w.kwargs} b{w.batch_size})."
            )

    @classmethod
    def of(
        cls,
        workload: Workload,
        optimizer: str = "train",
        *,
        defaults: str = "custom",
        conv_tune: str = "auto",
        xla_options=(),
        **fields,
    ) -> JaxCase:
        """A case of ``workload`` whose run is ``train.spec.config_for(optimizer, **fields)``
        (layout, precision, conv settings, ...) on the workload's model and batch, compiled
        with ``xla_options`` (a dict or items) alone; conv settings not given are XLA's conv
        with the layout's kernels and activations, as a plain XLA step."""
        from layoutlab.train.spec import config_for

        plain = {
            "conv_algorithm": "xla",
            "kernel_storage": "layout",
            "activation_storage": "layout",
        }
        run = config_for(
            optimizer,
            **{**plain, **fields},
            model=workload.model,
            model_kwargs=workload.kwargs,
            batch_size=workload.batch_size,
            xla_options=dict(xla_options),
            cpu_fast=False,
        )
        return cls(workload, run, defaults, conv_tune)

    @property
    def layout(self) -> str:  # canonical layout name, e.g. NHWC
        return self.run.layout

    @property
    def precision(self) -> str:  # a policy name
        return self.run.precision

    @property
    def conv_algo(self) -> str:  # a layoutlab.nn.conv_algos name; "auto": a plan per shape
        return self.run.conv_algorithm

    @property
    def kernel_storage(self) -> str:
        return self.run.kernel_storage

    @property
    def activation_storage(self) -> str:
        return self.run.activation_storage

    @property
    def xla_options(self) -> tuple[tuple[str, object], ...]:
        """The compile options as sorted items."""
        return tuple(sorted(self.run.xla_options.items()))

    @property
    def compiler_options(self) -> dict | None:
        return dict(self.run.xla_options) or None

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
            "layer_impl": self.run.layer_impl,
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
