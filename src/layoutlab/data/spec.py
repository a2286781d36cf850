"""The old name of ``layoutlab.data.source``: the text that names a data set is a data
source. Its names still resolve here, each with a ``DeprecationWarning`` naming the new one."""

from layoutlab.lazy import lazy_exports

__all__ = []

__getattr__, __dir__ = lazy_exports(
    __name__,
    {},
    lambda: set(globals()),
    renamed={
        "get_dataset": "layoutlab.data.source.get_dataset",
        "known_image_shape": "layoutlab.data.source_forms.known_image_shape",
        "parse_image_shape": "layoutlab.data.source_forms.parse_image_shape",
        "SPEC_FORMS": "layoutlab.data.source_forms.SOURCE_FORMS",
    },
)
