"""``metrics.png``: every point it draws is inside its axes."""

import numpy as np
import pytest

from layoutlab.train.plot import metrics_figure


def test_the_accuracy_panel_holds_every_plotted_point():
    # A run whose test accuracy sits at 97-99% (the zoom's case) while single batches'
    # train accuracies early on are far below it: zooming to the test accuracies alone
    # (0.95..1) left the per-step and mean train accuracies off the panel.
    records = [
        {
            "step": s,
            "train_loss": 2 / s,
            "train_accuracy": a,
            "test_loss": 1 / s,
            "test_accuracy": t,
        }
        for s, a, t in ((10, 0.62, 0.97), (20, 0.9, 0.985), (30, 0.96, 0.99))
    ]
    steps = [{"step": s, "loss": 3 / s, "accuracy": min(0.03 * s, 1.0)} for s in range(1, 31)]
    fig = metrics_figure(records, steps=steps)
    acc_ax = fig.axes[1]
    low, high = acc_ax.get_ylim()
    plotted = np.concatenate([line.get_ydata() for line in acc_ax.get_lines()])
    assert plotted.size == 30 + 3 + 3
    assert low <= plotted.min() and plotted.max() <= high, (low, high, plotted.min())
    assert 0.0 <= low and high <= 1.0
    # Still a zoom where every accuracy is high: differences of a percent stay visible.
    late = metrics_figure(records[1:], steps=[r for r in steps if r["step"] >= 29]).axes[1]
    assert late.get_ylim() == pytest.approx((0.85, 1.0))  # 0.87 .. 0.99, 0.02 margins
