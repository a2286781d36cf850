"""Use a trained run: ``load_model``, evaluation, prediction on image files, and export.

``load_model(workdir, step=None)`` returns the run's NNX model; ``layoutlab evaluate``,
``layoutlab predict`` and ``layoutlab export`` are thin shells over this package; the last
two run the conv plan of their own batch (``inference_plan``).
Names load lazily, so the CLI's ``command`` module imports without JAX.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layoutlab.infer.evaluate import evaluate_run, evaluate_workdir, plot_confusion
    from layoutlab.infer.export import export_run
    from layoutlab.infer.load import NoRunError, Run, load_model, open_run
    from layoutlab.infer.plan import inference_plan
    from layoutlab.infer.predict import load_images, predict_files

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

__all__ = [
    "NoRunError",
    "Run",
    "evaluate_run",
    "evaluate_workdir",
    "export_run",
    "inference_plan",
    "load_images",
    "load_model",
    "open_run",
    "plot_confusion",
    "predict_files",
]


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"layoutlab.infer.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'layoutlab.infer' has no attribute {name!r}")
