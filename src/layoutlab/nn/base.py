"""What every layout-aware layer shares: its layout, its policy and how it changes layout.

A layer takes values, never names (jmp passes a ``Policy``, equinox a module's
configuration): names are parsed once, at the edges (the CLI, ``TrainConfig``,
``models.create``), and a layer given a string says how to make the value.
"""

from __future__ import annotations

from flax import nnx

from layoutlab.layout import Layout
from layoutlab.precision import PRESETS, Policy

__all__ = ["LayoutModule", "layer_layout", "layer_policy"]


def layer_layout(layout: Layout, where: str) -> Layout:
    """``layout`` if it is a ``Layout``, else a ``TypeError`` naming the fix."""
    if isinstance(layout, Layout):
        return layout
    if isinstance(layout, str):
        fix = (
            f"layout=Layout.{layout.upper()} (or parse_layout({layout!r}))"
            if layout.upper() in Layout.__members__
            else f"a Layout, e.g. layout=Layout.NHWC (valid names: {', '.join(Layout.__members__)})"
        )
        raise TypeError(
            f"{where} got layout={layout!r}, a string; layers take Layout values: pass {fix}."
        )
    raise TypeError(
        f"{where} got layout={layout!r}; layers take Layout values, e.g. layout=Layout.NHWC."
    )


def layer_policy(policy: Policy | None, where: str) -> Policy:
    """``policy`` if it is a ``Policy``; None is the default, full precision (``fp32``), as a
    jmp-style module without a policy computes in its params' float32. Else a ``TypeError``
    naming the fix."""
    if policy is None:
        return PRESETS["fp32"]
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        raise TypeError(
            f"{where} got policy={policy!r}, a string; layers take Policy values: pass "
            f"policy=get_policy({policy!r})."
        )
    raise TypeError(
        f"{where} got policy={policy!r}; layers take Policy values, e.g. "
        "policy=get_policy('mixed_bf16'), or None for fp32."
    )


class LayoutModule(nnx.Module):
    """A module with a ``layout`` and a ``policy``.

    ``layoutlab.convert_layout`` walks a model and calls ``_to_layout`` on every
    ``LayoutModule``; layers holding layout-dependent params override ``_convert_params``.
    """

    layout: Layout
    policy: Policy

    def _set_layout_policy(self, layout: Layout, policy: Policy | None) -> None:
        self.layout = layer_layout(layout, type(self).__name__)
        self.policy = layer_policy(policy, type(self).__name__)

    def _convert_params(self, src: Layout, dst: Layout) -> None:
        """Rewrite params stored in a layout-dependent order; most layers have none."""

    def _to_layout(self, dst: Layout) -> None:
        src = self.layout
        if dst == src:
            return
        self._convert_params(src, dst)
        self.layout = dst

    def _name(self) -> str:
        return type(self).__name__
