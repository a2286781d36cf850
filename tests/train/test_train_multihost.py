"""Two processes x two CPU devices on localhost, joined by ``jax.distributed`` (gloo), train
one run: it finishes, matches one process x four devices, writes its files once, and a
kill -9 of both processes followed by ``--resume`` on both ends bit for bit where the
uninterrupted two-process run ends. Every subprocess has a timeout, so nothing hangs.

Process 0 of every launch is the command as a user runs it (``python -m layoutlab.cli``, its
supervisor and the trainer child). Process 1 runs that trainer child's part, ``cli.main``
with ``SUPERVISED_ENV`` set, in a process forked from one that imported layoutlab once
(``tests/helpers/block_server.py``): its own process, backend and distributed client, without the
~3.5 s of CPU that the interpreter and the imports cost each launch.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import kill_hook
import numpy as np
import pytest
from block_server import BlockServer

from layoutlab import cli
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.metrics import read_records
from layoutlab.train.step_log import TENSORBOARD_DIR
from layoutlab.train.supervise import SUPERVISED_ENV

# Every comparison here is between layoutlab's own runs (two processes against one, a resume
# against the uninterrupted run), so they compile at LLVM level 0 (docs/development.md): the
# same HLO passes and cpu_fast options, ~3 s less CPU per trainer that compiles, and process 1
# compiles in every launch (its cache keys name its own topology, and only process 0 writes).
LEVEL_0 = "xla_backend_optimization_level=0"
TRAIN = ["--set", "model_kwargs.width=4", "--steps", "6", "--batch-size", "16",
         "--set", "eval_every=3", "--log-every", "2", "--quiet",
         "--xla-option", LEVEL_0]  # fmt: skip
TIMEOUT_S = 240


def _env(devices: int, base=None, **extra) -> dict:
    env = dict(base or os.environ, JAX_PLATFORMS="cpu", **extra)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(workdir, *extra):
    return [sys.executable, "-m", "layoutlab.cli", "train", "--workdir", str(workdir),
            *TRAIN, *extra]  # fmt: skip


def _by_environment(i, port):
    """The launch through JAX's environment variables instead of flags."""
    env = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2",
           "JAX_PROCESS_ID": str(i)}  # fmt: skip
    return ["--distributed"], env


def _serving(port: int, timeout_s: float = 120.0) -> None:
    """Returns once something accepts connections on ``port`` of localhost."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing served port {port} within {timeout_s} s")


def start_forks(env: dict, log_dir: Path) -> BlockServer:
    """The server that process 1 of each launch is forked from: two devices, ``env``'s
    compilation cache (read at import), and nothing started."""
    return BlockServer(_env(2, env), log_dir)


def _run_forked(
    forks: BlockServer, argv: list[str], environ: dict, workdir: Path, kill_at: str | None = None
):
    """``layoutlab <argv>`` as the supervisor's child runs it (``SUPERVISED_ENV`` set, the
    environment's additions in place before anything reads them), in a child of ``forks``,
    which writes its process id to ``pid`` in its working directory (for a test to kill)
    and kills itself at ``kill_at`` of a save (``kill_hook``)."""
    code = (
        "import os, sys\n"
        "open('pid', 'w').write(str(os.getpid()))\n"
        f"os.environ.update({ {SUPERVISED_ENV: '1', **environ}!r})\n"
        f"{kill_hook.install_code(kill_at) if kill_at else ''}"
        "from layoutlab import cli\n"
        f"sys.exit(cli.main({argv!r}))\n"
    )
    cwd = Path(tempfile.mkdtemp(prefix=f"{workdir.name}-process1-", dir=workdir.parent))
    return forks.run(code, cwd, TIMEOUT_S)


def _launch(
    workdir, *extra, forks, env=None, env_extra=None, launch_flags=None, serve_first=False,
    cwd=None, kill_at=None,
):  # fmt: skip
    """Starts the two trainers of one run; returns ``[(returncode, stdout, stderr)]``.
    ``forks``: the server process 1 is forked from (``start_forks``).
    ``launch_flags(i, port)`` gives process ``i``'s flags, or ``(flags, environment)``.
    ``env``: process 0's environment to start from (the default: this process's).
    ``serve_first``: start process 1 once process 0 serves the coordinator's port.
    ``cwd``: process 0's working directory; process 1 runs in a new one inside it, so a
    relative ``workdir`` names another directory on each (by default each runs in its own
    directory beside ``workdir``).
    ``kill_at``: both processes kill themselves at that phase of a save (``kill_hook``)."""
    port = _free_port()
    commands = []
    for i in range(2):
        flags = launch_flags(i, port) if launch_flags else [
            "--distributed", "--coordinator", f"127.0.0.1:{port}",
            "--num-processes", "2", "--process-id", str(i),
        ]  # fmt: skip
        flags, own = flags if isinstance(flags, tuple) else (flags, {})
        commands.append((_command(workdir, *extra, *flags), {**(env_extra or {}), **own}))
    (command, environ), (forked, forked_environ) = commands
    with ThreadPoolExecutor(1) as pool:
        environ0 = _env(2, env, **environ)
        environ0 = kill_hook.environ(kill_at, environ0) if kill_at else environ0
        proc = subprocess.Popen(command, env=environ0, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=cwd)  # fmt: skip
        try:
            if serve_first:
                _serving(port)
            # forked[3:]: the command's arguments, after python -m layoutlab.cli
            where = Path(cwd) / workdir if cwd is not None else Path(workdir)
            other = pool.submit(_run_forked, forks, forked[3:], forked_environ, where, kill_at)
            out, err = proc.communicate(timeout=TIMEOUT_S)
        finally:  # process 1 then ends too: its coordinator, or the run, is gone
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return [(proc.returncode, out, err), other.result()]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, env, forks):
    # The module's persistent compilation cache: the killed and the resumed launches below
    # read the programs that this run compiled.
    workdir = tmp_path_factory.mktemp("multihost") / "run"
    results = _launch(workdir, env=env, forks=forks)
    for code, _, err in results:
        assert code == 0, err[-2000:]
    return workdir, results


def test_two_processes_train_one_run_like_one_process_with_four_devices(
    two_process_run, tmp_path, capsys
):
    workdir, _ = two_process_run
    # The one process with four devices is this one (tests/conftest.py), through the same
    # command: no second process start, and its programs are compiled here.
    assert jax.device_count() == 4 and jax.process_count() == 1
    single = tmp_path / "single"
    code = cli.main(["train", "--workdir", str(single), *TRAIN])
    assert code == 0, capsys.readouterr().err[-2000:]
    got, want = read_records(workdir / "metrics.jsonl"), read_records(single / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [3, 6]
    # The same global batches and the same program; only the gradient all-reduce differs
    # (gloo's ring across processes against XLA:CPU's in-process sum), which changes float32
    # rounding: ~1 ulp per step, well inside 1e-5 after 6 steps of a tiny model.
    for a, b in zip(got, want, strict=True):
        for key in ("train_loss", "test_loss", "test_accuracy"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=key)
    params_2p, _ = read_checkpoint(workdir / "checkpoints")
    params_1p, _ = read_checkpoint(single / "checkpoints")
    for path, value in params_1p.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(params_2p[path], value, rtol=1e-5, atol=1e-6, err_msg=path)


def test_only_process_0_writes_the_run_files(two_process_run):
    workdir, results = two_process_run
    # Two writers would show as duplicated records and a second event file.
    assert [r["step"] for r in read_records(workdir / "metrics.jsonl")] == [3, 6]
    assert [r["step"] for r in read_records(workdir / "steps.jsonl")] == [2, 4, 6]
    assert len(list((workdir / TENSORBOARD_DIR).iterdir())) == 1
    assert json.loads((workdir / "config.json").read_text())["num_steps"] == 6
    # Process 0 reports; process 1 prints no line of layoutlab's own.
    assert "step 6: test_accuracy" in results[0][1]
    assert "test_accuracy" not in results[1][1] and "outputs in" not in results[1][1]
    assert "error" not in results[1][2].lower()


def test_kill_both_then_resume_both_is_bitwise(two_process_run, tmp_path, env, forks):
    # The resume joins through JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID.
    # Checkpoints every 2 steps, evaluations every 3: the resume starts from step 4, between
    # evaluations, so step 6's train metrics need step 4's, carried in the checkpoint.
    workdir, every_2 = tmp_path / "killed", ("--set", "checkpoint_every=2")
    killed = _launch(workdir, *every_2, env=env, kill_at="before_save@6", forks=forks)
    assert [code for code, _, _ in killed] == [-signal.SIGKILL] * 2
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved[-1] == 4, saved
    resumed = _launch(
        workdir, "--resume", *every_2, env=env, launch_flags=_by_environment, forks=forks
    )
    for code, _, err in resumed:
        assert code == 0, err[-2000:]
    want, _ = read_checkpoint(two_process_run[0] / "checkpoints")
    got, meta = read_checkpoint(workdir / "checkpoints")
    assert meta["step"] == 6
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    # metrics.jsonl as the uninterrupted run wrote it, train metrics included, bit for bit
    keys = ("step", "epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy")
    rows = [read_records(d / "metrics.jsonl") for d in (workdir, two_process_run[0])]
    assert [[r[k] for k in keys] for r in rows[0]] == [[r[k] for k in keys] for r in rows[1]]


def _one_line_error(result, *words):
    code, out, err = result
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, (code, err[-2000:])
    for word in words:
        assert word in lines[0], lines[0]


def test_bad_launches_are_one_line_errors(tmp_path, capsys, monkeypatch):
    port = _free_port()
    base = [sys.executable, "-m", "layoutlab.cli", "train", "--workdir", str(tmp_path / "x")]

    def start(*args):
        return subprocess.Popen([*base, *args], env=_env(2), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip

    # Nobody listens at the coordinator: an error after the timeout, not a hang. The two
    # commands run side by side: the first only waits out its timeout.
    join = ["--distributed", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    procs = [start(*join, "--process-id", "1", "--distributed-timeout", "1"),
             start("--distributed")]  # fmt: skip
    try:
        results = [(p, *p.communicate(timeout=60)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    unanswered, no_cluster = [(p.returncode, out, err) for p, out, err in results]
    _one_line_error(unanswered, "could not join")
    _one_line_error(no_cluster, "found no cluster")

    # Flags refused before JAX's distributed client starts: the command in this process, as
    # the supervised child that reports them (the supervisor passed the lines above through).
    monkeypatch.setenv(SUPERVISED_ENV, "1")

    def here(*args):
        code = cli.main(["train", "--workdir", str(tmp_path / "x"), *args])
        out, err = capsys.readouterr()
        return code, out, err

    _one_line_error(here("--coordinator", "127.0.0.1:1"), "need --distributed")
    localhost = ["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"]
    _one_line_error(here("--distributed", *localhost), "HOST:PORT")
    _one_line_error(here(*join, "--process-id", "2"), "--process-id must lie in [0, 2)")
    assert jax.process_count() == 1  # nothing here joined a run


def test_mismatched_process_counts_and_batch_sizes(tmp_path, forks):
    def flags(i, port):
        count = ["2", "3"][i]  # process 1 was told another count
        return ["--distributed", "--coordinator", f"127.0.0.1:{port}",
                "--num-processes", count, "--process-id", str(i)]  # fmt: skip

    for result in _launch(tmp_path / "a", launch_flags=flags, forks=forks):
        _one_line_error(result, "--num-processes")
    # 4 devices in all: a global batch of 6 does not split over them.
    for result in _launch(tmp_path / "b", "--batch-size", "6", forks=forks):
        _one_line_error(result, "batch_size=6", "4 devices")


def test_initialize_distributed_checks_its_arguments_before_starting_jax():
    from layoutlab.train.distributed import DistributedError, initialize_distributed

    with pytest.raises(DistributedError, match="go together"):
        initialize_distributed("127.0.0.1:1234")
    with pytest.raises(DistributedError, match="HOST:PORT"):
        initialize_distributed("127.0.0.1", 2, 0)
