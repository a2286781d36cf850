"""``train --backend gpu`` names the installed GPU plugin's platform to JAX, found without
starting a backend (the distributed join must come first)."""

import importlib.metadata
import subprocess
import sys
import types

import pytest

from layoutlab.train.launch import gpu_platform


def _plugins(monkeypatch, entry_points=(), modules=None, tmp_path=None):
    found = [types.SimpleNamespace(name=n) for n in entry_points]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: found)
    if modules is None:
        monkeypatch.setitem(sys.modules, "jax_plugins", None)  # import raises ImportError
        return
    for name in modules:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    monkeypatch.setitem(sys.modules, "jax_plugins", types.SimpleNamespace(__path__=[str(tmp_path)]))


@pytest.mark.parametrize(
    ("entry_points", "want"),
    [(["xla_cuda13"], "cuda"), (["xla_cuda12"], "cuda"), (["xla_rocm7"], "rocm"), ([], "gpu")],
)
def test_entry_point_names_the_platform(monkeypatch, entry_points, want):
    _plugins(monkeypatch, entry_points)
    assert gpu_platform() == want


def test_namespace_package_plugin(monkeypatch, tmp_path):
    _plugins(monkeypatch, modules=["xla_rocm60"], tmp_path=tmp_path)
    assert gpu_platform() == "rocm"


def test_plugin_without_a_device_is_one_line():
    # The CUDA plugin on a machine without a GPU: jax skips cuda, then asserts that some
    # backend started. Run where no GPU is visible (the test's own process keeps its CPU).
    code = (
        "import sys, jax\n"
        "from layoutlab.train import launch\n"
        "launch.gpu_platform = lambda: 'cuda'\n"
        "jax.config.update('jax_platforms', 'cuda')\n"
        "sys.exit(launch.use_backend('gpu'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode == 0:
        pytest.skip("a GPU is visible here")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: --backend gpu is not available here")
