"""``layoutlab train`` end to end in subprocesses, including SIGKILL mid-epoch and ``--resume``
(the resume of the killed run in this process: what needs a process of its own is the kill).
The uninterrupted run is the command as a user starts it; the others are processes forked
from one that imported layoutlab before JAX started a backend (``fork_server``), each its own
process for a signal or ``--backend`` without paying ~3.5 s of imports again.

The subprocesses inherit the 4 fake CPU devices from conftest (XLA_FLAGS), so they train
data parallel. They share a persistent compilation cache: a run that compiles the same
programs as the uninterrupted one reads them back, which saves most of its start-up. This
process's own runs (the resume, the in-process run) read them from the same cache.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from block_server import BlockServer

from layoutlab import cli
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.command import build_config, register
from layoutlab.train.interrupt import Terminated, sigterm_interrupts
from layoutlab.train.launch import gpu_platform
from layoutlab.train.loop import train_and_evaluate

pytestmark = pytest.mark.usefixtures("shared_compiles")

# The runs read the data-parallel train step back from the cache too (conftest's
# PARTITIONED_KEY): every run here compiles one conv plan, the table's.
CACHE_PARTITIONED = True

# 44 batches of 32 make a digits epoch: every step here is mid-epoch 0. Every comparison is
# between layoutlab's own runs (resumed or in-process against the CLI run), so they compile at
# LLVM level 0 (docs/development.md).
ARGS = [
    "--data", "digits",
    "--steps", "12",
    "--batch-size", "32",
    "--seed", "3",
    "--set", "model_kwargs.width=4",
    "--set", "model_kwargs.hidden=16",
    "--set", "eval_every=4",
    "--set", "keep_checkpoints=2",
    "--xla-option", "xla_backend_optimization_level=0",
    "--quiet",
]  # fmt: skip

# Runs `layoutlab train` with train_batches patched to stop (sleep) before yielding batch
# STOP; the flag file says the process got there. Everything else is the real CLI.
DRIVER = """
import pathlib, sys, time
import layoutlab.train.loop as loop
from layoutlab.train.command import main

flag, stop = pathlib.Path(sys.argv[1]), int(sys.argv[2])
real = loop.train_batches

def stalling(*args, **kwargs):
    for i, batch in enumerate(real(*args, **kwargs)):
        if i == stop:
            flag.touch()
            time.sleep(600)
        yield batch

loop.train_batches = stalling
sys.exit(main(["train", *sys.argv[3:]]))
"""


def _cli():
    """``python -m layoutlab.cli`` once it exists, else this package's own entry point."""
    try:
        from layoutlab import cli
    except ImportError:
        cli = None
    if "layoutlab.train.command" in getattr(cli, "COMMANDS", ()):
        return [sys.executable, "-m", "layoutlab.cli"]
    return [sys.executable, "-m", "layoutlab.train.command"]


def _train(env, *argv, timeout=300) -> subprocess.CompletedProcess:
    """``layoutlab train ARGV`` in a child process, its output captured."""
    return subprocess.run(
        [*_cli(), "train", *argv], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def fork_server(env, tmp_path_factory):
    """The process the runs below are forked from, with the module's ``env`` (its
    compilation cache is read at import, so they read ``full_run``'s programs back)."""
    server = BlockServer(env, tmp_path_factory.mktemp("fork_server"))
    yield server
    server.close()


def _forked(server, pool, code, argv, cwd):
    """Submits ``code`` to ``pool``, run as ``python -c code *argv`` would be in a child of
    ``server`` in directory ``cwd``, which writes its process id to ``cwd/pid``; the future
    gives ``(returncode, stdout, stderr)``."""
    cwd.mkdir()
    head = f"import os, sys\nopen('pid', 'w').write(str(os.getpid()))\nsys.argv[1:] = {argv!r}\n"
    return pool.submit(server.run, head + code, cwd, 300)


def _train_forked(server, *argv):
    """``layoutlab train ARGV`` in a child of ``server``: ``(returncode, stdout, stderr)``."""
    with ThreadPoolExecutor(1) as pool:
        code = "from layoutlab import cli\nsys.argv[0] = 'layoutlab'\nsys.exit(cli.main())\n"
        cwd = Path(argv[argv.index("--workdir") + 1] + ".proc")
        return _forked(server, pool, code, ["train", *argv], cwd).result()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, env):
    workdir = tmp_path_factory.mktemp("cli") / "run"
    proc = _train(env, *ARGS, "--workdir", str(workdir))
    assert proc.returncode == 0, proc.stderr
    return workdir, proc


def test_cli_writes_the_workdir(full_run):
    workdir, proc = full_run
    assert f"outputs in {workdir}" in proc.stdout
    assert proc.stderr == ""  # --quiet: no bar, and no warnings or logs from orbax
    config = json.loads((workdir / "config.json").read_text())
    assert config["num_steps"] == 12 and config["model_kwargs"] == {"width": 4, "hidden": 16}
    assert config["data_parallel"] is True and config["loss_scale"] == "none"
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]
    for key in ("epoch", "train_loss", "test_loss", "test_accuracy", "images_per_sec"):
        assert all(isinstance(r[key], float) for r in records), key
    assert all(r["loss_scale"] == 1.0 and r["skipped_steps"] == 0 for r in records)
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [8, 12]  # keep_checkpoints=2
    assert (workdir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _wait_for(cwd, paths, run, timeout=240):
    """The process id of ``run`` (``_forked``'s future, in ``cwd``) once ``paths`` exist."""
    deadline = time.monotonic() + timeout
    pid = cwd / "pid"
    while not all(p.exists() for p in (pid, *paths)):
        if run.done():
            pytest.fail(f"driver exited early: {run.result()}")
        if time.monotonic() > deadline:
            if pid.exists():
                os.kill(int(pid.read_text()), signal.SIGKILL)
            pytest.fail(f"timed out waiting for {paths}")
        time.sleep(0.05)
    return int(pid.read_text())


def test_sigkill_mid_epoch_then_resume_matches_uninterrupted(
    full_run, fork_server, tmp_path, capsys
):
    reference, _ = full_run
    workdir, proc = tmp_path / "run", tmp_path / "proc"
    flag = proc / "stalled"
    with ThreadPoolExecutor(1) as pool:
        argv = [str(flag), "7", *ARGS, "--workdir", str(workdir)]
        run = _forked(fork_server, pool, DRIVER, argv, proc)
        # The prefetch thread asks for batch 7 once the loop has taken batch 4 (two wait in
        # its queue), i.e. after step 4 and its checkpoint; the loop then stalls after step
        # 7, so the kill lands mid-epoch between the checkpoints of steps 4 and 8.
        manifest = workdir / "checkpoints" / "4" / "layoutlab_manifest.json"
        os.kill(_wait_for(proc, [flag, manifest], run), signal.SIGKILL)
        assert run.result()[0] == -signal.SIGKILL
    assert not (workdir / "checkpoints" / "8").exists()

    # The command's own entry point, here: the interpreter and its ~3.5 s of imports are not
    # what a resume is about, and it reads full_run's programs back (shared_compiles).
    code = cli.main(["train", "--workdir", str(workdir), "--resume", "--quiet"])
    assert code == 0, capsys.readouterr().err
    got, meta = read_checkpoint(workdir / "checkpoints")
    want, _ = read_checkpoint(reference / "checkpoints")
    assert meta["step"] == 12 and got.keys() == want.keys()
    for path in want:  # params, batch stats, dropout RNG, Adam moments, step: bit for bit
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]


def test_same_seed_in_process_is_bitwise_identical_to_the_cli_run(full_run, tmp_path):
    reference, _ = full_run
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    config, _ = build_config(parser.parse_args(["train", *ARGS]))
    train_and_evaluate(config, tmp_path, quiet=True)
    got, _ = read_checkpoint(tmp_path / "checkpoints")
    want, _ = read_checkpoint(reference / "checkpoints")
    assert got.keys() == want.keys() and int(got[".step"]) == 12
    for path in want:  # two runs, two processes, one seed: every array bit for bit
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    init = ".params['classifier']['layers'][3]['kernel'].value"
    assert not np.array_equal(read_checkpoint(tmp_path / "checkpoints", step=8)[0][init], got[init])


def _quiet_run(code: str, env) -> int:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode


def test_backend_flag_picks_the_platform_or_says_it_is_missing(tmp_path, env, fork_server):
    # Probed in a child: this process's JAX may be held to the CPU (JAX_PLATFORMS=cpu) while
    # `--backend gpu` overrides that and starts an installed plugin's device.
    platform = gpu_platform()
    probe = f"import jax; jax.config.update('jax_platforms', '{platform}'); jax.devices()"
    if platform != "gpu" and _quiet_run(probe, env) == 0:
        pytest.skip("a GPU is present: --backend gpu would train on it")
    code, _, err = _train_forked(
        fork_server, "--backend", "gpu", "--workdir", str(tmp_path / "gpu")
    )
    assert code == 2, err
    assert err.startswith("error: --backend gpu is not available here")
    assert err.count("\n") == 1 and not (tmp_path / "gpu").exists()
    code, _, err = _train_forked(fork_server, *ARGS, "--backend", "cpu", "--workdir",
                                 str(tmp_path / "cpu"))  # fmt: skip
    assert code == 0, err
    assert json.loads((tmp_path / "cpu" / "config.json").read_text())["num_steps"] == 12


@pytest.mark.gpu
def test_backend_gpu_trains_on_the_gpu(tmp_path, env):
    # jax_platforms="gpu" expands to cuda, rocm and oneapi and fails unless all of them start:
    # on jax 0.11 with only the CUDA plugin, `train --backend gpu` failed that way.
    done = _train(env, *ARGS, "--backend", "gpu", "--workdir", str(tmp_path / "gpu"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "gpu" / "config.json").read_text())["num_steps"] == 12


# DRIVER whose stall ends when the test says so (FLAG.go exists): an interrupted run closes
# its prefetch thread, which would wait out a stall of fixed length.
RESUMABLE_STALL = DRIVER.replace(
    "time.sleep(600)", "while not flag.with_suffix('.go').exists(): time.sleep(0.05)"
)


def test_sigterm_says_what_ctrl_c_says(full_run, fork_server, tmp_path):
    """SIGTERM (what a job scheduler sends first) stops the run as Ctrl-C does: one line
    saying how to continue, a non-zero exit, and the workdir's lock released. The run is
    ``full_run``'s (its programs come from the cache), stalled mid-epoch."""
    assert RESUMABLE_STALL != DRIVER
    workdir, proc = tmp_path / "run", tmp_path / "proc"
    flag = proc / "stalled"
    with ThreadPoolExecutor(1) as pool:
        argv = [str(flag), "7", *ARGS, "--workdir", str(workdir)]
        run = _forked(fork_server, pool, RESUMABLE_STALL, argv, proc)
        os.kill(_wait_for(proc, [flag], run), signal.SIGTERM)
        flag.with_suffix(".go").touch()
        code, _, err = run.result(timeout=120)
    assert code == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["interrupted; continue with --resume"], err
    assert json.loads((workdir / "layoutlab.lock").read_text())["released"]


def test_a_sigterm_dropped_by_a_finalizer_is_raised_again():
    """Python drops an exception raised in a finalizer or garbage-collector callback (JAX
    runs one), where the SIGTERM handler may happen to run: the run must stop all the same."""

    class Finalizer:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs here, inside the finalizer
                pass

    with pytest.raises(Terminated), sigterm_interrupts():
        Finalizer()
        time.sleep(60)  # the work, interrupted when the signal comes again


def test_a_hook_installed_inside_the_sigterm_scope_outlives_it():
    """orbax's failure path wraps the unraisable hook for good, to drop the echo its threads
    raise after the call (train.orbax_failures); leaving the SIGTERM scope must not undo
    that, or the late echo surfaces ("Exception ignored in: None" after a full disk)."""
    before = sys.unraisablehook
    try:
        with sigterm_interrupts():
            inner = sys.unraisablehook

            def wrapper(unraisable):
                return inner(unraisable)

            sys.unraisablehook = wrapper
        assert sys.unraisablehook is wrapper
    finally:
        sys.unraisablehook = before
    with sigterm_interrupts():
        pass
    assert sys.unraisablehook is before  # and with nothing installed over it, ours goes
