"""Per-shape autotuning of convolution algorithms: measure, filter by numerics, cache.

For one conv shape (``ConvSpec``: batch, spatial size, channels, kernel, stride, padding,
dtype, layout) and backend, every registered algorithm that supports the shape is

1. checked: its forward output and both gradients, at the spec's dtype, are compared with
   float64 NumPy references (``layoutlab.compare.numpy_ref``: the forward conv, the input
   gradient as a transposed conv, the weight gradient as a conv of the input with the
   output gradient), within ``conv_tolerance``; failing candidates are dropped;
2. timed: forward alone and forward + backward (``jax.vjp``), candidates interleaved
   round by round (A B C A B C ...) so each sees the same machine load, medians kept.

The fastest passing candidate for the objective (``"train"``: forward + backward,
``"inference"``: forward) becomes the choice. It goes into the process-wide table that
``Conv(algorithm="auto")`` reads, and into a JSON cache on disk keyed by the shape, dtype,
layout, backend, device kind, jax/jaxlib versions, objective and the candidate set.

Tolerance (``conv_tolerance``): an output summing ``K`` products is checked with
``|a - e| <= rtol * (|e| + max|e|)``, ``rtol = u(dtype) + u(float32) * sqrt(K)``, where
``u`` is the dtype's default relative tolerance (float32 1.3e-6, bfloat16 1.6e-2): one
term for rounding the operands to the compute dtype, one for float32 accumulation, whose
rounding errors add like a random walk over the ``K`` terms. ``K`` is ``kh*kw*Cin`` for the
output, ``kh*kw*Cout`` for the input gradient and ``N*Ho*Wo`` for the weight gradient. The
absolute part scales with the largest reference value because near-zero outputs of a long
sum carry the rounding error of its large terms. Every algorithm meets the same bar
(Winograd included); it rejects wrong results (a bad tile, a flipped kernel), and Winograd
F(4x4,3x3) in bfloat16, whose transforms magnify the operand rounding about 20x.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layoutlab.compare import Tolerance, compare, default_tolerance
from layoutlab.compare import numpy_ref as nr
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import ConvSpec, Geometry
from layoutlab.nn.conv_config import model_conv_specs, set_conv_algorithm

__all__ = [
    "CACHE_ENV",
    "CandidateResult",
    "ConvCache",
    "TuneResult",
    "autotune_conv",
    "autotune_convs",
    "autotune_model",
    "candidate_errors",
    "candidate_fns",
    "candidates_for",
    "check_candidate",
    "conv_tolerance",
    "default_cache_path",
    "load_cached_choices",
    "model_conv_specs",
    "reference_conv",
    "spec_inputs",
    "summarize_results",
    "time_candidates",
]

CACHE_ENV = ca.CACHE_ENV
OBJECTIVES = ("train", "inference")
_FORMAT = ca.CACHE_FORMAT


# ---------------------------------------------------------------- numerics


def conv_tolerance(dtype, reduction: int) -> Tolerance:
    """Tolerance for a conv output summing ``reduction`` products computed in ``dtype``
    with float32 accumulation; apply with ``atol = rtol * max|expected|`` (see module doc).
    """
    if reduction < 1:
        raise ValueError(f"reduction must be >= 1, got {reduction}.")
    unit = default_tolerance(dtype).rtol
    accumulation = default_tolerance(np.float32).rtol * math.sqrt(reduction)
    rtol = unit + accumulation
    return Tolerance(rtol, rtol)


def _reductions(spec: ConvSpec) -> dict[str, int]:
    kh, kw = spec.geometry.kernel_size
    ho, wo = spec.out_size
    return {
        "y": kh * kw * spec.in_features,
        "dx": kh * kw * spec.out_features,
        "dw": spec.batch * ho * wo,
    }


def _shapes(spec: ConvSpec) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Input, kernel (layout's default order) and output shapes of ``spec``."""
    n, (h, w), c, o = spec.batch, spec.in_size, spec.in_features, spec.out_features
    kh, kw = spec.geometry.kernel_size
    ho, wo = spec.out_size
    cg = c // spec.geometry.groups
    if spec.layout == "NHWC":
        return (n, h, w, c), (kh, kw, cg, o), (n, ho, wo, o)
    return (n, c, h, w), (o, cg, kh, kw), (n, o, ho, wo)


def spec_inputs(spec: ConvSpec, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random float32 ``(x, kernel, dy)`` for ``spec``: unit-normal input and output
    gradient, kernel with variance ``1 / fan_in`` so outputs are of order one."""
    xs, ws, ys = _shapes(spec)
    rng = np.random.default_rng(seed)
    fan_in = math.prod(ws) // spec.out_features
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal(ws) / math.sqrt(fan_in)).astype(np.float32)
    dy = rng.standard_normal(ys, dtype=np.float32)
    return x, w, dy


def _to_cf(x: np.ndarray, layout: str) -> np.ndarray:
    return np.transpose(x, (0, 3, 1, 2)) if layout == "NHWC" else x


def _from_cf(x: np.ndarray, layout: str) -> np.ndarray:
    return np.transpose(x, (0, 2, 3, 1)) if layout == "NHWC" else x


def reference_conv(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, spec: ConvSpec
) -> dict[str, np.ndarray]:
    """Float64 ``{"y", "dx", "dw"}`` of ``spec``'s conv from NumPy alone, in its layout.

    ``dx`` is the transposed conv of ``dy``; ``dw`` is a conv of the (padded) input, batch
    and channels swapped, with ``dy`` as the kernel dilated by the stride.
    """
    g: Geometry = spec.geometry
    if g.groups != 1 or g.dilation != (1, 1):
        raise ValueError(
            "reference_conv covers ungrouped, undilated convs (the ones the custom "
            f"algorithms handle); got groups={g.groups}, dilation={g.dilation}."
        )
    xc = _to_cf(np.asarray(x, np.float64), spec.layout)
    dyc = _to_cf(np.asarray(dy, np.float64), spec.layout)
    wk = np.asarray(w, np.float64)
    oihw = np.transpose(wk, (3, 2, 0, 1)) if spec.layout == "NHWC" else wk
    y = nr.conv(xc, oihw, strides=g.strides, padding=g.padding, layout="NCHW")
    # Input gradient: the full transposed conv, then the padding cut away.
    ct = nr.conv_transpose(dyc, oihw, strides=g.strides, padding=0, layout="NCHW")
    (pl, ph), (ql, qh) = g.padding
    n, c, h, wd = xc.shape
    full = np.zeros((n, c, max(ct.shape[2], pl + h), max(ct.shape[3], ql + wd)))
    full[:, :, : ct.shape[2], : ct.shape[3]] = ct
    dx = full[:, :, pl : pl + h, ql : ql + wd]
    # Weight gradient: dW[o, c, i, j] = sum_{n,h,w} xp[n, c, s*h + i, s*w + j] dy[n, o, h, w].
    xp = np.pad(xc, ((0, 0), (0, 0), (pl, max(ph, 0)), (ql, max(qh, 0))))
    dwc = nr.conv(
        np.transpose(xp, (1, 0, 2, 3)),
        np.transpose(dyc, (1, 0, 2, 3)),
        strides=1,
        dilation=g.strides,
        padding="VALID",
        layout="NCHW",
    )  # (C, O, >=kh, >=kw)
    kh, kw = g.kernel_size
    dw_oihw = np.transpose(dwc[:, :, :kh, :kw], (1, 0, 2, 3))
    dw = np.transpose(dw_oihw, (2, 3, 1, 0)) if spec.layout == "NHWC" else dw_oihw
    return {"y": _from_cf(y, spec.layout), "dx": _from_cf(dx, spec.layout), "dw": dw}


Options = tuple[tuple[str, object], ...]


def _options(compiler_options: dict | None) -> Options:
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
            layout=spec.layout,
            algorithm=name,
            preferred_element_type=preferred,
        )

    def train(x, w, dy):
        y, vjp = jax.vjp(forward, x, w)
        dx, dw = vjp(dy.astype(y.dtype))
        return y, dx, dw

    sharding = jax.sharding.SingleDeviceSharding(device)
    xs, ws, ys = (jax.ShapeDtypeStruct(s, dtype, sharding=sharding) for s in _shapes(spec))
    opts = dict(options) or None
    fwd = jax.jit(forward).lower(xs, ws).compile(compiler_options=opts)
    trn = jax.jit(train).lower(xs, ws, ys).compile(compiler_options=opts)
    return fwd, trn


def candidate_fns(
    spec: ConvSpec, name: str, device=None, compiler_options: dict | None = None
) -> tuple[Callable, Callable]:
    device = device if device is not None else jax.devices()[0]
    return _compiled_fns(spec, ca.get_algorithm(name), device, _options(compiler_options))


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


def candidate_errors(
    spec: ConvSpec, outs: Sequence, refs: dict[str, np.ndarray]
) -> tuple[dict[str, float], dict[str, float], bool]:
    """``(errors, rtols, passed)`` of outputs ``(y, dx, dw)`` against float64 ``refs``;
    errors are max |actual - expected| / max |expected|."""
    errors, rtols, passed = {}, {}, True
    dtype = jnp.dtype(spec.dtype)
    for key, out, red in zip(("y", "dx", "dw"), outs, _reductions(spec).values(), strict=True):
        expected = refs[key]
        actual = np.asarray(jnp.asarray(out, jnp.float32))
        scale = float(np.max(np.abs(expected))) or 1.0
        tol = conv_tolerance(dtype, red)
        report = compare(actual, expected, rtol=tol.rtol, atol=tol.rtol * scale, name=key)
        errors[key] = report.max_abs_error / scale
        rtols[key] = tol.rtol
        passed = passed and report.passed
    return errors, rtols, passed


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
    result.errors, result.tolerances, result.passed = candidate_errors(spec, outs, refs)
    if not result.passed:
        worst = max(result.errors, key=lambda k: result.errors[k] / result.tolerances[k])
        result.error = (
            f"numerics: {worst} max error {result.errors[worst]:.2e} of max|ref| exceeds "
            f"rtol {result.tolerances[worst]:.2e}"
        )
    return result


def time_candidates(
    spec: ConvSpec,
    names: Sequence[str],
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device=None,
    objective: str = "train",
    compiler_options: dict | None = None,
) -> dict[str, tuple[float | None, float | None]]:
    """``{name: (forward_ms, train_ms)}`` medians; candidates run interleaved each round.
    ``objective="inference"`` times the forward only (train_ms None)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    dtype = jnp.dtype(spec.dtype)
    x, w, dy = (jax.device_put(jnp.asarray(a, dtype), device) for a in inputs)
    fns = {name: candidate_fns(spec, name, device, compiler_options) for name in names}
    do_train = objective == "train"
    for fwd, train in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fwd(x, w))
            if do_train:
                jax.block_until_ready(train(x, w, dy))
    times: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    for _ in range(repeats):
        for name, (fwd, train) in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fwd(x, w))
            times[name][0].append(time.perf_counter() - t0)
            if do_train:
                t0 = time.perf_counter()
                jax.block_until_ready(train(x, w, dy))
                times[name][1].append(time.perf_counter() - t0)
    return {
        name: (
            1e3 * statistics.median(f),
            1e3 * statistics.median(t) if t else None,
        )
        for name, (f, t) in times.items()
    }


# ---------------------------------------------------------------- results and cache


@dataclasses.dataclass
class TuneResult:
    """The outcome of tuning one conv shape."""

    spec_key: str
    cache_key: str
    objective: str
    choice: str
    backend: str
    device_kind: str
    versions: dict[str, str | None]
    candidates: list[CandidateResult]
    compiler_options: dict = dataclasses.field(default_factory=dict)
    from_cache: bool = False

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("from_cache")
        return out

    @classmethod
    def from_dict(cls, data: dict, from_cache: bool = True) -> TuneResult:
        cands = [CandidateResult(**c) for c in data["candidates"]]
        fields = {k: v for k, v in data.items() if k != "candidates"}
        return cls(**fields, candidates=cands, from_cache=from_cache)

    def table(self) -> str:
        """One line per candidate: times, errors, verdict."""
        lines = [f"{self.spec_key} [{self.objective}] -> {self.choice}"]
        for c in self.candidates:
            errs = " ".join(f"{k} {v:.1e}" for k, v in c.errors.items())
            t = (
                f"fwd {c.forward_ms:.2f} ms, fwd+bwd {c.train_ms:.2f} ms"
                if c.forward_ms is not None and c.train_ms is not None
                else (f"fwd {c.forward_ms:.2f} ms" if c.forward_ms is not None else "not timed")
            )
            verdict = "ok" if c.passed else f"rejected ({c.error})"
            lines.append(f"  {c.algorithm:10} {t}; err {errs}; {verdict}")
        return "\n".join(lines)


def default_cache_path() -> Path:
    """``$LAYOUTLAB_CONV_AUTOTUNE_CACHE`` or ``~/.cache/layoutlab/conv_autotune.json``."""
    return ca.default_cache_path()


class ConvCache:
    """The JSON cache: ``{"format": ..., "entries": {cache_key: TuneResult dict}}``."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.entries: dict[str, dict] = {}
        if self.path.is_file():
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError(
                    f"{self.path} is not a conv autotune cache (format {_FORMAT}); delete it "
                    "or pass another cache path."
                )
            self.entries = dict(data.get("entries", {}))

    def get(self, cache_key: str) -> TuneResult | None:
        data = self.entries.get(cache_key)
        return TuneResult.from_dict(data) if data is not None else None

    def put(self, result: TuneResult) -> None:
        self.entries[result.cache_key] = result.to_dict()

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"format": _FORMAT, "entries": self.entries}, indent=1))
        os.replace(tmp, self.path)
        return self.path


def _device(backend: str | None):
    try:
        return jax.devices(backend)[0]
    except RuntimeError as err:
        raise ValueError(f"No {backend!r} device: {err}") from None


def _versions() -> dict[str, str | None]:
    return ca.versions()


def _cache_key(spec_key, platform, device_kind, versions, objective, names, options) -> str:
    opts = ",".join(f"{k}={v}" for k, v in _options(options))
    return (
        f"{spec_key}|{platform}|{device_kind}|jax={versions['jax']}|jaxlib={versions['jaxlib']}"
        f"|{objective}|{','.join(sorted(names))}|{opts}"
    )


def candidates_for(spec: ConvSpec, algorithms: Iterable[str] | None = None) -> list[str]:
    """Registered algorithms (or ``algorithms``) that support ``spec``; ``xla`` first."""
    names = list(algorithms) if algorithms is not None else list(ca.algorithm_names())
    for name in names:
        ca.get_algorithm(name)  # unknown names raise with the list of known ones
    ok = [n for n in names if ca.get_algorithm(n).supports(spec) is None]
    return sorted(set(ok), key=lambda n: (n != ca.XLA, names.index(n)))


def _pick(cands: list[CandidateResult], objective: str) -> str:
    def t(c: CandidateResult) -> float:
        v = c.train_ms if objective == "train" else c.forward_ms
        return math.inf if v is None else v

    passing = [c for c in cands if c.passed and c.forward_ms is not None]
    return min(passing, key=t).algorithm if passing else ca.XLA


def autotune_conv(
    spec: ConvSpec,
    *,
    algorithms: Iterable[str] | None = None,
    objective: str = "train",
    repeats: int = 5,
    warmup: int = 1,
    backend: str | None = None,
    cache: ConvCache | str | Path | None = None,
    refresh: bool = False,
    seed: int = 0,
    apply: bool = True,
    compiler_options: dict | None = None,
) -> TuneResult:
    """Check, time and choose an algorithm for ``spec`` (see the module doc).

    ``cache``: a ``ConvCache``, a path, or None for ``default_cache_path()``; a cached
    result for the same key is reused unless ``refresh``. ``apply`` puts the choice into
    the table ``Conv(algorithm="auto")`` reads. With no passing candidate the choice is
    ``xla``. ``compiler_options``: XLA options every candidate is compiled with; tune with
    the options the model's step will be compiled with (they change what ``xla`` runs).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}.")
    cache = cache if isinstance(cache, ConvCache) else ConvCache(cache)
    device = _device(backend)
    versions = _versions()
    names = candidates_for(spec, algorithms)
    key = _cache_key(
        spec.key(),
        device.platform,
        device.device_kind,
        versions,
        objective,
        names,
        compiler_options,
    )
    result = None if refresh else cache.get(key)
    if result is None:
        inputs = spec_inputs(spec, seed)
        refs = reference_conv(*inputs, spec)
        checked = [
            check_candidate(spec, n, inputs, refs, device=device, compiler_options=compiler_options)
            for n in names
        ]
        timed_names = [c.algorithm for c in checked if c.passed]
        times = time_candidates(
            spec,
            timed_names,
            inputs,
            repeats=repeats,
            warmup=warmup,
            device=device,
            objective=objective,
            compiler_options=compiler_options,
        )
        for c in checked:
            c.forward_ms, c.train_ms = times.get(c.algorithm, (None, None))
        result = TuneResult(
            spec.key(),
            key,
            objective,
            _pick(checked, objective),
            device.platform,
            device.device_kind,
            versions,
            checked,
            dict(_options(compiler_options)),
        )
        cache.put(result)
        cache.save()
    if apply:
        ca.set_choice(result.spec_key, result.choice, platform=result.backend)
    return result


def autotune_convs(specs: Iterable[ConvSpec], **kw) -> list[TuneResult]:
    """``autotune_conv`` for each distinct spec, sharing one cache file."""
    cache = kw.pop("cache", None)
    cache = cache if isinstance(cache, ConvCache) else ConvCache(cache)
    seen, out = set(), []
    for spec in specs:
        if spec.key() in seen:
            continue
        seen.add(spec.key())
        out.append(autotune_conv(spec, cache=cache, **kw))
    return out


def summarize_results(results: Sequence[TuneResult]) -> str:
    """``"11 shapes (5 cached): xla x7, im2col x4"``: one line for a model's tuning."""
    cached = sum(r.from_cache for r in results)
    picked = collections.Counter(r.choice for r in results).most_common()
    return f"{len(results)} shapes ({cached} cached): " + ", ".join(
        f"{name} x{n}" for name, n in picked
    )


def autotune_model(model: nnx.Module, x, **kw) -> list[TuneResult]:
    """Tune every conv shape of ``model(x)`` and set the model's convs to ``"auto"``."""
    results = autotune_convs(model_conv_specs(model, x), **kw)
    set_conv_algorithm(model, ca.AUTO)
    return results


def load_cached_choices(
    path: str | Path | None = None,
    *,
    objective: str = "train",
    compiler_options: dict | None = None,
) -> dict[str, str]:
    """Load the cached choices matching this device kind, jax/jaxlib versions, objective
    and compiler options into the ``"auto"`` table; returns ``{spec_key: algorithm}``.
    (``layoutlab.nn.conv_algos.load_choices`` does the same without importing ``bench``.)"""
    path = Path(path).expanduser() if path is not None else default_cache_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"No conv autotune cache at {path}; run autotune_model/autotune_convs "
            "first (or set $LAYOUTLAB_CONV_AUTOTUNE_CACHE)."
        )
    ConvCache(path)  # checks the format
    return ca.load_choices(path, objective=objective, compiler_options=compiler_options)
