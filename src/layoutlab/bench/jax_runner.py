"""Runs one layoutlab configuration: build the model, compile its step, time calls."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layoutlab import models
from layoutlab.bench.cases import JaxCase
from layoutlab.bench.memory import device_peak_bytes, peak_rss_bytes
from layoutlab.bench.timing import JaxStep
from layoutlab.loss_scale import get_loss_scale
from layoutlab.precision import get_policy
from layoutlab.train.skip import skip_nonfinite
from layoutlab.train.state import create_train_state
from layoutlab.train.steps import make_forward, make_train_step

__all__ = ["JaxRunner", "build_model", "layout_images"]

# Plain SGD with momentum, as the PyTorch runner uses, so both sides do the same update.
_LR, _MOMENTUM = 0.01, 0.9


def layout_images(images_channels_last: np.ndarray, layout: str) -> np.ndarray:
    """Channels-last images moved into ``layout`` (a copy; the values are unchanged)."""
    lay = models.resolve_layout(layout, images_channels_last.ndim - 2)
    if lay.is_channels_last:
        return images_channels_last
    return np.ascontiguousarray(np.moveaxis(images_channels_last, -1, 1))


def build_model(case: JaxCase, seed: int = 0) -> nnx.Module:
    """The case's model; the same ``seed`` gives the same weights in every layout."""
    w = case.workload
    kwargs = {"in_channels": w.channels, **w.kwargs}
    return models.create(
        w.model,
        num_classes=w.num_classes,
        layout=case.layout,
        policy=case.precision,
        rngs=nnx.Rngs(seed),
        **kwargs,
    )


class JaxRunner:
    """``setup()`` compiles (row fields out), ``step()`` runs one blocked step,
    ``finish()`` reports memory, ``close()`` frees the buffers."""

    def __init__(self, case: JaxCase, *, backend: str | None = None, seed: int = 0):
        self.case, self.backend, self.seed = case, backend, seed
        self.step_fn: JaxStep | None = None

    def row(self) -> dict:
        return self.case.row()

    def setup(self) -> dict:
        case, w = self.case, self.case.workload
        policy = get_policy(case.precision)
        tx = skip_nonfinite(optax.sgd(_LR, momentum=_MOMENTUM))
        loss_scale = get_loss_scale("dynamic" if policy.needs_loss_scaling else None)
        defs, state = create_train_state(build_model(case, self.seed), tx, loss_scale)
        images = jnp.asarray(layout_images(w.images_channels_last(self.seed), case.layout))
        name = f"{w.model}/{case.layout}/{case.precision}/{w.mode}/b{w.batch_size}"
        if w.mode == "train":
            labels = jnp.asarray(w.labels(self.seed))
            step = make_train_step(defs, tx)
            self.step_fn = JaxStep(
                step,
                (state, images, labels),
                donate_argnums=(0,),
                carry=0,
                backend=self.backend,
                name=name,
            )
        else:
            # Inference needs no optimizer state: leave it out of the arguments.
            forward = make_forward(defs)
            self.step_fn = JaxStep(
                forward, (state._replace(opt_state=None), images), backend=self.backend, name=name
            )
        fields = self.step_fn.compile()
        fields.pop("lower_s")
        fields.pop("alias_bytes")
        be = self.step_fn.backend
        return {**fields, "backend": be.name, "device_kind": be.device_kind}

    def step(self) -> None:
        self.step_fn()

    def logits(self) -> np.ndarray | None:
        """The last inference step's output (None in train mode)."""
        if self.case.workload.mode != "infer" or self.step_fn.outputs is None:
            return None
        return np.asarray(self.step_fn.outputs.astype(jnp.float32))

    def finish(self) -> dict:
        device = self.step_fn.backend.device if self.step_fn else None
        return {
            "device_peak_bytes": device_peak_bytes(device) if device is not None else None,
            "peak_rss_bytes": peak_rss_bytes(),
        }

    def close(self) -> None:
        if self.step_fn is not None:
            self.step_fn.close()
