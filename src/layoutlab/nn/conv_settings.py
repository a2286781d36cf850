"""``ConvSettings``: how one ``Conv`` computes, as one frozen value.

A conv holds its settings as a static attribute, so a jitted model's cache key holds them
and new settings are a new trace. ``nn.configure(model, settings)`` returns a copy with new
ones; nothing changes a model's convs in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from layoutlab.nn.conv_algos.algorithm import Algorithm
from layoutlab.nn.conv_algos.plan import PlanEntry
from layoutlab.nn.conv_names import AUTO, KERNEL_STORAGES, XLA

__all__ = ["ConvSettings", "check_kernel_storage"]


def check_kernel_storage(storage: str) -> str:
    if storage not in KERNEL_STORAGES:
        raise ValueError(
            f"Unknown kernel_storage {storage!r}; use 'layout' (the layout's kernel order) "
            "or 'channels_last' (HWIO in every layout)."
        )
    return storage


@dataclasses.dataclass(frozen=True)
class ConvSettings:
    """How a 2D ``Conv`` computes and how it stores its kernel.

    ``algorithm``: the value it runs (``conv_algos.Algorithm``), None for XLA's native conv.
    ``auto``: it runs ``plan_entry`` (a ``ConvPlan``'s entry for it) when the entry was
    chosen for the shape it is called at, else XLA's conv; ``algorithm`` is then the entry's
    algorithm. ``kernel_storage``: ``"layout"`` (the layout's kernel order, which torch weight
    import and ``convert_layout`` expect) or ``"channels_last"`` (``HWIO`` in every layout,
    the order XLA:CPU computes in, so no kernel transpose runs per call).

    ``named`` and ``planned`` make one from names; nothing here reads the table of names.
    """

    algorithm: Algorithm | None = None
    auto: bool = False
    plan_entry: PlanEntry | None = None
    kernel_storage: str = "layout"

    def __post_init__(self):
        check_kernel_storage(self.kernel_storage)
        if self.algorithm is not None and not isinstance(self.algorithm, Algorithm):
            raise TypeError(
                f"ConvSettings.algorithm is an Algorithm value or None, got "
                f"{self.algorithm!r}; ConvSettings.named(name) takes a name."
            )
        if self.algorithm is not None and self.algorithm.name == XLA:
            object.__setattr__(self, "algorithm", None)  # the native conv is the None default
        if self.plan_entry is not None and not self.auto:
            raise ValueError("ConvSettings: a plan_entry is for auto=True settings only.")
        if self.auto:
            wanted = None if self.plan_entry is None else self.plan_entry.algorithm
            have = None if self.algorithm is None else self.algorithm.name
            if (wanted or XLA) != (have or XLA):
                raise ValueError(
                    f"ConvSettings: an auto conv runs its plan entry's algorithm ({wanted}), "
                    f"got the value of {have}; use ConvSettings.planned(entry, algorithms)."
                )

    @property
    def name(self) -> str:
        """What was asked: ``"auto"``, ``"xla"`` or the algorithm's name."""
        if self.auto:
            return AUTO
        return XLA if self.algorithm is None else self.algorithm.name

    @classmethod
    def named(
        cls,
        name: str | Algorithm,
        algorithms: Mapping[str, Algorithm] | None = None,
        *,
        kernel_storage: str = "layout",
    ) -> ConvSettings:
        """The settings of algorithm ``name`` (``"xla"``, ``"auto"``: no plan entry yet, or
        a registered name, its value taken from ``algorithms``, else from the table of names,
        ``conv_algos.get_algorithm``: this is where a name is parsed)."""
        if isinstance(name, Algorithm):
            return cls(name, kernel_storage=kernel_storage)
        if name == AUTO:
            return cls(auto=True, kernel_storage=kernel_storage)
        if name == XLA:
            return cls(kernel_storage=kernel_storage)
        return cls(_value(name, algorithms), kernel_storage=kernel_storage)

    @classmethod
    def planned(
        cls,
        entry: PlanEntry | None,
        algorithms: Mapping[str, Algorithm],
        *,
        kernel_storage: str = "layout",
    ) -> ConvSettings:
        """``"auto"`` settings running ``entry`` (None: XLA's conv), its algorithm's value
        taken from ``algorithms`` (a ``train.spec.RunSpec``'s), never from the table."""
        if entry is None or entry.algorithm == XLA:
            return cls(auto=True, plan_entry=entry, kernel_storage=kernel_storage)
        if entry.algorithm not in algorithms:
            raise ValueError(
                f"the conv plan names algorithm {entry.algorithm!r}, whose value was not "
                "given: pass it in algorithms (train.spec.resolve_spec makes them, or "
                f"{{name: conv_algos.get_algorithm(name)}})."
            )
        algorithm = algorithms[entry.algorithm]
        return cls(algorithm, True, entry, kernel_storage)

    def replace(self, **changes) -> ConvSettings:
        """These settings with ``changes`` (checked as new ones are)."""
        return dataclasses.replace(self, **changes)

    def native(self) -> ConvSettings:
        """These settings with XLA's conv (the kernel storage kept)."""
        return ConvSettings(kernel_storage=self.kernel_storage)


def _value(name: str, algorithms: Mapping[str, Algorithm] | None) -> Algorithm:
    if algorithms is not None and name in algorithms:
        return algorithms[name]
    from layoutlab.nn.conv_algos.registry import get_algorithm

    return get_algorithm(name)
