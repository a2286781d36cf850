"""Pure train and eval steps: ``(state, images, labels) -> (state, metrics)``.

They are plain functions of pytrees, so ``jax.jit`` compiles them, ``layoutlab.xla`` lowers
them ahead of time and ``layoutlab.bench`` times them, all on the same code.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layoutlab.loss_scale import all_finite
from layoutlab.train.ema import optimizer_stepped, update_ema
from layoutlab.train.skip import update_and_apply
from layoutlab.train.state import ModelDefs, TrainState

__all__ = [
    "TOP_K",
    "class_last",
    "cross_entropy",
    "make_eval_step",
    "make_forward",
    "make_train_step",
]


def class_last(logits: jax.Array, class_axis: int = -1) -> jax.Array:
    """``logits`` in float32 with their class axis last: a segmentation model's per-pixel
    logits in a channels-first layout carry their classes on axis 1."""
    logits = logits.astype(jnp.float32)
    if class_axis % logits.ndim != logits.ndim - 1:
        logits = jnp.moveaxis(logits, class_axis, -1)
    return logits


def cross_entropy(logits: jax.Array, labels: jax.Array, class_axis: int = -1) -> jax.Array:
    """Mean softmax cross-entropy, always in float32 (see ``precision.FP32_OPS``), over
    every label: one per image, or one per pixel (``labels`` shaped like ``logits`` without
    the class axis ``class_axis``). Float ``labels`` are soft targets, one row of class
    weights per image (mixup, cutmix, label smoothing: ``train.batch_augment``)."""
    logits = class_last(logits, class_axis)
    if jnp.issubdtype(labels.dtype, jnp.floating):
        return optax.softmax_cross_entropy(logits, labels.astype(jnp.float32)).mean()
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _select(pred, on_true, on_false):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def make_train_step(
    defs: ModelDefs,
    tx: optax.GradientTransformation,
    *,
    augment: Callable | None = None,
    targets: Callable | None = None,
    skip_branch: str = "select",
    class_axis: int = -1,
    ema_decay: float | None = None,
    trainable: frozenset | None = None,
) -> Callable[[TrainState, jax.Array, jax.Array], tuple[TrainState, dict]]:
    """One optimizer step with loss scaling; a step with non-finite grads changes nothing.

    ``tx`` should be wrapped in ``layoutlab.train.skip.skip_nonfinite`` so its state also
    stays put on a skipped step. ``augment(key, images) -> images`` runs on device, then
    ``targets(key, images, labels) -> (images, soft targets, labels)`` (mixup, cutmix, label
    smoothing): the loss takes the soft targets, the accuracy the labels it returns.
    ``skip_branch``: how the params keep their values on such a step (``train.skip``).
    ``class_axis``: the logits' class axis (a segmentation model's per-pixel logits: the
    layout's channel axis); the labels have the logits' shape without it.
    ``ema_decay``: the decay of ``state.ema`` (``train.ema``), updated once per applied
    optimizer step; the state has an EMA exactly when it is given.
    ``trainable``: None, or the key paths of the parameters that get gradients; the others'
    are zero constants, so their backward is not computed (a frozen backbone).
    """

    def loss_fn(params, model_state, images, targets, loss_scale):
        if trainable is not None:
            params = jax.tree_util.tree_map_with_path(
                lambda path, p: p if tuple(path) in trainable else jax.lax.stop_gradient(p), params
            )
        model = nnx.merge(defs.train, params, model_state, copy=True)
        logits = model(images)
        loss = cross_entropy(logits, targets, class_axis)
        _, _, new_model_state = nnx.split(model, nnx.Param, ...)
        return loss_scale.scale(loss), (loss, logits, new_model_state)

    def step(state: TrainState, images: jax.Array, labels: jax.Array):
        if augment is not None or targets is not None:
            key = jax.random.fold_in(jax.random.key(0), state.step)
        if augment is not None:
            images = augment(key, images)
        soft = labels
        if targets is not None:
            images, soft, labels = targets(key, images, labels)
        grads, (loss, logits, model_state) = jax.grad(loss_fn, has_aux=True)(
            state.params, state.model_state, images, soft, state.loss_scale
        )
        # Gradients keep their params' dtypes: the optimizer state and the update must match
        # half-precision params (pure bf16/fp16 policies). float32 params are unaffected.
        grads = state.loss_scale.unscale(grads, keep_dtype=True)
        finite = all_finite(grads)
        # optax relies on standard promotion (e.g. ``decay ** count`` with an int count).
        with jax.numpy_dtype_promotion("standard"):
            params, opt_state = update_and_apply(
                tx, grads, state.opt_state, state.params, finite, skip_branch
            )
        model_state = _select(finite, model_state, state.model_state)
        ema = state.ema
        if ema_decay is not None:
            stepped = optimizer_stepped(state.opt_state, opt_state, finite)
            ema = update_ema(ema, params, model_state, ema_decay, stepped)
        new_state = TrainState(
            step=state.step + 1,
            params=params,
            model_state=model_state,
            opt_state=opt_state,
            loss_scale=state.loss_scale.adjust(finite),
            ema=ema,
        )
        metrics = {
            "loss": loss,
            "accuracy": jnp.mean(
                (jnp.argmax(logits, axis=class_axis) == labels).astype(jnp.float32)
            ),
            "grads_finite": finite,
            "loss_scale": state.loss_scale.loss_scale,
        }
        return new_state, metrics

    return step


# The eval step also counts top-k hits where a data set has more classes than this.
TOP_K = 5


def make_eval_step(
    defs: ModelDefs, class_axis: int = -1
) -> Callable[[TrainState, jax.Array, jax.Array], dict]:
    """Sums over a batch, so batches of any size add up: ``loss_sum``, ``correct``,
    ``count``, the ``confusion`` matrix (rows: true class, columns: predicted) and, with more
    than ``TOP_K`` classes, ``top5_correct`` (a label among the ``TOP_K`` highest logits, ties
    to the lower class as ``argmax``). Per-pixel labels count each pixel (``class_axis`` as
    in ``make_train_step``). A negative label marks padding (``train.evaluation.PAD_LABEL``):
    it counts nowhere. The training loop's evaluations and ``layoutlab evaluate`` run this one
    program: the same figures, each image's forward computed once."""

    def step(state: TrainState, images: jax.Array, labels: jax.Array) -> dict:
        model = nnx.merge(defs.eval, state.params, state.model_state)
        logits = class_last(model(images), class_axis)
        real = labels >= 0
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
        predicted = jnp.argmax(logits, axis=-1)
        classes = logits.shape[-1]
        counted = real.astype(jnp.int32)
        # One cell per (true, predicted) pair; a padding row adds 0 to cell 0.
        cells = jnp.where(real, labels * classes + predicted, 0).ravel()
        confusion = jnp.zeros(classes * classes, jnp.int32).at[cells].add(counted.ravel())
        sums = {
            "loss_sum": jnp.sum(jnp.where(real, losses, 0.0)),
            "correct": jnp.sum((real & (predicted == labels)).astype(jnp.int32)),
            "count": jnp.sum(counted),
            "confusion": confusion.reshape(classes, classes),
        }
        if classes > TOP_K:
            top = jax.lax.top_k(logits, TOP_K)[1]
            hit = real & jnp.any(top == labels[..., None], axis=-1)
            sums[f"top{TOP_K}_correct"] = jnp.sum(hit.astype(jnp.int32))
        return sums

    return step


def make_forward(defs: ModelDefs) -> Callable[[TrainState, jax.Array], jax.Array]:
    """Inference: eval-mode logits."""

    def forward(state: TrainState, images: jax.Array) -> jax.Array:
        return nnx.merge(defs.eval, state.params, state.model_state)(images)

    return forward
