"""Autotuning, the analog of ``torch.backends.cudnn.benchmark``: measure each layout x
precision candidate for one exact input shape and backend, interleaved round by round, and
keep the default (the first candidate, NHWC fp32) unless a candidate whose numerics pass is
faster with statistical separation (``bench.stats.decide``); remember the choice and its
evidence on disk.

Numerics: every candidate's eval-mode logits on the same batch are compared (with
``layoutlab.compare.compare``) against the float32 NHWC candidate's, all built from the same
seed, so with the same weights. The tolerance is scaled for the candidate's compute dtype:

    rtol = default_tolerance(compute_dtype).rtol * sqrt(L)
    atol = rtol * max|reference logits|

``L`` is the number of weight layers (convolutions and dense layers). Each layer rounds
its inputs and weights to the compute dtype, and independent rounding errors add like a
random walk, so the expected error grows with ``sqrt(L)``; the per-layer unit, the dtype's
default tolerance, is already about four unit roundoffs (bfloat16: 1.6e-2). The errors of
the small logits are set by the scale of the large ones, hence the absolute part. On GPU,
XLA computes float32 convolutions and matmuls in TensorFloat32 at JAX's default matmul
precision, so float32 candidates there get float16's tolerance (TF32 keeps float16's 10
mantissa bits) unless ``jax_default_matmul_precision`` asks for full float32. The check
rejects broken candidates (overflow, NaN, a wrong layout), not the rounding of a dtype.

Cache: a ``"layout"`` entry of the autotune cache (``cache.AutotuneCache``, default
``$LAYOUTLAB_AUTOTUNE_CACHE`` or ``~/.cache/layoutlab/autotune.json``). The key holds the
model, its options, the number of classes, batch size, input shape and dtype, mode,
candidates, backend, device kind, the jax/jaxlib/flax versions and the machine fingerprint
(CPU model, cores, vector features): on another machine or jax the choice is measured
again. A new input shape (or batch size) is a new key, so a new search: a training loop
that keeps seeing new shapes pays a search and a compile for each, which ``ShapeWatcher``
warns about.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layoutlab import models
from layoutlab.bench.cases import JaxCase, format_shape, make_workload, parse_shape
from layoutlab.bench.jax_runner import JaxRunner, case_model, layout_images
from layoutlab.bench.machine import library_versions, machine_fingerprint
from layoutlab.bench.stats import decide, dispersion, load_average
from layoutlab.bench.status import OK, classify_failure
from layoutlab.bench.sweep_config import resolve_input
from layoutlab.bench.timing import summarize, timed
from layoutlab.bench.tuning.cache import CACHE_FILE, AutotuneCache
from layoutlab.bench.tuning.conv_reference import effective_compute_dtype
from layoutlab.compare import Tolerance, compare, default_tolerance
from layoutlab.loss_scale import NoOpLossScale
from layoutlab.precision import get_policy
from layoutlab.train.state import TrainState, split_model
from layoutlab.train.steps import make_forward
from layoutlab.xla import resolve_backend

__all__ = [
    "AutotuneResult",
    "DEFAULT_CANDIDATES",
    "autotune",
    "autotune_config",
    "cache_key",
    "candidate_tolerance",
    "parse_candidates",
]

DEFAULT_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("NHWC", "fp32"),
    ("NCHW", "fp32"),
    ("NHWC", "mixed_bf16"),
    ("NCHW", "mixed_bf16"),
)
_REFERENCE = ("NHWC", "fp32")
_NUMERICS_BATCH = 8  # examples compared; enough to catch a broken candidate
_CACHE_FORMAT = 1


@dataclasses.dataclass
class AutotuneResult:
    layout: str
    precision: str
    from_cache: bool
    cache_path: str | None  # the autotune cache file
    key: dict
    candidates: list[dict]  # one dict per candidate: timing, numerics, status
    # How the choice was made (bench.stats.decide): verdict "faster", "tie" (the first
    # candidate, the default, is kept), "default fastest" or "default failed", the paired
    # ratio default / fastest with its 95% interval, the machine fingerprint and load.
    evidence: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_candidates(spec: str | Sequence) -> tuple[tuple[str, str], ...]:
    """``"NHWC:fp32,NCHW:mixed_bf16"`` (or pairs) -> canonical ``((layout, precision), ...)``."""
    from layoutlab.layout import parse_layout

    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        pair = item.split(":") if isinstance(item, str) else list(item)
        if len(pair) != 2 or not all(str(p).strip() for p in pair):
            raise ValueError(
                f"Candidate {item!r} is not LAYOUT:PRECISION (e.g. NHWC:fp32, NCHW:mixed_bf16)."
            )
        layout, precision = (str(p).strip() for p in pair)
        get_policy(precision)  # unknown precision: ValueError listing the presets
        out.append((parse_layout(layout).name, precision))
    if not out:
        raise ValueError("No candidates given; e.g. NHWC:fp32,NCHW:fp32.")
    return tuple(dict.fromkeys(out))


def _input_shape(input_shape) -> tuple[int, ...]:
    return parse_shape(input_shape) if isinstance(input_shape, str) else tuple(input_shape)


def cache_key(
    model: str,
    batch_size: int,
    input_shape,
    *,
    model_kwargs: dict | None = None,
    num_classes: int | None = None,
    mode: str = "train",
    candidates: Sequence[tuple[str, str]] = DEFAULT_CANDIDATES,
    backend: str | None = None,
) -> dict:
    """Everything the choice depends on, as a JSON-ready dict."""
    kwargs = dict(model_kwargs or {})
    given = _input_shape(input_shape)
    spatial = models.spec(model).num_spatial
    if len(given) != spatial + 1:
        example = "x".join(["32"] * spatial + ["3"])
        raise ValueError(
            f"{model} takes {spatial} spatial sizes and a channel count (e.g. {example}); "
            f"got input shape {format_shape(given)}."
        )
    shape, classes = resolve_input(model, kwargs, given[:-1], given[-1], num_classes)
    be = resolve_backend(backend)
    versions = library_versions()
    return {
        "format": _CACHE_FORMAT,
        "model": models.spec(model).name,
        "model_kwargs": kwargs,
        "num_classes": classes,
        "batch_size": int(batch_size),
        "input_shape": format_shape(shape),
        "input_dtype": "float32",
        "mode": mode,
        "candidates": [list(c) for c in candidates],
        "backend": be.name,
        "device_kind": be.device_kind,
        "versions": {k: versions[k] for k in ("jax", "jaxlib", "flax")},
        "fingerprint": machine_fingerprint(),
    }


def _entry_key(key: dict) -> str:
    return "layout|" + json.dumps(key, sort_keys=True)


def _cached_choice(cache: AutotuneCache, key: dict) -> dict | None:
    entry = cache.get(_entry_key(key), "layout")
    if entry is None or entry.get("key") != key or "choice" not in entry:
        return None
    return entry


def weight_layers(model: nnx.Module) -> int:
    """Convolution and dense kernels (parameters of rank >= 2) in ``model``."""
    params = nnx.state(model, nnx.Param)
    return max(1, sum(1 for p in jax.tree.leaves(params) if np.ndim(p) >= 2))


def _effective_compute_dtype(precision: str, platform: str) -> np.dtype:
    return effective_compute_dtype(get_policy(precision).compute_dtype, platform)


def candidate_tolerance(
    precision: str, layers: int, reference: np.ndarray, platform: str = "cpu"
) -> Tolerance:
    """The tolerance a candidate's logits must meet (see the module docstring)."""
    base = default_tolerance(_effective_compute_dtype(precision, platform))
    rtol = base.rtol * math.sqrt(max(1, int(layers)))
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    return Tolerance(rtol, rtol * scale)


def _forward_logits(case: JaxCase, images_cl: np.ndarray, backend) -> np.ndarray:
    defs, params, rest = split_model(case_model(case))
    # make_forward reads only params and rest.
    state = TrainState(jnp.zeros((), jnp.int32), params, rest, None, NoOpLossScale())
    device = resolve_backend(backend).device
    images = jax.device_put(layout_images(images_cl, case.layout), device)
    out = jax.jit(make_forward(defs))(jax.device_put(state, device), images)
    return np.asarray(out.astype(jnp.float32))


def _measure_interleaved(entries, repeats: int, warmup: int, timer) -> None:
    """Times every set-up candidate round by round (A B C A B C ...), so that each round's
    times saw the same machine; a candidate that fails drops out with its error."""
    for rounds, measured in ((warmup, False), (repeats, True)):
        for _ in range(rounds):
            for e in entries:
                if e["status"] != OK:
                    continue
                try:
                    t = timer(e["_runner"].step)
                except Exception as err:
                    e.update(zip(("status", "error"), classify_failure(err), strict=True))
                    continue
                if measured:
                    e["round_ms"].append(1e3 * t)


def autotune(
    model: str,
    batch_size: int,
    input_shape,
    *,
    candidates: Sequence[tuple[str, str]] | str | None = None,
    backend: str | None = None,
    cache: AutotuneCache | str | Path | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    mode: str = "train",
    model_kwargs: dict | None = None,
    num_classes: int | None = None,
    repeats: int = 8,
    warmup: int = 1,
    runner: Callable | None = None,
    log: Callable[[str], None] | None = None,
    timer: Callable[[Callable], float] = timed,
) -> AutotuneResult:
    """The fastest candidate whose numerics pass, for this exact shape and backend.

    ``input_shape``: ``(*spatial, channels)`` or ``"HxWxC"``. A cached choice is returned
    without measuring unless ``force``. ``cache``: an ``AutotuneCache``, its file, or None
    (``default_cache_path()``); ``cache_dir``: a directory holding ``autotune.json``.
    ``runner(case)`` builds the runner and ``timer(step)`` times a step (tests pass
    fakes). The candidates are timed interleaved, round by round; the first candidate (the
    default, NHWC fp32) is kept unless another passing one is faster with separation
    (``bench.stats.decide``), and the result's ``evidence`` says which happened.
    """
    cands = parse_candidates(candidates if candidates is not None else DEFAULT_CANDIDATES)
    if mode not in ("infer", "train"):
        raise ValueError(f"mode must be 'infer' or 'train', got {mode!r}.")
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise ValueError(
            f"Need batch_size >= 1, repeats >= 1, warmup >= 0; got "
            f"{batch_size}, {repeats}, {warmup}."
        )
    kwargs = dict(model_kwargs or {})
    key = cache_key(
        model,
        batch_size,
        input_shape,
        model_kwargs=kwargs,
        num_classes=num_classes,
        mode=mode,
        candidates=cands,
        backend=backend,
    )
    if cache is None and cache_dir is not None:
        cache = Path(cache_dir) / CACHE_FILE
    store = AutotuneCache.at(cache)
    path = store.path
    cached = None if force else _cached_choice(store, key)
    if cached is not None:
        choice = cached["choice"]
        return AutotuneResult(
            choice["layout"], choice["precision"], True, str(path), key, cached["candidates"],
            cached.get("evidence", {}),
        )  # fmt: skip

    shape = parse_shape(key["input_shape"])
    workload = make_workload(model, kwargs, shape, key["num_classes"], mode, batch_size)
    make_runner = runner or (lambda case: JaxRunner(case, backend=backend))
    n = min(batch_size, _NUMERICS_BATCH)
    images = workload.images_channels_last()[:n]

    results, logits = [], {}
    for layout, precision in cands:
        canonical = models.resolve_layout(layout, len(shape) - 1).name
        case = JaxCase.of(workload, layout=canonical, precision=precision)
        entry = {"layout": layout, "precision": precision, "status": OK, "error": None}
        entry.update(round_ms=[], _runner=make_runner(case))
        try:
            entry["compile_s"] = entry["_runner"].setup().get("compile_s")
        except Exception as err:  # a failing candidate is skipped, not fatal
            entry.update(zip(("status", "error"), classify_failure(err), strict=True))
        results.append(entry)
    load = load_average()
    try:
        _measure_interleaved(results, repeats, warmup, timer)
        for e in results:
            if e["status"] == OK:
                stats = summarize([ms / 1e3 for ms in e["round_ms"]])
                e.update(step_ms_median=stats.median_ms, step_ms_min=stats.min_ms,
                         step_ms_max=stats.max_ms, dispersion=dispersion(e["round_ms"]),
                         images_per_sec=batch_size / (stats.median_ms / 1e3))  # fmt: skip
                out = e["_runner"].logits() if hasattr(e["_runner"], "logits") else None
                logits[(e["layout"], e["precision"])] = out[:n] if out is not None else None
    finally:
        for e in results:
            e.pop("_runner").close()
    for e in results:
        if log is not None:
            log(_describe(e))

    ok = [e for e in results if e["status"] == OK]
    if not ok:
        raise RuntimeError(
            "Every autotune candidate failed: "
            + "; ".join(f"{e['layout']}:{e['precision']}: {e['error']}" for e in results)
        )
    _check_numerics(ok, logits, workload, images, backend)
    passing = {_name(e): e for e in ok if e["numerics_passed"]}
    if not passing:
        raise RuntimeError("No autotune candidate passed the numerics check against fp32 NHWC.")
    default = _name(dict(zip(("layout", "precision"), cands[0], strict=True)))
    decision = decide(default, {name: e["round_ms"] for name, e in passing.items()})
    best = passing[decision.choice]
    for e in results:
        e["chosen"] = e is best
    choice = {"layout": best["layout"], "precision": best["precision"]}
    evidence = {
        "verdict": decision.verdict,
        "default": default,
        "fastest": decision.fastest,
        "ratio": None if decision.ratio is None else list(decision.ratio),
        "fingerprint": key["fingerprint"],
        "load_avg": load,
    }
    if log is not None:
        log(f"choice {decision.choice} ({decision.verdict}; default {default}, fastest "
            f"{decision.fastest})")  # fmt: skip
    entry = {"key": key, "choice": choice, "evidence": evidence, "candidates": results}
    store.put(_entry_key(key), "layout", entry)
    store.save()
    return AutotuneResult(
        best["layout"], best["precision"], False, str(path), key, results, evidence
    )


def _name(e: dict) -> str:
    return f"{e['layout']}:{e['precision']}"


def _case(workload, name: tuple[str, str]) -> JaxCase:
    layout, precision = name
    return JaxCase.of(workload, layout=layout, precision=precision)


def _check_numerics(ok, logits, workload, images, backend) -> None:
    ref_case = _case(workload, _REFERENCE)
    reference = logits.get(_REFERENCE)
    if reference is None:
        reference = _forward_logits(ref_case, images, backend)
    # Only the kernels' ranks count: an abstract model, no weights drawn.
    layers = weight_layers(nnx.eval_shape(lambda: case_model(ref_case)))
    platform = resolve_backend(backend).platform
    for e in ok:
        name = (e["layout"], e["precision"])
        out = logits.get(name)
        if out is None and name == _REFERENCE:  # the same model and weights, already run
            out = reference
        if out is None:
            out = _forward_logits(_case(workload, name), images, backend)
        tol = candidate_tolerance(e["precision"], layers, reference, platform)
        report = compare(out, reference, rtol=tol.rtol, atol=tol.atol, name="logits")
        e.update(
            numerics_passed=bool(report.passed),
            max_abs_error=_finite_or_none(report.max_abs_error),
            rtol=tol.rtol,
            atol=tol.atol,
        )


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _describe(e: dict) -> str:
    what = f"{e['layout']:<5} {e['precision']:<10}"
    if e["status"] != OK:
        return f"{what} {e['status'].upper()}: {(e.get('error') or '')[:160]}"
    return f"{what} median {e['step_ms_median']:.2f} ms ({e['images_per_sec']:.1f} img/s)"


def autotune_config(model: str, batch_size: int, input_shape, **kwargs) -> tuple[str, str]:
    """``(layout, precision)`` for a training run: ``autotune(..., mode="train")``'s choice."""
    kwargs.setdefault("mode", "train")
    result = autotune(model, batch_size, input_shape, **kwargs)
    return result.layout, result.precision
