"""Recording every layer's output of a model, in execution order, under PyTorch-style paths.

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

import collections
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from layoutlab.layout import Layout, to_layout
from layoutlab.models.torch_weights import torch_name as canonical_path
from layoutlab.nn.base import LayoutModule

__all__ = [
    "LayerOutput",
    "LayerRecorder",
    "MATMUL_PRECISION",
    "highest_precision",
    "module_table",
    "module_paths",
    "canonical_path",
    "model_layout",
    "set_mode",
    "record_layers",
    "layer_outputs",
]

MATMUL_PRECISION = "highest"


@contextlib.contextmanager
def highest_precision() -> Iterator[str]:
    """JAX matmuls and convs at full float32 precision (no TF32/bf16 passes on GPU/TPU)."""
    with jax.default_matmul_precision(MATMUL_PRECISION):
        yield MATMUL_PRECISION


# --------------------------------------------------------------------------- paths


def module_table(model: nnx.Module) -> dict[tuple, Any]:
    return {tuple(path): node for path, node in nnx.iter_modules(model)}


def module_paths(model: nnx.Module, *, include_containers: bool = False) -> dict[int, tuple]:
    """``{id(module): (canonical path, op name)}`` of the modules a layerwise run records:
    the leaf layers, plus every container with ``include_containers``."""
    nodes = module_table(model)
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
    # The copy keeps the model's activation storage: a comparison checks the computation
    # that runs, and layer_outputs puts the records in the model's layout.
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


def _in_model_layout(value: np.ndarray, inner: Layout, outer: Layout) -> np.ndarray:
    """A layer output of a model whose layers compute in ``inner`` (its ``compute_layout``),
    in the model's own layout ``outer``; logits and other non-spatial outputs as they are."""
    if inner == outer or value.ndim != outer.rank:
        return value
    return np.asarray(to_layout(value, inner, outer))


def layer_outputs(
    model: nnx.Module,
    x: Any,
    *,
    train: bool = False,
    include_containers: bool = False,
    compiler_options: dict | None = None,
) -> tuple[np.ndarray, list[LayerOutput]]:
    """Compile one forward of ``model`` on ``x`` that returns every layer's output.

    ``train`` picks batch statistics (True) or running statistics (False); ``model`` itself
    is not changed (its running statistics are not updated). A model computing channels-last
    inside (``nn.configure``'s ``activation_storage``) runs so, and its layers' outputs are
    returned in its own layout. ``compiler_options``: XLA options of the compile (e.g.
    ``fast_defaults.fast_compile_options``).
    """
    model = set_mode(model, train)
    outer = model_layout(model)
    inner = getattr(model, "compute_layout", None) or outer
    graphdef, state = nnx.split(model)
    key = ("forward", graphdef, include_containers, options_key(compiler_options))
    with highest_precision():
        (out, values), meta = run_program(key, lambda: _forward_program(*key[1:]), (state, x))
    records = [
        LayerOutput(p, op, _in_model_layout(np.asarray(v), inner, outer))
        for (p, op), v in zip(meta, values, strict=True)
    ]
    return np.asarray(out), records


def _forward_program(graphdef, include_containers: bool, options: tuple) -> Program:
    """The jitted forward of ``layer_outputs`` for models split to ``graphdef``."""
    traced: dict = {}

    def run(state, x):
        out, records = record_layers(
            nnx.merge(graphdef, state), x, include_containers=include_containers
        )
        traced[signature((state, x))] = tuple((r.path, r.op) for r in records)
        return out, [r.value for r in records]

    return Program(jax.jit(run, compiler_options=dict(options) or None), traced)


# --------------------------------------------------------------------------- compiled programs


class Program(NamedTuple):
    """A jitted function and what its traces saw that is not an array (layer paths, decision
    sites), by the arguments' ``signature``: a call jit serves from its cache does not trace."""

    fn: Callable
    traced: dict


def options_key(options: dict | None) -> tuple:
    """Compiler options as part of a ``PROGRAMS`` key."""
    return tuple(sorted((options or {}).items()))


def signature(args: Any) -> tuple:
    """The pytree structure, shapes and dtypes of ``args``, read alike from arrays and from
    the tracers jit makes of them."""
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((tuple(np.shape(v)), _dtype(v)) for v in leaves)


def _dtype(value: Any) -> Any:
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return type(value)
    with contextlib.suppress(TypeError, ValueError):
        return jax.dtypes.canonicalize_dtype(dtype)
    return dtype


class ProgramCache:
    """Compiled comparison programs by everything that determines them (the model's
    ``graphdef``, which holds its structure, static attributes and mode, plus options), so a
    comparison repeating a program compiles nothing; the least recently used go first. Read
    and written only outside tracing."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.programs: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: tuple, build: Callable[[], Program]) -> Program:
        try:
            program = self.programs.pop(key, None)
        except TypeError:  # an unhashable option value: compile for this call only
            return build()
        if program is None:
            program = build()
        self.programs[key] = program
        while len(self.programs) > self.size:
            self.programs.popitem(last=False)
        return program


# Few: a compiled training program of a large model is tens of MB of machine code.
PROGRAMS = ProgramCache(8)


def run_program(key: tuple | None, build: Callable[[], Program], args: tuple) -> tuple:
    """``(outputs, traced)``: ``build()``'s program called on ``args`` (kept in ``PROGRAMS``
    under ``key``; None: built for this call only) and what its trace recorded for them."""
    program = build() if key is None else PROGRAMS.get(key, build)
    out = program.fn(*args)
    traced = program.traced.get(signature(args))
    if traced is None:  # arguments whose traced types do not read as given: no reuse
        program = build()
        out = program.fn(*args)
        (traced,) = program.traced.values()
    return out, traced
