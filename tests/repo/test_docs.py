"""The documentation site builds with warnings as errors, and its generated references cover
every command and every ``TrainConfig`` field.

A warning is a broken link inside the site (a page or a heading anchor that does not exist),
a bad cross-reference, a docstring that does not parse or a page left out of every toctree.
The build reads the notebooks' saved outputs (the notebooks themselves run under nbmake).
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from layoutlab.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


# ``python -m sphinx``, less furo's sidebar tree: the whole site's toctree, resolved again for
# each page, about a third of the build's CPU time. It warns of nothing the pages do not:
# every toctree (none is hidden) is resolved, and its entries warned about, in its own page.
# Less the search index too (every page's words stemmed, and search.html): about a tenth of what
# is left, it warns of nothing, and no test reads it.
_SPHINX = (
    "import sys, furo\n"
    "from sphinx.builders.html import StandaloneHTMLBuilder\n"
    "furo._compute_navigation_tree = lambda context: ''\n"
    "StandaloneHTMLBuilder.search = False\n"
    "from sphinx.cmd.build import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    proc = subprocess.run(
        [sys.executable, "-c", _SPHINX, "-E", "-W", "--keep-going", "-q", "-b", "html"]
        + ["-d", str(out / ".doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


def test_no_toctree_is_hidden():
    """What lets ``site`` leave out furo's sidebar tree: a hidden toctree's entries are
    resolved (and a missing or title-less page warned about) only in that tree."""
    pages = [p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts]
    pages += [ROOT / "docs" / "_ext" / "generated_pages.py"]  # writes the generated toctrees
    assert pages and not [p.name for p in pages if ":hidden:" in p.read_text()]


def test_docs_build_without_warnings(site):
    for page in ("index", "quickstart", "guides/training", "cli", "api", "_generated/config"):
        assert (site / f"{page}.html").is_file(), page


def test_cli_reference_lists_every_command(site):
    from test_cli_fast_start import _command_paths

    html = (site / "cli.html").read_text()
    for path in sorted(set(_command_paths())):
        # sphinx-argparse gives each (sub)command's section the id layoutlab-<path>
        assert f'id="layoutlab-{"-".join(path)}"' in html, path


def test_config_reference_lists_every_field(site):
    html = (site / "_generated" / "config.html").read_text()
    for field in dataclasses.fields(TrainConfig):
        assert (
            f'<code class="docutils literal notranslate"><span class="pre">{field.name}</span>'
            in html
        ), field.name


def test_every_notebook_and_results_file_has_a_page(site):
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert (site / "_generated" / "notebooks" / f"{nb.stem}.html").is_file(), nb.name
    for md in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert (site / "_generated" / "results" / f"{md.stem}.html").is_file(), md.name
