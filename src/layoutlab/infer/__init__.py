"""Use a trained run: ``load_model``, evaluation, prediction on image files, and export.

``load_model(workdir, step=None)`` returns the run's NNX model; ``layoutlab evaluate``,
``layoutlab predict`` and ``layoutlab export`` are thin shells over this package; the last
two run the conv plan of their own batch (``inference_plan``).
Names load lazily, so the CLI's ``command`` module imports without JAX.
"""

import importlib

_HOMES = {
    "NoRunError": "load",
    "Run": "load",
    "load_model": "load",
    "open_run": "load",
    "evaluate_run": "evaluate",
    "evaluate_workdir": "evaluate",
    "plot_confusion": "evaluate",
    "export_run": "export",
    "inference_plan": "plan",
    "load_images": "predict",
    "predict_files": "predict",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"layoutlab.infer.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'layoutlab.infer' has no attribute {name!r}")
