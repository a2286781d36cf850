"""Progress output of a training run: the tqdm bar, per-eval lines and the bar's postfix."""

from __future__ import annotations

import sys

from tqdm import tqdm

from layoutlab.train.metrics import RunningMean

__all__ = ["Progress", "bar_postfix", "format_record"]


class Progress:
    """The tqdm bar plus per-eval lines; silent when ``quiet``."""

    def __init__(self, total: int, initial: int, quiet: bool):
        self.quiet = quiet
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            disable=quiet or not sys.stderr.isatty(),
            file=sys.stderr,
        )

    def update(self, n: int, postfix: dict | None) -> None:
        self.bar.update(n)
        if postfix is not None:
            self.bar.set_postfix(postfix, refresh=False)

    def write(self, line: str) -> None:
        if not self.quiet:
            tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()


def format_record(r: dict) -> str:
    # A run with a validation split evaluates it, and the test split once at the end.
    splits = "".join(
        f"{s}_loss {r[s + '_loss']:.4f} {s}_accuracy {r[s + '_accuracy']:.4f} "
        for s in ("val", "test")
        if s + "_loss" in r
    )
    return (
        f"step {r['step']} (epoch {r['epoch']:g}): train_loss {r['train_loss']:.4f} "
        f"{splits}images/s {r['images_per_sec']:.0f} loss_scale {r['loss_scale']:g}"
    )


def bar_postfix(meter: RunningMean, last: dict, images: int, seconds: float) -> dict:
    return {
        "loss": f"{meter.mean('loss'):.4f}",
        "acc": f"{meter.mean('accuracy'):.3f}",
        "img/s": f"{images / seconds:.0f}",
        "scale": f"{float(last['loss_scale']):g}",
    }
