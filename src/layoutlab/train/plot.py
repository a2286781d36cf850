"""Loss and accuracy curves of a run as a PNG, drawn with matplotlib's Agg canvas.

The figure is built without ``pyplot``, so no global backend or window state is touched.
"""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_metrics"]


def _series(records: list[dict], key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_metrics(records: list[dict], path: str | os.PathLike, *, title: str = "") -> None:
    """Two panels: train/test loss and train/test accuracy against the optimizer step."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for key, label in (("train_loss", "train"), ("test_loss", "test")):
        loss_ax.plot(*_series(records, key), marker="o", markersize=3, label=label)
    for key, label in (("train_accuracy", "train"), ("test_accuracy", "test")):
        acc_ax.plot(*_series(records, key), marker="o", markersize=3, label=label)
    loss_ax.set(xlabel="step", ylabel="loss", title="loss")
    acc_ax.set(xlabel="step", ylabel="accuracy", title="accuracy", ylim=(0.0, 1.0))
    for ax in (loss_ax, acc_ax):
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.savefig(os.fspath(path), dpi=100)
