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

from typing import TYPE_CHECKING

from layoutlab.lazy import lazy_exports

if TYPE_CHECKING:
    from layoutlab.bench.tuning.cache import AutotuneCache, default_cache_path
    from layoutlab.bench.tuning.conv_candidates import CandidateResult, check_candidate
    from layoutlab.bench.tuning.conv_reference import conv_tolerance, reference_conv
    from layoutlab.bench.tuning.convs import (
        ConvTuning,
        TuneResult,
        autotune_conv,
        autotune_convs,
        autotune_model,
        candidates_for,
        plan_from_results,
    )
    from layoutlab.bench.tuning.layout import (
        DEFAULT_CANDIDATES,
        AutotuneResult,
        autotune,
        autotune_config,
        cache_key,
        candidate_tolerance,
        parse_candidates,
    )
    from layoutlab.bench.tuning.registry_model import autotune_registry_model
    from layoutlab.bench.tuning.shapes import ShapeChurnWarning, ShapeWatcher

_EXPORTS = {
    "AutotuneCache": "cache",
    "default_cache_path": "cache",
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
    "CandidateResult": "conv_candidates",
    "check_candidate": "conv_candidates",
    "ConvTuning": "convs",
    "TuneResult": "convs",
    "autotune_conv": "convs",
    "autotune_convs": "convs",
    "autotune_model": "convs",
    "candidates_for": "convs",
    "plan_from_results": "convs",
    "autotune_registry_model": "registry_model",
}

__all__ = [
    "AutotuneCache",
    "AutotuneResult",
    "CandidateResult",
    "ConvTuning",
    "DEFAULT_CANDIDATES",
    "ShapeChurnWarning",
    "ShapeWatcher",
    "TuneResult",
    "autotune",
    "autotune_config",
    "autotune_conv",
    "autotune_convs",
    "autotune_model",
    "autotune_registry_model",
    "cache_key",
    "candidate_tolerance",
    "candidates_for",
    "check_candidate",
    "conv_tolerance",
    "default_cache_path",
    "parse_candidates",
    "plan_from_results",
    "reference_conv",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: set(globals()))
