"""Layer-by-layer comparison of two runs of one architecture: every layer's output in
execution order and every parameter's gradient in backprop order, naming the first layer out
of tolerance, which is where the divergence starts.

Layer outputs are recorded by a small recorder of our own rather than ``nnx.capture(...,
method_outputs=...)``: on flax 0.12.8 that returns the outputs as a path-sorted ``State``
(execution order is lost) and sows every public method, containers included. Our recorder
wraps the ``__call__`` of the recorded modules' classes for the duration of one traced call,
keeps outputs in call order, and numbers repeated calls of one module (``pool``,
``pool#2``).

Layer paths use the PyTorch naming: ``Sequential``'s inner ``layers`` list is dropped, so
``features.layers.0.layers.1`` reads ``features.0.1`` and ``layer1[0].downsample[0]`` reads
``layer1.0.downsample.0``, the ``named_modules()`` names of the torch mirrors.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layoutlab.compare.report import CompareReport, compare, fmt_float
from layoutlab.layout import Layout, to_layout
from layoutlab.nn.base import LayoutModule
from layoutlab.nn.convert import convert_layout

__all__ = [
    "LayerOutput",
    "LayerRecorder",
    "LayerTolerance",
    "LayerRow",
    "LayerwiseReport",
    "MATMUL_PRECISION",
    "highest_precision",
    "module_paths",
    "canonical_path",
    "model_layout",
    "set_mode",
    "record_layers",
    "layer_outputs",
    "compare_records",
    "compare_layerwise",
    "parameter_grads",
    "compare_grad_trees",
    "compare_gradients",
    "loss_fn",
]

MATMUL_PRECISION = "highest"


@contextlib.contextmanager
def highest_precision() -> Iterator[str]:
    """JAX matmuls and convs at full float32 precision (no TF32/bf16 passes on GPU/TPU)."""
    with jax.default_matmul_precision(MATMUL_PRECISION):
        yield MATMUL_PRECISION


# --------------------------------------------------------------------------- paths


def _module_table(model: nnx.Module) -> dict[tuple, Any]:
    return {tuple(path): node for path, node in nnx.iter_modules(model)}


def canonical_path(path: Sequence[Any], nodes: dict[tuple, Any]) -> str:
    """Dotted PyTorch-style name of ``path``: the ``layers`` list of a Sequential is dropped."""
    parts = []
    for i, key in enumerate(path):
        if key == "layers" and isinstance(nodes.get(tuple(path[: i + 1])), nnx.List):
            continue
        parts.append(str(key))
    return ".".join(parts)


def module_paths(model: nnx.Module, *, include_containers: bool = False) -> dict[int, tuple]:
    """``{id(module): (canonical path, op name)}`` of the modules a layerwise run records:
    the leaf layers, plus every container with ``include_containers``."""
    nodes = _module_table(model)
    paths = [p for p, node in nodes.items() if p and not isinstance(node, nnx.List)]
    parents = {p[:i] for p in paths for i in range(1, len(p))}
    result = {}
    for path in paths:
        if path in parents and not include_containers:
            continue
        node = nodes[path]
        result[id(node)] = (canonical_path(path, nodes), type(node).__name__)
    return result


def model_layout(model: nnx.Module) -> Layout:
    """The layout of a model built from ``layoutlab.nn`` (its ``layout`` attribute or its
    first layout-aware layer's)."""
    layout = getattr(model, "layout", None)
    if isinstance(layout, Layout):
        return layout
    for _, node in nnx.iter_modules(model):
        if isinstance(node, LayoutModule):
            return node.layout
    raise ValueError(f"{type(model).__name__} has no layoutlab.nn layer; cannot tell its layout.")


def set_mode(model: nnx.Module, train: bool) -> nnx.Module:
    """A copy of ``model`` in train mode (batch statistics) or eval mode (running ones).

    Dropout is off in both: a comparison needs both sides to see the same values, and two
    frameworks (or two layouts) draw different dropout masks.
    """
    if any(getattr(node, "remat", False) is True for _, node in nnx.iter_modules(model)):
        raise ValueError(
            f"{type(model).__name__} was built with remat=True: its blocks run inside "
            "nnx.remat, which hides their layers from a layerwise comparison; build it with "
            "remat=False (the numerics are the same)."
        )
    model = nnx.clone(model)
    if train:
        model.train()
    else:
        model.eval()
    model.set_attributes(deterministic=True, raise_if_not_found=False)
    return model


# --------------------------------------------------------------------------- recording


class LayerOutput(NamedTuple):
    """One recorded call: the layer's path, its class name and its output array."""

    path: str
    op: str
    value: Any


class LayerRecorder:
    """Collects ``LayerOutput``s of the tracked modules, numbering repeated calls."""

    def __init__(self, tracked: dict[int, tuple]):
        self.tracked = tracked
        self.records: list[LayerOutput] = []
        self.calls: dict[str, int] = {}

    def add(self, module: Any, output: Any) -> None:
        entry = self.tracked.get(id(module))
        if entry is None or not isinstance(output, jax.Array | np.ndarray):
            return
        path, op = entry
        n = self.calls.get(path, 0) + 1
        self.calls[path] = n
        self.records.append(LayerOutput(path if n == 1 else f"{path}#{n}", op, output))


_ACTIVE: contextvars.ContextVar[LayerRecorder | None] = contextvars.ContextVar(
    "layoutlab_layer_recorder", default=None
)


def _wrap(call: Callable) -> Callable:
    def wrapper(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        recorder = _ACTIVE.get()
        if recorder is not None:
            recorder.add(self, out)
        return out

    wrapper._layoutlab_recording = True  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def _patched(classes: set[type]) -> Iterator[None]:
    # Resolve every original before patching any, so a subclass never calls its parent's
    # wrapper (which would record the same call twice).
    originals = {cls: (cls.__dict__.get("__call__"), cls.__call__) for cls in classes}
    try:
        for cls, (_, call) in originals.items():
            if not getattr(call, "_layoutlab_recording", False):
                cls.__call__ = _wrap(call)
        yield
    finally:
        for cls, (own, _) in originals.items():
            if own is None:
                with contextlib.suppress(AttributeError):
                    del cls.__call__
            else:
                cls.__call__ = own


def record_layers(
    model: nnx.Module, x: Any, *, include_containers: bool = False, call: Callable | None = None
) -> tuple[Any, list[LayerOutput]]:
    """Run ``call(model, x)`` (default ``model(x)``) and return ``(output, layer outputs)``
    in execution order. Works eagerly and under ``jax.jit``; the model must not use
    ``remat`` (its layers run inside a transform that hides them)."""
    tracked = module_paths(model, include_containers=include_containers)
    classes = {type(node) for _, node in nnx.iter_modules(model) if id(node) in tracked}
    recorder = LayerRecorder(tracked)
    token = _ACTIVE.set(recorder)
    try:
        with _patched(classes):
            out = call(model, x) if call is not None else model(x)
    finally:
        _ACTIVE.reset(token)
    return out, recorder.records


def layer_outputs(
    model: nnx.Module, x: Any, *, train: bool = False, include_containers: bool = False
) -> tuple[np.ndarray, list[LayerOutput]]:
    """Compile one forward of ``model`` on ``x`` that returns every layer's output.

    ``train`` picks batch statistics (True) or running statistics (False); ``model`` itself
    is not changed (its running statistics are not updated).
    """
    model = set_mode(model, train)
    graphdef, state = nnx.split(model)
    meta: list[tuple[str, str]] = []

    def run(state, x):
        out, records = record_layers(
            nnx.merge(graphdef, state), x, include_containers=include_containers
        )
        meta[:] = [(r.path, r.op) for r in records]
        return out, [r.value for r in records]

    with highest_precision():
        out, values = jax.jit(run)(state, x)
    records = [LayerOutput(p, op, np.asarray(v)) for (p, op), v in zip(meta, values, strict=True)]
    return np.asarray(out), records


# --------------------------------------------------------------------------- tolerance


class LayerTolerance(NamedTuple):
    """Per-layer closeness rule ``|a - e| <= atol_eff + rtol * |e|``.

    With ``relative_to_max`` the absolute part scales with the layer: ``atol_eff = atol *
    max|expected|``, a normwise (infinity-norm) bound. Rounding error in an output element is
    proportional to the size of the values summed into it, not to the element itself, so the
    near-zero outputs of a layer (cancellation) carry absolute errors of the layer's scale.
    A layer whose reference is (near) zero throughout, such as the gradient of a BatchNorm
    bias that a following train-mode BatchNorm cancels exactly, is rounding noise of
    ordinary-sized terms: its scale is at least ``ZERO_FLOOR`` times the median layer's.
    """

    rtol: float
    atol: float
    relative_to_max: bool = False

    def effective(self, expected: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
        """``(rtol, atol_eff)`` for one layer; ``floor`` is the least scale to assume."""
        if not self.relative_to_max:
            return float(self.rtol), float(self.atol)
        return float(self.rtol), float(self.atol) * max(_max_abs(expected), floor, 1e-30)

    def describe(self) -> str:
        atol = f"{self.atol:g} x max|expected|" if self.relative_to_max else f"{self.atol:g}"
        return f"rtol {self.rtol:g}, atol {atol}"


ZERO_FLOOR = 0.1


def _max_abs(x: np.ndarray) -> float:
    x = np.abs(np.asarray(x, np.float64))
    finite = x[np.isfinite(x)]
    return float(finite.max()) if finite.size else 0.0


def _rms(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    finite = x[np.isfinite(x)]
    return float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0


def _rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    ok = np.isfinite(a) & np.isfinite(e)
    if not ok.all():
        return math.inf
    denom = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(a - e))
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


# --------------------------------------------------------------------------- reports


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One layer (or one parameter's gradient): where it is, what it is, how far off."""

    index: int
    path: str
    op: str
    report: CompareReport
    rel_l2: float  # ||actual - expected|| / ||expected||
    rms_expected: float

    @property
    def passed(self) -> bool:
        return self.report.passed

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.report.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "path": self.path,
            "op": self.op,
            "shape": list(self.shape),
            "rel_l2": _json_float(self.rel_l2),
            "rms_expected": _json_float(self.rms_expected),
            "passed": self.passed,
            "report": self.report.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerRow:
        return cls(
            index=int(data["index"]),
            path=data["path"],
            op=data["op"],
            report=CompareReport.from_dict(data["report"]),
            rel_l2=float(data["rel_l2"]),
            rms_expected=float(data["rms_expected"]),
        )


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@dataclasses.dataclass(frozen=True)
class LayerwiseReport:
    """Per-layer comparison in execution order; ``first_failure`` is the first layer out of
    tolerance, which is where a divergence starts."""

    kind: str  # "activations" or "gradients"
    reference: str
    candidate: str
    tolerance: str
    rows: tuple[LayerRow, ...]
    settings: dict = dataclasses.field(default_factory=dict)
    unmatched_reference: tuple[str, ...] = ()
    unmatched_candidate: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> tuple[LayerRow, ...]:
        return tuple(r for r in self.rows if not r.passed)

    @property
    def first_failure(self) -> LayerRow | None:
        return next((r for r in self.rows if not r.passed), None)

    def __getitem__(self, path: str) -> LayerRow:
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(f"No layer {path!r}; layers are: {[r.path for r in self.rows]}")

    def depth_profile(self) -> list[dict[str, Any]]:
        """Error against depth (execution index): how error accumulates through the net."""
        return [
            {
                "depth": r.index,
                "path": r.path,
                "op": r.op,
                "rel_l2": r.rel_l2,
                "max_abs_error": r.report.max_abs_error,
                "max_abs_over_rms": r.report.max_abs_error / r.rms_expected
                if r.rms_expected > 0
                else math.inf,
            }
            for r in self.rows
        ]

    def __str__(self) -> str:
        return format_layerwise(self)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "kind": self.kind,
            "reference": self.reference,
            "candidate": self.candidate,
            "tolerance": self.tolerance,
            "settings": _jsonable(self.settings),
            "passed": self.passed,
            "num_rows": len(self.rows),
            "num_failed": len(self.failures),
            "first_failure": first.path if first is not None else None,
            "unmatched_reference": list(self.unmatched_reference),
            "unmatched_candidate": list(self.unmatched_candidate),
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerwiseReport:
        return cls(
            kind=data["kind"],
            reference=data["reference"],
            candidate=data["candidate"],
            tolerance=data["tolerance"],
            rows=tuple(LayerRow.from_dict(r) for r in data["rows"]),
            settings=dict(data.get("settings", {})),
            unmatched_reference=tuple(data.get("unmatched_reference", ())),
            unmatched_candidate=tuple(data.get("unmatched_candidate", ())),
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    return str(value)


_COLUMNS = ("#", "layer", "op", "shape", "max abs", "max rel", "rel L2", "cosine", "status")


def _row_cells(r: LayerRow) -> tuple[str, ...]:
    status = "ok" if r.passed else f"FAIL ({r.report.mismatches})"
    return (
        str(r.index),
        r.path,
        r.op,
        "x".join(str(s) for s in r.shape) or "()",
        fmt_float(r.report.max_abs_error),
        fmt_float(r.report.max_rel_error),
        fmt_float(r.rel_l2),
        fmt_float(r.report.cosine_similarity),
        status,
    )


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned text table with a rule under the header."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_layerwise(report: LayerwiseReport) -> str:
    what = "layer outputs" if report.kind == "activations" else "parameter gradients"
    verdict = (
        f"PASSED ({len(report.rows)} {what} within tolerance)"
        if report.passed
        else f"FAILED ({len(report.failures)} of {len(report.rows)} {what} out of tolerance)"
    )
    lines = [
        f"layerwise {report.kind}: {report.candidate} vs reference {report.reference}: {verdict}",
        f"  tolerance: {report.tolerance}",
    ]
    for key, value in report.settings.items():
        lines.append(f"  {key}: {value}")
    lines += format_table(_COLUMNS, [_row_cells(r) for r in report.rows])
    for side, paths in (
        ("reference", report.unmatched_reference),
        ("candidate", report.unmatched_candidate),
    ):
        if paths:
            more = f", ... ({len(paths) - 8} more)" if len(paths) > 8 else ""
            lines.append(f"not compared, only in the {side}: {', '.join(paths[:8])}{more}")
    first = report.first_failure
    if first is not None:
        lines += [
            "",
            f"First divergence: #{first.index} {first.path} ({first.op})",
            str(first.report),
        ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- comparing


def _to_reference_layout(value: np.ndarray, src: Layout | None, dst: Layout | None) -> np.ndarray:
    if src is None or dst is None or src == dst or value.ndim != src.rank:
        return value
    return np.asarray(to_layout(value, src, dst))


def compare_records(
    reference: Sequence[LayerOutput],
    candidate: Sequence[LayerOutput],
    tolerance: LayerTolerance,
    *,
    reference_layout: Layout | None = None,
    candidate_layout: Layout | None = None,
    kind: str = "activations",
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    settings: dict | None = None,
) -> LayerwiseReport:
    """Compare two recordings path by path, in the reference's order. Activations of the
    rank of ``candidate_layout`` are moved to ``reference_layout`` first."""
    cand = {r.path: r for r in candidate}
    ref_paths = {r.path for r in reference}
    scales = [_max_abs(np.asarray(r.value)) for r in reference if r.path in cand]
    floor = ZERO_FLOOR * float(np.median(scales)) if scales else 0.0
    rows = []
    for r in reference:
        c = cand.get(r.path)
        if c is None:
            continue
        actual = _to_reference_layout(np.asarray(c.value), candidate_layout, reference_layout)
        expected = np.asarray(r.value)
        if (
            actual.shape != expected.shape
            and np.squeeze(actual).shape == np.squeeze(expected).shape
        ):
            # e.g. torch's AdaptiveAvgPool2d((1, 1)) gives (N, C, 1, 1) where ours gives (N, C)
            actual = actual.reshape(expected.shape)
        rtol, atol = tolerance.effective(expected, floor)
        report = compare(actual, expected, rtol=rtol, atol=atol, name=r.path)
        rows.append(
            LayerRow(len(rows), r.path, c.op, report, _rel_l2(actual, expected), _rms(expected))
        )
    return LayerwiseReport(
        kind=kind,
        reference=reference_name,
        candidate=candidate_name,
        tolerance=tolerance.describe(),
        rows=tuple(rows),
        settings=dict(settings or {}),
        unmatched_reference=tuple(r.path for r in reference if r.path not in cand),
        unmatched_candidate=tuple(c.path for c in candidate if c.path not in ref_paths),
    )


def describe(model: nnx.Module) -> str:
    """``"ResNet NHWC params=float32,compute=float32,output=float32"``."""
    policy = getattr(model, "policy", None)
    return f"{type(model).__name__} {model_layout(model).value}" + (f" {policy}" if policy else "")


def compare_layerwise(
    reference: nnx.Module,
    candidate: nnx.Module,
    x: Any,
    tolerance: LayerTolerance,
    *,
    train: bool = False,
    include_containers: bool = False,
    reference_name: str | None = None,
    candidate_name: str | None = None,
) -> LayerwiseReport:
    """Run two configurations of one architecture on ``x`` (in the reference's layout) and
    compare every layer's output, the candidate's moved to the reference's layout."""
    ref_layout, cand_layout = model_layout(reference), model_layout(candidate)
    ref_out, ref_records = layer_outputs(
        reference, x, train=train, include_containers=include_containers
    )
    x_cand = _to_reference_layout(np.asarray(x), ref_layout, cand_layout)
    cand_out, cand_records = layer_outputs(
        candidate, x_cand, train=train, include_containers=include_containers
    )
    # The model output closes the table, so a divergence after the last layer shows too.
    ref_records.append(LayerOutput("(output)", "output", ref_out))
    cand_records.append(LayerOutput("(output)", "output", cand_out))
    return compare_records(
        ref_records,
        cand_records,
        tolerance,
        reference_layout=ref_layout,
        candidate_layout=cand_layout,
        reference_name=reference_name or describe(reference),
        candidate_name=candidate_name or describe(candidate),
        settings={"mode": "train" if train else "eval", "jax_matmul_precision": MATMUL_PRECISION},
    )


# --------------------------------------------------------------------------- gradients


def loss_fn(logits: jax.Array, labels: jax.Array, layout: Layout) -> jax.Array:
    """Mean softmax cross-entropy in float32; per-pixel logits have their class axis moved
    last first, so classification and segmentation models share one loss."""
    logits = logits.astype(jnp.float32)
    if logits.ndim == layout.rank:
        logits = jnp.moveaxis(logits, layout.channel_axis, -1)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def parameter_grads(
    model: nnx.Module, x: Any, labels: Any, *, train: bool = True
) -> tuple[float, nnx.State, list[str]]:
    """``(loss, grads, module order)``: gradients of ``loss_fn`` w.r.t. every ``nnx.Param``
    (an ``nnx.State`` shaped like the params) and the canonical paths of the layers in
    execution order, for ordering the gradient table."""
    model = set_mode(model, train)
    layout = model_layout(model)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    order: list[str] = []

    def loss(params, rest, x, labels):
        m = nnx.merge(graphdef, params, rest, copy=True)
        logits, records = record_layers(m, x)
        order[:] = [r.path for r in records]
        return loss_fn(logits, labels, layout)

    with highest_precision():
        value, grads = jax.jit(jax.value_and_grad(loss))(params, rest, x, labels)
    return float(value), grads, order


def grads_to_layout(model: nnx.Module, grads: nnx.State, layout: Layout) -> nnx.State:
    """Move a gradient tree of ``model`` to ``layout`` the way ``convert_layout`` moves its
    params (conv kernels permuted, everything else as is)."""
    if model_layout(model) == layout:
        return grads
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    holder = nnx.merge(graphdef, grads, rest, copy=True)
    return nnx.state(convert_layout(holder, layout), nnx.Param)


def _grad_rows_order(
    model: nnx.Module, grads: nnx.State, order: Sequence[str], backward: bool
) -> list[tuple[str, str, np.ndarray]]:
    """``(param path, owning op, grad)`` in backprop order (the layer that runs last comes
    first) or, with ``backward=False``, in execution order; layers that never ran last."""
    nodes = _module_table(model)
    rank = {}
    for i, path in enumerate(order):
        rank.setdefault(path.split("#")[0], -i if backward else i)
    never = 1 if backward else len(order)
    entries = []
    for path, value in nnx.to_flat_state(grads):
        owner_path = tuple(path[:-1])
        owner = canonical_path(owner_path, nodes)
        op = type(nodes[owner_path]).__name__ if owner_path in nodes else "?"
        name = canonical_path(path, nodes)
        array = np.asarray(value.get_value() if isinstance(value, nnx.Variable) else value)
        entries.append((rank.get(owner, never), name, op, array))
    entries.sort(key=lambda e: e[0])  # stable: params of one layer keep their order
    return [(name, op, array) for _, name, op, array in entries]


def compare_grad_trees(
    reference_model: nnx.Module,
    reference_grads: nnx.State,
    candidate_grads: nnx.State,
    tolerance: LayerTolerance,
    *,
    order: Sequence[str] = (),
    backward: bool = True,
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    settings: dict | None = None,
) -> LayerwiseReport:
    """Compare two gradient trees already in the reference model's layout, row by row in
    backprop order (``backward``; ``order`` is the layers' execution order), so the first
    failing row is where the backward pass starts to diverge."""
    ref = _grad_rows_order(reference_model, reference_grads, order, backward)
    cand = _grad_rows_order(reference_model, candidate_grads, order, backward)
    return compare_records(
        [LayerOutput(p, op, v) for p, op, v in ref],
        [LayerOutput(p, op, v) for p, op, v in cand],
        tolerance,
        kind="gradients",
        reference_name=reference_name,
        candidate_name=candidate_name,
        settings={"order": "backprop" if backward else "execution", **(settings or {})},
    )


def compare_gradients(
    reference: nnx.Module,
    candidate: nnx.Module,
    x: Any,
    labels: Any,
    tolerance: LayerTolerance,
    *,
    train: bool = True,
    reference_name: str | None = None,
    candidate_name: str | None = None,
) -> LayerwiseReport:
    """Gradients of every parameter of two configurations w.r.t. the same loss, the
    candidate's conv kernels moved to the reference's layout, in backprop order.

    A bug in one layer's forward changes every gradient (the activations after it change),
    so look for it in ``compare_layerwise``; a bug in one layer's backward leaves the layers
    after it intact, and the first failing row here names it."""
    ref_layout, cand_layout = model_layout(reference), model_layout(candidate)
    ref_loss, ref_grads, order = parameter_grads(reference, x, labels, train=train)
    x_cand = _to_reference_layout(np.asarray(x), ref_layout, cand_layout)
    cand_loss, cand_grads, _ = parameter_grads(candidate, x_cand, labels, train=train)
    cand_grads = grads_to_layout(candidate, cand_grads, ref_layout)
    return compare_grad_trees(
        reference,
        ref_grads,
        cand_grads,
        tolerance,
        order=order,
        reference_name=reference_name or describe(reference),
        candidate_name=candidate_name or describe(candidate),
        settings={
            "mode": "train" if train else "eval",
            "loss": "mean softmax cross-entropy, fixed labels",
            "reference_loss": ref_loss,
            "candidate_loss": cand_loss,
            "jax_matmul_precision": MATMUL_PRECISION,
        },
    )
