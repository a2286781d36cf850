"""The documented way to run one notebook from the command line works after
``pip install -e ".[test]"``: its programs are installed by the test extra and start."""

import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from test_readme import ROOT

DEVELOPMENT = ROOT / "docs" / "development.md"
# The distributions that provide each documented runner: the `jupyter` command (jupyter_core)
# and its `execute` subcommand (nbclient), pytest's notebook plugin (nbmake), and the
# `python3` kernel every notebook names (ipykernel).
PROVIDERS = {
    ("jupyter", "execute"): {"jupyter_core", "nbclient", "ipykernel"},
    ("python3", "-m", "pytest"): {"pytest", "nbmake", "ipykernel"},
}


def _documented() -> list[list[str]]:
    """The shell lines of docs/development.md that run a notebook."""
    blocks = re.findall(r"^```bash\n(.*?)^```", DEVELOPMENT.read_text(), re.S | re.M)
    lines = [shlex.split(line) for block in blocks for line in block.splitlines()]
    return [words for words in lines if words and words[-1].endswith(".ipynb")]


def _test_extra() -> set[str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = (
        re.match(r"[A-Za-z0-9_.-]+", spec)[0] for spec in extra["optional-dependencies"]["test"]
    )
    return {name.lower().replace("-", "_") for name in names}


def test_the_documented_notebook_commands_are_installed_by_the_test_extra_and_start():
    commands = _documented()
    assert {tuple(words[: len(key)]) for words in commands for key in PROVIDERS} >= set(PROVIDERS)
    extra = _test_extra()
    for words in commands:
        key = next(k for k in PROVIDERS if tuple(words[: len(k)]) == k)
        assert PROVIDERS[key] <= extra, (words, PROVIDERS[key] - extra)
        assert (ROOT / words[-1]).is_file(), words[-1]
        if key[0] == "python3":  # pytest runs notebooks through nbmake's plugin, as installed
            plugins = entry_points(group="pytest11")
            assert any(e.value.startswith("nbmake") for e in plugins), list(plugins)
            continue
        # `jupyter execute` starts (its --help): the console script beside this interpreter.
        jupyter = str(Path(sys.executable).parent / "jupyter")
        done = subprocess.run([jupyter, *key[1:], "--help"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
