"""``ShapeWatcher``: warns when a loop keeps meeting new input shapes (each one recompiles
the step and, with autotuning, searches again)."""

from __future__ import annotations

import warnings

from layoutlab.bench.cases import format_shape

__all__ = ["ShapeChurnWarning", "ShapeWatcher"]


class ShapeChurnWarning(UserWarning):
    """A run keeps meeting new input shapes; each one recompiles (and re-autotunes)."""


class ShapeWatcher:
    """Tracks the input shapes a loop sees and warns once when there are too many.

    Two shapes are normal (full batches and the last partial one); each shape beyond
    ``max_shapes`` costs a compile and, with autotuning, a new search.
    """

    def __init__(self, max_shapes: int = 2, *, name: str = "input"):
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be >= 1, got {max_shapes}.")
        self.max_shapes, self.name = max_shapes, name
        self.shapes: list[tuple[int, ...]] = []
        self.warned = False

    def observe(self, shape) -> bool:
        """Records ``shape`` (a shape or an array); True when it is new."""
        shape = tuple(int(s) for s in getattr(shape, "shape", shape))
        if shape in self.shapes:
            return False
        self.shapes.append(shape)
        if len(self.shapes) > self.max_shapes and not self.warned:
            self.warned = True
            seen = ", ".join(format_shape(s) for s in self.shapes)
            warnings.warn(
                ShapeChurnWarning(
                    f"{len(self.shapes)} different {self.name} shapes so far ({seen}); each "
                    "new shape recompiles the step and, with autotuning, runs a new search. "
                    "Keep shapes fixed: drop or pad the last partial batch, or bucket "
                    "variable sizes into a few shapes."
                ),
                stacklevel=2,
            )
        return True
