"""A sweep's ``max_step_s``: a configuration's step time predicted from the runs before it,
so that one that would take too long is skipped without being set up."""

from __future__ import annotations

__all__ = ["predicted_step_s", "skip_message"]

# Training costs about three forward passes; predictions use 2 so that they err towards
# running a configuration rather than skipping one that would have fit.
_TRAIN_OVER_INFER = 2.0


def predicted_step_s(row: dict, history: list[tuple[dict, float]]) -> tuple[float, dict] | None:
    """The step time ``row`` should take, scaled linearly in batch size from the closest
    earlier run of the same framework, layout and precision: the same mode at the largest
    smaller batch, else an inference run (times ``_TRAIN_OVER_INFER`` for training)."""
    keys = ("framework", "layout", "precision", "model", "model_kwargs", "input_shape")
    keys += ("conv_algo", "kernel_storage", "activation_storage", "defaults", "memory_format")
    same = [
        (past, seconds)
        for past, seconds in history
        if all(past.get(k) == row.get(k) for k in keys) and past["batch_size"] <= row["batch_size"]
    ]
    for mode in (row["mode"], "infer"):
        # The XLA options differ by mode by default (cpu_fast_options), so only a same-mode
        # run must have had the same ones.
        runs = [
            (p, t)
            for p, t in same
            if p["mode"] == mode
            and (mode != row["mode"] or p.get("xla_options") == row.get("xla_options"))
        ]
        if runs:
            past, seconds = max(runs, key=lambda run: run[0]["batch_size"])
            factor = row["batch_size"] / past["batch_size"]
            if mode != row["mode"]:
                factor *= _TRAIN_OVER_INFER
            return seconds * factor, past
    return None


def skip_message(guess: float, past: dict, limit: float) -> str:
    """The error of a row not run because ``guess`` (from ``past``) is over ``limit``."""
    return (
        f"not run: predicted {guess:.1f} s per step from the {past['mode']} batch "
        f"{past['batch_size']} run, over the max_step_s limit of {limit:g} s"
    )
