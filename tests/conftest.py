"""Strict test settings: the suite runs with the strictest numpy semantics JAX offers.

- dtype promotion is strict, so a silent upcast in a layer is an error;
- rank promotion raises, so a bias added without an explicit broadcast is an error;
- 4 fake CPU devices back the sharding tests (set before JAX starts its backend);
- the autotune cache is a fresh file, not the user's;
- warnings are errors (pyproject's filterwarnings).
"""

import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=4"
os.environ.setdefault("MPLBACKEND", "Agg")
# The suite's own autotune cache, empty at start: what a user (or an earlier run) tuned into
# ~/.cache/layoutlab must not change which conv plan a test sees. Subprocesses inherit it.
os.environ["LAYOUTLAB_AUTOTUNE_CACHE"] = os.path.join(
    tempfile.mkdtemp(prefix="layoutlab-autotune-"), "autotune.json"
)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


def has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a GPU; none present")
    gpu = has_gpu()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment for training subprocesses of one test module: they share a persistent
    compilation cache, so a resumed or repeated run reads its programs back."""
    cache = tmp_path_factory.mktemp("jax_cache")
    return {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


@pytest.fixture(scope="session")
def guarantees_run(tmp_path_factory):
    """A finished 4-step CLI run of a tiny small_cnn on digits (checkpoints and evaluations
    at steps 2 and 4), shared read-only by the modules that check a run's guarantees."""
    from layoutlab import cli

    workdir = tmp_path_factory.mktemp("guarantees") / "run"
    argv = ["--steps", "4", "--batch-size", "32", "--seed", "1", "--set", "eval_every=2"]
    argv += ["--set", "model_kwargs.width=4", "--set", "model_kwargs.hidden=16"]
    assert cli.main(["train", *argv, "--workdir", str(workdir), "--quiet"]) == 0
    return workdir


@pytest.fixture
def copy(guarantees_run, tmp_path):
    """A writable copy of ``guarantees_run``, for tests that resume or damage a run."""
    dest = tmp_path / "run"
    shutil.copytree(guarantees_run, dest)
    return dest
