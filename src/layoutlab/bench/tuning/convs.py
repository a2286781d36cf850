"""Per-shape autotuning of convolution algorithms: measure, filter by numerics, cache, plan.

For one conv shape (``ConvSpec``: batch, spatial size, channels, kernel, stride, padding,
dtype, layout) and backend, every registered algorithm that supports the shape is

1. checked: its forward output and both gradients, at the spec's dtype, are compared with
   float64 NumPy references (``conv_reference``: the forward conv, the input gradient as a
   transposed conv, the weight gradient as a conv of the input with the output gradient),
   within ``conv_tolerance``; failing candidates are dropped;
2. timed: forward alone and forward + backward (``jax.vjp``), interleaved
   (``conv_candidates.time_candidates``).

The fastest passing candidate for the objective (``"train"``: forward + backward,
``"inference"``: forward) becomes the choice only when it beats ``xla`` with separation
(``bench.stats.decide``: the 95% interval of the per-round paired ratio lies above 1);
otherwise ``xla`` stays, recorded as a ``"tie"``. It goes into the autotune cache
(``cache.AutotuneCache``) keyed by the shape, dtype, layout, backend, device kind,
jax/jaxlib versions, objective, candidate set and compiler options. ``autotune_model``
turns the choices for every conv of a model into a ``ConvPlan``, which the caller hands to
the model (``nn.configure(model, plan)``); nothing here changes a model or any process-wide state.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
from flax import nnx

from layoutlab.bench.machine import machine_fingerprint
from layoutlab.bench.stats import Decision, decide, load_average
from layoutlab.bench.tuning.cache import AutotuneCache, device_for, versions
from layoutlab.bench.tuning.conv_candidates import (
    CandidateResult,
    check_candidate,
    options_key,
    time_candidate_rounds,
    unusable_reason,
)
from layoutlab.bench.tuning.conv_reference import reference_conv, spec_inputs
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import ConvPlan, ConvSpec
from layoutlab.nn.conv_config import conv_specs

__all__ = [
    "OBJECTIVES",
    "ConvTuning",
    "TuneResult",
    "autotune_conv",
    "autotune_convs",
    "autotune_model",
    "candidates_for",
    "plan_from_results",
    "summarize_results",
]

OBJECTIVES = ("train", "inference")


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
    # The evidence: "faster" (choice beat xla with separation), "tie" (kept xla), "default
    # fastest", "default failed"; the paired ratio xla / fastest with its 95% interval; the
    # objective's per-round ms of each timed candidate; the machine and its load.
    verdict: str = ""
    ratio: list | None = None
    rounds_ms: dict = dataclasses.field(default_factory=dict)
    fingerprint: str = ""
    load_avg: float | None = None
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
        why = f" ({self.verdict})" if self.verdict else ""
        lines = [f"{self.spec_key} [{self.objective}] -> {self.choice}{why}"]
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


def _cache_key(spec_key, platform, device_kind, versions, objective, names, options) -> str:
    opts = ",".join(f"{k}={v}" for k, v in options_key(options))
    return (
        f"{spec_key}|{platform}|{device_kind}|jax={versions['jax']}|jaxlib={versions['jaxlib']}"
        f"|{objective}|{','.join(sorted(names))}|{opts}|{machine_fingerprint()}"
    )


def _forward_is_xla(name: str) -> bool:
    methods = getattr(ca.get_algorithm(name).core, "methods", None)
    return methods is not None and methods.forward == "native"


def candidates_for(
    spec: ConvSpec,
    algorithms: Iterable[str] | None = None,
    objective: str = "train",
    platform: str | None = None,
) -> list[str]:
    """Registered algorithms (or ``algorithms``) that support ``spec`` and can run on
    ``platform`` (default: JAX's default backend; ``conv_candidates.unusable_reason``: an
    unavailable ``onednn`` is skipped, not failed); ``xla`` first.

    For ``"inference"`` the algorithms whose forward is XLA's own conv (``gemm_dw``, ``col2im_dx``,
    ``phase_dx``) are left out: they run the same program as ``xla`` there, and timing them could
    only pick one by noise (docs/performance/measurements.md#benchmark-timing)."""
    names = list(algorithms) if algorithms is not None else list(ca.algorithm_names())
    for name in names:
        ca.get_algorithm(name)  # unknown names raise with the list of known ones
    platform = platform or jax.default_backend()
    ok = [n for n in names if ca.get_algorithm(n).supports(spec) is None
          and unusable_reason(n, platform) is None]  # fmt: skip
    if objective == "inference":
        ok = [n for n in ok if n == ca.XLA or not _forward_is_xla(n)]
    return sorted(set(ok), key=lambda n: (n != ca.XLA, names.index(n)))


def _decide(rounds: dict, objective: str) -> Decision | None:
    """``xla`` unless a passing candidate beats it with separation (``bench.stats.decide``)."""
    kind = "train" if objective == "train" else "fwd"
    timed = {name: ms for (k, name), ms in rounds.items() if k == kind}
    return decide(ca.XLA, timed) if timed else None


def autotune_conv(
    spec: ConvSpec,
    *,
    algorithms: Iterable[str] | None = None,
    objective: str = "train",
    repeats: int = 8,
    warmup: int = 1,
    backend: str | None = None,
    cache: AutotuneCache | str | Path | None = None,
    refresh: bool = False,
    seed: int = 0,
    compiler_options: dict | None = None,
    cached_only: bool = False,
) -> TuneResult | None:
    """Check, time and choose an algorithm for ``spec`` (see the module doc).

    ``cache``: an ``AutotuneCache``, a path, or None for ``default_cache_path()``; a cached
    result for the same key is reused unless ``refresh``. With no passing candidate the choice is
    ``xla``. ``compiler_options``: XLA options every candidate is compiled with; tune with
    the options the model's step will be compiled with (they change what ``xla`` runs).
    ``cached_only``: return the cached result or None, measuring nothing.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}.")
    cache = AutotuneCache.at(cache)
    device = device_for(backend)
    here = versions()
    names = candidates_for(spec, algorithms, objective, device.platform)
    key = _cache_key(
        spec.key(),
        device.platform,
        device.device_kind,
        here,
        objective,
        names,
        compiler_options,
    )
    cached = None if refresh else cache.get(key, "conv")
    result = None if cached is None else TuneResult.from_dict(_without_kind(cached))
    if result is None and cached_only:
        return None
    if result is None:
        # A grouped, dilated or otherwise special conv only XLA takes: nothing to choose, and
        # the float64 reference does not cover it either, so nothing is measured.
        alone = names == [ca.XLA]
        inputs = None if alone else spec_inputs(spec, seed)
        refs = None if alone else reference_conv(*inputs, spec)
        checked = [] if alone else [
            check_candidate(spec, n, inputs, refs, device=device, compiler_options=compiler_options)
            for n in names
        ]  # fmt: skip
        timed_names = [c.algorithm for c in checked if c.passed]
        rounds = time_candidate_rounds(
            spec,
            timed_names,
            inputs,
            repeats=repeats,
            warmup=warmup,
            device=device,
            objective=objective,
            compiler_options=compiler_options,
        ) if timed_names else {}  # fmt: skip
        for c in checked:
            fwd, train = rounds.get(("fwd", c.algorithm)), rounds.get(("train", c.algorithm))
            c.forward_ms = None if fwd is None else statistics.median(fwd)
            c.train_ms = None if train is None else statistics.median(train)
        decision = _decide(rounds, objective)
        result = TuneResult(
            spec.key(),
            key,
            objective,
            ca.XLA if decision is None else decision.choice,
            device.platform,
            device.device_kind,
            here,
            checked,
            dict(options_key(compiler_options)),
            verdict=_verdict(decision, spec, alone),
            ratio=None if decision is None or decision.ratio is None else list(decision.ratio),
            rounds_ms={
                n: ms
                for (k, n), ms in rounds.items()
                if k == ("train" if objective == "train" else "fwd")
            },  # fmt: skip
            fingerprint=machine_fingerprint(),
            load_avg=load_average(),
        )
        cache.put(key, "conv", result.to_dict())
        cache.save()
    return result


def _verdict(decision: Decision | None, spec: ConvSpec, alone: bool) -> str:
    if alone:
        reasons = {ca.get_algorithm(n).supports(spec) for n in ca.algorithm_names()} - {None}
        return "only xla takes this conv: " + "; ".join(sorted(reasons))[:200]
    return "no candidate timed" if decision is None else decision.verdict


def autotune_convs(specs: Iterable[ConvSpec], **kw) -> list[TuneResult]:
    """``autotune_conv`` for each distinct spec, sharing one cache file."""
    cache = AutotuneCache.at(kw.pop("cache", None))
    seen, out = set(), []
    for spec in specs:
        if spec.key() in seen:
            continue
        seen.add(spec.key())
        result = autotune_conv(spec, cache=cache, **kw)
        if result is not None:  # None: not cached, with cached_only
            out.append(result)
    return out


def summarize_results(results: Sequence[TuneResult]) -> str:
    """``"11 shapes (5 cached): xla x7, im2col x4"``: one line for a model's tuning."""
    cached = sum(r.from_cache for r in results)
    picked = collections.Counter(r.choice for r in results).most_common()
    return f"{len(results)} shapes ({cached} cached): " + ", ".join(
        f"{name} x{n}" for name, n in picked
    )


def _without_kind(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "kind"}


def plan_from_results(specs: dict[str, ConvSpec], results: Sequence[TuneResult]) -> ConvPlan:
    """The ``ConvPlan`` giving each conv path of ``specs`` its shape's choice in ``results``,
    with the evidence: the candidates' times (ms: forward, forward + backward), the objective,
    device, versions and compiler options it was measured with."""
    by_key = {r.spec_key: r for r in results}
    entries, evidence = {}, {}
    for path, spec in specs.items():
        r = by_key.get(spec.key())
        if r is None:
            continue
        entries[path] = (r.choice, r.spec_key)
        evidence[path] = {
            "source": "cache" if r.from_cache else "measured",
            "objective": r.objective,
            "backend": r.backend,
            "device_kind": r.device_kind,
            "versions": r.versions,
            "compiler_options": r.compiler_options,
            "times_ms": {c.algorithm: [c.forward_ms, c.train_ms] for c in r.candidates if c.passed},
        }
    return ConvPlan(entries, evidence)


class ConvTuning(NamedTuple):
    """``autotune_model``'s outcome: the plan for the model's convs and one result per shape."""

    plan: ConvPlan
    results: list[TuneResult]

    def summary(self) -> str:
        return summarize_results(self.results)


def autotune_model(model: nnx.Module, x, *, specs: dict | None = None, **kw) -> ConvTuning:
    """Tune every 2D conv shape of ``model(x)`` (``autotune_convs`` keywords) and return the
    plan for its convs. ``model`` is not changed: hand the plan to it with
    ``nn.configure(model, plan)`` (its ``"auto"`` convs run it). ``specs``:
    ``conv_specs(model, x)`` when the caller has it (saves a trace of the model)."""
    specs = conv_specs(model, x) if specs is None else specs
    if not specs:
        raise ValueError(
            f"{type(model).__name__} runs no 2D layoutlab.nn.Conv on input {tuple(x.shape)}; "
            "nothing to autotune."
        )
    results = autotune_convs(specs.values(), **kw)
    return ConvTuning(plan_from_results(specs, results), results)
