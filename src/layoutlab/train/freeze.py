"""``freeze_backbone``: linear probing, where only the classifier head trains.

The head is the parameters whose shapes follow the class count (the model built for one
class more, compared), so no architecture names its head. Two parts:

- the optimizer gives every other parameter a ``-0.0`` update (``frozen_updates``): ``x +
  (-0.0) == x`` bit for bit for every ``x``, ``-0.0`` included (``+0.0`` would turn a ``-0.0``
  into ``+0.0``), and their optimizer state (moments, weight decay) is never made; the train
  step takes no gradient of them (``steps.make_train_step``'s ``trainable``), so the
  backbone runs forward only;
- the backbone runs in eval mode in the train step too (``frozen_defs``): its BatchNorm
  layers normalize with their running statistics and keep them, its dropout is off. A backbone
  in train mode would normalize each batch by its own statistics, features the head never
  sees at evaluation, and would move statistics that belong to the frozen weights; in eval
  mode the backbone is one fixed function in training and evaluation alike (what
  torchvision's and timm's linear probes do with ``backbone.eval()``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layoutlab.train.state import ModelDefs

__all__ = ["frozen_defs", "frozen_updates", "head_paths"]


def _param_shapes(model: nnx.Module) -> dict[tuple, tuple]:
    params = nnx.state(model, nnx.Param)
    return {
        tuple(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def head_paths(model: nnx.Module, one_more_class: nnx.Module) -> frozenset[tuple]:
    """Key paths (``jax.tree_util`` keys, as in the params' pytree) of ``model``'s head:
    its parameters whose shapes differ in ``one_more_class`` (the same model built for one
    class more; both may be abstract)."""
    more = _param_shapes(one_more_class)
    return frozenset(p for p, shape in _param_shapes(model).items() if more.get(p) != shape)


def _negative_zeros(updates):
    return jax.tree.map(lambda u: -jnp.zeros_like(u), updates)


def frozen_updates(
    inner: optax.GradientTransformation, head: frozenset[tuple]
) -> optax.GradientTransformation:
    """``inner`` on the ``head`` parameters; a ``-0.0`` update and no state for the rest."""

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "head" if tuple(path) in head else "frozen", params
        )

    keep = optax.stateless(lambda updates, params=None: _negative_zeros(updates))
    return optax.multi_transform({"head": inner, "frozen": keep}, labels)


def frozen_defs(model: nnx.Module, defs: ModelDefs, head: frozenset[tuple]) -> ModelDefs:
    """``defs`` with a train graph whose layers outside the head run in eval mode (their
    BatchNorm on running statistics, no dropout; ``model``: the model ``defs`` split,
    abstract is fine)."""
    head_modules = {_module_path(p) for p in head}
    model.train()
    for path, module in nnx.iter_modules(model):
        if _under(tuple(path), head_modules):
            continue
        for flag in ("use_running_average", "deterministic"):  # BatchNorm's, Dropout's
            if isinstance(getattr(module, flag, None), bool):
                setattr(module, flag, True)
    train_def = nnx.split(model, nnx.Param, ...)[0]
    model.train()
    return ModelDefs(train_def, defs.eval)


def _module_path(key_path: tuple) -> tuple:
    """The module path (attribute names and indices) of a parameter's key path
    (``['fc']['kernel'].value`` -> ``("fc",)``)."""
    keys = [k.key for k in key_path if isinstance(k, jax.tree_util.DictKey)]
    return tuple(keys[:-1])


def _under(path: tuple, prefixes: set[tuple]) -> bool:
    return any(path[: len(p)] == p for p in prefixes)
