"""Strict test settings: the suite runs with the strictest numpy semantics JAX offers.

- dtype promotion is strict, so a silent upcast in a layer is an error;
- rank promotion raises, so a bias added without an explicit broadcast is an error;
- 4 fake CPU devices back the sharding tests (set before JAX starts its backend);
- the autotune cache is a fresh file, not the user's;
- one persistent compilation cache for the whole run, not the user's: both workers, their
  subprocesses and notebook kernels read back what any of them compiled;
- one OpenMP thread per process (oneDNN, PyTorch): the two workers already fill two cores;
- on a GPU, float32 matmuls run at full precision: the float64 references' float32
  tolerances assume it, where XLA:GPU's default is TensorFloat32 (docs/performance/gpu.md);
- warnings are errors (pyproject's filterwarnings).
"""

import atexit
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

# tests/ holds a folder per package and helpers/ (docs/development.md): every folder is on the
# path, so test modules and helpers import one another by file name wherever they live.
sys.path[:0] = [
    str(p) for p in sorted(Path(__file__).parent.iterdir()) if p.is_dir() and p.name[0] not in "_."
]

# Python's bytecode cache on, where the environment turned it off (PYTHONDONTWRITEBYTECODE):
# the workers and the ~110 processes the suite starts (command-line runs, notebook kernels,
# distributed launches) each import layoutlab's ~200 modules, which without a .pyc Python
# compiles from source every time: 3.05 against 2.5-2.8 CPU-seconds for the CLI's imports on
# the 2-core VM (docs/development.md). The files land in the checkout's ignored __pycache__/.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=4"
os.environ.setdefault("MPLBACKEND", "Agg")
# One OpenMP thread (oneDNN's kernels; PyTorch's too) in this process and the ones it starts,
# notebook kernels included: the suite keeps both cores busy with its two workers, and a
# second OpenMP thread has to share its core with the other worker while oneDNN's first waits
# for it in a spinning barrier. Beside one busy process, notebook 06's four runs took 49-55
# CPU-seconds with two threads and 27-30 with one, with the same accuracies. XLA's own
# threads are not OpenMP's and keep their number.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite's own autotune cache, empty at start: what a user (or an earlier run) tuned into
# ~/.cache/layoutlab must not change which conv plan a test sees. Subprocesses inherit it;
# the directory goes when this process exits (each xdist worker makes its own).
_AUTOTUNE_DIR = tempfile.mkdtemp(prefix="layoutlab-autotune-")
atexit.register(shutil.rmtree, _AUTOTUNE_DIR, ignore_errors=True)
os.environ["LAYOUTLAB_AUTOTUNE_CACHE"] = os.path.join(_AUTOTUNE_DIR, "autotune.json")
# One persistent compilation cache for the whole run: both xdist workers (they inherit the
# controller's environment, so the controller makes it) and the processes they start. Test
# modules compile many of the same programs (a small_cnn's train step on digits, a
# ResNet-18's forward), and the key holds the whole HLO and every option, so a hit is the
# same executable. Programs under a second are compiled again rather than written (the
# thousands of eager primitives). Not the user's cache: what it holds must not change a test.
# A size limit turns on jax's file lock around each read and write: without it a worker could
# read a program another process is still writing, and fail on the half-written file.
if "LAYOUTLAB_SUITE_JAX_CACHE" not in os.environ:
    os.environ["LAYOUTLAB_SUITE_JAX_CACHE"] = tempfile.mkdtemp(prefix="layoutlab-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["LAYOUTLAB_SUITE_JAX_CACHE"], ignore_errors=True)
SUITE_CACHE = os.environ["LAYOUTLAB_SUITE_JAX_CACHE"]
os.environ["JAX_COMPILATION_CACHE_DIR"] = SUITE_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(16 << 30)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


def has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


# The longest modules (and notebooks), longest first, from their CPU seconds measured one
# module at a time (docs/development.md, 2026-12-06; issue 69's modules from their
# --durations, 2026-12-07). xdist hands whole modules to its two
# workers in collection order (pyproject: `--dist loadscope --no-loadscope-reorder`), so each
# module's fixtures are built on one worker only, and with the long ones first the two
# workers finish together instead of one running a long module alone at the end. The rest
# keep their collection order; a stale entry only costs balance.
LONGEST_FIRST = (
    "test_readme.py",
    "test_grad_numerics_torchvision.py",
    "test_models.py",
    "test_train_multihost.py",
    "test_train_agreement.py",
    "test_host_memory.py",
    "test_fast_defaults.py",
    "test_docs.py",
    "06_train_digits.ipynb",
    "07_regularization.ipynb",
    "test_fine_tuning_guide.py",
    "test_train_regularization.py",
    "test_train_validation.py",
    "test_train_ema.py",
    "test_train_cli.py",
    "test_segmentation_training.py",
    "test_train_integrity.py",
    "test_bench_conv_options.py",
    "04_benchmark.ipynb",
    "test_infer.py",
    "test_compare_defaults.py",
    "test_conv_algos.py",
    "test_train_crash_resume.py",
    "test_compare_torch.py",
    "test_compare_layerwise.py",
    "test_kill_resume_attack.py",
    "test_train_conv_options.py",
    "test_activation_storage.py",
    "test_infer_plan.py",
    "test_train_guarantees.py",
    "05_numerics.ipynb",
    "test_mixed_precision_training.py",
    "test_train_step_log.py",
    "test_compare_cli.py",
    "test_evaluation.py",
    "test_huge_pages.py",
    "test_run_identity.py",
    "test_bench_sweep.py",
    "test_train_loop.py",
)


def _module_rank(item) -> int:
    name = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_finish(session):
    # What exists after collection (JAX, Flax, PyTorch, every test module) lives for the whole
    # session: frozen, it is left out of the collector's full passes, which otherwise walk it
    # again each time. A young collection every 10,000 allocations instead of 700 (and so a
    # full pass 14 times less often) leaves the collector a third of its CPU time
    # (docs/development.md).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_module_rank)  # stable: a module's tests keep their order
    skip_gpu = pytest.mark.skip(reason="needs a GPU; none present")
    gpu = has_gpu()
    if gpu:
        # TF32 keeps 10 mantissa bits: a 3e-4 relative error against float64 that the
        # float32 tolerances (1e-5) would call a wrong answer (seen on an H200: Dense and
        # the one-dot transposed conv; cuDNN's small convs happened to run in full float32).
        jax.config.update("jax_default_matmul_precision", "highest")
        # Training subprocesses too (``env`` copies this environment): a run records the
        # setting, and a resume across an in-process and a subprocess run compares it.
        os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)


# A data-parallel train step's convs are custom_partitioning calls, each keyed by its Python
# callback's id: no other process (nor a later trace in this one) finds the step in the cache.
# A module that sets CACHE_PARTITIONED = True drops the ids from the key (jax's flag): only
# where no two of its programs differ in a partitioned conv's algorithm alone, which the key
# would then no longer tell apart, and each run is one process (a two-process resume that read
# its step back aborted: test_train_multihost.py does not opt in; docs/development.md).
PARTITIONED_KEY = "JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY"


@pytest.fixture(scope="module")
def env(tmp_path_factory, request):
    """The environment for training subprocesses of one test module: they share the run's
    persistent compilation cache (a module with ``CACHE_PARTITIONED`` one of its own), so a
    resumed or repeated run reads its programs back."""
    partitioned = {PARTITIONED_KEY: "1"} if getattr(request.module, "CACHE_PARTITIONED", 0) else {}
    # Without the partitioning ids two modules' programs that differ in a partitioned conv's
    # algorithm alone share a key: such a module keeps a cache of its own.
    cache = tmp_path_factory.mktemp("jax_cache") if partitioned else SUITE_CACHE
    return {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        **partitioned,
    }


@pytest.fixture(scope="module")
def forks(env, tmp_path_factory):
    """The server that process 1 of each multi-process launch is forked from
    (``test_train_multihost.start_forks``), one per module that launches them (the
    multihost and agreement tests), with that module's ``env``."""
    from test_train_multihost import start_forks

    server = start_forks(env, tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def shared_compiles(env):
    """This process compiles into the cache the module's subprocesses use (``env``), so its
    in-process runs that repeat a program read it back; jax's previous cache settings come
    back after the module. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("shared_compiles")``."""
    from layoutlab.xla.cache import compilation_cache

    flag, before = "jax_remove_custom_partitioning_ptr_from_cache_key", None
    if PARTITIONED_KEY in env:
        before = getattr(jax.config, flag)
        jax.config.update(flag, True)
    try:
        with compilation_cache(env["JAX_COMPILATION_CACHE_DIR"]):
            yield
    finally:  # the worker's next modules compile without the flag, whatever happened here
        if before is not None:
            jax.config.update(flag, before)


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
