"""Training-curve comparison: the same model, init and batch order trained in two
configurations (layout, precision policy), loss by loss, with the first step at which the
two curves leave a stated band.

The band at step ``t`` is ``|loss_b - loss_a| <= atol + rtol * |loss_a|``. Defaults:
``rtol = atol = 0.05``. Two fp32 layouts agree to ~1e-6 over tens of steps; bfloat16 compute
moves the loss by ~1e-2 early on and the gap grows slowly as the runs decorrelate; a real
problem (a wrong gradient, a loss going non-finite, an optimizer bug) opens a gap of 0.1 or
more within a few steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from layoutlab.compare.references import with_policy
from layoutlab.layout import parse_layout
from layoutlab.loss_scale import get_loss_scale
from layoutlab.nn.convert import convert_layout
from layoutlab.precision import get_policy
from layoutlab.train.run_precision import AUTO_LOSS_SCALE, resolve_loss_scale

__all__ = [
    "DEFAULT_RTOL",
    "DEFAULT_ATOL",
    "RunConfig",
    "CurveReport",
    "parse_config",
    "compare_curves",
    "train_losses",
    "compare_training",
]

DEFAULT_RTOL = 0.05
DEFAULT_ATOL = 0.05


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One side of a curve comparison: a layout and a precision policy (and, for float16
    compute, a loss scale; ``None`` picks ``"dynamic"`` when the policy needs one)."""

    layout: str = "NHWC"
    policy: str = "fp32"
    loss_scale: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "layout", parse_layout(self.layout).value)
        get_policy(self.policy)  # validate early

    @property
    def label(self) -> str:
        return f"{self.layout}/{self.policy}"

    def loss_scale_name(self) -> str | None:
        """The loss-scale name this side trains with (``train.run_precision``'s rule for None)."""
        return resolve_loss_scale(self.loss_scale or AUTO_LOSS_SCALE, get_policy(self.policy))


def parse_config(text: str) -> RunConfig:
    """``"NCHW/mixed_bf16"``, ``"NHWC"`` or ``"mixed_fp16"`` -> ``RunConfig``."""
    layout, policy = "NHWC", "fp32"
    for part in (p.strip() for p in text.split("/") if p.strip()):
        if part.upper() in ("NHWC", "NCHW", "NWC", "NCW", "NDHWC", "NCDHW"):
            layout = part
        else:
            policy = part
    return RunConfig(layout, policy)


@dataclasses.dataclass(frozen=True)
class CurveReport:
    """Two loss curves, step by step, and where they first leave the band."""

    labels: tuple[str, str]
    losses_a: tuple[float, ...]
    losses_b: tuple[float, ...]
    rtol: float
    atol: float
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.losses_a)

    def band(self, step: int) -> float:
        return self.atol + self.rtol * abs(self.losses_a[step])

    def diff(self, step: int) -> float:
        a, b = self.losses_a[step], self.losses_b[step]
        if not (math.isfinite(a) and math.isfinite(b)):
            return 0.0 if (a == b or (math.isnan(a) and math.isnan(b))) else math.inf
        return abs(b - a)

    @property
    def drifted(self) -> tuple[int, ...]:
        return tuple(t for t in range(self.steps) if not self.diff(t) <= self.band(t))

    @property
    def first_drift_step(self) -> int | None:
        """The first step (0-based) whose losses differ by more than the band."""
        drifted = self.drifted
        return drifted[0] if drifted else None

    @property
    def passed(self) -> bool:
        return self.first_drift_step is None

    @property
    def max_diff(self) -> float:
        return max((self.diff(t) for t in range(self.steps)), default=0.0)

    def __str__(self) -> str:
        return format_curves(self)

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)

        return {
            "labels": list(self.labels),
            "rtol": self.rtol,
            "atol": self.atol,
            "passed": self.passed,
            "first_drift_step": self.first_drift_step,
            "max_diff": num(self.max_diff),
            "settings": json.loads(json.dumps(self.settings, default=str)),
            "losses_a": [num(x) for x in self.losses_a],
            "losses_b": [num(x) for x in self.losses_b],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CurveReport:
        return cls(
            labels=tuple(data["labels"]),
            losses_a=tuple(float(x) for x in data["losses_a"]),
            losses_b=tuple(float(x) for x in data["losses_b"]),
            rtol=float(data["rtol"]),
            atol=float(data["atol"]),
            settings=dict(data.get("settings", {})),
        )


def format_curves(r: CurveReport, max_rows: int = 40) -> str:
    first = r.first_drift_step
    verdict = (
        f"PASSED (all {r.steps} steps within the band)"
        if first is None
        else f"FAILED (first drift at step {first}; {len(r.drifted)} of {r.steps} steps out)"
    )
    lines = [
        f"training curves: {r.labels[1]} vs reference {r.labels[0]}: {verdict}",
        f"  band: |loss_b - loss_a| <= {r.atol:g} + {r.rtol:g} * |loss_a|",
    ]
    lines += [f"  {k}: {v}" for k, v in r.settings.items()]
    stride = max(1, math.ceil(r.steps / max_rows))
    shown = sorted(set(range(0, r.steps, stride)) | ({first} if first is not None else set()))
    head = ("step", f"loss {r.labels[0]}", f"loss {r.labels[1]}", "|diff|", "band", "")
    rows = [
        (
            str(t),
            f"{r.losses_a[t]:.6f}",
            f"{r.losses_b[t]:.6f}",
            f"{r.diff(t):.3g}",
            f"{r.band(t):.3g}",
            "DRIFT" if t in r.drifted else "",
        )
        for t in shown
    ]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def compare_curves(
    losses_a: Sequence[float],
    losses_b: Sequence[float],
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    labels: tuple[str, str] = ("a", "b"),
    settings: dict | None = None,
) -> CurveReport:
    """Compare two loss curves (``a`` is the reference) step by step."""
    if len(losses_a) != len(losses_b):
        raise ValueError(
            f"The curves have different lengths ({len(losses_a)} and {len(losses_b)} steps); "
            "compare runs of the same number of steps."
        )
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}.")
    return CurveReport(
        labels=tuple(labels),
        losses_a=tuple(float(x) for x in losses_a),
        losses_b=tuple(float(x) for x in losses_b),
        rtol=float(rtol),
        atol=float(atol),
        settings=dict(settings or {}),
    )


def _optimizer(learning_rate: float) -> optax.GradientTransformation:
    from layoutlab.train.skip import skip_nonfinite

    return skip_nonfinite(optax.sgd(learning_rate, momentum=0.9))


def train_losses(
    model: nnx.Module,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    learning_rate: float = 0.05,
    loss_scale: str | None = None,
) -> np.ndarray:
    """The training loss at each step of ``model`` (left untouched) over ``batches``, with
    ``layoutlab.train.steps.make_train_step`` and SGD with momentum 0.9."""
    from layoutlab.train.state import create_train_state
    from layoutlab.train.steps import make_train_step

    tx = _optimizer(learning_rate)
    defs, state = create_train_state(nnx.clone(model), tx, get_loss_scale(loss_scale))
    step = jax.jit(make_train_step(defs, tx))
    losses = []
    for images, labels in batches:
        state, metrics = step(state, images, labels)
        losses.append(metrics["loss"])
    return np.asarray(jax.device_get(losses), np.float64)


def compare_training(
    model: nnx.Module,
    a: RunConfig | str,
    b: RunConfig | str,
    *,
    dataset: Any = "synthetic:16x16x3:10:512",
    steps: int = 20,
    batch_size: int = 16,
    learning_rate: float = 0.05,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> CurveReport:
    """Train ``model``'s weights ``steps`` steps in configuration ``a`` and in ``b`` (same
    init: ``b``'s model is ``a``'s converted with ``convert_layout``/``with_policy``; same
    batches in the same order) and compare the loss curves.

    ``dataset`` is a data source (``layoutlab.data.get_dataset``) or a ``Dataset``; its
    images must fit the model.
    """
    from layoutlab.data.loader import train_batches
    from layoutlab.data.source import get_dataset

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}.")
    a = parse_config(a) if isinstance(a, str) else a
    b = parse_config(b) if isinstance(b, str) else b
    data = get_dataset(dataset, seed=seed) if isinstance(dataset, str) else dataset
    curves = []
    for cfg in (a, b):
        run_model = with_policy(convert_layout(model, cfg.layout), cfg.policy)
        batches = train_batches(data, batch_size, layout=cfg.layout, seed=seed, num_steps=steps)
        curves.append(
            train_losses(
                run_model,
                list(batches),
                learning_rate=learning_rate,
                loss_scale=cfg.loss_scale_name(),
            )
        )
    settings = {
        "model": type(model).__name__,
        "dataset": getattr(data, "name", str(dataset)),
        "steps": steps,
        "batch_size": batch_size,
        "optimizer": f"SGD(lr={learning_rate}, momentum=0.9)",
        "seed": seed,
    }
    return compare_curves(
        curves[0], curves[1], rtol=rtol, atol=atol, labels=(a.label, b.label), settings=settings
    )
