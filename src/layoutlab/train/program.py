"""``build_program(spec, inputs)``: the model, train state and steps of a ``RunSpec``.

The one builder: ``train`` (``train.loop``), ``inspect`` (``xla.inspect``), ``bench``
(``bench.jax_runner``), ``compare`` and ``infer`` all build their programs here, so a
step's optimizer, policy, loss scale, conv plan and storage are those of the spec and of
nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layoutlab import models
from layoutlab.fast_defaults import default_skip_branch
from layoutlab.models.torch_weights import assign_torch_values
from layoutlab.nn.configuration import configure
from layoutlab.nn.conv_algos import AUTO
from layoutlab.nn.conv_algos.plan import ConvPlan
from layoutlab.nn.conv_settings import ConvSettings
from layoutlab.train.batch_augment import image_augment, soft_targets
from layoutlab.train.freeze import frozen_defs, frozen_updates, head_paths
from layoutlab.train.model_checks import builder_options
from layoutlab.train.optim import build_optimizer
from layoutlab.train.spec import InputSpec, RunSpec
from layoutlab.train.state import ModelDefs, TrainState, create_train_state, split_model
from layoutlab.train.steps import make_eval_step, make_forward, make_train_step

__all__ = [
    "INIT_COMPILER_OPTIONS",
    "Program",
    "build_model",
    "build_program",
    "class_axis",
    "configure_model",
    "create_model",
    "eval_defs",
]

# A program's init runs once: compiled without LLVM optimizations it compiles ~4x faster on
# CPU (threefry is slow to optimize); its float results may differ from an eager init by an
# ulp (no FMA contraction), identically in every run.
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def create_model(spec: RunSpec, inputs: InputSpec) -> nnx.Module:
    """The registry model of ``spec`` for ``inputs``' classes and channels, seeded by
    ``spec.seed``, before its conv settings (``configure_model``)."""
    kwargs = dict(spec.model_kwargs)
    if "in_channels" in builder_options(spec.model):
        kwargs.setdefault("in_channels", inputs.channels)
    if spec.remat:
        kwargs["remat"] = True
    return models.create(
        spec.model,
        num_classes=inputs.num_classes,
        layout=spec.layout,
        policy=spec.policy,
        rngs=nnx.Rngs(spec.seed),
        kernel_storage=spec.kernel_storage,
        activation_storage=spec.activation_storage,
        **kwargs,
    )


def configure_model(model: nnx.Module, spec: RunSpec) -> nnx.Module:
    """A copy of ``model`` with ``spec``'s conv algorithm or, for ``"auto"``, its plan
    (``nn.configure``); every conv carries its algorithm's value from ``spec.algorithms``,
    and every batch norm and max pool computes as ``spec.layer_impl`` says."""
    impls = {"batch_norm": spec.layer_impl, "max_pool": spec.layer_impl}
    if spec.conv_algorithm == AUTO:
        plan = spec.conv_plan or ConvPlan()
        return configure(model, plan, algorithms=spec.algorithms, **impls)
    settings = ConvSettings.named(
        spec.conv_algorithm, spec.algorithms, kernel_storage=spec.kernel_storage
    )
    return configure(model, settings, **impls)


def build_model(spec: RunSpec, inputs: InputSpec) -> nnx.Module:
    """The configured model of ``spec``. The kernels are initialized in the layout's order
    and then moved to the kernel storage, so both storages start from the same weights;
    under ``jax.jit``/``eval_shape`` the move is traced with the rest of the init."""
    return configure_model(create_model(spec, inputs), spec)


def eval_defs(spec: RunSpec, model: nnx.Module, defs: ModelDefs) -> ModelDefs:
    """The graph definitions of ``spec``'s eval step: ``model`` (``build_model``'s, abstract
    is fine) on ``spec.eval_conv_plan`` when it runs ``"auto"`` convs with one, else
    ``defs`` (the model's own)."""
    if spec.conv_algorithm != AUTO or spec.eval_conv_plan is None:
        return defs
    return split_model(configure(model, spec.eval_conv_plan, algorithms=spec.algorithms))[0]


class Program(NamedTuple):
    """What a ``RunSpec`` runs: ``init(model=None, weights=None)`` makes the initial
    ``TrainState`` (run it under ``jax.jit`` or ``jax.eval_shape``; ``model``: one of
    ``create_model``'s or ``build_model``'s to start from instead of a fresh one;
    ``weights``: values by ``state_dict`` key to set, ``train.init_weights``); the steps are
    pure functions for ``jax.jit``."""

    spec: RunSpec
    inputs: InputSpec
    defs: ModelDefs
    tx: optax.GradientTransformation
    init: Callable[..., TrainState]
    train_step: Callable  # (state, images, labels) -> (state, metrics)
    # Both on spec.eval_conv_plan when the spec has one (its entries: the eval batch's).
    eval_step: Callable  # (state, images, labels) -> summed loss and correct count
    forward: Callable  # (state, images) -> logits

    def batch(self, batch_size: int | None = None, sharding=None):
        """``(images, labels)`` shapes of a batch in the run's layout."""
        return self.inputs.batch(self.spec.layout, batch_size, sharding)


def class_axis(spec: RunSpec) -> int:
    """The axis of the classes in the model's logits: a segmentation model's logits are per
    pixel, with the classes on the layout's channel axis."""
    return spec.layout.channel_axis if models.spec(spec.model).per_pixel else -1


def build_program(spec: RunSpec, inputs: InputSpec, backend: str | None = None) -> Program:
    """The model, state and steps of ``spec`` on ``inputs`` (see ``Program``) for
    ``backend`` (None: JAX's default), which picks how a non-finite step is skipped
    (``fast_defaults.default_skip_branch``)."""
    branch = default_skip_branch(backend)
    abstract = nnx.eval_shape(lambda: build_model(spec, inputs))
    defs = split_model(abstract)[0]
    step_defs = eval_defs(spec, abstract, defs)
    frozen = trainable = None
    if spec.config.freeze_backbone:  # train.freeze: only the head trains
        more = dataclasses.replace(inputs, num_classes=inputs.num_classes + 1)
        head = head_paths(abstract, nnx.eval_shape(lambda: build_model(spec, more)))
        frozen = functools.partial(frozen_updates, head=head)
        trainable = head
        defs = frozen_defs(abstract, defs, head)
    tx = build_optimizer(spec.optimizer, branch, frozen=frozen)
    axis = class_axis(spec)

    def init(model: nnx.Module | None = None, weights: dict | None = None) -> TrainState:
        model = build_model(spec, inputs) if model is None else configure_model(model, spec)
        if weights:  # train --init: state_dict-keyed values (train.init_weights)
            assign_torch_values(model, weights)
        # A copy: a step may take the state's buffers (donated), the spec keeps its value.
        loss_scale = jax.tree.map(jnp.array, spec.loss_scale)
        return create_train_state(model, tx, loss_scale, ema=spec.ema_decay is not None)[1]

    return Program(
        spec=spec,
        inputs=inputs,
        defs=defs,
        tx=tx,
        init=init,
        train_step=make_train_step(
            defs,
            tx,
            augment=image_augment(spec, inputs),
            targets=soft_targets(spec, inputs),
            skip_branch=branch,
            class_axis=axis,
            ema_decay=spec.ema_decay,
            trainable=trainable,
        ),
        eval_step=make_eval_step(step_defs, axis),
        forward=make_forward(step_defs),
    )
