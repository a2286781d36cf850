"""``layoutlab train``'s recipe flags: where a run starts from (``--init``,
``--freeze-backbone``), its learning-rate schedule, clipping and weight EMA
(``train.lr_schedule``, ``train.ema``), and its validation split, best checkpoint and early
stop (``train.best``), each setting the ``TrainConfig`` field of its name. Imports no JAX
(``train --help``)."""

from __future__ import annotations

import argparse

from layoutlab.train.config import TrainConfig

__all__ = ["RECIPE_FLAGS", "add_recipe_flags"]

# flag dest -> TrainConfig field
RECIPE_FLAGS = {
    "init": "init",
    "schedule": "schedule",
    "warmup_epochs": "warmup_epochs",
    "warmup_steps": "warmup_steps",
    "min_lr": "min_lr",
    "lr_decay_epochs": "lr_decay_epochs",
    "lr_decay_rate": "lr_decay_rate",
    "clip_grad_norm": "clip_grad_norm",
    "ema_decay": "ema_decay",
    "val_fraction": "val_fraction",
    "keep_best": "keep_best",
    "early_stop": "early_stop",
}


def add_recipe_flags(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    w = p.add_argument_group("starting weights, validation and the best checkpoint")
    w.add_argument(
        "--init",
        metavar="PATH",
        help="start from these weights: a PyTorch state dict (.pth/.pt, torchvision names; "
        "needs the torch extra) or another run's workdir (its newest checkpoint), either "
        "layout; a classifier head of another class count is re-initialized",
    )
    w.add_argument(
        "--freeze-backbone",
        action="store_true",
        default=None,
        help="train only the classifier head (linear probing; needs --init): the rest keeps "
        "its weights and BatchNorm statistics",
    )
    w.add_argument(
        "--val-fraction",
        metavar="F",
        help="hold out F of each class of the train split for validation: evaluations run on "
        "it (val_loss, val_accuracy), the test split once at the end (default 0: none)",
    )
    w.add_argument(
        "--keep-best",
        metavar="METRIC[:max|min]",
        help="keep the checkpoint of the best val_accuracy, val_loss, test_accuracy or "
        "test_loss in <workdir>/best (read it with --checkpoint best)",
    )
    w.add_argument(
        "--early-stop",
        metavar="PATIENCE",
        help="stop after PATIENCE evaluations without a better --keep-best metric",
    )
    g = p.add_argument_group("learning-rate schedule, clipping and weight EMA")
    g.add_argument(
        "--schedule",
        help=f"constant | cosine | step: the learning rate after the warmup (default {d.schedule})",
    )
    g.add_argument(
        "--warmup-epochs",
        metavar="E",
        help="linear warmup over E epochs (a fraction is fine); default 5%% of the steps",
    )
    g.add_argument("--warmup-steps", metavar="N", help="the warmup in optimizer steps instead")
    g.add_argument(
        "--min-lr", metavar="LR", help="the floor: cosine ends at it, step never goes below it (0)"
    )
    g.add_argument(
        "--lr-decay-epochs",
        metavar="E1,E2,...",
        help="--schedule step: multiply the rate by --lr-decay-rate at each of these epochs",
    )
    g.add_argument(
        "--lr-decay-rate", metavar="R", help=f"--schedule step's factor (default {d.lr_decay_rate})"
    )
    g.add_argument(
        "--clip-grad-norm",
        metavar="MAX",
        help="clip each optimizer step's whole gradient to this global L2 norm",
    )
    g.add_argument(
        "--ema-decay",
        metavar="D",
        help="keep a moving average of the weights (e.g. 0.9998), evaluated beside them",
    )
