"""What every layout-aware layer shares: its layout, its policy and how it changes layout."""

from __future__ import annotations

from flax import nnx

from layoutlab.layout import Layout, parse_layout
from layoutlab.precision import Policy, get_policy

__all__ = ["LayoutModule"]


class LayoutModule(nnx.Module):
    """A module with a ``layout`` and a ``policy``.

    ``layoutlab.convert_layout`` walks a model and calls ``_to_layout`` on every
    ``LayoutModule``; layers holding layout-dependent params override ``_convert_params``.
    """

    layout: Layout
    policy: Policy

    def _set_layout_policy(self, layout: Layout | str, policy: Policy | str | None) -> None:
        self.layout = parse_layout(layout)
        self.policy = get_policy(policy)

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
