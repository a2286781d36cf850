"""``intercept_convs(fn)``: within it, every ``nn.Conv`` call goes to ``fn`` instead, like
linen's ``intercept_methods``: how ``conv_config.conv_specs`` reads each conv's input shape
from one abstract trace without a callback on the model."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

__all__ = ["current_interceptor", "intercept_convs"]

# What ``intercept_convs`` set, for the duration of one trace; a model holds no callback.
_INTERCEPTOR: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "layoutlab_conv_interceptor", default=None
)


@contextlib.contextmanager
def intercept_convs(fn: Callable) -> Iterator[None]:
    """Within, every ``Conv`` call ``conv(x)`` returns ``fn(conv, x)`` instead (``fn`` may
    call ``conv.compute(x)``), in this context (thread, task) only."""
    token = _INTERCEPTOR.set(fn)
    try:
        yield
    finally:
        _INTERCEPTOR.reset(token)


def current_interceptor() -> Callable | None:
    """What ``Conv.__call__`` hands its calls to (None: nothing intercepts them)."""
    return _INTERCEPTOR.get()
