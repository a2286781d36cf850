"""What ``layoutlab train`` asks of the tuner before it trains: the layout and precision of
``--autotune``, and the planner of ``auto`` convs. ``bench/`` sits above ``train/`` in the
repository map, so the ``layoutlab`` command passes these to ``train.command.run``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layoutlab.train.config import TrainConfig

__all__ = ["autotune_train", "conv_planner"]

# Conv autotuning before training measures each candidate this many interleaved rounds: a
# cache-once tune, and the fewest rounds that give a 95% interval of the paired ratio, which
# a candidate must clear to replace XLA's conv (bench.stats.decide).
CONV_TUNE_REPEATS = 6
CONV_TUNE_WARMUP = 1


def autotune_train(config: TrainConfig) -> tuple[str, str]:
    """``train --autotune``: the measured ``(layout, precision)`` for the run's model, batch
    and input shape (process 0 measures, every process of a distributed run returns its
    choice)."""
    from layoutlab.bench.tuning import autotune_config
    from layoutlab.train.agreement import decided_by_process_0
    from layoutlab.train.distributed import main_process
    from layoutlab.train.run_data import load_run_data

    def decide():  # measured once, by process 0 of a multi-process run
        dataset = load_run_data(config)
        return autotune_config(
            config.model,
            config.batch_size,
            dataset.image_shape,
            model_kwargs=dict(config.model_kwargs),
            num_classes=dataset.num_classes,
        )

    layout, precision = decided_by_process_0("autotune", decide)
    if main_process():
        print(f"autotune chose layout {layout}, precision {precision}")
    return layout, precision


def conv_planner(tune: str):
    """``train`` with ``"auto"`` convs (the default) and no ``conv_plan`` in its config: the
    loop asks this for the plan once it has built the model: the autotune cache, a tuning
    when it pays (``tune``, ``--conv-tune``) or the shipped table. The plan is stored in
    config.json and the checkpoints, so a resumed run keeps its algorithms."""

    def plan(model, images, steps: int, compiler_options: dict):
        from layoutlab.bench.tuning.plan_source import conv_plan_for_run

        found = conv_plan_for_run(
            model,
            images,
            steps=steps,
            tune=tune,
            compiler_options=compiler_options or None,
            repeats=CONV_TUNE_REPEATS,
            warmup=CONV_TUNE_WARMUP,
        )
        print(f"conv plan: {found.detail}")  # once, even with --quiet; stderr is for errors
        return found.plan

    return plan
