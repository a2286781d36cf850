"""A run's loss scale, resolved in one place: what ``"auto"`` stands for.

Every part that builds a run (``train``, ``inspect``, ``bench``, ``compare``) takes the
``Policy`` (``precision.get_policy``) and the loss scale from ``train.spec.RunSpec``, so the
rule "float16 compute gets a dynamic loss scale" is written once and cannot drift between
them.
"""

from __future__ import annotations

from layoutlab.loss_scale import get_loss_scale
from layoutlab.precision import Policy

__all__ = ["AUTO_LOSS_SCALE", "loss_scale_name", "resolve_loss_scale"]

AUTO_LOSS_SCALE = "auto"


def loss_scale_name(loss_scale: str | None, policy: Policy) -> str:
    """The loss-scale name a run uses, unchecked: ``"auto"`` is ``"dynamic"`` when
    ``policy`` computes in float16 (its gradients underflow without scaling) and ``"none"``
    otherwise; ``None`` is ``"none"``; anything else as given."""
    if loss_scale is None:
        return "none"
    if loss_scale == AUTO_LOSS_SCALE:
        return "dynamic" if policy.needs_loss_scaling else "none"
    return loss_scale


def resolve_loss_scale(loss_scale: str | None, policy: Policy) -> str:
    """``loss_scale_name``, checked (``ValueError`` for a name ``get_loss_scale`` refuses)."""
    name = loss_scale_name(loss_scale, policy)
    get_loss_scale(name)
    return name
