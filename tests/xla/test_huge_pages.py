"""glibc's transparent huge pages: when the ``layoutlab`` command starts itself again with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, and that a process started so really gets huge
pages."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from layoutlab import cli
from layoutlab.host import huge_pages
from layoutlab.host.flag import huge_pages_wanted

# A fresh process that maps and touches 64 MiB through malloc and prints how much of its
# memory the kernel backs with huge pages, and this process's state.
_PROBE = """
import ctypes, json, re
from layoutlab.host import huge_pages_state
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
n = 64 << 20
ctypes.memset(libc.malloc(ctypes.c_size_t(n)), 1, n)
text = open("/proc/self/smaps_rollup").read()
huge = int(re.search(r"AnonHugePages:\\s+(\\d+) kB", text).group(1)) << 10
print(json.dumps([huge, *huge_pages_state()]))
"""


@pytest.fixture
def qualifying(monkeypatch, tmp_path):
    """A machine where the tunable changes something: glibc 2.36, THP in madvise mode."""
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "THP_MODE_FILE", mode)
    monkeypatch.setattr(huge_pages, "_glibc_version", lambda: (2, 36))
    return mode


def test_the_tunable_is_added_where_it_changes_something(qualifying, monkeypatch):
    env = huge_pages.huge_pages_environ({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    # Other tunables (the host-memory ones, say) stay, in front.
    kept = "glibc.malloc.mmap_max=0:glibc.malloc.top_pad=134217728"
    env = huge_pages.huge_pages_environ({"GLIBC_TUNABLES": kept})
    assert env["GLIBC_TUNABLES"] == kept + ":glibc.malloc.hugetlb=1"
    # The user's own choice, off included, is theirs.
    for own in ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=1", "a=1:glibc.malloc.hugetlb=2"):
        assert huge_pages.huge_pages_environ({"GLIBC_TUNABLES": own}) is None
    # Kernels that give huge pages always or never, or do not say: nothing to ask for.
    for text in ("[always] madvise never", "always madvise [never]"):
        qualifying.write_text(text)
        assert huge_pages.huge_pages_environ({}) is None
    qualifying.unlink()
    assert huge_pages.huge_pages_environ({}) is None
    qualifying.write_text("always [madvise] never")
    for version in (None, (2, 34)):  # not glibc; a glibc without the tunable
        monkeypatch.setattr(huge_pages, "_glibc_version", lambda v=version: v)
        assert huge_pages.huge_pages_environ({}) is None


def test_the_kernels_mode_is_the_bracketed_word(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert huge_pages.thp_mode(path) == "madvise"
    path.write_text("garbage")
    assert huge_pages.thp_mode(path) is None
    assert huge_pages.thp_mode(tmp_path / "absent") is None


def test_the_restart_replaces_the_process_with_its_own_command_line(qualifying, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "layoutlab.cli", "train"])
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_max=0")
    huge_pages.restart_with_huge_pages()
    ((executable, argv, env),) = calls
    assert (executable, argv) == (sys.executable, ["python", "-m", "layoutlab.cli", "train"])
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.mmap_max=0:glibc.malloc.hugetlb=1"
    # Started again, the process finds the tunable and goes on: no loop.
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])
    huge_pages.restart_with_huge_pages()
    assert len(calls) == 1


def test_a_failed_restart_goes_on_without(qualifying, monkeypatch):
    def refuse(*_):
        raise PermissionError("no exec here")

    monkeypatch.setattr(os, "execve", refuse)
    assert huge_pages.restart_with_huge_pages() is None


def _train(**kw):
    from layoutlab.cli import build_parser

    args = build_parser().parse_args(["train"])
    for name, value in {"data": "cifar10", "batch_size": 8, **kw}.items():
        setattr(args, name, value)  # as the flag of that name sets it
    return args


def _bench(*batches, keep=None, image_size=(32,)):
    return argparse.Namespace(command="bench", image_size=image_size, batch_sizes=list(batches),
                              keep_host_memory=keep)  # fmt: skip


def test_huge_pages_come_with_kept_host_memory_from_8192_pixels():
    # Measured faster from ResNet-18 CIFAR's batch 8 (8,192 input pixels) up with either
    # arenas, slower nowhere there; below it even (ResNet-18 at batch 1) or slower (the
    # digits job at 32 x 8 x 8 = 2,048) (benchmarks/results/huge_pages_zen4_cpu.md).
    from layoutlab.host.flag import HUGE_PAGES_MIN_PIXELS

    assert HUGE_PAGES_MIN_PIXELS == 8 * 32 * 32
    assert huge_pages_wanted(_train(batch_size=8))  # per-thread arenas
    assert huge_pages_wanted(_train(batch_size=32))  # one arena
    assert not huge_pages_wanted(_train(batch_size=7))
    assert not huge_pages_wanted(_train(data="digits", batch_size=32))  # the main job
    assert huge_pages_wanted(_train(batch_size=8, keep_host_memory=True))
    assert not huge_pages_wanted(_train(batch_size=8, keep_host_memory=False))
    assert not huge_pages_wanted(_train(config="run.json"))  # the batch is not on the line
    assert huge_pages_wanted(_bench(8, 16)) and huge_pages_wanted(_bench(8, 128))
    assert not huge_pages_wanted(_bench(1, image_size=None))  # the model's default input
    # A sweep with a batch under the size: the parent starts no JAX and stays as it is; each
    # part decides for itself (bench.host_memory_parts).
    assert not huge_pages_wanted(_bench(1, 8, 128))
    assert not huge_pages_wanted(_bench(8, 16, keep=False))
    assert not huge_pages_wanted(argparse.Namespace(command="predict"))


def test_a_sweep_runs_a_process_per_setting():
    from layoutlab.bench.host_memory_parts import host_memory_parts

    def parts(*batches, image_size=(32,)):
        return host_memory_parts(_bench(*batches, image_size=image_size), ["bench"])

    # Per-thread arenas; the same with huge pages; one arena with huge pages.
    assert parts(1, 8, 32, 128, 256) == [[1], [8], [32, 128, 256]]
    assert parts(256, 16, 1, 8) == [[1], [16, 8], [256]]  # each group in the order given
    assert parts(8, 16) is None and parts(32, 128) is None  # one setting: one process
    assert parts(1, 2, 4) is None


class _Restarted(Exception):
    pass


def test_the_command_restarts_only_as_the_process_itself(monkeypatch):
    def restart():
        raise _Restarted

    monkeypatch.setattr(huge_pages, "restart_with_huge_pages", restart)
    argv = ["train", "--data", "synthetic:32x32x3:4:16", "--batch-size", "8", "--epochs", "0"]
    monkeypatch.setattr(sys, "argv", ["layoutlab", *argv])
    with pytest.raises(_Restarted):
        cli.main()
    # Called from Python (a notebook, a test), main runs in the caller's process as it is.
    monkeypatch.setattr(cli, "huge_pages_wanted", lambda args: pytest.fail("asked"))
    assert cli.main([*argv]) == 2  # --epochs 0 is refused, after the check


@pytest.mark.skipif(
    huge_pages.huge_pages_environ({}) is None,
    reason="the tunable changes nothing here (not glibc 2.35+, or THP not in madvise mode)",
)
def test_a_process_started_with_the_tunable_gets_huge_pages():
    # The kernel's own counter, not layoutlab's report: 64 MiB mapped and touched through
    # malloc is backed by huge pages with the tunable and by none without (THP in madvise
    # mode backs only what is asked for).
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}

    def probe(environ):
        out = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True,
                             text=True, timeout=120, check=True).stdout  # fmt: skip
        return json.loads(out)

    # docs/guides/host-memory.md gives this state.
    assert probe(env) == [0, False, "glibc's default (no huge pages asked)"]
    huge, on, how = probe(huge_pages.huge_pages_environ(env))
    assert on and huge >= 32 << 20, huge  # at least half of the 64 MiB in 2 MiB pages
    assert how == "GLIBC_TUNABLES glibc.malloc.hugetlb=1 at start, THP madvise"


@pytest.mark.skipif(
    huge_pages.huge_pages_environ({}) is None,
    reason="the tunable changes nothing here (not glibc 2.35+, or THP not in madvise mode)",
)
def test_a_bench_sweep_records_huge_pages_per_part(tmp_path):
    # The command as a user runs it (its own process), across the size: batch 1 of 32x32
    # images (1,024 pixels) runs without huge pages, batch 8 (8,192) in a part that starts
    # again with them, and machine.json says which. No roofline: each part would measure the
    # machine's matmul peak (importing PyTorch for it) and copy 256 MiB, ~1.5 s of CPU a part
    # for figures this test does not read.
    out = tmp_path / "bench"
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    args = [
        "bench", "--model", "small_cnn", "--tiny", "--layouts", "NHWC", "--precisions",
        "fp32", "--modes", "infer", "--batch-sizes", "1,8", "--repeats", "1", "--warmup", "0",
        "--image-size=32", "--no-plots", "--no-roofline", "--out", str(out),
    ]  # fmt: skip
    subprocess.run([sys.executable, "-m", "layoutlab.cli", *args], env=env, timeout=300,
                   check=True, capture_output=True)  # fmt: skip
    machine = json.loads((out / "machine.json").read_text())["machine"]
    assert machine["huge_pages"] == (
        "batch 1: glibc's default (no huge pages asked); "
        "batch 8: GLIBC_TUNABLES glibc.malloc.hugetlb=1 at start, THP madvise"
    ), machine["huge_pages"]
    assert machine["host_memory"] == (
        "batch 1: mallopt (per-thread arenas); batch 8: mallopt (per-thread arenas)"
    )


def test_the_state_reads_the_tunables_the_process_started_with(qualifying, monkeypatch):
    def started_with(tunables):
        monkeypatch.setattr(huge_pages, "_start_tunables", lambda: tunables)
        return huge_pages.huge_pages_state()

    assert started_with("glibc.malloc.hugetlb=1") == (
        True, "GLIBC_TUNABLES glibc.malloc.hugetlb=1 at start, THP madvise"
    )  # fmt: skip
    assert started_with("glibc.malloc.hugetlb=0") == (
        False, "GLIBC_TUNABLES sets glibc.malloc.hugetlb=0 already"
    )  # fmt: skip
    assert started_with("glibc.malloc.hugetlb=2").on  # hugetlbfs pages, not transparent ones
    assert started_with("") == (False, "glibc's default (no huge pages asked)")
    # os.environ changed after the start is not what glibc read.
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert started_with("").on is False
