"""``keep_host_memory``: XLA:CPU's per-call temp buffer stops page-faulting once freed host
memory stays in the process.

The positive checks run in fresh processes: the setting has to come before JAX starts its
backend, and this test process started it at collection (conftest). The page-fault probes are
new interpreters (their counts were measured on such); the commands and the other checks are
forked from one server that imported layoutlab and JAX without starting a backend
(``fresh``), as a new interpreter is once it has imported them, without ~2 s of imports each.
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

import pytest
from block_server import BlockServer
from host_memory_probe import probe

from layoutlab import cli
from layoutlab.host import HostMemoryError, host_memory_state, keep_host_memory
from layoutlab.host.memory import ENV_SETTING, ENV_SETTING_PER_THREAD

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the malloc settings exist on Linux with glibc only",
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """``fresh(code) -> stdout``: ``code`` run as ``python -c`` would, in a process started
    without ``GLIBC_TUNABLES`` (``tests/helpers/block_server.py``); it must exit with 0."""
    root = tmp_path_factory.mktemp("fresh")
    server = BlockServer({k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}, root)

    def run(code: str) -> str:
        rc, out, err = server.run(code, Path(tempfile.mkdtemp(dir=root)), 300)
        assert rc == 0, err[-2000:]
        return out

    yield run
    server.close()


@pytest.fixture(scope="module")
def default_probe():
    """glibc's defaults, probed once: the baseline of both arena settings below."""
    return probe("default")


@glibc_only
@pytest.mark.parametrize(
    "arenas, how", [("one", "mallopt"), ("per_thread", "mallopt (per-thread arenas)")]
)
def test_kept_host_memory_stops_the_temp_buffer_faulting(default_probe, arenas, how):
    # Per-thread arenas too: the 36 MB buffer is under the 64 MiB a thread's arena holds.
    default, kept = default_probe, probe(arenas)
    assert default["state"] == [False, "default glibc malloc"]
    assert kept["state"] == [True, how]
    pages = kept["temp"] / os.sysconf("SC_PAGE_SIZE")
    assert pages > 8000  # the probe really has a temp buffer above the mmap threshold
    # The first calls grow the heap to its peak: until the free space left by earlier calls
    # fits the buffer again, a call can still take fresh pages (seen up to the 12th call in 14
    # runs at load 3-6 on 2 cores; most settle by the 9th). Steady state: calls 17 to 48.
    # Per-thread arenas without glibc's top pad faulted the whole buffer again on up to 19 of
    # these 32 calls under load: glibc unmaps a thread's heap that a free leaves empty,
    # whatever the trim threshold (keep_host_memory's docstring). With the pad, 24 runs at
    # load 3-7 on 2 cores faulted none after the 11th call. The claim stays about the typical
    # steady call, not every one, since 24 runs bound only what they saw: most of them (more
    # than half: the median call) reuse the heap, under 1% of the buffer's pages faulted,
    # where without the setting every steady call faults the whole buffer again (one fault
    # per page, unless transparent huge pages back the mapping: then faults are cheap too and
    # the comparison says nothing).
    steady_default, steady_kept = default["faults"][16:], kept["faults"][16:]
    if statistics.median(steady_default) < pages / 2:
        pytest.skip("this kernel backs fresh mappings with huge pages; nothing to compare")
    reused = sum(f < pages / 100 for f in steady_kept)
    assert reused > len(steady_kept) / 2, kept
    assert min(steady_default) > pages / 2, default


@glibc_only
def test_too_late_is_a_clear_error():
    if host_memory_state().kept:
        pytest.skip("GLIBC_TUNABLES already keeps host memory in this process")
    with pytest.raises(HostMemoryError, match="before JAX starts its backend") as err:
        keep_host_memory()
    assert "GLIBC_TUNABLES=" in str(err.value)
    assert host_memory_state().kept is False  # nothing was changed half-way


@glibc_only
def test_cli_flag_too_late_exits_with_the_fix(capsys):
    if host_memory_state().kept:
        pytest.skip("GLIBC_TUNABLES already keeps host memory in this process")
    code = cli.main(["bench", "--model", "small_cnn", "--keep-host-memory", "--out", "unused"])
    assert code == 2
    assert "before JAX starts its backend" in capsys.readouterr().err


def test_environment_setting_names_every_tunable():
    # The fallback printed in the error must carry all three settings keep_host_memory sets.
    for tunable in ("arena_max=1", "mmap_max=0", "trim_threshold="):
        assert f"glibc.malloc.{tunable}" in ENV_SETTING


def test_the_host_memory_guide_gives_both_environment_settings():
    # The guide spells the settings out for the command line; they must be the ones that
    # host_memory_state() reads back as kept (the per-thread one with its top pad).
    guide = (Path(__file__).resolve().parents[2] / "docs/guides/host-memory.md").read_text()
    for setting in (ENV_SETTING, ENV_SETTING_PER_THREAD):
        assert setting in guide, setting


@pytest.mark.parametrize(
    "tunables, arenas",
    [
        (ENV_SETTING.split("=", 1)[1], "one"),
        (ENV_SETTING_PER_THREAD.split("=", 1)[1], "per_thread"),
        # Without the top pad a thread's empty heap is unmapped: not kept.
        ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736", None),
        (
            "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=9:glibc.malloc.top_pad=1048576",
            None,
        ),
        # 16 arenas is not one: an exact item, not a prefix.
        (
            "glibc.malloc.arena_max=16:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=9:"
            "glibc.malloc.top_pad=268435456",
            "per_thread",
        ),
        ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0", None),  # the heap is trimmed
        ("", None),
    ],
)
def test_the_environment_setting_is_read_back_with_its_arenas(monkeypatch, tunables, arenas):
    from layoutlab.host import memory as host_memory

    monkeypatch.setenv("GLIBC_TUNABLES", tunables)
    assert host_memory._from_environment() == arenas


@glibc_only
def test_the_default_leaves_a_process_that_started_jax_as_it_was(capsys):
    # cli.main called from Python (a notebook): the small-batch default would be per-thread
    # arenas, which could still be set, but nobody asked for them.
    if host_memory_state().kept:
        pytest.skip("GLIBC_TUNABLES already keeps host memory in this process")
    argv = ["bench", "--model", "no_such_model", "--image-size", "8", "--batch-sizes", "2",
            "--out", "unused"]  # fmt: skip
    assert cli.main(argv) == 2  # the unknown model, after the setting's turn
    assert host_memory_state() == (False, "default glibc malloc")
    assert "no_such_model" in capsys.readouterr().err


@glibc_only
def test_per_thread_arenas_can_come_after_jax_starts(fresh):
    # Only one arena for every thread has to come first: per-thread arenas set no arena.
    code = (
        "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()\n"
        "from layoutlab.host import keep_host_memory\n"
        "print(list(keep_host_memory('per_thread')))"
    )
    out = fresh(code)
    assert out.strip().splitlines()[-1] == "[True, 'mallopt (per-thread arenas)']"


def test_keep_host_memory_rejects_unknown_arenas():
    with pytest.raises(ValueError, match="arenas must be one of"):
        keep_host_memory("two")


@glibc_only
@pytest.mark.parametrize(
    "flags, how",
    [
        (["--keep-host-memory"], "mallopt"),
        # The default for a batch of 2 x 8 x 8 pixels: per-thread arenas.
        (["--image-size=8"], "mallopt (per-thread arenas)"),
        # A sweep across the threshold (1 x 32 x 32 under it, 64 x 32 x 32 over): a process
        # per side, each with the setting it gets alone.
        (
            ["--image-size=32", "--batch-sizes=1,64"],
            "batch 1: mallopt (per-thread arenas); batch 64: mallopt",
        ),
    ],
)
def test_bench_records_kept_host_memory(tmp_path, fresh, flags, how):
    out = tmp_path / "bench"
    # No roofline: each part would measure the machine's matmul peak and copy bandwidth for
    # figures this test does not read (test_bench_sweep's real sweep measures them).
    args = [
        "bench", "--model", "small_cnn", "--tiny", "--layouts", "NHWC", "--precisions",
        "fp32", "--modes", "infer", "--batch-sizes", "2", "--repeats", "1", "--warmup", "0",
        *flags, "--no-plots", "--no-roofline", "--out", str(out),
    ]  # fmt: skip
    fresh(f"import sys; from layoutlab.cli import main; sys.exit(main({args!r}))")
    machine = json.loads((out / "machine.json").read_text())["machine"]
    assert machine["host_memory_kept"] is True
    assert machine["host_memory"] == how
    rows = json.loads((out / "results.json").read_text())["rows"]
    batches = [int(b) for b in flags[-1].split("=")[1].split(",")] if len(flags) > 1 else [2]
    assert sorted({r["batch_size"] for r in rows if r["status"] == "ok"}) == batches


def test_train_bench_and_conv_autotune_take_the_flag():
    parser = cli.build_parser()
    for argv in (
        ["train", "--keep-host-memory"],
        ["bench", "--model", "resnet18", "--out", "x", "--keep-host-memory"],
        ["conv-autotune", "--model", "resnet18", "--batch-size", "2", "--keep-host-memory"],
        ["autotune", "convs", "--model", "resnet18", "--batch-size", "2", "--keep-host-memory"],
    ):
        assert parser.parse_args(argv).keep_host_memory is True
        # Not given: None, the default (kept unless the batches are known to be small).
        assert parser.parse_args(argv[:-1]).keep_host_memory is None
        assert parser.parse_args([*argv[:-1], "--no-keep-host-memory"]).keep_host_memory is False


def test_each_batch_falls_on_its_side_of_the_threshold():
    # The setting is process-wide: one process running batch 1 to 256 would run its batch-1
    # and batch-8 steps with one malloc arena too, where MobileNetV2's training step ran
    # 1.8-2.3x slower (benchmarks/results/host_memory_small_batch_avx512_cpu.md): any batch
    # under the threshold gets per-thread arenas (a sweep across it: a process per side).
    from layoutlab.host.flag import HOST_MEMORY_MIN_PIXELS, host_memory_arenas

    def bench(*batches, image_size=(32,)):
        return argparse.Namespace(
            command="bench", image_size=image_size, batch_sizes=batches, keep_host_memory=None
        )

    # 32 x 32 x 32 = 32,768 pixels is the first batch over the threshold.
    assert HOST_MEMORY_MIN_PIXELS == 32 * 32 * 32
    assert host_memory_arenas(bench(1, 8, 32, 128, 256)) == "per_thread"
    assert host_memory_arenas(bench(256, 31)) == "per_thread"  # whatever the order
    assert host_memory_arenas(bench(32, 128, 256)) == "one"
    assert host_memory_arenas(bench(8, image_size=(64,))) == "one"  # 8 x 64 x 64
    assert host_memory_arenas(bench(15, image_size=(64, 32))) == "per_thread"  # H x W: 30,720
    assert host_memory_arenas(bench(16, image_size=(64, 32))) == "one"  # 32,768
    assert host_memory_arenas(bench(1, image_size=None)) == "one"  # the model's default input

    def train(*argv):
        return cli.build_parser().parse_args(["train", "--data", "cifar10", *argv])

    assert host_memory_arenas(train("--batch-size", "32")) == "one"  # 32 x 1,024 CIFAR pixels
    assert host_memory_arenas(train("--batch-size", "31")) == "per_thread"
    # A config that cannot be read: the batch is unknown here (the run's checks say why).
    assert host_memory_arenas(train("--batch-size", "1", "--config", "run.json")) == "one"


def test_a_train_runs_arenas_follow_the_batch_and_data_of_its_config(tmp_path):
    # The batch and data a run trains on, however they are set (a flag, --set, --config),
    # read from the config the flags make (train.command.config_from_flags): --set
    # batch_size= and --set data= were read from the flags alone, and so ignored.
    from layoutlab.cli import build_parser
    from layoutlab.host.flag import host_memory_arenas

    def arenas(*argv):
        return host_memory_arenas(build_parser().parse_args(["train", *argv]))

    assert arenas("--data", "cifar10", "--batch-size", "1") == "per_thread"  # 1 x 1,024
    assert arenas("--data", "cifar10", "--set", "batch_size=1") == "per_thread"
    assert arenas("--set", "data=cifar10", "--batch-size", "32") == "one"  # 32 x 1,024
    assert arenas("--batch-size", "32") == "per_thread"  # digits: 32 x 64 pixels
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"data": "cifar10", "batch_size": 64}))
    assert arenas("--config", str(config)) == "one"
    assert arenas("--config", str(config), "--set", "batch_size=2") == "per_thread"
    assert arenas("--data", "folder:/nowhere", "--image-size", "64") == "one"  # 32 x 64 x 64
    # A resumed run's config is the workdir's, read only once JAX may start: no batch shown.
    assert arenas("--workdir", str(tmp_path), "--resume", "--batch-size", "1") == "one"


def test_evaluate_predict_and_export_keep_glibcs_malloc():
    # The host-memory guide says so: one arena ran a 10,000-image evaluation 6-7% faster in
    # two triples, within the VM's drift (benchmarks/results/evaluate_host_memory_zen4_cpu.md).
    from layoutlab.cli import build_parser
    from layoutlab.host.flag import host_memory_arenas, huge_pages_wanted

    parser = build_parser()
    for argv in (["evaluate", "--workdir", "R"], ["predict", "--workdir", "R", "a.png"],
                 ["export", "--workdir", "R", "--out", "m.jax"]):  # fmt: skip
        args = parser.parse_args(argv)
        assert not hasattr(args, "keep_host_memory"), argv
        assert host_memory_arenas(args) is None and not huge_pages_wanted(args), argv


def test_the_flags_choose_the_arenas():
    # Small batches keep host memory with per-thread arenas, large ones (or batches the
    # flags do not show) with one, a sweep across the threshold with per-thread arenas (with
    # glibc's defaults, PyTorch's large batches page-fault and the ratio flatters
    # layoutlab); the flag given says one or none whatever the batch.
    from layoutlab.host.flag import host_memory_arenas

    def bench(*batches, keep=None, image_size=(32,)):
        return argparse.Namespace(
            command="bench", image_size=image_size, batch_sizes=batches, keep_host_memory=keep
        )

    assert host_memory_arenas(bench(1, 8, 16)) == "per_thread"  # 16 x 32 x 32 = 16,384
    assert host_memory_arenas(bench(1, 8, 128)) == "per_thread"
    assert host_memory_arenas(bench(32, 128)) == "one"
    assert host_memory_arenas(bench(1, image_size=None)) == "one"  # the model's default input
    assert host_memory_arenas(bench(1, keep=True)) == "one"
    assert host_memory_arenas(bench(128, keep=False)) is None
    assert host_memory_arenas(argparse.Namespace(command="predict")) is None
    # A batch-1 training run on 32x32 images gets per-thread arenas, as a batch-1 bench
    # (docs/performance/cpu.md: the batch-1 training cell of a sweep across the threshold
    # runs without them).
    from layoutlab.cli import build_parser

    argv = ["train", "--data", "synthetic:32x32x3:10:64", "--batch-size", "1"]
    assert host_memory_arenas(build_parser().parse_args(argv)) == "per_thread"


@glibc_only
def test_released_host_memory_faults_again_and_keeping_it_again_reuses(default_probe):
    # What a bench sweep across the threshold does between batch groups, with JAX running:
    # per-thread arenas kept, then released, then kept again. The steady calls (17 to 48,
    # as above) must fault like glibc's defaults once released (the 36 MB buffer is over the
    # 32 MiB mmap threshold release_host_memory sets) and reuse the heap once kept again.
    released = probe("per_thread", then="released")
    again = probe("per_thread+released", then="per_thread")
    assert released["state"] == [False, "mallopt: glibc's default limits (released)"]
    assert again["state"] == [True, "mallopt (per-thread arenas)"]
    pages = released["temp"] / os.sysconf("SC_PAGE_SIZE")
    if statistics.median(default_probe["faults"][16:]) < pages / 2:
        pytest.skip("this kernel backs fresh mappings with huge pages; nothing to compare")
    assert min(released["faults"][16:]) > pages / 2, released
    steady = again["faults"][16:]
    assert sum(f < pages / 100 for f in steady) > len(steady) / 2, again


@glibc_only
def test_one_arena_cannot_be_released(fresh):
    code = (
        "from layoutlab.host import HostMemoryError, keep_host_memory, release_host_memory\n"
        "keep_host_memory('one')\n"
        "try:\n    release_host_memory()\nexcept HostMemoryError as e:\n    print('refused:', e)"
    )
    out = fresh(code)
    assert "refused: release_host_memory() cannot undo one malloc arena" in out, out


def test_a_bench_sweep_across_the_threshold_runs_a_process_per_side():
    from layoutlab.bench.host_memory_parts import host_memory_parts

    def bench(*batches, keep=None, image_size=(32,)):
        flags = dict(image_size=image_size, batch_sizes=list(batches), keep_host_memory=keep)
        return argparse.Namespace(command="bench", **flags), ["bench"]  # and the command line

    # 32 x 32 x 32 = 32,768 pixels is the first batch over the threshold; from 8 x 32 x 32
    # the small side runs with huge pages, in a process of its own (test_huge_pages.py).
    assert host_memory_parts(*bench(1, 8, 32, 128, 256)) == [[1], [8], [32, 128, 256]]
    assert host_memory_parts(*bench(256, 1, 7)) == [[1, 7], [256]]  # the order given
    assert host_memory_parts(*bench(1, 2, 4)) is None  # all small: one process
    assert host_memory_parts(*bench(32, 128)) is None  # all large
    assert host_memory_parts(*bench(1, 128, keep=False)) is None  # the user chose a setting
    assert host_memory_parts(*bench(1, 128, keep=True)) is None
    assert host_memory_parts(*bench(1, 128, image_size=None)) is None  # input not shown


def test_a_failing_part_stops_the_sweep_with_its_exit_status(tmp_path):
    from layoutlab.bench.host_memory_parts import run_parts

    # The child names the bad model itself (exit 2); the parent passes that status on.
    with pytest.raises(ChildProcessError) as err:
        run_parts(["bench", "--model", "no_such_model"], [[1], [64]], tmp_path)
    assert err.value.errno == 2
    assert "batch sizes 1 exited with 2" in err.value.strerror
    assert not (tmp_path / "part-2-b64").exists()  # the second part never started


def test_host_memory_is_a_package_of_its_own():
    """glibc's arenas and huge pages are the process's, not XLA's: ``layoutlab.host`` holds
    them and ``layoutlab.xla`` names none of them."""
    import layoutlab.host
    import layoutlab.xla
    from layoutlab.host import huge_pages, memory

    assert layoutlab.host.keep_host_memory is memory.keep_host_memory
    assert layoutlab.host.huge_pages_state is huge_pages.huge_pages_state
    assert not set(layoutlab.xla.__all__) & set(layoutlab.host.__all__)
