"""Model registry and architectures, built only from ``layoutlab.nn``.

``names()`` lists them, ``create(name, num_classes=, layout=, policy=, rngs=, **kw)`` builds one.
"""

from layoutlab.models import cnn3d, mobilenet, resnet, small_cnn, unet, vgg  # noqa: F401
from layoutlab.models.registry import (
    ModelSpec,
    create,
    names,
    register,
    resolve_layout,
    spec,
    unregister,
)

__all__ = ["ModelSpec", "create", "names", "register", "resolve_layout", "spec", "unregister"]
