"""The old name of ``layoutlab.data.source_forms``: the text that names a data set is a data
source. Its names still resolve here, each with a ``DeprecationWarning`` naming the new one."""

from layoutlab.lazy import lazy_exports

__all__ = []

__getattr__, __dir__ = lazy_exports(
    __name__,
    {},
    lambda: set(globals()),
    renamed={
        "SPEC_FORMS": "layoutlab.data.source_forms.SOURCE_FORMS",
        "SYNTHETIC_SHAPE": "layoutlab.data.source_forms.SYNTHETIC_SHAPE",
        "known_image_shape": "layoutlab.data.source_forms.known_image_shape",
        "parse_image_shape": "layoutlab.data.source_forms.parse_image_shape",
    },
)
