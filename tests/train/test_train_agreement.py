"""The processes of a multi-process run agree before anything compiles, or all stop with one
line: two processes x two CPU devices on localhost (the launch helpers of
test_train_multihost), and the fingerprint and its comparison in-process."""

import json
import time

from test_train_multihost import LEVEL_0, _launch, _one_line_error

from layoutlab.train.agreement import describe_differences, run_fingerprint

FAST = ["--distributed-timeout", "30"]


def _per_process(flags_of):
    """Launch flags giving process ``i`` also ``flags_of[i]`` (a list) and environment."""

    def flags(i, port):
        extra, env = flags_of[i] if isinstance(flags_of[i], tuple) else (flags_of[i], {})
        return [*extra, "--distributed", "--coordinator", f"127.0.0.1:{port}",
                "--num-processes", "2", "--process-id", str(i)], env  # fmt: skip

    return flags


# A learning rate and a conv algorithm in one launch: the line names every field that
# differs (up to four), so each must appear in it. That the data's fields are compared is
# test_data_differences_name_the_data_fields, in-process: the launch, its exit and its line
# are the same whatever differs, and a second launch would cost ~5 s of CPU.
def test_processes_that_differ_stop_before_compiling(tmp_path, forks):
    flags = (["--lr", "0.003"], ["--lr", "0.1", "--conv-algo", "im2col"])
    words = [
        "learning_rate: 0.003 on process 0, 0.1 on process 1",
        'conv_algorithm: "auto" on process 0, "im2col" on process 1',
    ]
    start = time.perf_counter()
    results = _launch(tmp_path / "run", *FAST, launch_flags=_per_process(flags), forks=forks)
    seconds = time.perf_counter() - start
    for result in results:
        _one_line_error(result, "the processes of this run differ", *words)
    # Both say the same, and nothing was compiled or written: the check comes first.
    assert results[0][2] == results[1][2]
    assert not (tmp_path / "run" / "config.json").exists()
    assert seconds < 60, seconds


def _seed_conv_cache(path, monkeypatch, *convs):
    """Writes ``path`` as a run of the test below would find it after tuning ``convs``
    (``(in_size, cin, cout)`` of the run's small_cnn convs, width 4 on digits): each
    entry keyed as the run keys it (autotune_conv with the run's compile options), XLA's
    conv chosen, nothing compiled."""
    from layoutlab.bench.tuning import convs as tuning
    from layoutlab.bench.tuning.conv_candidates import CandidateResult
    from layoutlab.nn.conv_algos.geometry import make_spec, resolve_geometry
    from layoutlab.train.config import TrainConfig, apply_overrides, validate
    from layoutlab.train.fast_config import compile_options

    # The launches' own XLA options (test_train_multihost.TRAIN) are part of every key.
    config = TrainConfig(precision="bf16", eval_batch_size=16)
    config = validate(apply_overrides(config, [f"xla_options.{LEVEL_0}"]), 4)
    options = compile_options(config, "train")
    skipped = lambda spec, name, *a, **k: CandidateResult(name, error="seeded")  # noqa: E731
    monkeypatch.setattr(tuning, "check_candidate", skipped)
    for size, cin, cout in convs:
        # Batch 16 and width 4: the shapes the run's own spec keys name (n16, 1->4, 4->8, 8->8).
        geom = resolve_geometry((size, size), 3, 1, "SAME")
        spec = make_spec((16, size, size, cin), cout, geom, dtype="bfloat16", layout="NHWC")
        tuning.autotune_conv(spec, compiler_options=options or None, cache=path)
    monkeypatch.undo()


def test_conv_tune_always_is_decided_by_process_0_alone(tmp_path, monkeypatch, forks):
    # Each process gets its own autotune cache: only process 0 may tune (and write one).
    caches = [tmp_path / f"autotune{i}.json" for i in range(2)]
    # Process 0's holds two of the three conv shapes, so it tunes one (each shape compiles
    # every candidate: ~15 s of CPU); process 1's is empty, so had it decided for itself,
    # it would have tuned all three and written its cache.
    _seed_conv_cache(caches[0], monkeypatch, (8, 1, 4), (4, 8, 8))
    flags = tuple(([], {"LAYOUTLAB_AUTOTUNE_CACHE": str(c)}) for c in caches)
    workdir = tmp_path / "run"
    # bfloat16: 7 candidates per conv shape instead of 10 (no Winograd F(4x4)), a cheaper tuning.
    flags_all = ["--conv-tune", "always", "--steps", "1", "--precision", "bf16",
                 "--set", "eval_batch_size=16"]  # fmt: skip
    results = _launch(workdir, *FAST, *flags_all, launch_flags=_per_process(flags), forks=forks)
    for code, _, err in results:
        assert code == 0, err[-2000:]
    assert "conv plan: autotuned (3 shapes (2 cached)" in results[0][1], results[0][1][-2000:]
    assert "conv plan" not in results[1][1] and "conv plan" not in results[1][2]
    assert caches[0].is_file() and not caches[1].exists()
    # The run finished past the second check, of the plan each process compiles; the
    # plan recorded is process 0's (its cache and its tuning, with the measurements), one
    # entry per conv.
    convs = json.loads((workdir / "config.json").read_text())["conv_plan"]["convs"]
    tuned = json.loads(caches[0].read_text())["entries"]
    assert len(convs) == 3 and len(tuned) == 3
    sources = sorted(entry["evidence"]["source"] for entry in convs.values())
    assert sources == ["cache", "cache", "measured"], convs
    measured = [e for e in convs.values() if e["evidence"]["source"] == "measured"]
    assert measured[0]["spec_key"].startswith("NHWC:n16:8x8:4->8:"), measured


def test_duplicate_process_id_is_one_line_on_both(tmp_path, forks):
    def flags(i, port):
        return ["--distributed", "--coordinator", f"127.0.0.1:{port}", "--num-processes",
                "2", "--process-id", "0", "--distributed-timeout", "5"]  # fmt: skip

    # The second starts once the first serves the coordinator's port, as a duplicate
    # started by mistake does. (Two started within the same instant both find the port free
    # and both time out waiting, with the join error that names --process-id.)
    results = _launch(tmp_path / "run", launch_flags=flags, serve_first=True, forks=forks)
    words = {r[2].strip().split(":")[1].split()[0] for r in results}
    for result in results:
        _one_line_error(result)
    # The second finds the coordinator's port taken; the first waits for a
    # process 1 that never comes. Its wait is 5 s, for it must still hold the port when the
    # second, started after it, reaches its check: forked with everything imported, the
    # second gets there 0.1 s after it starts (a fresh interpreter needed up to ~10 s on a
    # loaded 2-core machine, and the wait was 20 s).
    joined = " ".join(r[2] for r in results)
    assert "another process was started with --process-id 0" in joined, joined
    assert words == {"port", "could"}, words


def _fingerprint(*overrides, data="synthetic:8x8x1:10:64"):
    from flax import nnx

    from layoutlab.train.config import TrainConfig, apply_overrides, validate
    from layoutlab.train.loop import make_step_schedule
    from layoutlab.train.program import build_model
    from layoutlab.train.run_data import load_run_data
    from layoutlab.train.spec import InputSpec, resolve_spec

    config = validate(apply_overrides(TrainConfig(data=data), list(overrides)), 1)
    dataset = load_run_data(config)
    spec = resolve_spec(config)
    model = nnx.eval_shape(lambda: build_model(spec, InputSpec.of(dataset, spec.batch_size)))
    return run_fingerprint(spec, dataset, make_step_schedule(config, dataset), model)


def test_fingerprint_compares_resolved_values():
    base = _fingerprint("learning_rate=0.1", "layout=nhwc", "model_kwargs.width=4")
    same = _fingerprint("learning_rate=1e-1", "layout=NHWC", "model_kwargs.width=4")
    assert describe_differences([base, same]) is None
    wider = _fingerprint("learning_rate=0.1", "model_kwargs.width=8")
    line = describe_differences([base, same, wider])
    # Only process 2 differs: its width, and the model state that follows from it.
    assert line.startswith("model_kwargs: {\"width\": 4} on process 0, {\"width\": 8} on "
                           "process 2; model state ("), line  # fmt: skip
    assert "process 1" not in line and "\n" not in line


def test_data_differences_name_the_data_fields():
    # Other data of the same shape: the fingerprint holds the data's sizes and contents, and
    # the line names them (with the data's own fields it passes four, so this is its own case).
    line = describe_differences(
        [_fingerprint(data="synthetic:8x8x1:10:64"), _fingerprint(data="synthetic:8x8x1:10:96")]
    )
    for word in ("data.train_size", "51 on process 0", "77 on process 1", "data.contents"):
        assert word in line, line
    assert "\n" not in line


def test_supervisor_holds_back_a_fatal_trace_and_names_its_reason():
    import io
    import os

    from layoutlab.train.supervise import fatal_message, pass_through

    read, write = os.pipe()
    os.write(write, b"W1125 06:00:00.000001 1 a.cc:1] a warning\nprogress 50%\rprogress 90%\r"
                    b"F1125 06:46:42.051416   28951 client.h:80] Terminating process. "
                    b"absl::Status: UNAVAILABLE: Failed to send RPC\n*** Check failure stack "
                    b"trace: ***\n    @ 0x7f36b8240634 absl::LogMessage\n")  # fmt: skip
    os.close(write)
    out = io.BytesIO()
    with os.fdopen(read, "rb") as stream:
        held = pass_through(stream, out)
    # Everything before the fatal line passes as it came; the trace is held back.
    assert (
        out.getvalue() == b"W1125 06:00:00.000001 1 a.cc:1] a warning\nprogress 50%\rprogress 90%\r"
    )
    assert fatal_message(held) == "UNAVAILABLE: Failed to send RPC"


def test_processes_that_do_not_share_the_workdir_stop_before_training(tmp_path, forks):
    # One relative --workdir, two working directories: the same path string names another
    # directory on each process, as one absolute path does on hosts without a shared
    # filesystem. Each process then trained and waited out orbax's 600 s in the first save.
    zero = tmp_path / "zero"
    zero.mkdir()
    results = _launch("run", *FAST, launch_flags=_per_process(([], [])), forks=forks, cwd=zero)
    for result in results:
        _one_line_error(
            result, "do not share one workdir", f"{zero / 'run'} on process 0",
            "workdir.probe", "(no probe file) on process 1", "filesystem they all share",
        )  # fmt: skip
    assert results[0][2] == results[1][2]
    # Process 0's probe file is gone again, and nothing was trained or written.
    left = sorted(p.name for p in (zero / "run").iterdir())
    assert not any(n.startswith(".layoutlab-probe") or n == "config.json" for n in left), left


def test_processes_with_other_device_counts_stop_with_one_line(tmp_path, forks):
    # Process 1 has one CPU device, process 0 two: 3 in all, which a global batch of 12
    # divides, so only the per-process count can tell (it crashed in a reshape on both).
    one = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    flags = _per_process(([], ([], one)))
    results = _launch(tmp_path / "run", *FAST, "--batch-size", "12", launch_flags=flags,
                      forks=forks)  # fmt: skip
    for result in results:
        _one_line_error(result, "different numbers of devices (2 on process 0, 1 on process 1)")


def test_probe_tells_a_workdir_that_is_not_shared(tmp_path):
    from layoutlab.train.agreement import PROBE, WORKDIR, read_probe, verdict, write_probe

    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir(), elsewhere.mkdir()
    nonce, path = write_probe(shared)
    # The same path string on both (one mount point on two hosts), so only the probe can
    # tell: a process that sees process 0's file reads its nonce, one that does not, none.
    base = {WORKDIR: "/runs/r", "lr": "0.1"}
    zero = {**base, PROBE: nonce}
    assert verdict([zero, {**base, PROBE: read_probe(shared, nonce)}]) == ""
    line = verdict([zero, {**base, PROBE: read_probe(elsewhere, nonce)}])
    assert line.startswith("the processes of this run do not share one workdir: workdir.probe:")
    assert "(no probe file) on process 1" in line and "\n" not in line, line
    path.unlink()


def test_fingerprint_holds_the_source_and_the_numerics_settings(tmp_path):
    import shutil

    import jax

    import layoutlab
    from layoutlab.train.agreement import source_digest

    base = _fingerprint()
    root = tmp_path / "layoutlab"
    shutil.copytree(layoutlab.__path__[0], root, ignore=shutil.ignore_patterns("__pycache__"))
    assert base["versions.layoutlab_source"] == source_digest() == source_digest(str(root))
    optim = root / "train" / "optim.py"
    optim.write_text(optim.read_text() + "\n# patched\n")  # same version, other code
    patched = {**base, "versions.layoutlab_source": source_digest(str(root))}
    line = describe_differences([base, patched])
    assert line.startswith("versions.layoutlab_source: "), line
    with jax.default_matmul_precision("bfloat16"):
        bf16 = _fingerprint()
    line = describe_differences([base, bf16])
    assert "jax_default_matmul_precision: " in line and "bfloat16 on process 1" in line, line
    assert base["devices.local_count"] == str(jax.local_device_count())
    assert base["jax_enable_x64"] == "False"


def test_a_killed_process_stops_the_other_at_once_with_one_line(tmp_path, forks):
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor

    # Process 1 is killed (-9) while both train: process 0 then waits in the step's
    # all-reduce, which does not fail. Process 1's link to process 0 closes with it, which
    # names it at once; the watchdog alone waited out --distributed-timeout, and the
    # coordination service's C++ logs came with its line.
    workdir = tmp_path / "run"
    long = ["--steps", "2000", "--set", "eval_every=2000", "--set", "checkpoint_every=2000"]
    with ThreadPoolExecutor(1) as pool:
        launched = pool.submit(_launch, workdir, *FAST, *long, forks=forks)
        steps = workdir / "steps.jsonl"
        while not (steps.is_file() and steps.read_text().count("\n") >= 2):
            assert not launched.done(), launched.result()
            time.sleep(0.2)
        (pid,) = tmp_path.glob("run-process1-*/pid")
        os.kill(int(pid.read_text()), signal.SIGKILL)
        zero, one = launched.result()
    assert one[0] == -signal.SIGKILL, one
    _one_line_error(zero, "process 1 ended without finishing (killed or crashed")
    # Nothing else on stderr: no C++ log of the coordination service, no trace.
    assert zero[2].strip().count("\n") == 0, zero[2][-2000:]


def test_supervisor_keeps_the_error_line_and_drops_what_follows(capsysbinary):
    import io
    import os
    import signal

    from layoutlab.train.supervise import OutputFilter, finish

    def run(data: bytes, code: int):
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        out = io.BytesIO()
        f = OutputFilter(out)
        with os.fdopen(read, "rb") as stream:
            f.feed(stream)
        return out.getvalue(), finish(f, code), capsysbinary.readouterr().err

    trace = (b"F1125 06:46:42.051416   28951 client.h:80] Terminating process. absl::Status: "
             b"UNAVAILABLE: Failed to send RPC\n*** Check failure stack trace: ***\n"
             b"    @ 0x7f36b8240634 absl::LogMessage\n")  # fmt: skip
    # The child's own error line, then an abort at exit: one line, the child's.
    line = b"error: the processes of this run differ: --num-processes\n"
    out, code, err = run(b"step 1\r" + line + trace, -signal.SIGABRT)
    assert (out, code, err) == (b"step 1\r" + line, 2, b"")
    # The coordination service's logs before the watchdog's line: the line alone.
    logs = (b"E1206 19:39:29.301218   27327 coordination_service.cc:1549] Use error polling "
            b"to propagate the following error to all tasks: UNAVAILABLE: The following "
            b"tasks are unhealthy (stopped sending heartbeats):\n1\nThe tasks have crashed."
            b"\n\nRPC: /xla.coordination.CoordinationService/PollForError\n")  # fmt: skip
    stopped = b"error: the distributed run stopped: process 1 ended without finishing\n"
    out, code, err = run(logs + stopped, 2)
    assert (out, code, err) == (stopped, 2, b"")
    # An abort with no error line of the child's: the supervisor's one line.
    out, code, err = run(b"step 1\n" + trace, -signal.SIGABRT)
    assert out == b"step 1\n" and code == 2 and err.count(b"\n") == 1, err
    assert b"UNAVAILABLE: Failed to send RPC" in err
    # A run that ends well after held logs shows them, late rather than never.
    out, code, err = run(logs + b"done\n", 0)
    assert (out, code, err) == (b"", 0, logs + b"done\n")
