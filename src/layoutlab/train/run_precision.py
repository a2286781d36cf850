"""A run's precision, resolved in one place: the policy a name gives and the loss scale
``"auto"`` stands for.

Every part that builds a run (``train``, ``inspect``, ``bench``, ``compare``) reads the
``Policy`` and the loss scale from here, through ``train.spec.RunSpec``, so the rule "float16
compute gets a dynamic loss scale" is written once and cannot drift between them.
"""

from __future__ import annotations

from layoutlab.loss_scale import get_loss_scale
from layoutlab.precision import Policy, get_policy

__all__ = ["AUTO_LOSS_SCALE", "resolve_loss_scale", "resolve_policy"]

AUTO_LOSS_SCALE = "auto"


def resolve_policy(precision: Policy | str | None) -> Policy:
    """The ``Policy`` of a preset name or spec (``ValueError`` listing the presets)."""
    return get_policy(precision)


def resolve_loss_scale(loss_scale: str | None, policy: Policy) -> str:
    """The loss-scale spec a run uses: ``"auto"`` is ``"dynamic"`` when ``policy`` computes
    in float16 (its gradients underflow without scaling) and ``"none"`` otherwise; ``None``
    is ``"none"``. Anything else is checked (``ValueError``) and returned as given."""
    if loss_scale is None:
        return "none"
    if loss_scale == AUTO_LOSS_SCALE:
        return "dynamic" if policy.needs_loss_scaling else "none"
    get_loss_scale(loss_scale)
    return loss_scale
