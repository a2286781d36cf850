"""Sphinx configuration: MyST pages, the notebooks with their saved outputs, the CLI and
config references generated from the parsers and ``TrainConfig``, and an API reference from
the docstrings. Build: ``python3 -m sphinx -W -b html docs docs/_build/html``."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import layoutlab  # noqa: E402

project = "layoutlab"
release = version = layoutlab.__version__
copyright = "the layoutlab authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "generated_pages",
]
# The notebooks run in the test suite (nbmake); the pages show the outputs saved with them.
nb_execution_mode = "off"
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
html_theme = "furo"
html_title = f"layoutlab {release}"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
autodoc_typehints = "description"
autodoc_member_order = "bysource"
# Forward references inside annotations that autodoc cannot resolve are not errors here.
nitpicky = False
