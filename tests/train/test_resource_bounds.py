"""Resource bounds and outputs, checked before the work (docs/guides/guarantees.md): a data
set or run larger than the memory it would go in, too many classes to evaluate, an output
path that cannot be written, a distributed timeout that is no number of seconds. Each is
one ``error:`` line, exit code 2, with nothing written; and the run's last line names only
the outputs it wrote.

The memory available is patched down to a few MB, so that small data sets stand for the
ones that would not fit (a real one would take the machine's memory before the fix).
"""

import os
import subprocess
import sys

import pytest
from cli_helpers import one_line_error as _one_line_error
from cli_helpers import run_cli as _cli

from layoutlab.data import memory as data_memory
from layoutlab.train import run_memory

TINY = ["--tiny", "--quiet", "--steps", "1"]


def _folder(root, n=4, size=16):
    from PIL import Image

    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(n):
            Image.new("L", (size, size), 40 * i).save(root / label / f"{i}.png")
    return root


def test_data_larger_than_the_memory_available_is_refused_before_it_loads(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(data_memory, "available_bytes", lambda: 1_000_000)
    workdir = tmp_path / "run"
    # 10000 float32 images of 8x8x1 and a copy: 5.12 MB; 10 prototypes add 2.6 kB.
    code, _, err = _cli(
        capsys, "train", "--workdir", workdir, *TINY, "--data", "synthetic:8x8x1:10:10000"
    )
    assert code == 2 and not workdir.exists()
    _one_line_error(
        err, "10000 images and 10 class prototypes of 8x8x1 need about 5.1 MB", "1.0 MB available"
    )
    # 8 images of 16x16 resized to 128x128: 8 * 128 * 128 * 4 * 2 bytes = 1.05 MB.
    code, _, err = _cli(
        capsys, "train", "--workdir", workdir, *TINY, "--data", f"folder:{_folder(tmp_path / 'f')}",
        "--image-size", "128",
    )  # fmt: skip
    assert code == 2 and not workdir.exists()
    _one_line_error(err, "8 images of 128x128x1 need about 1.0 MB", "smaller --image-size")


def test_a_run_larger_than_its_device_memory_is_refused_before_it_starts(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(run_memory, "available_bytes", lambda: 100_000)
    workdir = tmp_path / "run"
    code, _, err = _cli(capsys, "train", "--workdir", workdir, *TINY)
    assert code == 2 and not workdir.exists()
    line = _one_line_error(err, "the run needs about", "state", "activations", "confusion")
    assert "the machine has available (MemAvailable) 0.1 MB" in line and "--batch-size" in line
    # More classes than the eval step's int32 confusion-matrix index holds: no run at all.
    monkeypatch.undo()
    code, _, err = _cli(
        capsys, "train", "--workdir", workdir, *TINY, "--data", "synthetic:8x8x1:46341:64"
    )
    assert code == 2 and not workdir.exists()
    _one_line_error(err, "has 46341 classes, more than the 46340 the evaluation counts")


def test_a_gpu_is_compared_with_its_own_memory(monkeypatch):
    class Device:
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 8_000_000_000}

    monkeypatch.setattr(run_memory.jax, "local_devices", lambda: [Device()])
    monkeypatch.setattr(run_memory, "available_bytes", lambda: 1)  # the host's: not asked
    assert run_memory._device_bytes() == (8_000_000_000, "the GPU holds", True)


def test_output_paths_are_checked_before_the_work(tmp_path, capsys, monkeypatch):
    from layoutlab.bench import sweep
    from layoutlab.bench.tuning import registry_model

    def no_work(*args, **kwargs):
        raise AssertionError("the work ran before its output path was checked")

    monkeypatch.setattr(sweep, "run_sweep", no_work)
    monkeypatch.setattr(registry_model, "autotune_registry_model", no_work)
    taken = tmp_path / "results"
    taken.write_text("keep me")
    code, _, err = _cli(
        capsys, "bench", "--model", "small_cnn", "--tiny", "--layouts", "NHWC", "--precisions",
        "fp32", "--batch-sizes", "2", "--modes", "infer", "--backend", "cpu", "--out", taken,
    )  # fmt: skip
    assert code == 2 and taken.read_text() == "keep me"
    _one_line_error(err, f"--out {taken} is a file, not a directory")
    code, _, err = _cli(
        capsys,
        "autotune",
        "convs",
        "--model",
        "small_cnn",
        "--batch-size",
        "2",
        "--out",
        tmp_path / "no" / "p.json",
    )
    assert code == 2
    _one_line_error(err, "its directory", "does not exist")
    code, _, err = _cli(
        capsys, "export", "--workdir", tmp_path / "no-run", "--out", tmp_path / "no" / "m.bin"
    )
    assert code == 2
    _one_line_error(err, "--out", "its directory", "does not exist")


def test_a_distributed_timeout_that_is_no_number_of_seconds_is_one_line(tmp_path):
    command = [sys.executable, "-m", "layoutlab.cli", "train", "--workdir", str(tmp_path / "r"),
               "--distributed", "--coordinator", "127.0.0.1:1", "--num-processes", "1",
               "--process-id", "0", "--distributed-timeout", "nan"]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    _one_line_error(proc.stderr, "--distributed-timeout must be a number of seconds > 0", "nan")
    assert not (tmp_path / "r").exists()


@pytest.mark.usefixtures("shared_compiles")
def test_the_last_line_names_only_the_outputs_written(tmp_path, capsys):
    # A run checked for its files and its last line, not its numbers: LLVM level 0
    # (docs/development.md), about half the compile time of its steps.
    workdir = tmp_path / "run"
    code, out, err = _cli(
        capsys, "train", "--workdir", workdir, *TINY, "--set", "tensorboard=false",
        "--xla-option", "xla_backend_optimization_level=0",
    )  # fmt: skip
    assert code == 0, err
    line = out.strip().splitlines()[-1]
    assert line.startswith(f"outputs in {workdir}: config.json, metrics.jsonl, ")
    assert "checkpoints/" in line and "tensorboard" not in line
    assert not (workdir / "tensorboard").exists()
