"""Autotuning, one module with one cache (``cache.AutotuneCache``) and two questions:

- ``layout``: the fastest layout x precision for a model and input shape whose logits pass
  the numerics check (``autotune``, ``autotune_config``; ``layoutlab autotune layout``,
  ``layoutlab train --autotune``);
- ``convs``: the fastest numerically sound algorithm for each conv shape of a model, as a
  ``ConvPlan`` (``autotune_model``, ``autotune_registry_model``; ``layoutlab autotune
  convs``, ``layoutlab train --conv-algo auto``).

Names are imported lazily so ``import layoutlab.bench.tuning`` stays light.
"""

from __future__ import annotations

from layoutlab.lazy import lazy_exports

_EXPORTS = {
    "AutotuneCache": "cache",
    "CACHE_ENV": "cache",
    "CACHE_FORMAT": "cache",
    "default_cache_path": "cache",
    "versions": "cache",
    "AutotuneResult": "layout",
    "DEFAULT_CANDIDATES": "layout",
    "autotune": "layout",
    "autotune_config": "layout",
    "cache_key": "layout",
    "candidate_tolerance": "layout",
    "parse_candidates": "layout",
    "ShapeChurnWarning": "shapes",
    "ShapeWatcher": "shapes",
    "conv_tolerance": "conv_reference",
    "reference_conv": "conv_reference",
    "spec_inputs": "conv_reference",
    "CandidateResult": "conv_candidates",
    "check_candidate": "conv_candidates",
    "time_candidates": "conv_candidates",
    "ConvTuning": "convs",
    "TuneResult": "convs",
    "autotune_conv": "convs",
    "autotune_convs": "convs",
    "autotune_model": "convs",
    "candidates_for": "convs",
    "plan_from_results": "convs",
    "summarize_results": "convs",
    "autotune_registry_model": "registry_model",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
