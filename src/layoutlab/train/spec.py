"""``RunSpec``: a run resolved once, the one value every program of the run is built from.

``TrainConfig`` is the serializable form (flags, ``--set``, ``config.json``, checkpoints): it
holds names. ``resolve_spec(config)`` turns them into what a step is made of: the ``Layout``,
the ``Policy`` and the ``LossScale`` (``train.run_precision``, the one place the loss-scale
rule lives), the batch sizes and data parallelism, the ``ConvPlan`` with every algorithm it
names taken as a value (``Algorithm``, core and all), kernel and activation storage, how the
batch norms and max pools compute (``layer_impl``), the XLA options of each program, the
``OptimizerSpec`` and the data. ``train.program.build_program(spec, inputs)`` builds the
model, state and steps from it for ``train``, ``inspect``, ``bench``, ``compare`` and
``infer`` alike, so the step one inspects or times is the step ``layoutlab train`` runs. A
run resolves its config once; what it decides later (its conv plans, its record) changes the
spec as a value (``RunSpec.with_plan``, ``with_record``).

A conv algorithm is looked up here, when the spec is resolved, and never while tracing: a
conv carries its algorithm's value, so an algorithm registered again under the same name
reaches a step only through a spec resolved (and a program built) after it.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from layoutlab import models
from layoutlab.fast_defaults import resolve_activation_storage, resolve_kernel_storage
from layoutlab.layout import Layout
from layoutlab.loss_scale import LossScale, get_loss_scale
from layoutlab.nn.conv_algos import AUTO, XLA, Algorithm, ConvPlan, get_algorithm
from layoutlab.precision import Policy, get_policy
from layoutlab.train.config import TrainConfig, data_parallel_on, eval_batch_on
from layoutlab.train.fast_config import compile_options
from layoutlab.train.optim import OptimizerSpec, optimizer_spec
from layoutlab.train.run_precision import loss_scale_name

__all__ = [
    "OPTIMIZER_CHOICES",
    "RECORD_ONLY",
    "SCHEDULE_STEPS",
    "InputSpec",
    "RunSpec",
    "config_for",
    "resolve_spec",
]

# Optimizer steps the learning-rate schedule spans when the config sets no num_steps (bench,
# inspect): the schedule's length changes constants of the step, not its ops.
SCHEDULE_STEPS = 1000
# What `bench` and `inspect` may run: "train", the optimizer `layoutlab train` builds for the
# same flags (AdamW, float32 state for half params, MultiSteps), or "pytorch": SGD with
# momentum 0.9 at a constant 0.01, the update the PyTorch runner (bench/torch_runner.py) makes
# (not train's --optimizer sgd, which has no momentum: hence a name of its own).
OPTIMIZER_CHOICES = ("train", "pytorch")
_PYTORCH_SGD = {
    "optimizer": "momentum",
    "learning_rate": 0.01,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "schedule": "constant",
    "warmup_steps": 0,
}


_KEEP = object()  # with_plan's default eval plan: the spec's own
# Config fields a run records that change none of its programs (RunSpec.with_record).
RECORD_ONLY = frozenset(
    {"run_id", "data_fingerprint", "jax_numerics", "model", "model_kwargs", "layout", "precision"}
    | {"init", "init_fingerprint"}
)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What a program's batch is: images of ``image_shape`` (H, W, C; or D, H, W, C) in the
    run's layout, ``num_classes`` classes, ``batch_size`` rows; ``per_pixel``: a label per
    pixel (a segmentation model's), else one per image."""

    image_shape: tuple[int, ...]
    num_classes: int
    batch_size: int
    per_pixel: bool = False
    # The per-channel mean and std the images were normalized with, in pixel units [0, 1]
    # (a data set's; the photometric augmentations work in those units); None: not known.
    pixel_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @classmethod
    def of(cls, dataset, batch_size: int) -> InputSpec:
        """The batches of a ``data.Dataset``."""
        stats = (tuple(dataset.mean), tuple(dataset.std))
        return cls(tuple(dataset.image_shape), dataset.num_classes, batch_size, False, stats)

    @classmethod
    def for_model(cls, model: str, image_shape, num_classes: int, batch_size: int) -> InputSpec:
        """Synthetic batches for registered ``model``: per-pixel labels for a segmentation
        model, one per image otherwise."""
        return cls(tuple(image_shape), num_classes, batch_size, models.spec(model).per_pixel)

    @property
    def channels(self) -> int:
        return self.image_shape[-1]

    def batch(self, layout: Layout, batch_size: int | None = None, sharding=None):
        """``(images, labels)`` as ``ShapeDtypeStruct``s in ``layout``."""
        n = self.batch_size if batch_size is None else batch_size
        *spatial, c = self.image_shape
        shape = (n, *spatial, c) if layout.is_channels_last else (n, c, *spatial)
        return (
            jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding),
            jax.ShapeDtypeStruct(
                (n, *spatial) if self.per_pixel else (n,), jnp.int32, sharding=sharding
            ),
        )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run, resolved: build its programs with ``train.program.build_program``."""

    # What the run records of itself (config.json, checkpoints): the config it was resolved
    # from, with its automatic fields filled in ("auto" loss scale and storages, None data
    # parallelism and eval batch) and the conv plans it runs.
    config: TrainConfig
    model: str
    model_kwargs: Mapping[str, Any]
    layout: Layout
    policy: Policy
    loss_scale: LossScale  # the state a fresh train state starts from
    batch_size: int  # the training batch, over all devices
    eval_batch_size: int  # the most test images per eval step (train.evaluation)
    data_parallel: bool  # batches split over the devices
    conv_algorithm: str
    conv_plan: ConvPlan | None
    eval_conv_plan: ConvPlan | None  # the eval step's plan; None: conv_plan
    algorithms: Mapping[str, Algorithm]  # every algorithm the convs may run, as values
    kernel_storage: str
    activation_storage: str
    # How the batch norms and max pools compute (nn.configure's batch_norm= and max_pool=):
    # the config's layer_impl, "xla" in a data-parallel run (its statistics are over the
    # global batch, which XLA's partitioner reduces across devices and a oneDNN call cannot;
    # a max pool's oneDNN call would gather the batch).
    layer_impl: str
    xla_options: Mapping[str, Mapping[str, Any]]  # "train"/"infer" -> XLA compile options
    optimizer: OptimizerSpec
    data: str
    image_size: tuple[int, ...] | None
    seed: int
    remat: bool
    augment: bool
    ema_decay: float | None = None  # the weights' moving average (train.ema); None: none

    def compile_options(self, mode: str) -> dict:
        """The XLA options of the run's ``"train"`` or ``"infer"`` programs."""
        return dict(self.xla_options[mode])

    def with_plan(self, plan, eval_plan=_KEEP) -> RunSpec:
        """This spec with ``plan`` (a ``ConvPlan`` or None) for its ``"auto"`` convs, and
        ``eval_plan`` for its eval step's (default: the one it has); their algorithms are
        taken as values now. The config records the plans themselves (a plan's JSON, a
        decided or saved one, is parsed there once)."""
        eval_plan = self.config.eval_conv_plan if eval_plan is _KEEP else eval_plan
        config = dataclasses.replace(self.config, conv_plan=plan, eval_conv_plan=eval_plan)
        train, evaluation = config.conv_plan, config.eval_conv_plan
        algorithms = _algorithms(self.conv_algorithm, train, evaluation)
        return dataclasses.replace(
            self,
            config=config,
            conv_plan=train,
            eval_conv_plan=evaluation,
            algorithms=types.MappingProxyType(algorithms),
        )

    def with_record(self, **fields) -> RunSpec:
        """This spec with ``fields`` of its record changed that build nothing (``RECORD_ONLY``:
        the run's id, data fingerprint and numerics, and another spelling of its model,
        kwargs, layout or precision, as a resumed run keeps the saved one)."""
        if unknown := sorted(set(fields) - RECORD_ONLY):
            raise ValueError(f"with_record changes only {sorted(RECORD_ONLY)}, not {unknown}.")
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **fields))

    def summary(self) -> dict:
        """What the step is made of, as plain values (for reports, rows and comparisons)."""
        return {
            "model": self.model,
            "model_kwargs": dict(self.model_kwargs),
            "layout": self.layout.value,
            "policy": str(self.policy),
            "loss_scale": self.config.loss_scale,
            "optimizer": self.optimizer.label,
            "conv_algorithm": self.conv_algorithm,
            "conv_plan": None if self.conv_plan is None else self.conv_plan.algorithms(),
            "kernel_storage": self.kernel_storage,
            "activation_storage": self.activation_storage,
            "xla_options": {m: dict(o) for m, o in self.xla_options.items()},
        }


def _algorithms(conv_algorithm: str, *plans: ConvPlan | None) -> dict[str, Algorithm]:
    names = {conv_algorithm} if conv_algorithm != AUTO else set()
    for plan in plans:
        if plan is not None and conv_algorithm == AUTO:
            names |= set(plan.algorithms().values())
    return {name: get_algorithm(name) for name in sorted(names - {XLA})}


def resolve_spec(
    config: TrainConfig,
    total_steps: int | None = None,
    num_devices: int = 1,
    steps_per_epoch: float | None = None,
) -> RunSpec:
    """The ``RunSpec`` of a checked ``config`` (``train.config.validate``, or the checks of
    the command that made it); ``total_steps``: the optimizer steps the schedule spans
    (None: ``config.num_steps``, else ``SCHEDULE_STEPS``); ``num_devices``: the devices a
    data-parallel run splits its batches over (``bench`` and ``inspect`` build one
    device's program); ``steps_per_epoch``: the run's optimizer steps per epoch, which the
    schedule's epoch counts are converted with (``train.optim.optimizer_spec``)."""
    policy = get_policy(config.precision)
    if total_steps is None:
        total_steps = config.num_steps or SCHEDULE_STEPS
    data_parallel = data_parallel_on(config, num_devices)
    loss_scale = loss_scale_name(config.loss_scale, policy)
    config = dataclasses.replace(
        config,
        loss_scale=loss_scale,
        data_parallel=data_parallel,
        eval_batch_size=eval_batch_on(config, num_devices),
        kernel_storage=resolve_kernel_storage(config.kernel_storage),
        activation_storage=resolve_activation_storage(config.activation_storage),
    )
    plan, eval_plan = config.conv_plan, config.eval_conv_plan  # ConvPlans (TrainConfig's)
    layout = models.resolve_layout(config.layout, models.spec(config.model).num_spatial)
    options = {
        m: types.MappingProxyType(compile_options(config, m, policy=policy))
        for m in ("train", "infer")
    }
    return RunSpec(
        config=config,
        model=config.model,
        model_kwargs=types.MappingProxyType(dict(config.model_kwargs)),
        layout=layout,
        policy=policy,
        loss_scale=get_loss_scale(loss_scale),
        batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size,
        data_parallel=data_parallel,
        conv_algorithm=config.conv_algorithm,
        conv_plan=plan,
        eval_conv_plan=eval_plan,
        algorithms=types.MappingProxyType(_algorithms(config.conv_algorithm, plan, eval_plan)),
        kernel_storage=config.kernel_storage,
        activation_storage=config.activation_storage,
        layer_impl="xla" if data_parallel else config.layer_impl,
        xla_options=types.MappingProxyType(options),
        optimizer=optimizer_spec(config, total_steps, policy, steps_per_epoch),
        data=config.data,
        image_size=None if config.image_size is None else tuple(config.image_size),
        seed=config.seed,
        remat=config.remat,
        augment=config.augment,
        ema_decay=config.ema_decay or None,
    )


def config_for(optimizer: str = "train", **fields) -> TrainConfig:
    """The ``TrainConfig`` that ``bench`` and ``inspect`` resolve their spec from: ``fields``
    (model, layout, precision, conv settings, ...) over ``TrainConfig``'s defaults, so what
    they do not set is what ``layoutlab train`` would use; ``optimizer="pytorch"``: the PyTorch
    runner's SGD with momentum instead of train's optimizer (``OPTIMIZER_CHOICES``)."""
    if optimizer not in OPTIMIZER_CHOICES:
        raise ValueError(
            f"Unknown optimizer choice {optimizer!r}; use 'train' (the optimizer `layoutlab "
            "train` runs for these flags) or 'pytorch' (SGD with momentum, as the PyTorch "
            "runner)."
        )
    extra = _PYTORCH_SGD if optimizer == "pytorch" else {}
    return TrainConfig(**{**fields, **extra})
