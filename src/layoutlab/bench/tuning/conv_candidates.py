"""Conv algorithm candidates for one ``ConvSpec``: compiled once, checked against the float64
references of ``conv_reference``, timed interleaved (``bench.timing.interleaved_ms``: A B C
A B C ..., so each sees the same machine load), medians kept."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from layoutlab.bench.timing import interleaved_rounds
from layoutlab.bench.tuning.conv_reference import candidate_errors, conv_shapes
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import ConvSpec

__all__ = [
    "CandidateResult",
    "candidate_fns",
    "check_candidate",
    "options_key",
    "time_candidates",
    "unusable_reason",
]

Options = tuple[tuple[str, object], ...]


def unusable_reason(name: str, platform: str) -> str | None:
    """Why the registered algorithm ``name`` cannot be a candidate on ``platform``, or None.

    ``onednn`` and ``onednn_xla_dw`` run oneDNN's CPU primitives, so they are candidates on
    CPU only, and only where its extension loaded (``nn.conv_algos.onednn_status``);
    elsewhere their convs would run XLA's, and timing that twin of ``xla`` could only pick
    it by noise.
    """
    if name not in ("onednn", "onednn_xla_dw"):
        return None
    if platform != "cpu":
        return f"oneDNN's convs run on CPU, not {platform}"
    from layoutlab.nn.conv_algos.onednn_status import onednn_status

    status = onednn_status()
    return None if status.available else f"oneDNN unavailable: {status.reason}"


def options_key(compiler_options: dict | None) -> Options:
    return tuple(sorted((compiler_options or {}).items()))


@functools.lru_cache(maxsize=256)
def _compiled_fns(
    spec: ConvSpec, algorithm: ca.Algorithm, device, options: Options
) -> tuple[Callable, Callable]:
    """Compiled ``forward(x, w)`` and ``train(x, w, dy)`` for ``device`` with XLA
    ``options``; cached (per registered algorithm object, so a re-registered name is traced
    anew) so the numerics check and the timing share one compile."""
    name = algorithm.name
    g = spec.geometry
    dtype = jnp.dtype(spec.dtype)
    preferred = jnp.float32 if dtype.itemsize < 4 else None

    def forward(x, w):
        return ca.conv2d(
            x,
            w,
            strides=g.strides,
            padding=g.padding,
            groups=g.groups,
            layout=spec.layout,
            algorithm=name,
            preferred_element_type=preferred,
        )

    def train(x, w, dy):
        y, vjp = jax.vjp(forward, x, w)
        dx, dw = vjp(dy.astype(y.dtype))
        return y, dx, dw

    sharding = jax.sharding.SingleDeviceSharding(device)
    xs, ws, ys = (jax.ShapeDtypeStruct(s, dtype, sharding=sharding) for s in conv_shapes(spec))
    opts = dict(options) or None
    fwd = jax.jit(forward).lower(xs, ws).compile(compiler_options=opts)
    trn = jax.jit(train).lower(xs, ws, ys).compile(compiler_options=opts)
    return fwd, trn


def candidate_fns(
    spec: ConvSpec, name: str, device=None, compiler_options: dict | None = None
) -> tuple[Callable, Callable]:
    device = device if device is not None else jax.local_devices()[0]
    return _compiled_fns(spec, ca.get_algorithm(name), device, options_key(compiler_options))


@dataclasses.dataclass
class CandidateResult:
    """One algorithm on one shape: whether it ran and passed, its errors and its times."""

    algorithm: str
    ran: bool = False
    passed: bool = False
    error: str | None = None
    # max |actual - expected| / max |expected| per output ("y", "dx", "dw")
    errors: dict[str, float] = dataclasses.field(default_factory=dict)
    tolerances: dict[str, float] = dataclasses.field(default_factory=dict)
    forward_ms: float | None = None
    train_ms: float | None = None
    compile_s: float | None = None


def check_candidate(
    spec: ConvSpec,
    name: str,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    refs: dict[str, np.ndarray],
    *,
    device=None,
    compiler_options: dict | None = None,
) -> CandidateResult:
    """Run ``name`` once at the spec's dtype and compare y, dx, dw with ``refs``."""
    result = CandidateResult(name)
    dtype = jnp.dtype(spec.dtype)
    try:
        t0 = time.perf_counter()
        _, train = candidate_fns(spec, name, device, compiler_options)
        args = [jax.device_put(jnp.asarray(a, dtype), device) for a in inputs]
        outs = jax.block_until_ready(train(*args))
        result.compile_s = time.perf_counter() - t0
    except Exception as err:  # a candidate that cannot compile or run is reported, not fatal
        result.error = f"{type(err).__name__}: {err}"
        return result
    result.ran = True
    platform = getattr(device, "platform", None) or jax.default_backend()
    result.errors, result.tolerances, result.passed = candidate_errors(spec, outs, refs, platform)
    if not result.passed:
        worst = max(result.errors, key=lambda k: result.errors[k] / result.tolerances[k])
        result.error = (
            f"numerics: {worst} max error {result.errors[worst]:.2e} of max|ref| exceeds "
            f"rtol {result.tolerances[worst]:.2e}"
        )
    return result


def time_candidates(spec, names, inputs, **kw) -> dict[str, tuple[float | None, float | None]]:
    """``{name: (forward_ms, train_ms)}`` medians of ``time_candidate_rounds``."""
    rounds = time_candidate_rounds(spec, names, inputs, **kw)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    return {n: (med[("fwd", n)], med.get(("train", n))) for n in names}


def time_candidate_rounds(
    spec: ConvSpec,
    names: Sequence[str],
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device=None,
    objective: str = "train",
    compiler_options: dict | None = None,
) -> dict[tuple[str, str], list[float]]:
    """``{("fwd"|"train", name): [ms per round]}``; candidates run interleaved each round.
    ``objective="inference"`` times the forward only (no ``"train"`` entries)."""
    dtype = jnp.dtype(spec.dtype)
    x, w, dy = (jax.device_put(jnp.asarray(a, dtype), device) for a in inputs)
    calls = {}
    for name in names:
        fwd, train = candidate_fns(spec, name, device, compiler_options)
        calls[("fwd", name)] = lambda fwd=fwd: jax.block_until_ready(fwd(x, w))
        if objective == "train":
            calls[("train", name)] = lambda train=train: jax.block_until_ready(train(x, w, dy))
    return interleaved_rounds(calls, repeats, warmup)
