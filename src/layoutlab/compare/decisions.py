"""The discrete decisions of a forward pass (which ReLU/ReLU6 inputs pass their gradient,
which element of each max-pool window is its maximum), recorded or pinned to another run's.

A pre-activation within rounding of zero (or of 6) can take a different side in float32
than in float64; the gradient of that element is then all or nothing, and a train-mode
BatchNorm behind it spreads the change over its channel's batch. Such a gradient difference
is correct arithmetic on a decision the two runs took differently, not a defect, and it
disappears when the decisions are pinned: ``probe_decisions(pins=...)`` makes every ReLU,
ReLU6 and max pool follow the given masks and window choices, so a comparison can rerun the
candidate on the reference's decisions and see whether what is left is rounding.

Sites are named like torch modules: a layer module by its path (``features.3``), a
functional ReLU by the innermost module calling it plus ``relu`` (``layer1.1.relu``, whose
second call in that block is ``layer1.1.relu#2``), as torchvision's blocks name theirs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from layoutlab.compare.layer_recording import canonical_path, module_table
from layoutlab.layout import Layout, to_layout
from layoutlab.nn import activation as _activation
from layoutlab.nn import pooling as _pooling

__all__ = ["Decision", "DecisionLog", "probe_decisions", "count_flips", "pool_choice"]


class Decision(NamedTuple):
    """One decision site: ``kind`` is ``relu``, ``relu6`` or ``max_pool``; ``value`` the
    gradient mask (ReLU/ReLU6: bool, True where the gradient passes) or the window offset
    each max-pool output took (int32, row-major in the window); ``position`` the number of
    module calls that had returned before it (``DecisionLog.done``), its place among the
    layers."""

    site: str
    kind: str
    value: Any
    position: int


class DecisionLog:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.calls: dict[str, int] = {}
        self.stack: list[str] = []
        self.done: list[str] = []

    def site(self, name: str | None) -> str:
        base = self.stack[-1] if self.stack else ""
        if name:
            base = f"{base}.{name}" if base else name
        n = self.calls.get(base, 0) + 1
        self.calls[base] = n
        return base if n == 1 else f"{base}#{n}"


def pool_windows(x, dims, strides, pads) -> jax.Array:
    """``(window size, *output shape)``: each window offset's strided slice of the padded
    input (padding ``-inf``), in row-major window order."""
    if isinstance(pads, str):
        pads = lax.padtype_to_pads(x.shape, dims, strides, pads)
    xp = lax.pad(x, jnp.asarray(-jnp.inf, x.dtype), [(lo, hi, 0) for lo, hi in pads])
    out = [(n - d) // s + 1 for n, d, s in zip(xp.shape, dims, strides, strict=True)]
    slices = []
    for offset in itertools.product(*(range(d) for d in dims)):
        limit = [o + s * (n - 1) + 1 for o, s, n in zip(offset, strides, out, strict=True)]
        slices.append(lax.slice(xp, offset, limit, strides))
    return jnp.stack(slices)


def pool_choice(x, dims, strides, pads) -> jax.Array:
    """The window offset of each output's first maximum (the element its gradient goes to)."""
    return jnp.argmax(pool_windows(x, dims, strides, pads), axis=0).astype(jnp.int32)


def _pinned_max_pool(x, dims, strides, pads, choice):
    windows = pool_windows(x, dims, strides, pads)
    return jnp.take_along_axis(windows, jnp.asarray(choice)[None], axis=0)[0]


def _relu_mask(x, kind):
    if kind == "relu6":
        return (x > 0) & (x < 6)
    return x > 0


def _pinned_activation(x, kind, mask):
    """The activation with the gradient mask ``mask``: inputs where it is True pass as they
    are, the others take the value their side of the threshold gives."""
    mask = jnp.asarray(mask)
    zero = jnp.zeros((), x.dtype)
    if kind == "relu6":
        off = jnp.where(x >= 6, jnp.asarray(6, x.dtype), zero)
        return jnp.where(mask, x, lax.stop_gradient(off))
    return jnp.where(mask, x, zero)


@contextlib.contextmanager
def probe_decisions(
    model: nnx.Module, pins: Mapping[str, Any] | None = None
) -> Iterator[DecisionLog]:
    """Record (and, for the sites in ``pins``, impose) every ReLU, ReLU6 and max-pool
    decision of ``model``'s calls traced inside the block. Pins are in the layout the layer
    computes in (``Decision.value`` of another run of the same model)."""
    log = DecisionLog()
    nodes = module_table(model)
    paths = {id(node): canonical_path(p, nodes) for p, node in nodes.items() if p}
    pins = dict(pins or {})
    relu = jax.nn.relu

    def decide(site, kind, x, plain):
        mask = _relu_mask(x, kind)
        log.decisions.append(Decision(site, kind, mask, len(log.done)))
        if site in pins:
            return _pinned_activation(x, kind, pins[site])
        return plain(x)

    def probed_relu(x):
        return decide(log.site(None if _in_module(_activation.ReLU) else "relu"), "relu", x, relu)

    def _in_module(cls):
        return bool(log.stack) and log.stack[-1] in owned.get(cls, ())

    owned = {
        cls: {paths[id(n)] for n in nodes.values() if type(n) is cls and id(n) in paths}
        for cls in (_activation.ReLU, _activation.ReLU6, _pooling.MaxPool)
    }
    relu6_call = _activation.ReLU6.__call__
    pool_call = _pooling.MaxPool.__call__

    def probed_relu6(self, x):
        return decide(log.site(None), "relu6", x, lambda v: relu6_call(self, v))

    def probed_max_pool(self, x):
        dims, strides, pads = self._window_args(x)
        site = log.site(None)
        choice = pool_choice(x, dims, strides, pads)
        log.decisions.append(Decision(site, "max_pool", choice, len(log.done)))
        if site in pins:
            return _pinned_max_pool(x, dims, strides, pads, pins[site])
        return pool_call(self, x)

    classes = {type(n) for n in nodes.values()}
    originals = {cls: cls.__dict__.get("__call__") for cls in classes}
    replaced = {_activation.ReLU6: probed_relu6, _pooling.MaxPool: probed_max_pool}

    def entered(cls):
        inner = replaced.get(cls, cls.__call__)

        def call(self, *args, **kwargs):
            path = paths.get(id(self))
            if path is None:
                return inner(self, *args, **kwargs)
            log.stack.append(path)
            try:
                out = inner(self, *args, **kwargs)
            finally:
                log.stack.pop()
            log.done.append(path)
            return out

        return call

    try:
        for cls in classes:
            cls.__call__ = entered(cls)
        jax.nn.relu = probed_relu
        yield log
    finally:
        jax.nn.relu = relu
        for cls, own in originals.items():
            if own is None:
                with contextlib.suppress(AttributeError):
                    del cls.__call__
            else:
                cls.__call__ = own


def count_flips(reference: np.ndarray, candidate: np.ndarray) -> int:
    """How many decisions of one site differ (masks or window offsets, same layout)."""
    return int(np.count_nonzero(np.asarray(reference) != np.asarray(candidate)))


class FlipSite(NamedTuple):
    """A decision site where the candidate decided ``count`` elements differently from the
    reference; ``position`` as in ``Decision`` (the candidate's)."""

    site: str
    kind: str
    count: int
    position: int


def _in_layout(value: np.ndarray, src: Layout | None, dst: Layout | None) -> np.ndarray:
    if src is None or dst is None or src == dst or value.ndim != src.rank:
        return value
    return np.asarray(to_layout(value, src, dst))


def decision_flips(
    reference: list[Decision],
    candidate: list[Decision],
    reference_layout: Layout | None = None,
    candidate_layout: Layout | None = None,
) -> tuple[list[FlipSite], dict[str, np.ndarray]] | None:
    """``(flip sites, pins)``: the sites where the runs' decisions differ and, per candidate
    site, the reference's decisions moved from ``reference_layout`` to ``candidate_layout``
    (the layout the candidate's layers compute in). Sites are matched in call order;
    ``None`` when the two runs do not have the same sequence of decision kinds and shapes
    (different architectures)."""
    if len(reference) != len(candidate):
        return None
    flips, pins = [], {}
    for r, c in zip(reference, candidate, strict=True):
        cv = np.asarray(c.value)
        rv = _in_layout(np.asarray(r.value), reference_layout, candidate_layout)
        if r.kind != c.kind or rv.shape != cv.shape:
            return None
        pins[c.site] = rv.astype(cv.dtype)
        n = count_flips(rv, cv)
        if n:
            flips.append(FlipSite(r.site, r.kind, n, c.position))
    return flips, pins
