"""The optional native extension ``layoutlab._onednn`` (``native/``): oneDNN convolutions as
XLA FFI handlers. Everything else is in ``pyproject.toml``.

The include and library folders are found at build time: XLA's FFI headers in the installed
jaxlib (found without importing jax), oneDNN's headers and ``libdnnl`` in the
``onednn-devel-cpu-gomp`` / ``onednn-cpu-gomp`` wheels. Where any of them is missing (another
architecture, no compiler) the extension is left out and layoutlab runs XLA's convs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

from setuptools import Extension, setup


def _wheel_dir(dist: str, suffix: str) -> str | None:
    """The folder holding the file of ``dist`` whose path ends with ``suffix``."""
    try:
        files = importlib.metadata.files(dist) or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        # A wheel's data files sit outside site-packages: their paths start with ../..
        path = os.path.normpath(os.path.abspath(str(f.locate())))
        if path.replace(os.sep, "/").endswith("/" + suffix) and os.path.isfile(path):
            return os.path.dirname(path)
    return None


def _jaxlib_include() -> str | None:
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = os.path.join(next(iter(spec.submodule_search_locations)), "include")
    return inc if os.path.isfile(os.path.join(inc, "xla", "ffi", "api", "ffi.h")) else None


def _extensions() -> list[Extension]:
    ffi_inc = _jaxlib_include()
    dnnl_hpp = _wheel_dir("onednn-devel-cpu-gomp", "include/oneapi/dnnl/dnnl.hpp")
    lib_dir = _wheel_dir("onednn-cpu-gomp", "libdnnl.so.3")
    if not (ffi_inc and dnnl_hpp and lib_dir):
        return []
    dnnl_inc = os.path.dirname(os.path.dirname(dnnl_hpp))  # .../include
    return [
        Extension(
            "layoutlab._onednn",
            sources=[
                "native/onednn_conv.cc",
                "native/onednn_norm.cc",
                "native/onednn_pool.cc",
                "native/onednn_ffi.cc",
            ],
            depends=["native/onednn_common.h", "native/onednn_conv.h"],
            include_dirs=[ffi_inc, dnnl_inc],
            library_dirs=[lib_dir],
            # The wheel ships libdnnl.so.3 (and a copy named libdnnl.so): link by the SONAME's
            # file so the link works whichever copies exist. No rpath: layoutlab loads the
            # library by absolute path before it imports the extension.
            extra_link_args=[os.path.join(lib_dir, "libdnnl.so.3")],
            extra_compile_args=[
                "-std=c++17",
                "-O2",
                "-fvisibility=hidden",
                "-Wno-return-type",
                "-g0",
            ],
            language="c++",
            optional=True,
        )
    ]


setup(ext_modules=_extensions())
