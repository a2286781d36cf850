"""Run code blocks each in a process of its own without paying for the imports each time.

A server process imports the libraries the documentation's blocks use (jax, flax, optax,
NumPy, matplotlib and layoutlab's packages) and then does nothing else: it starts no JAX
backend and draws nothing. For every block it forks a child, which runs the block as
``python -c`` would: a new ``__main__``, ``sys.argv == ["-c"]``, the block's own working
directory, stdout and stderr to files, and at the end the interpreter's exit sequence
(non-daemon threads joined, ``atexit`` handlers run). A block therefore sees a process in
which only imports have happened, as a reader's fresh session does once it has run its
import lines; about 3 s of imports per block on a 2-core machine are paid once.

Everything that must precede JAX's backend still can: the backend starts in the child
(``tests/repo/test_readme.py`` runs the host-memory guide's ``keep_host_memory()`` this way).
``tests/train/test_train_crash_resume.py`` forks its runs to be killed from one too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

# Imported once in the server. Nothing here may start a JAX backend (the server checks).
PRELOAD = (
    "numpy",
    "jax",
    "jax.numpy",
    "flax.nnx",
    "optax",
    "matplotlib.pyplot",
    "layoutlab.models",
    "layoutlab.compare",
    "layoutlab.train.loop",
    "layoutlab.bench.sweep",
    "layoutlab.xla",
    "layoutlab.infer",
    "layoutlab.data",
)

_SERVER = r"""
import atexit, importlib, json, os, sys, threading, traceback, types

for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
from layoutlab.host.memory import backend_started
assert not backend_started(), "an import started the JAX backend"
requests, replies = sys.stdin, os.fdopen(int(sys.argv[2]), "w", buffering=1)
replies.write("ready\n")


def _exit_code(err):
    code = err.code
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _child(req):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(req["cwd"])
    sys.argv[:] = ["-c"]
    sys.path[0] = ""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(req["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as err:
        code = _exit_code(err)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # what the interpreter does at exit
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


for line in requests:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        replies.close()
        _child(req)
    replies.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
"""


class BlockServer:
    """``run(code, cwd, timeout)`` -> ``(returncode, stdout, stderr)``, each block in a child
    forked from one server started with ``env`` that imported ``preload``. POSIX only
    (``os.fork``)."""

    def __init__(self, env: dict[str, str], log_dir: Path, preload: tuple[str, ...] = PRELOAD):
        read_fd, write_fd = os.pipe()
        self._log = open(log_dir / "server.log", "w")  # the server's own errors, if any
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(preload), str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=self._log,
            env=env,
            text=True,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)  # the server's replies come through the pipe it inherited
        self._replies = os.fdopen(read_fd)
        self._dir = log_dir
        try:
            self._expect("ready", 600)
        except BaseException:
            self.close()
            raise

    def _readline(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self._replies], [], [], timeout)
        return self._replies.readline().strip() if ready else None

    def _expect(self, what: str, timeout: float) -> None:
        line = self._readline(timeout)
        if line != what:
            self._log.flush()
            raise RuntimeError(
                f"block server: expected {what!r}, got {line!r}; its log:\n"
                + (self._dir / "server.log").read_text()[-4000:]
            )

    def run(self, code: str, cwd: Path, timeout: float) -> tuple[int, str, str]:
        """Run ``code`` in ``cwd``; its output goes to files beside ``cwd``, not in it."""
        out, err = cwd.with_name(cwd.name + ".stdout"), cwd.with_name(cwd.name + ".stderr")
        req = {"code": code, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        pid = json.loads(self._readline(60) or "{}").get("pid")
        if pid is None:
            raise RuntimeError("block server: no child started")
        line = self._readline(timeout)
        if line is None:  # the block ran past its time: kill it, as subprocess.run would
            os.kill(pid, signal.SIGKILL)
            self._readline(60)
            raise subprocess.TimeoutExpired(["<block>"], timeout)
        rc = json.loads(line)["rc"]
        return rc, out.read_text(), err.read_text()

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._replies.close()
        self._log.close()
