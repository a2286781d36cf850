"""Loss and accuracy curves of a run as a PNG, drawn with matplotlib's Agg canvas.

The figure is built without ``pyplot``, so no global backend or window state is touched.
Its margins are fixed (``_MARGINS``) rather than computed by a layout engine: a layout
engine measures every tick label and then draws the figure twice (once to lay it out), which
took about half of the plot's CPU time, and the end of a short run waits for it.
"""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["metrics_figure", "plot_metrics"]

# Figure fractions for the 10x4 inch figure: room for tick labels of up to about 7
# characters and the axis label on the left of each panel, the panel titles and the
# suptitle above, the step labels below. Values outside 1e-3..1e4 get a "1e-4"-style
# multiplier above the axis (instead of labels such as 0.0001255), so they fit too.
_MARGINS = {"left": 0.075, "right": 0.97, "bottom": 0.115, "top": 0.85, "wspace": 0.2}
_SCILIMITS = (-3, 4)


def _series(records: list[dict], key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _zoom(values: list[float]) -> tuple[float, float]:
    """Accuracy limits around every plotted accuracy (with a margin), inside [0, 1]: a run at
    97-99% shows its differences instead of a flat line at the top of a 0..1 axis, and no
    point falls off it (zooming to the test accuracies alone cut off the per-step and mean
    train accuracies below them)."""
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    margin = max(0.02, 0.1 * (high - low))
    return max(0.0, low - margin), min(1.0, high + margin)


def plot_metrics(
    records: list[dict], path: str | os.PathLike, *, title: str = "", steps: list[dict] = ()
) -> None:
    """``metrics_figure(records, title=title, steps=steps)`` written to ``path`` as a PNG."""
    metrics_figure(records, title=title, steps=steps).savefig(os.fspath(path), dpi=100)


def metrics_figure(records: list[dict], *, title: str = "", steps: list[dict] = ()) -> Figure:
    """Two panels against the optimizer step: loss and accuracy. ``records`` are the
    per-evaluation records (train means and test values), ``steps`` the per-step train
    records of ``steps.jsonl``, drawn as thin lines under them. The accuracy axis zooms to
    the accuracies drawn (``_zoom``)."""
    fig = Figure(figsize=(10, 4))
    fig.subplots_adjust(**_MARGINS)
    FigureCanvasAgg(fig)
    loss_ax, acc_ax = fig.subplots(1, 2)
    accuracies = []
    for ax, key in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        xs, ys = _series(list(steps), key)
        if xs:
            ax.plot(xs, ys, linewidth=0.8, alpha=0.6, label="train (per step)")
        drawn = [ys]
        for prefix, label in (
            ("train_", "train (mean per eval)"),
            ("val_", "validation"),
            ("test_", "test"),
        ):
            xs, ys = _series(records, prefix + key)
            if prefix == "val_" and not xs:  # a run without a validation split
                continue
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn.append(ys)
        if key == "accuracy":
            accuracies = [y for ys in drawn for y in ys]
    loss_ax.set(xlabel="step", ylabel="loss", title="loss")
    acc_ax.set(xlabel="step", ylabel="accuracy", title="accuracy", ylim=_zoom(accuracies))
    for ax in (loss_ax, acc_ax):
        ax.grid(True, alpha=0.3)
        ax.ticklabel_format(axis="y", style="sci", scilimits=_SCILIMITS)
        ax.legend()
    if title:
        fig.suptitle(title)
    return fig
