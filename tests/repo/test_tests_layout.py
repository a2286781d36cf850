"""``tests/`` is arranged by package (docs/development.md, "Where a test goes"): a folder per
package of ``src/layoutlab``, ``core``, ``cli`` and ``repo`` for what belongs to none, and
``helpers`` for the shared modules, which hold no tests."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src" / "layoutlab"
OWN = {"core", "cli", "repo", "helpers"}


def test_every_test_module_sits_in_a_package_folder_and_helpers_apart():
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name[0] not in "_."}
    assert folders <= packages | OWN, sorted(folders - packages - OWN)
    assert [p.name for p in TESTS.glob("*.py")] == ["conftest.py"]
    modules = [p for p in TESTS.glob("*/*.py") if p.name != "conftest.py"]
    for path in modules:
        # A helper holds no tests and a package folder nothing but tests.
        assert path.name.startswith("test_") == (path.parent.name != "helpers"), path
    # Every folder is on the path (conftest.py): a module is imported by its file name alone.
    names = [p.name for p in modules]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_suite_runs_one_openmp_thread():
    """tests/conftest.py sets it before anything starts OpenMP, unless the environment did;
    a subprocess inherits it (docs/development.md)."""
    import os
    import subprocess
    import sys

    assert os.environ.get("OMP_NUM_THREADS")
    got = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert got == os.environ["OMP_NUM_THREADS"]
